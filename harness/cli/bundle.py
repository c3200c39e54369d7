"""`harness export` and `harness import`: move runs between databases as a bundle file (docs/bundles.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import DbOption, app, console
from harness.record.bundle import export_bundle, import_bundle, read_header
from harness.record.outbox import open_store


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _say(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


@app.command("export")
def export_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Bundle file to write (gzip-compressed JSON lines).")],
    db: DbOption = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="Run id to export (repeatable).")] = None,
    commit: Annotated[str | None, typer.Option(help="Export the runs of this commit (full sha or a prefix).")] = None,
    chip: Annotated[str | None, typer.Option(help="Only runs on this chip key.")] = None,
) -> None:
    """Write runs (all, or --run/--commit, optionally of one --chip) with their jobs and raw samples to a bundle."""
    store = open_store(db, must_exist=True)  # reading only: a missing database is an error, not created empty
    try:
        summary = export_bundle(store, out, run_ids=run, commit=commit, chip=chip)
    finally:
        store.close()
    _say(f"exported {summary.runs} runs, {summary.jobs} jobs, {summary.samples} samples to {summary.path} "
         f"({_size(summary.bytes)})")


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="Bundle file written by `harness export`.", metavar="FILE")],
    db: DbOption = None,
) -> None:
    """Add a bundle's runs to a database; what is already there (same run id and job key) is skipped."""
    read_header(file)  # a wrong file is refused before any database is opened or created
    store = open_store(db)
    try:
        s = import_bundle(store, file)
    finally:
        store.close()
    h = s.header
    _say(f"imported {file} (from {h.get('source_db')}, written {h.get('created_at')} by harness "
         f"{h.get('harness_version')})")
    completed = f", {s.runs_completed} completed" if s.runs_completed else ""
    _say(f"runs: {s.runs_added} added, {s.runs_skipped} already present{completed}; "
         f"jobs: {s.jobs_added} added, {s.jobs_skipped} skipped; "
         f"samples: {s.samples_added} added, {s.samples_skipped} skipped")
    if s.chips_added or s.machines_added or s.commits_added:
        _say(f"new: {s.chips_added} chips, {s.machines_added} machines, {s.commits_added} commits")
