"""`harness report`: re-render the HTML report from a database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.commands.common import DbOption, app, console


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
