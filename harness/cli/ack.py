"""`harness ack`: mark a regression of the report's list as seen, with a note (shown on the regressions page)."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from harness.cli.common import DbOption, app, console
from harness.core.errors import HarnessError
from harness.record import acks
from harness.record.outbox import open_store

HELP = ("Acknowledge a regression: ID is the id the report's regressions page shows next to it (12 hex digits). "
        "The next `harness report` shows it acknowledged with the note (and can hide it); --undo removes it.")


@app.command(help=HELP)
def ack(
    ack_id: Annotated[str, typer.Argument(metavar="ID", help="The regression's id, as the regressions page shows it.")],
    note: Annotated[str, typer.Option("--note", help="Why (e.g. 'expected: tile change, see #123').")] = "",
    undo: Annotated[bool, typer.Option("--undo", help="Remove the acknowledgement instead.")] = False,
    db: DbOption = None,
) -> None:
    ack_id = ack_id.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{12}", ack_id):
        raise HarnessError(f"{ack_id!r} is not a regression id: 12 hex digits, as the regressions page shows them")
    store = open_store(db, must_exist=True)
    try:
        if undo:
            found = acks.forget(store, ack_id)
            console.print(f"{ack_id}: acknowledgement removed" if found else f"{ack_id}: was not acknowledged")
        else:
            acks.acknowledge(store, ack_id, note)
            console.print(f"{ack_id}: acknowledged{': ' + note if note else ''}; `harness report` shows it")
    finally:
        store.close()
