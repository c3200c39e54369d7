"""Shared CLI pieces: the Typer app, the console and the common options."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from harness.record import store

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Correctness and speed of MLX kernels, per commit and per chip.")
console = Console(stderr=True, soft_wrap=True)  # a path or URL in a CI log stays on one line, copyable
state = {"debug": False}


def _db_url(value: str | None) -> str | None:
    return store.as_db_url(value) if value else value


DbOption = Annotated[str | None, typer.Option(
    "--db", callback=_db_url, help="Database URL (sqlite:///FILE or postgresql://user@host/db); a plain file path "
                                   "means SQLite. Default: $HARNESS_DB, else sqlite:///harness-out/results.db (in "
                                   "the current folder).")]


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False) -> None:
    state["debug"] = debug

# The verdict thresholds shared by compare and variants (defaults: harness.core.defaults).
MinEffectOption = Annotated[float, typer.Option("--min-effect", help="Smallest relative change that matters.")]
FdrOption = Annotated[float, typer.Option("--alpha", help="False discovery rate (Benjamini-Hochberg) across "
                                                           "everything compared.")]
