"""`harness noise`: how noisy each chip's benchmark series are, at every level, and what that lets a comparison see."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from harness.cli.common import DbOption, app
from harness.cli.tables import check_format, emit_table, percent, print_json, seconds, stdout_console
from harness.core.collector import loading_modules
from harness.record.outbox import open_store

HELP = "\n\n".join((
    "Show the noise of the benchmark series: within one job process (the spread of its samples), between the "
    "processes of a run (its trials), and between runs (the series' recent runs on the base branch), each as a "
    "relative standard deviation; and 'detects', the smallest change that comparing this series with itself at "
    "its trials per side could detect. A verdict can only be as sure as the largest of these allows.",
    "REF is a commit (its runs pooled) or a run id; by default each chip's latest run. Per chip the summary gives "
    "the median and 90th percentile over its series, and how many series were host-paced (the device waited for "
    "the host's calls, so their time is the host's pace: harness.stats.pacing); --series lists every series, "
    "noisiest first.",
))

LEVEL_NAMES = {"within": "within a process", "between_trial": "between trials", "between_run": "between runs",
               "detectable": "detects"}


def _relative(log_sd: float) -> str:
    return percent(math.expm1(log_sd)) if math.isfinite(log_sd) else "-"


@app.command(help=HELP)
def noise(
    ref: Annotated[str | None, typer.Argument(help="Commit sha (or unique prefix) or run id. Default: each "
                                                   "chip's latest run.")] = None,
    db: DbOption = None,
    chip: Annotated[str | None, typer.Option("--chip", help="This chip key only.")] = None,
    format: Annotated[str, typer.Option("--format", help="text, json or markdown.")] = "text",
    series: Annotated[bool, typer.Option("--series", help="List every series, noisiest first.")] = False,
) -> None:
    """Noise per chip and series (see HELP)."""
    with loading_modules():
        from harness.analysis.noise import LEVELS, noise_report  # loads scipy: not at CLI start-up

    check_format(format)
    store = open_store(db, must_exist=True)
    try:
        report = noise_report(store, ref, chip)
    finally:
        store.close()
    if format == "json":
        print_json(report.to_dict())
        return
    console = stdout_console()
    if not report.chips:
        console.print("no runs with benchmark series")
        return
    headers = ("chip", "runs", "series", "with history", "host-paced",
               *(f"{LEVEL_NAMES[level]} (median / p90)" for level in LEVELS))
    emit_table(console, format, "Noise per chip", headers, [
        (c.chip, str(len(c.run_ids)), str(c.series), str(c.with_history), str(c.host_paced),
         *(f"{_relative(c.levels[level][0])} / {_relative(c.levels[level][1])}" if level != "detectable"
           else f"{percent(c.levels[level][0]) or '-'} / {percent(c.levels[level][1]) or '-'}" for level in LEVELS))
        for c in report.chips])
    if series:
        rows = sorted(report.rows, key=lambda r: -max((v for v in (r.between_trial, r.between_run, r.within)
                                                       if math.isfinite(v)), default=0.0))
        emit_table(console, format, "Series, noisiest first",
                   ("chip", "kernel", "variant", "dtype", "shape", "median", "mode", "trials", "within",
                    "between trials", "between runs (runs)", "detects"),
                   [(r.key.chip, r.key.kernel, r.key.variant, r.key.dtype, r.key.shape_key, seconds(r.median_s),
                     r.mode or "-", str(r.trials), _relative(r.within), _relative(r.between_trial),
                     f"{_relative(r.between_run)} ({r.history_runs})" if r.history_runs else "-",
                     percent(r.detectable) or "-")
                    for r in rows])
