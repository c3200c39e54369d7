"""`harness init`: adopt the harness in a kernel repository (a commented harness.toml and the CI workflows)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import app, console
from harness.core.errors import HarnessError
from harness.spec import git
from harness.spec.init.files import TOPOLOGIES, render_files
from harness.spec.init.repo import scan
from harness.spec.init.source import index_source, installed_source

HELP = "\n\n".join((
    "Write a commented harness.toml for this repository (the test folders and markers found, the benchmark "
    "functions decorated with harness.bench.benchmark, an example correctness check and variant grid for a "
    "registered kernel) and the GitHub workflows of one topology: .github/workflows/harness-measure.yml (measure "
    "every push to the default branch, backfill on demand, the report on Pages) and harness-gate.yml (the "
    "pull-request gate: compare with the merge base, a comment, exit 1 on a regression).",
    "--topology: shared-db (each benchmark Mac is a self-hosted runner writing to one PostgreSQL), bundles (each "
    "Mac uploads a bundle; one job imports them all) or cluster (a Ray cluster). docs/topology.md compares them.",
    "--harness-source: the pip requirement the workflows install the harness from, pinned. Default: where this "
    "harness was installed from (a git URL and commit, or an index version); there is none for a local checkout, "
    "so pass it, e.g. 'mlx-kernel-harness @ git+https://github.com/OWNER/REPO@v0.1.0'.",
    "Existing files are not overwritten without --force. Exit status: 0 written, 2 refused or bad input.",
))


@app.command("init", help=HELP)
def init(
    topology: Annotated[str, typer.Option(help="shared-db, bundles or cluster (docs/topology.md).")] = "shared-db",
    harness_source: Annotated[str | None, typer.Option(
        help="pip requirement of the harness for the workflows, pinned (default: where this one came from).")
    ] = None,
    branch: Annotated[str | None, typer.Option(help="Branch to measure on push (default: the default branch).")
                      ] = None,
    path: Annotated[Path, typer.Option(help="The repository's root.")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Write harness.toml and the workflows (see HELP)."""
    if topology not in TOPOLOGIES:
        raise HarnessError(f"--topology must be one of {', '.join(TOPOLOGIES)}, not {topology!r}")
    root = path.resolve()
    if not root.is_dir():
        raise HarnessError(f"--path {path} is not a folder")
    source = harness_source or installed_source() or index_source()
    if not source:
        raise HarnessError("this harness was installed from a local folder, which CI cannot install from: pass "
                           "--harness-source 'mlx-kernel-harness @ git+https://github.com/OWNER/REPO@TAG' "
                           "(docs/ci.md, Installing the harness)")
    if git.is_repo(root):
        branch = branch or git.default_branch(root)
    branch = branch or "main"
    found = scan(root)
    files = render_files(found, topology, source, branch)
    existing = [name for name in files if (root / name).exists()]
    if existing and not force:
        raise HarnessError(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''} "
                           "(--force overwrites)")
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        console.print(f"wrote {name}", highlight=False)
    console.print(f"found: {len(found.test_dirs)} test folder(s), {len(found.markers)} marker(s), "
                  f"{len(found.functions)} benchmark function(s), {len(found.kernels)} registered kernel(s)",
                  highlight=False)
    for warning in found.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    console.print(f"topology {topology}: measure on push to {branch}, gate on pull requests, report on Pages. "
                  "Settings to add: docs/ci.md. The harness is installed from: " + source, highlight=False)
