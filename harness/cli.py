"""The `harness` command line: one function per verb, thin over the pipeline modules."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.errors import HarnessError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Correctness and speed of MLX kernels, per commit and per chip.")
console = Console(stderr=True)
state = {"debug": False}

DbOption = Annotated[str | None, typer.Option("--db", help="Database URL. Default: $HARNESS_DB, else "
                                                           "sqlite:///harness-out/results.db (in the current folder).")]


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False) -> None:
    state["debug"] = debug


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


@app.command()
def chips(
    format: Annotated[str, typer.Option("--format", help="text or json")] = "text",
    chip_label: Annotated[str | None, typer.Option(help="Override the detected chip key.")] = None,
) -> None:
    """Print this machine's chip identity (the key results are stored under)."""
    from harness.chip import detect, machine_facts

    ident = detect(chip_label)
    if format == "json":
        print(json.dumps({**ident.to_dict(), "machine": machine_facts()}, indent=2, default=str))
        return
    if format != "text":
        raise HarnessError(f"--format must be text or json, not {format!r}")
    print(f"key:          {ident.key}")
    print(f"backend:      {ident.backend}")
    print(f"device:       {ident.device_name}")
    print(f"architecture: {ident.architecture}")
    if ident.gpu_cores:
        print(f"GPU cores:    {ident.gpu_cores}")
    if ident.memory_bytes:
        print(f"memory:       {ident.memory_bytes / 2**30:.1f} GiB")
    print(f"OS:           {ident.os}")
    print(f"MLX:          {ident.mlx_version}")


@app.command()
def report(
    db: DbOption = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("harness-out/report"),
) -> None:
    """Re-render the HTML report from a database."""
    from harness.report import build_report
    from harness.store import open_store

    store = open_store(db)
    try:
        index = build_report(store, out)
    finally:
        store.close()
    console.print(f"report: {index.resolve()}")


def main() -> None:
    """Entry point: user errors are one line on stderr (exit 2), tracebacks only with --debug."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        app(standalone_mode=False)
    except HarnessError as exc:
        if state["debug"]:
            raise
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        raise
