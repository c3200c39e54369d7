"""The `harness` command line: registers one module per verb and turns user errors into one line."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from harness.core.collector import loading_modules

with loading_modules():  # imports make objects, not garbage: ~0.1 s of collections at every start otherwise
    import click
    import typer

    with contextlib.suppress(ImportError):  # what typer loads (pydantic) when a command is invoked: loaded here
        import typer._adapters  # noqa: F401

    from harness.core.defaults import THREAD_VARS

COMMANDS = ("run", "chips", "report", "compare", "noise", "variants", "bundle", "bisect", "cluster", "node", "submit",
            "spool", "init", "ack")
ANALYSIS_VERBS = ("report", "compare", "variants", "noise")
"""The verbs that read and analyse the database and start no timed job: their BLAS runs on one thread (set in the
environment before numpy loads, unless set already). A report shares the cores between processes of its own
(``harness.core.fork``), and an idle BLAS pool's threads spin on the cores the others need: on 2 cores, 7-25 % of
the user CPU time of a report after one new run in three measured pairs. A verb that starts jobs is not among
them: the job processes inherit the environment, and their timing protocol decides their threads."""


def _invoked_verb(argv: list[str]) -> str | None:
    """The verb a command line names (the first word after the global options), if it is one of ``COMMANDS``."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


# A command line that names its verb loads that verb's module alone: the other verbs' imports (Ray's driver, the
# executors, the suite schema: ~0.5 s) are start-up every command would pay. Anything else -- `harness --help`, a
# mistyped verb, an import from Python (tests, ``app``) -- registers every verb.
_verb = _invoked_verb(sys.argv[1:]) if Path(sys.argv[0]).name in ("harness", "__main__.py") else None
if _verb in ANALYSIS_VERBS:
    for _name in THREAD_VARS:
        os.environ.setdefault(_name, "1")

with loading_modules():
    from harness.cli.common import app, console, state, styled  # noqa: E402 - numpy loads here: after the thread variables
    from harness.core.errors import HarnessError  # noqa: E402


def register(verbs: tuple[str, ...] = COMMANDS) -> None:
    """Import the modules of ``verbs`` (each registers its command on ``app``)."""
    with loading_modules():
        for name in verbs:
            importlib.import_module(f"harness.cli.{name}")


register((_verb,) if _verb else COMMANDS)


def main() -> None:
    """Entry point: user errors are one line on stderr (exit 2), tracebacks only with --debug. SIGUSR1 prints every
    thread's stack on stderr and goes on (a command that seems stuck: ``kill -USR1 PID``)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(ValueError, AttributeError, RuntimeError):  # a stderr with no file descriptor
            faulthandler.register(signal.SIGUSR1, all_threads=True)
    if hasattr(signal, "pthread_sigmask"):  # a stop must stop: Ray blocks SIGINT in its processes, and their children
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # inherit that mask
    try:
        code = app(standalone_mode=False)  # click returns the exit code of typer.Exit here
        sys.exit(code if isinstance(code, int) else 0)
    except HarnessError as exc:
        if state["debug"]:
            raise
        console.print(styled("error:", "red"), str(exc), soft_wrap=True)
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


def command() -> NoReturn:
    """The ``harness`` executable and ``python -m harness``: ``main``, then, where no other thread runs, out without
    the interpreter's teardown once the exit handlers have run and the output is flushed. The teardown frees every
    object one at a time: 0.3-0.5 s after a report of a 1,000-commit history, and nothing a command wrote depends on
    it (its files are closed, its transactions committed). ``main`` itself exits as usual: tests call it
    in-process."""
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if threading.active_count() > 1:  # they would be joined first: exit as usual
        sys.exit(code)
    if not isinstance(code, int):  # as SystemExit: None is success, anything else is printed and fails
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: what Python's own exit reports as status 120
        code = code or 120
    os._exit(code)


def is_usage_error(exc: BaseException) -> bool:
    """A click usage error (missing argument, unknown option, bad value): it shows itself, with its exit status.
    Duck-typed, because typer >= 0.20 raises those of its own vendored copy of click, not ``click.ClickException``."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)
