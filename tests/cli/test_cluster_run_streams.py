"""`harness run --executor ray` keeps stdout for results, as a local run does: each job's progress line goes to
stderr (it went to stdout through the driver's print_progress, so `harness run --executor ray > log` mixed them)."""

from __future__ import annotations

import pytest
import typer

from harness.cli import run as run_cli
from harness.cluster.driver import ClusterOutcome
from harness.core.job import JobResult
from harness.pipeline.run import ClusterRunRequest


class _Job:
    key = "correctness/flash/default/float32/S=7"


def test_a_cluster_runs_progress_goes_to_stderr_and_its_results_to_stdout(monkeypatch, capsys, tmp_path):
    def fake_run_on_cluster(request, *, progress, log):
        progress("tiny-a", _Job(), JobResult(key=_Job.key, status="passed"), 1, 1)
        return ClusterOutcome()

    monkeypatch.setattr(run_cli, "run_on_cluster", fake_run_on_cluster)
    request = ClusterRunRequest(suite=None, db_url=f"sqlite:///{tmp_path / 'r.db'}", commit=None, repo=".",
                                parallel=1, address="127.0.0.1:1", max_attempts=1, chips=())
    with pytest.raises(typer.Exit):
        run_cli._run_on_cluster(request, None)
    captured = capsys.readouterr()
    assert "[tiny-a] 1/1 passed" in captured.err and "[tiny-a]" not in captured.out
    assert "database: " in captured.out
