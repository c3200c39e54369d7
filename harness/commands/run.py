"""`harness run`: run a suite on this machine's chip, record, report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.commands.common import DbOption, app, console


@app.command()
def run(
    suite: Annotated[str | None, typer.Option(help="Suite file (TOML). Default: the built-in suite "
                                                   "jobs/builtin.toml.")] = None,
    db: DbOption = None,
    report: Annotated[Path, typer.Option(help="Folder for the HTML report.")] = Path("harness-out/report"),
    commit: Annotated[str | None, typer.Option(help="Commit to run. Default: HEAD of the repository under test "
                                                    "(uncommitted changes are recorded as a dirty flag); another "
                                                    "commit runs from a clean git worktree.")] = None,
    repo: Annotated[str, typer.Option(help="Repository under test.")] = ".",
    chip_label: Annotated[str | None, typer.Option(help="Override the detected chip key.")] = None,
    parallel: Annotated[int, typer.Option(help="Correctness jobs run at once (benchmarks always run alone).")] = 1,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip rendering the HTML report.")] = False,
) -> None:
    """Run a suite on this machine's chip, store every result, render the report."""
    from harness import store
    from harness.report import build_report
    from harness.runner import RunRequest, execute_run

    request = RunRequest(suite=suite, db_url=db, commit=commit, repo=repo, chip_label=chip_label, parallel=parallel)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("planning", total=None)

        def planned(n: int) -> None:
            bar.update(task, total=n, description="running jobs")

        def progress(job, result, done, total) -> None:
            bar.update(task, completed=done, description=f"{job.kind[:5]} {job.kernel}/{job.variant}")
            if result.status in ("failed", "crashed", "timeout", "lost"):
                bar.console.print(f"[red]{result.status}[/red] {job.key}: {result.detail[:200]}")

        outcome = execute_run(request, progress=progress, on_planned=planned)
    db_url = db or store.default_db_url()
    counts = outcome.counts
    dirty = " (dirty)" if outcome.dirty else ""
    console.print(f"run {outcome.run_id} on {outcome.chip_key} at {outcome.sha[:12]}{dirty}")
    console.print(f"jobs: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
                  f"{counts['crashed']} crashed, {counts['timeout']} timed out, {counts['lost']} lost "
                  f"(of {outcome.planned})")
    flops, bandwidth = outcome.peaks
    if flops or bandwidth:
        console.print(f"calibrated peak: {(flops or 0) / 1e9:.1f} GFLOP/s matmul, "
                      f"{(bandwidth or 0) / 1e9:.1f} GB/s copy")
    console.print(f"database: {store.mask_url(db_url)}")
    if not no_report:
        db_store = store.open_store(db_url)
        try:
            index = build_report(db_store, report)
        finally:
            db_store.close()
        console.print(f"report: {index.resolve()}")
    bad = counts["failed"] + counts["crashed"] + counts["timeout"] + counts["lost"]
    raise typer.Exit(1 if bad else 0)
