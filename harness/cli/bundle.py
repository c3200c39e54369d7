"""`harness export` and `harness import`: move runs between databases as a bundle file (docs/bundles.md)."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import DbOption, app, console
from harness.core.errors import HarnessError
from harness.record.bundle import ImportSummary, export_bundle, import_bundle, read_header
from harness.record.outbox import open_store
from harness.record.store import link_repository
from harness.spec import git


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


def _bundle_files(patterns: list[str]) -> list[Path]:
    """The files named, each glob pattern (``*``, ``?``, ``[``, ``**``) expanded in name order; a pattern that
    matches nothing is an error (a CI job whose artifacts did not arrive must not publish a partial report)."""
    files: list[Path] = []
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            found = sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True))
            found = [p for p in found if p.is_file()]
            if not found:
                raise HarnessError(f"no bundle matches {pattern}")
            files.extend(found)
        else:
            files.append(Path(pattern))
    return list(dict.fromkeys(files))


@app.command("import")
def import_cmd(
    files: Annotated[list[str], typer.Argument(help="Bundle files written by `harness export`, or glob patterns "
                                                    "(quoted: 'bundles/**/*.bundle').", metavar="FILE...")],
    db: DbOption = None,
    repo_name: Annotated[str | None, typer.Option(help="Store every commit of the bundles under this repository "
                                                       "identity (instead of the one each bundle carries).")] = None,
    repo: Annotated[Path | None, typer.Option(help="A clone of the bundles' repository: the ancestry between "
                                                   "their commits is read from it.")] = None,
) -> None:
    """Add bundles' runs to a database; what is already there (same run id and job key) is skipped. Each bundle
    is imported whole or not at all; every file is checked before the database is opened."""
    paths = _bundle_files(files)
    for path in paths:
        read_header(path)  # a wrong file is refused before any database is opened or created
    if repo is not None and not git.is_repo(repo):
        raise HarnessError(f"--repo {repo}: not a git repository")
    store = open_store(db)
    try:
        for path in paths:
            _report_import(path, import_bundle(store, path, repo_name=repo_name))
        if repo is not None:
            name = repo_name or git.identity(repo)
            link_repository(store, name, git.toplevel(repo))
            _say(f"ancestry of {name} read from {repo}")
    finally:
        store.close()


def _report_import(file: Path, s: ImportSummary) -> None:
    h = s.header
    _say(f"imported {file} (from {h.get('source_db')}, written {h.get('created_at')} by harness "
         f"{h.get('harness_version')})")
    completed = f", {s.runs_completed} completed" if s.runs_completed else ""
    _say(f"runs: {s.runs_added} added, {s.runs_skipped} already present{completed}; "
         f"jobs: {s.jobs_added} added, {s.jobs_skipped} skipped; "
         f"samples: {s.samples_added} added, {s.samples_skipped} skipped")
    if s.chips_added or s.machines_added or s.commits_added:
        _say(f"new: {s.chips_added} chips, {s.machines_added} machines, {s.commits_added} commits")
