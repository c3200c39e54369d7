"""`harness spool status|flush`: results that waited on disk while the database was unreachable."""

from __future__ import annotations

import typer

from harness.cli.common import DbOption, app, console
from harness.record import outbox, spool, store

spool_app = typer.Typer(no_args_is_help=True, help="Results spooled to disk while the database was unreachable.")
app.add_typer(spool_app, name="spool")


@spool_app.command("status")
def status() -> None:
    """List every database with spooled results (URLs shown with the password masked)."""
    rows = spool.status()
    if not rows:
        console.print(f"spool empty ({spool.root()})", highlight=False, soft_wrap=True)
        return
    for db, folder, results, finishes in rows:
        console.print(f"{db}: {results} results, {finishes} runs to finish, in {folder}", highlight=False,
                      soft_wrap=True)


@spool_app.command("flush")
def flush(db: DbOption = None) -> None:
    """Write the spooled results of one database (default: $HARNESS_DB or the default SQLite file); exit 3 if
    the database is still unreachable."""
    url = db or store.default_db_url()
    opened = outbox.open_store(url)  # opening drains the spool already
    try:
        outcome = outbox.drain(opened)
    finally:
        opened.close()
    left = spool.pending(url)
    console.print(f"{store.mask_url(url)}: spool drained, {left} results left", highlight=False, soft_wrap=True)
    raise typer.Exit(3 if left or outcome.remaining else 0)
