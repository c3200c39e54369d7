"""`harness report`: re-render the HTML report from a database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import DbOption, app, console
from harness.record.outbox import open_store


@app.command()
def report(
    db: DbOption = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("harness-out/report"),
    change_points: Annotated[bool, typer.Option(
        "--change-points/--no-change-points",
        help="Search every history for change points (O(commits²) per series: the slow part on long histories)."),
    ] = True,
    last: Annotated[int | None, typer.Option(
        min=2, help="Histories and regressions cover each chip's last N commits only (default: all).")] = None,
    commit: Annotated[str | None, typer.Option(
        help="Show this commit's runs on the chip pages, the variant matrix and the noise (full sha or unique "
             "prefix), instead of each chip's latest run: e.g. the full-suite run rather than a later bisect probe "
             "or a partial run.")] = None,
) -> None:
    """Re-render the HTML report from a database: index, chip pages, variant matrix, histories, regressions."""
    from harness.render.site import build_report  # loads scipy: only when this command runs

    store = open_store(db, must_exist=True)  # reading only: a missing database is an error, not created empty
    try:
        index = build_report(store, out, change_points=change_points, last=last, commit=commit)
    finally:
        store.close()
    console.print(f"report: {index.resolve()}")
