"""`harness compare BASE HEAD`: per-series verdicts with evidence; exit 1 on a regression or a correctness failure."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.common import DbOption, FdrOption, MinEffectOption, app
from harness.cli.tables import (
    change,
    check_format,
    check_thresholds,
    emit_table,
    interval,
    markdown_text,
    print_json,
    pvalue,
    ratio,
    seconds,
    stdout_console,
)
from harness.core import defaults
from harness.record.outbox import open_store

SERIES_HEADERS = ("verdict", "chip", "kernel", "variant", "dtype", "shape", "change", "ratio", "95% CI", "p (BH)",
                  "n base/head", "median base → head", "more samples")
FAILURE_HEADERS = ("chip", "kind", "what", "dtype", "shape", "status", "detail")


HELP = "\n\n".join((
    "Compare the benchmarks of HEAD with BASE, series by series, per chip.",
    "BASE and HEAD are each a commit (full sha or unique prefix: all runs of that commit on a chip pool their "
    "samples) or a run id (that run only). A commit compared with itself pools the same runs on both sides, so it "
    "is trivially unchanged; to compare two runs of one commit, pass their run ids.",
    "Every series present on both sides gets a verdict (regressed, improved, unchanged, inconclusive) from a "
    "Mann-Whitney test with Benjamini-Hochberg control across the whole grid and a bootstrap interval of the "
    "median ratio; a kernel that failed a correctness job on HEAD on a chip is 'broken' there, without a timing "
    "verdict. Unchanged series are counted, not listed (--all lists them).",
    "Exit status: 1 on any confirmed regression or correctness failure on HEAD, 0 otherwise, 2 on a usage error "
    "(such as an unknown commit).",
))


@app.command(help=HELP)
def compare(
    base: Annotated[str, typer.Argument(help="Base: commit sha (or unique prefix) or run id.")],
    head: Annotated[str, typer.Argument(help="Head: commit sha (or unique prefix) or run id.")],
    db: DbOption = None,
    chip: Annotated[str | None, typer.Option("--chip", help="Compare on this chip key only.")] = None,
    format: Annotated[str, typer.Option("--format", help="text, json or markdown (for $GITHUB_STEP_SUMMARY).")
                      ] = "text",
    min_effect: MinEffectOption = defaults.MIN_EFFECT,
    alpha: FdrOption = defaults.ALPHA,
    all_series: Annotated[bool, typer.Option("--all", help="List unchanged series too.")] = False,
) -> None:
    """Compare HEAD with BASE (see HELP)."""
    from harness.analysis.compare import compare as run_compare  # loads scipy: not at CLI start-up

    check_format(format)
    check_thresholds(min_effect, alpha)
    store = open_store(db, must_exist=True)  # reading only: a missing database is an error, not created empty
    try:
        report = run_compare(store, base, head, chip=chip, min_effect=min_effect, alpha=alpha)
    finally:
        store.close()
    if format == "json":
        print_json(report.to_dict())
    else:
        _render(report, format, all_series)
    raise typer.Exit(report.exit_code)


def _side_line(name: str, side) -> str:
    runs = ", ".join(f"{chip} ({len(ids)} run{'s' if len(ids) != 1 else ''})" for chip, ids in side.runs.items())
    what = f"run {side.run_ids[0]} of {side.sha[:12]}" if side.kind == "run" else f"commit {side.sha[:12]}"
    message = side.message.splitlines()[0] if side.message else ""
    dirty = f", {side.dirty_runs} dirty" if side.dirty_runs else ""
    return f"{name}: {what} {message!r} on {runs}{dirty}"


def _render(report, fmt: str, all_series: bool) -> None:
    console = stdout_console()
    counts = report.counts
    summary = ", ".join(f"{counts[v]} {v}" for v in ("regressed", "improved", "unchanged", "inconclusive", "broken"))
    status = "FAIL" if report.exit_code else "OK"
    if fmt == "markdown":
        print(f"### Benchmark comparison: {status}\n")
        for name, side in (("base", report.base), ("head", report.head)):
            print(f"- {markdown_text(_side_line(name, side))}")
        print(f"- {summary}")
    else:
        console.print(_side_line("base", report.base))
        console.print(_side_line("head", report.head))
    for title, failures in ((f"Newly failing on head ({len(report.newly_failing)})", report.newly_failing),
                            (f"Already failing at base ({len(report.already_failing)})", report.already_failing)):
        if failures:
            emit_table(console, fmt, title, FAILURE_HEADERS,
                       [(f.chip, f.kind, f.what, f.dtype, f.shape_key, f.status,
                         f.detail.splitlines()[0] if f.detail else "") for f in failures])
    shown = report.rows if all_series else report.changed
    if shown:
        title = "All series" if all_series else f"Changed series ({len(shown)})"
        emit_table(console, fmt, title, SERIES_HEADERS, [
            (row.verdict, row.key.chip, row.key.kernel, row.key.variant, row.key.dtype, row.key.shape_key,
             change(row.ratio), ratio(row.ratio), interval(row.ci_low, row.ci_high),
             pvalue(None if row.verdict == "broken" else row.p_adjusted),
             f"{row.n_base}/{row.n_head}", f"{seconds(row.base_median)} → {seconds(row.head_median)}",
             str(row.more_samples_needed) if row.more_samples_needed else "")
            for row in shown])
    notes = []
    if not report.rows:
        notes.append("no benchmark series on both sides")
    if counts["unchanged"] and not all_series:
        notes.append(f"{counts['unchanged']} unchanged series not listed (--all lists them)")
    if report.only_base or report.only_head:
        notes.append(f"{report.only_base} series only on base, {report.only_head} only on head (not compared)")
    lines = [*notes, f"{status}: {summary}; {len(report.correctness_failures)} correctness failure(s) on head "
             f"({len(report.newly_failing)} new, {len(report.already_failing)} already failing at base; "
             f"min effect {report.min_effect:g}, FDR {report.alpha:g})"]
    if fmt == "markdown":
        print()
        for line in lines:
            print(f"_{line}_  ")
    else:
        for line in lines:
            console.print(line)
