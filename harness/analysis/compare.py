"""Compare BASE with HEAD: resolve each side to its runs, then give every series on both sides (per chip) a
verdict at trial level (``harness.stats.trials.compare_trials``: the spread between job processes, floored by the
spread of the series' recent runs on the base branch; BH across the whole grid), ``broken`` where the head failed a
correctness job of the kernel on that chip.  Samples, failures and references come from ``harness.record.query``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from datetime import datetime

import numpy as np

from harness.analysis.records import CompareReport, CompareRow, CorrectnessFailure, Side
from harness.core.chip import timing_fit
from harness.core.status import each_test_once, outcome_key
from harness.record import query
from harness.record.store import Store
from harness.stats import decide, policy, runshift, trials
from harness.stats import paired as stats_paired
from harness.stats.modes import same_mode

__all__ = ["VERDICT_ORDER", "compare", "for_order", "resolve_side", "round_pairs"]

VERDICT_ORDER = ("broken", "regressed", "improved", "inconclusive", "unchanged")
"""Display order of compare rows: what needs attention first."""


def resolve_side(store: Store, ref: str, chip: str | None = None) -> Side:
    """A commit sha (full or unique prefix: all its runs, pooled per chip) or a run id (full or unique prefix)."""
    return Side(ref.strip(), *query.resolve_ref(store, ref, chip))


def _row_order(row: CompareRow) -> tuple:
    return (VERDICT_ORDER.index(row.verdict), row.key.chip, row.key.kernel, row.key.variant, row.key.dtype,
            row.key.shape_key)


def compare(
    store: Store,
    base: str,
    head: str,
    chip: str | None = None,
    min_effect: float = policy.DEFAULT_MIN_EFFECT,
    alpha: float = policy.DEFAULT_ALPHA,
    same_session: bool = False,
    sides: tuple[Side, Side] | None = None,
    paired: bool = False,
) -> CompareReport:
    """Every benchmark series present on both sides (per chip): pooled samples, BH across the whole grid, gated.

    ``same_session``: the two sides were measured interleaved in one session (``harness compare --ab``), so the
    spread between their trials is the whole noise and no history floor applies.

    Correctness failures on the head side (kernel checks and repository tests, ``harness.core.status``) are listed,
    each marked new or already failing at base; any of them fails the gate. A kernel whose correctness check failed
    on the head side on a chip has every series of it on that chip ``broken``. Comparing a commit with itself pools
    the same runs on both sides (trivially unchanged): compare two run ids to compare runs. ``sides``: ``base`` and
    ``head`` already resolved (``resolve_side`` with ``chip``). ``paired``: the i-th base run and the i-th head run
    were measured interleaved (ABBA, ``harness compare --settle``'s rounds): each series is decided on its pairs of
    trials (``harness.stats.paired``), matched by round and trial number.
    """
    base_side, head_side = sides or (resolve_side(store, base, chip), resolve_side(store, head, chip))
    base_trials = query.series_trials(store, base_side.run_ids)
    head_trials = query.series_trials(store, head_side.run_ids)
    failing_at_base = {_outcome(row) for row in query.correctness_failures(store, base_side.run_ids)}
    failures = [CorrectnessFailure(*row, new=_outcome(row) not in failing_at_base)
                for row in distinct_failures(query.correctness_failures(store, head_side.run_ids))]
    failures.sort(key=lambda f: not f.new)  # newly failing first
    broken_kernels = {(f.chip, f.kernel) for f in failures if f.kind == "correctness"}
    common = sorted(base_trials.keys() & head_trials.keys())
    pairs = {key: (base_trials[key].trials, head_trials[key].trials) for key in common}
    broken = {key for key in common if (key.chip, key.kernel) in broken_kernels}
    base_modes, head_modes = query.timing_modes(store, base_side.run_ids), query.timing_modes(store, head_side.run_ids)
    incomparable = {key for key in common
                    if not same_mode(base_modes.get(key), head_modes.get(key)) or not timing_fit(key.chip)}
    if paired:
        rounds = list(zip(base_side.run_ids, head_side.run_ids, strict=True))
        verdicts = stats_paired.compare_paired(
            {key: round_pairs(base_trials[key], head_trials[key], rounds) for key in common},
            min_effect=min_effect, alpha=alpha, broken=broken, incomparable=incomparable)
    else:
        history = {} if same_session else query.history_medians(store, base_side.run_ids)
        verdicts = trials.compare_trials(pairs, floors=_floors(history), same_session=same_session,
                                         history_runs={key: len(medians) for key, medians in history.items()},
                                         run_groups={key: key.chip for key in common},
                                         runs={key: (base_trials[key].runs, head_trials[key].runs) for key in common},
                                         min_effect=min_effect, alpha=alpha, broken=broken,
                                         # the same runs on both sides (a commit with itself) share every run effect
                                         separate_runs=set(base_side.run_ids) != set(head_side.run_ids),
                                         incomparable=incomparable)
    host_paced = query.host_paced_series(store, base_side.run_ids) | query.host_paced_series(store, head_side.run_ids)
    rows = sorted((_row(key, c, pairs[key], key in host_paced) for key, c in verdicts.items()), key=_row_order)
    counts = {verdict: 0 for verdict in policy.VERDICTS}
    for row in rows:
        counts[row.verdict] += 1
    return CompareReport(base_side, head_side, tuple(rows), tuple(failures), counts,
                         len(base_trials.keys() - head_trials.keys()), len(head_trials.keys() - base_trials.keys()),
                         min_effect, alpha)


def round_pairs(base: query.SeriesTrials, head: query.SeriesTrials,
                rounds: Sequence[tuple[str, str]]) -> list[stats_paired.Pair]:
    """A series' pairs of trials: in each round (a base run and the head run measured interleaved with it), the base
    trial and the head trial of the same number (adjacent in the ABBA order); a trial without its partner is left
    out."""
    head_of, head_trials = dict(rounds), head.by_label()
    return [(samples, head_trials[head_of[run], number]) for (run, number), samples in base.by_label().items()
            if run in head_of and (head_of[run], number) in head_trials]


def for_order(report: CompareReport, proven: bool) -> CompareReport:
    """``report`` as it is when ancestry proves its base comes before its head; else (the base placed before the
    head by commit time, as a previous run) no change is decided: each regressed or improved series is
    inconclusive, and the report says "order not proven by ancestry" (``order_proven`` False); its exit code counts
    correctness failures only."""
    if proven:
        return report
    rows = tuple(dataclasses.replace(row, verdict="inconclusive") if row.verdict in ("regressed", "improved")
                 else row for row in report.rows)
    counts = {verdict: 0 for verdict in report.counts}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return dataclasses.replace(report, rows=tuple(sorted(rows, key=_row_order)), counts=counts, order_proven=False)


HOURS_APART_S = 3600.0
"""A side that is a single run measured at least this long before or after the other side is marked: its trials
share one session's conditions, so a shift of the whole run (clocks, thermal state, other load) is not in their
spread."""


def _outcome(row: query.FailureRow) -> tuple[str, str]:
    return row.chip, outcome_key(row.kind, row.key, row.name)


def distinct_failures(rows: Sequence[query.FailureRow]) -> list[query.FailureRow]:
    """Failing correctness rows with each repository test once per chip (``each_test_once``), named with every
    selection it failed in ("a, b")."""
    selections: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.kind == "test":
            selections.setdefault(_outcome(row), []).append(row.kernel)
    return [row._replace(kernel=", ".join(dict.fromkeys(selections[_outcome(row)]))) if row.kind == "test" else row
            for row in each_test_once(rows, lambda row: row.kind, _outcome, lambda row: row.status)]


def single_run_gap(base_starts: Sequence[datetime | None], head_starts: Sequence[datetime | None]) -> float | None:
    """Seconds between the two sides' nearest runs when one side is a single run (None otherwise, or when no start
    time is known): a comparison of one run with runs measured hours away rests on one session's noise."""
    if not (len(base_starts) == 1 or len(head_starts) == 1):
        return None
    gaps = [abs((b - h).total_seconds()) for b in base_starts for h in head_starts if b is not None and h is not None]
    return min(gaps) if gaps else None


def hours_apart(report: CompareReport, starts: Mapping[str, datetime | None]) -> dict[str, float]:
    """Per chip of ``report``: the gap in seconds where one side is a single run measured ``HOURS_APART_S`` or more
    from the other (``starts``: run id -> start time)."""
    found = {}
    for chip in report.base.runs.keys() & report.head.runs.keys():
        gap = single_run_gap([starts.get(r) for r in report.base.runs[chip]],
                             [starts.get(r) for r in report.head.runs[chip]])
        if gap is not None and gap >= HOURS_APART_S:
            found[chip] = gap
    return found


def series_floors(store: Store, run_ids: list[str]) -> dict[query.SeriesKey, runshift.Floor]:
    """Each series' between-run noise from its recent runs on the base branch (where it has enough of them)."""
    return _floors(query.history_medians(store, run_ids))


def _floors(history: Mapping[query.SeriesKey, Sequence[float]]) -> dict[query.SeriesKey, runshift.Floor]:
    floors = {key: runshift.history_floor(medians) for key, medians in history.items()}
    return {key: floor for key, floor in floors.items() if floor is not None}


def _pooled_median(side: list) -> float:
    return float(np.median(np.concatenate(side))) if side else float("nan")


def _row(key: query.SeriesKey, c: decide.TrialComparison, pair: tuple[list, list], host_paced: bool) -> CompareRow:
    return CompareRow(key, c.verdict, c.ratio, c.ci_low, c.ci_high, c.p_value, c.p_adjusted, c.n_base, c.n_head,
                      c.more_samples_needed, _pooled_median(pair[0]), _pooled_median(pair[1]),
                      trials_base=c.trials_base, trials_head=c.trials_head, more_trials_needed=c.more_trials_needed,
                      basis=c.basis, noise=c.noise, detectable=c.detectable, host_paced=host_paced,
                      more_runs_needed=c.more_runs_needed,
                      run_shift=c.run_shift if math.isfinite(c.run_shift) else None)
