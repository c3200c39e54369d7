"""The `harness` command line: registers one module per verb and turns user errors into one line."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import click
import typer

from harness.cli.common import app, console, state
from harness.core.errors import HarnessError

COMMANDS = ("run", "chips", "report", "compare", "noise", "variants", "bundle", "bisect", "cluster", "node", "submit",
            "spool")


def _invoked_verb(argv: list[str]) -> str | None:
    """The verb a command line names (the first word after the global options), if it is one of ``COMMANDS``."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def register(verbs: tuple[str, ...] = COMMANDS) -> None:
    """Import the modules of ``verbs`` (each registers its command on ``app``)."""
    for name in verbs:
        importlib.import_module(f"harness.cli.{name}")


# A command line that names its verb loads that verb's module alone: the other verbs' imports (Ray's driver, the
# executors, the suite schema: ~0.5 s) are start-up every command would pay. Anything else -- `harness --help`, a
# mistyped verb, an import from Python (tests, ``app``) -- registers every verb.
_verb = _invoked_verb(sys.argv[1:]) if Path(sys.argv[0]).name in ("harness", "__main__.py") else None
register((_verb,) if _verb else COMMANDS)


def main() -> None:
    """Entry point: user errors are one line on stderr (exit 2), tracebacks only with --debug."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        code = app(standalone_mode=False)  # click returns the exit code of typer.Exit here
        sys.exit(code if isinstance(code, int) else 0)
    except HarnessError as exc:
        if state["debug"]:
            raise
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click's usage errors and the like
        if is_usage_error(exc):
            exc.show()  # type: ignore[attr-defined]
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        if isinstance(exc, click.exceptions.Abort | typer.Abort):
            sys.exit(130)
        raise


def is_usage_error(exc: BaseException) -> bool:
    """A click usage error (missing argument, unknown option, bad value): it shows itself, with its exit status.
    Duck-typed, because typer >= 0.20 raises those of its own vendored copy of click, not ``click.ClickException``."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)
