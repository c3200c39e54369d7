"""`harness compare BASE HEAD`: per-series verdicts with evidence; exit 1 on a regression or a correctness failure."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Annotated

import typer

from harness.cli.common import DbOption, FdrOption, MinEffectOption, QuietOption, app, console
from harness.cli.run import progress_display  # the same progress as `harness run`
from harness.cli.tables import (
    HOST_PACED_NOTE,
    change,
    check_format,
    check_thresholds,
    emit_table,
    interval,
    markdown_text,
    noise_used,
    percent,
    print_json,
    pvalue,
    ratio,
    runs_a_side,
    seconds,
    stdout_console,
    to_settle,
)
from harness.cluster.driver import connect
from harness.core import defaults
from harness.core.chip import timing_fit
from harness.core.collector import loading_modules
from harness.core.errors import HarnessError
from harness.pipeline.ab import ABRequest, execute_ab
from harness.record import query
from harness.record.outbox import open_store

SERIES_HEADERS = ("verdict", "chip", "kernel", "variant", "dtype", "shape", "change", "ratio", "95% CI", "p (BH)",
                  "trials base/head", "median base → head", "noise", "detects", "to settle")
FAILURE_HEADERS = ("chip", "kind", "what", "dtype", "shape", "status", "detail")


HELP = "\n\n".join((
    "Compare the benchmarks of HEAD with BASE, series by series, per chip.",
    "BASE and HEAD are each a commit (full sha or unique prefix: all runs of that commit on a chip pool their "
    "samples) or a run id (that run only). A commit compared with itself pools the same runs on both sides, so it "
    "is trivially unchanged; to compare two runs of one commit, pass their run ids.",
    "Every series present on both sides gets a verdict (regressed, improved, unchanged, inconclusive). The unit of "
    "evidence is a trial (one job process; a run measures each benchmark in \\[timing] trials of them): the spread "
    "between trials, floored by the spread of the series' recent runs on the base branch, gives a t interval of "
    "the ratio, with Benjamini-Hochberg control across the whole grid. With one trial a side and no history the "
    "noise is unknown and the verdict is inconclusive, with the trials that would settle it. 'noise' is the spread "
    "used, 'detects' the smallest change the comparison could detect. A kernel that failed a correctness job on "
    "HEAD on a chip is 'broken' there, without a timing verdict. Unchanged series are counted, not listed (--all "
    "lists them).",
    "--ab measures BASE and HEAD afresh on this machine, interleaved in one session (ABBA rounds), and compares "
    "the two new runs: for when there is little history.",
    "The comparison goes to stdout; with --ab or --settle, progress and the failures of the new runs to stderr "
    "(--quiet: none).",
    "--settle compares the stored runs on this machine's chip, then re-measures only the series left inconclusive "
    "(held against their run's shift, short of trials, or straddling the band): BASE and HEAD interleaved ABBA, "
    "stored as settling runs of the two commits (never a tip or a history point), decided again on those, round "
    "after round until every series is decided or --budget is spent (default 600s). With --address HEAD:PORT it "
    "settles on that Ray cluster: every chip with an undecided series, each round a task on a node of that chip "
    "(docs/cluster.md); a chip with no live node is an error (exit 2) before anything is measured.",
    "Exit status (docs/exit-codes.md): 1 on any confirmed regression or correctness failure on HEAD, 0 otherwise "
    "(inconclusive changes alone: 0), 2 on bad input (such as an unknown commit, a file that is no harness "
    "database) or an unreachable database.",
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
    ab: Annotated[bool, typer.Option("--ab", help="Measure BASE and HEAD (commits of --repo) afresh on this "
                                                  "machine, interleaved ABBA in one session, then compare the two "
                                                  "runs on the spread between their trials.")] = False,
    repo: Annotated[str, typer.Option(help="With --ab: the repository whose commits BASE and HEAD are.")] = ".",
    suite: Annotated[str | None, typer.Option(help="With --ab: suite file (default: the built-in suite, or the "
                                                   "commit's harness.toml).")] = None,
    trials: Annotated[int | None, typer.Option(help="With --ab: trials per side (default: the suite's \\[timing] "
                                                    "trials, at least 4 when the suite has fewer than 3 series: a "
                                                    "lone series' change must also show by rank).", min=1)] = None,
    chip_label: Annotated[str | None, typer.Option(help="With --ab: override the detected chip key.")] = None,
    quiet: QuietOption = False,
    settle: Annotated[bool, typer.Option("--settle", help="Compare the stored runs on this machine's chip, then "
                                                          "re-measure only the inconclusive series, BASE and HEAD "
                                                          "(commits of --repo) interleaved ABBA, stored as settling "
                                                          "runs, until each is decided or --budget is spent.")
                      ] = False,
    budget: Annotated[str, typer.Option(help="With --settle: trials a side per series over all rounds (e.g. 24) "
                                             "or time measuring (e.g. 300s, 10m).")] = "600s",
    address: Annotated[str | None, typer.Option(help="With --settle: settle on this Ray cluster (HEAD:PORT), each "
                                                     "chip with an undecided series on a node of that chip "
                                                     "(docs/cluster.md).")] = None,
) -> None:
    """Compare HEAD with BASE (see HELP)."""
    with loading_modules():
        from harness.analysis.compare import compare as run_compare  # loads scipy: not at CLI start-up
        from harness.analysis.compare import hours_apart  # the same module (scipy): not at CLI start-up

    check_format(format)
    check_thresholds(min_effect, alpha)
    if settle:
        _check_settle(ab, chip, trials)
        report = _settle(base, head, repo=repo, suite=suite, db=db, chip_label=chip_label, budget=budget,
                         min_effect=min_effect, alpha=alpha, address=address)
        if format == "json":
            print_json({**report.to_dict(), "single_run_hours_apart": {}})
        else:
            _render(report, format, all_series, {})
        raise typer.Exit(report.exit_code)
    if ab:
        base, head = _measure_ab(base, head, repo=repo, suite=suite, db=db, trials=trials, chip_label=chip_label,
                                 quiet=quiet)
    elif (repo, suite, trials, chip_label, budget, address) != (".", None, None, None, "600s", None):
        raise HarnessError("--repo, --suite, --trials and --chip-label are for --ab or --settle (measuring afresh), "
                           "--budget and --address for --settle")
    store = open_store(db, must_exist=True)  # reading only: a missing database is an error, not created empty
    try:
        report = run_compare(store, base, head, chip=chip, min_effect=min_effect, alpha=alpha, same_session=ab)
        apart = hours_apart(report, {run.id: run.started_at for run in query.run_briefs(store)})
        proven = ab or query.ancestry_proves(store, report.base.sha, report.head.sha)
    finally:
        store.close()
    if format == "json":
        print_json({**report.to_dict(), "single_run_hours_apart": {c: gap / 3600 for c, gap in apart.items()},
                    "order_proven": proven})
    else:
        if not proven:
            console.print(f"base {report.base.sha[:12]} → head {report.head.sha[:12]}: {query.NOT_PROVEN} (the "
                          "stored ancestry does not show base before head)", markup=False, highlight=False)
        _render(report, format, all_series, apart)
    raise typer.Exit(report.exit_code)


def _measure_ab(base: str, head: str, *, repo: str, suite: str | None, db: str | None, trials: int | None,
                chip_label: str | None, quiet: bool = False) -> tuple[str, str]:
    """Run both commits' benchmarks interleaved (harness/pipeline/ab.py); the two new run ids."""
    request = ABRequest(base=base, head=head, repo=repo, suite=suite, db_url=db, chip_label=chip_label,
                        trials=trials)
    with progress_display(quiet) as (on_planned, progress, abandon):
        try:
            base_run, head_run = execute_ab(request, progress=progress, on_planned=on_planned)
        except BaseException:
            abandon()
            raise
    for name, outcome in () if quiet else (("base", base_run), ("head", head_run)):
        console.print(f"{name} run {outcome.run_id} at {outcome.sha[:12]}: {dict(outcome.counts)}",
                          highlight=False, soft_wrap=True)
    return base_run.run_id, head_run.run_id


def _check_settle(ab: bool, chip: str | None, trials: int | None) -> None:
    if ab:
        raise HarnessError("--settle and --ab are two ways to measure afresh: use one")
    if chip is not None or trials is not None:
        raise HarnessError("--settle measures on this machine's chip, its trials by round: no --chip or --trials")


def _settle(base: str, head: str, *, repo: str, suite: str | None, db: str | None, chip_label: str | None,
            budget: str, min_effect: float, alpha: float, address: str | None = None):
    """The stored comparison with its undecided series settled (harness/pipeline/settle.py); progress on stderr."""
    from harness.pipeline.settle import SettleRequest, parse_budget, settle  # loads scipy: only with --settle

    if address is not None and chip_label is not None:
        raise HarnessError("--settle --address settles each chip on a node labelled with it: no --chip-label")
    request = SettleRequest(ABRequest(base=base, head=head, repo=repo, suite=suite, db_url=db, chip_label=chip_label),
                            budget=parse_budget(budget), min_effect=min_effect, alpha=alpha)
    open_store(db, must_exist=True).close()  # a missing database is an error, not created empty

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True, markup=False)

    if address is not None:
        return _settle_on_cluster(request, address, say)

    with progress_display() as (on_planned, progress, abandon):
        try:
            report, _ = settle(request, say=say, progress=progress, on_planned=on_planned)
        except BaseException:
            abandon()
            raise
    return report


def _settle_on_cluster(request, address: str, say):
    """--settle --address: each chip with an undecided series settled by Ray tasks on a node of that chip
    (harness/cluster/settle.py); a chip with no live node is an error before anything is measured."""
    import ray  # loads ray: only with --address

    from harness.cluster import settle as cluster_settle  # loads ray: only with --address
    from harness.pipeline.settle import settle_chips, undecided_chips  # loads scipy: only with --settle

    request = replace(request, ab=cluster_settle.for_nodes(request.ab))
    report, chips = undecided_chips(request)
    if not chips:
        say("settle: nothing undecided, nothing measured")
        return report
    connected = connect(address)
    try:
        cluster_settle.check_chips(chips)
        return settle_chips(request, report, chips, say=say, measure_on=cluster_settle.measure_on)
    finally:
        if connected:
            ray.shutdown()


def _held_notes(report) -> list[str]:
    """Per chip, the flags held as inconclusive because they did not stand out from their run's common shift."""
    held: dict[str, list] = {}
    for row in report.rows:
        if row.more_runs_needed and row.verdict == "inconclusive":
            held.setdefault(row.key.chip, []).append(row)
    notes = []
    for chip_key, chip_rows in sorted(held.items()):
        shifts = [row.run_shift for row in chip_rows if row.run_shift is not None]
        moved = (f"its series moved together by x{statistics.median(shifts):.2f}" if shifts
                 else "no other series tells a change from a shift of the whole run")
        runs = max(row.more_runs_needed for row in chip_rows)
        notes.append(f"{chip_key}: {len(chip_rows)} change(s) held as inconclusive: {runs_a_side(report, chip_key)} "
                     f"and no history floor, and {moved}; {runs} more base "
                     + ("runs give" if runs != 1 else "run gives") + " the floor")
    return notes


def _side_line(name: str, side) -> str:
    runs = ", ".join(f"{chip} ({len(ids)} run{'s' if len(ids) != 1 else ''})" for chip, ids in side.runs.items())
    what = f"run {side.run_ids[0]} of {side.sha[:12]}" if side.kind == "run" else f"commit {side.sha[:12]}"
    message = side.message.splitlines()[0] if side.message else ""
    dirty = f", {side.dirty_runs} dirty" if side.dirty_runs else ""
    return f"{name}: {what} {message!r} on {runs}{dirty}"


def _render(report, fmt: str, all_series: bool, apart: dict[str, float]) -> None:
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
        console.print(_side_line("base", report.base), markup=False)
        console.print(_side_line("head", report.head), markup=False)
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
             f"{row.trials_base}/{row.trials_head}", f"{seconds(row.base_median)} → {seconds(row.head_median)}",
             noise_used(row), percent(row.detectable), to_settle(row))
            for row in shown])
    notes = []
    if not report.rows:
        notes.append("no benchmark series on both sides")
    if counts["unchanged"] and not all_series:
        notes.append(f"{counts['unchanged']} unchanged series not listed (--all lists them)")
    if report.only_base or report.only_head:
        notes.append(f"{report.only_base} series only on base, {report.only_head} only on head (not compared)")
    if paced := sum(row.host_paced for row in report.rows):
        notes.append(f"{paced} series host-paced: {HOST_PACED_NOTE}")
    notes.extend(_held_notes(report))
    for chip_key in sorted({row.key.chip for row in report.rows if not timing_fit(row.key.chip)}):
        notes.append(f"{chip_key} is a virtual GPU: its timings carry no verdict (inconclusive), its correctness "
                     "counts; time on real hardware (docs/macs.md)")
    for chip_key, gap in sorted(apart.items()):
        notes.append(f"{chip_key}: one side is a single run measured {gap / 3600:.1f} h from the other: its trials "
                     f"share one session, so a shift of the whole run is not in their spread (more runs settle it)")
    lines = [*notes, f"{status}: {summary}; {len(report.correctness_failures)} correctness failure(s) on head "
             f"({len(report.newly_failing)} new, {len(report.already_failing)} already failing at base; "
             f"min effect {report.min_effect:g}, FDR {report.alpha:g})"]
    if fmt == "markdown":
        print()
        for line in lines:
            print(f"_{line}_  ")
    else:
        for line in lines:
            console.print(line, markup=False)  # plain text: commit subjects and notes may hold [brackets]
