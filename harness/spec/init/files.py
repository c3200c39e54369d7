"""Every file `harness init` writes, by path: the commented ``harness.toml`` and the workflows of one topology.

``repo.scan`` reads the repository (files only: nothing is imported or run); everything else is pure and returns
file texts, so the generated files are tested as texts (the TOML through the suite loader, the workflows against
GitHub's schema and by running their shell steps locally: tests/spec/test_init*.py).

Topologies (docs/topology.md):

- ``shared-db``: each benchmark machine is a self-hosted runner and writes to one shared database (``$HARNESS_DB``,
  PostgreSQL); one job renders the report from it.
- ``bundles``: each benchmark machine measures into a local SQLite file and uploads a bundle; one collector job
  imports them all into ``$HARNESS_DB`` and renders the report. The benchmark machines need no database access.
- ``cluster``: one runner submits each commit to a chip-labelled Ray cluster (docs/cluster.md), whose nodes write
  to ``$HARNESS_DB``.
"""

from __future__ import annotations

from harness.spec.init.repo import RepoScan
from harness.spec.init.suite_toml import render_toml
from harness.spec.init.workflows import gate_workflow, measure_workflow

TOPOLOGIES = ("shared-db", "bundles", "cluster")
MEASURE_WORKFLOW = ".github/workflows/harness-measure.yml"
GATE_WORKFLOW = ".github/workflows/harness-gate.yml"


def render_files(found: RepoScan, topology: str, source: str, branch: str) -> dict[str, str]:
    """Every file ``harness init`` writes, by path relative to the repository root."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"--topology must be one of {', '.join(TOPOLOGIES)}, not {topology!r}")
    return {"harness.toml": render_toml(found),
            MEASURE_WORKFLOW: measure_workflow(topology, source, branch),
            GATE_WORKFLOW: gate_workflow(topology, source)}
