"""Tables for the analysis verbs (compare, variants): one row model, rendered as a rich table or GitHub markdown."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.cli.common import PlainConsole, plain
from harness.core.errors import HarnessError
from harness.stats.policy import MAX_MORE_TRIALS

FORMATS = ("text", "json", "markdown")


HOST_PACED_NOTE = ("the device waited for the host's calls (harness.stats.pacing), so their time is the host's pace, "
                   "which differs between processes, and a change in the kernel alone may not show (on CUDA, "
                   "[timing] mode = \"device\" times the kernel on the GPU's clock)")

def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise HarnessError(f"--format must be text, json or markdown, not {fmt!r}")
    return fmt


def check_thresholds(min_effect: float, alpha: float) -> None:
    if not 0.0 <= min_effect < 1.0:
        raise HarnessError(f"--min-effect must be in [0, 1), not {min_effect}")
    if not 0.0 < alpha < 1.0:
        raise HarnessError(f"--alpha must be in (0, 1), not {alpha}")


def stdout_console() -> Console:
    """Results go to stdout (pipeable); a pipe gets wide lines instead of 80-column wrapping."""
    return PlainConsole(width=None if sys.stdout.isatty() else 200, soft_wrap=True)  # a long line stays one line


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, allow_nan=False))


def seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def ratio(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


def interval(low: float | None, high: float | None) -> str:
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "-"
    return f"{low:.3f}–{high:.3f}"


def change(value: float | None) -> str:
    """Relative change of a time ratio: +10.3 % is slower."""
    return "-" if value is None or not math.isfinite(value) else f"{100.0 * (value - 1.0):+.1f} %"


def percent(value: float | None) -> str:
    """A relative figure (0.034) as a percentage ("3.4%"); empty when unknown."""
    return "" if value is None or value != value else f"{100 * value:.1f}%"


def pvalue(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def markdown_text(text: str) -> str:
    """One line of GitHub markdown that renders as the literal text (no HTML, no table breaks)."""
    return " ".join(plain(text).split()).replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|")


def _markdown_cell(text: str) -> str:
    return markdown_text(text)[:300]


def emit_table(console: Console, fmt: str, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A titled table: rich on a console for ``text``, a GitHub-flavoured table for ``markdown``."""
    if fmt == "markdown":
        print(f"\n#### {markdown_text(title)}\n")
        print("| " + " | ".join(map(markdown_text, headers)) + " |")
        print("|" + "|".join("---" for _ in headers) + "|")
        for row in rows:
            print("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*[str(cell) for cell in row])
    console.print(table)


def noise_used(row) -> str:
    """The spread the verdict used, where it came from (between trials, or the series' run history), and whether
    the host set the pace."""
    paced = ", host-paced" if row.host_paced else ""
    if row.basis == "none" or row.noise != row.noise:
        return "unknown" + paced
    return f"{percent(math.expm1(row.noise))} ({row.basis}){paced}"


def runs_a_side(report, chip: str) -> str:
    """The runs each side of ``report`` pooled on ``chip``, in words: "one run a side", "2 base runs and 1 head
    run" (a held row's reason must not say one run a side when the base has two)."""
    base, head = (len(side.runs.get(chip, ())) for side in (report.base, report.head))
    if base == head == 1:
        return "one run a side"
    return f"{base} base run{'s' if base != 1 else ''} and {head} head run{'s' if head != 1 else ''}"


def held_reason(report, chip: str, more_runs: int) -> str:
    """Why a row of ``chip`` is held as inconclusive, and the base runs that give its floor."""
    return (f"{runs_a_side(report, chip)} and no history floor; {more_runs} more base "
            + ("runs give" if more_runs != 1 else "run gives") + " the floor")


def to_settle(row) -> str:
    """What an inconclusive row still needs: runs of the base (its between-run noise is unknown) or trials per side."""
    if row.more_runs_needed:
        return f"{row.more_runs_needed} more base run{'s' if row.more_runs_needed != 1 else ''}"
    if row.basis == "history" and row.more_trials_needed >= MAX_MORE_TRIALS:
        return "more base runs (the spread between runs decides; trials cannot narrow it)"
    return f"{row.more_trials_needed} more trials" if row.more_trials_needed else ""
