"""Shared CLI pieces: the Typer app, the console and the common options."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from harness.core.errors import HarnessError
from harness.record import store

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Correctness and speed of MLX kernels, per commit and per chip.")

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1 (\x85 breaks a line), line separators


def plain(text: object) -> str:
    """``text`` as it may reach a terminal or a log: control characters (an ANSI escape in a test's failure message)
    shown as ``\\x1b``, lone surrogates (bytes a path or a decoder could not read) as ``\\udcff``: printable,
    never a colour change or an encoding error."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class PlainConsole(Console):
    """A console on which no string is markup: test ids, failure messages, commit subjects, paths and names come
    from the outside world (``[/x/y]`` in a message would raise MarkupError, ``[metal_kernel]`` vanish). Styles are
    given explicitly (:func:`styled`, ``style=``); every string is made printable (:func:`plain`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(markup=False, highlight=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs) -> Text:  # every str printed, in a table cell too, comes here
        return super().render_str(plain(text), **{**kwargs, "markup": False, "highlight": False, "emoji": False})


def styled(text: object, style: str = "") -> Text:
    """``text`` (plain, never markup) in ``style``, to print or to join with other :class:`Text`."""
    return Text(plain(text), style=style)


# Progress, logs and failures as they happen go to stderr; results to stdout (``out``), as Unix tools do. Soft wrap:
# a path or URL in a CI log stays on one line, copyable.
console = PlainConsole(stderr=True, soft_wrap=True)
out = PlainConsole(soft_wrap=True)
state = {"debug": False, "quiet": False}


def _db_url(value: str | None) -> str | None:
    return store.as_db_url(value) if value else value


DbOption = Annotated[str | None, typer.Option(
    "--db", callback=_db_url, help="Database URL (sqlite:///FILE or postgresql://user@host/db); a plain file path "
                                   "means SQLite. Default: $HARNESS_DB, else sqlite:///harness-out/results.db (in "
                                   "the current folder).")]


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False) -> None:
    state["debug"] = debug

QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no failures as they happen on "
                                                              "stderr: only the results (for CI logs).")]

def check_out_folder(folder: Path, option: str) -> None:
    """A report's folder may be missing (it is made) or a folder, never a file (checked before any work)."""
    if folder.exists() and not folder.is_dir():
        raise HarnessError(f"{option} {folder} is a file, not a folder for the report")


# The verdict thresholds shared by compare and variants (defaults: harness.core.defaults).
MinEffectOption = Annotated[float, typer.Option("--min-effect", help="Smallest relative change that matters.")]
FdrOption = Annotated[float, typer.Option("--alpha", help="False discovery rate (Benjamini-Hochberg) across "
                                                           "everything compared.")]
