"""`harness compare BASE HEAD --settle`: measure what decides instead of leaving it inconclusive.

A comparison of stored runs leaves series ``inconclusive`` where its evidence is short: too few trials, a run-level
shift it cannot measure (held: no history floor), an interval straddling the band. Settling re-measures only those
series, both commits interleaved in ABBA rounds on this machine (``harness.pipeline.ab``, on that subset of jobs),
stores what it measured as *settling runs* of the two commits (``Run.settling``: read by this comparison alone,
never a chip page's tip, a history point, a floor's run or a later run's previous run), and decides those series
again on the pairs of trials of every round so far (``compare(paired=True)``, ``harness.stats.paired``: each head
trial against the base trial measured next to it, so load that comes and goes cancels within a pair; no floor and
no hold), the k-th time at level alpha / 2^k (``harness.stats.settling.look_alpha``: deciding after every round must
not spend more than alpha in all). It
repeats, with more trials each round, until every series is decided or the budget is spent. Series decided by the
stored runs keep their verdicts; incomparable series (timed in different modes) and broken ones are not re-measured
(no trials settle them).

On a cluster (``harness compare --settle --address``), :func:`settle_chips` does the same for every chip with an
undecided series, each round measured by a ``Measure`` the caller gives (``harness.cluster.settle``: a Ray task on
a node of that chip) instead of here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from harness.analysis.compare import VERDICT_ORDER, compare, resolve_side
from harness.analysis.records import CompareReport, CompareRow, Side
from harness.core import chip as chip_id
from harness.core import defaults
from harness.core.errors import HarnessError
from harness.pipeline.ab import ABRequest, execute_ab
from harness.pipeline.run import Progress
from harness.record import outbox, query
from harness.stats import policy
from harness.stats.paired import min_pairs
from harness.stats.settling import look_alpha, to_settle

__all__ = ["Budget", "Measure", "SettleRequest", "SettleRound", "first_round_trials", "fit_round", "parse_budget",
           "settle", "settle_chips", "undecided", "undecided_chips"]

MAX_ROUND_TRIALS = 16
DEFAULT_BUDGET = "600s"
# One settling round elsewhere (a cluster node): the round's request -> (base run id, head run id); its second
# argument is the seconds left of a time budget (None: a trial budget), for the measurer's timeout.
Measure = Callable[[ABRequest, float | None], tuple[str, str]]


@dataclass(frozen=True)
class Budget:
    """What settling may spend: trials per side of each series over all rounds, or seconds of measuring."""

    trials: int | None = None
    seconds: float | None = None

    def __str__(self) -> str:
        return f"{self.trials} trials a side" if self.trials is not None else f"{self.seconds:g} s"


def parse_budget(text: str) -> Budget:
    """``"24"``: trials per side of each series, all rounds together; ``"300s"``, ``"10m"``: seconds of measuring."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min)?\s*", text or "")
    if not match:
        raise HarnessError(f"--budget {text!r}: a number of trials (e.g. 24) or a time (e.g. 300s, 10m)")
    value, unit = float(match.group(1)), match.group(2)
    if value <= 0:
        raise HarnessError(f"--budget {text!r} must be positive")
    if unit is None:
        return Budget(trials=int(value))
    return Budget(seconds=value * (60.0 if unit in ("m", "min") else 1.0))


@dataclass(frozen=True)
class SettleRequest:
    """What to settle: ``ab`` names the commits, repository, suite, database and chip label (its ``trials``,
    ``series`` and ``settle`` are set by each round); the budget and thresholds are settling's own."""

    ab: ABRequest
    budget: Budget = Budget(seconds=600.0)
    min_effect: float = defaults.MIN_EFFECT
    alpha: float = defaults.ALPHA


@dataclass(frozen=True)
class SettleRound:
    """One round of settling: the series re-measured, the trials a side each, the runs stored, what it took."""

    series: int
    trials: int
    base_run: str
    head_run: str
    seconds: float
    undecided_after: int


def undecided(rows: tuple[CompareRow, ...], settling: set | frozenset = frozenset()) -> list[CompareRow]:
    """The rows that more trials of both commits, interleaved, can settle: inconclusive ones (held included) whose
    sides were timed alike, and rows being settled (keys in ``settling``) that came out ``unchanged`` only for want
    of evidence (an interval reaching ``policy.SETTLED_WITHIN`` beyond 1): ``harness.stats.settling.to_settle``."""
    return [row for row in rows
            if to_settle(row.verdict, row.basis, row.ci_low, row.ci_high, row.key in settling)]


def first_round_trials(alpha: float) -> int:
    """Trials a side of a first round: the fewest pairs that can pass the signed-rank test at the first look's level
    (``harness.stats.paired.min_pairs``: 7 at alpha 0.05), so that a clear change is decided in one round."""
    return min_pairs(look_alpha(alpha, 1))


def _round_trials(rows: list[CompareRow], spent: int, budget: Budget, number: int, alpha: float) -> int:
    """Trials a side this round: ``first_round_trials``, doubling each round, at most 16, what the rows ask for where
    they say, and what is left of a trial budget."""
    wanted = max([first_round_trials(alpha) * 2 ** number,
                  *(row.more_trials_needed for row in rows if 0 < row.more_trials_needed < 100)])
    trials = min(MAX_ROUND_TRIALS, wanted)
    if budget.trials is not None:
        trials = min(trials, budget.trials - spent)
    return trials


def fit_round(series: int, trials: int, trial_s: float | None, left_s: float) -> tuple[int, int]:
    """(trials a side, series) of a round that fits ``left_s`` seconds, ``trial_s`` the seconds of one trial of one
    series on both sides (None: unknown, nothing cut): its trials cut first, down to 1, then its series (0 0: not
    even one trial of one series fits)."""
    if trial_s is None or trial_s <= 0:
        return trials, series
    fit = int(left_s / trial_s)  # trials of one series, both sides, that fit
    if fit >= series:
        return min(trials, fit // series), series
    return (1, fit) if fit else (0, 0)


def _merged(first: CompareReport, settled: CompareReport, keys: set) -> CompareReport:
    """``first`` with the rows of ``keys`` taken from ``settled``: verdicts, counts and exit status recomputed."""
    by_key = {row.key: row for row in settled.rows if row.key in keys}
    rows = sorted((by_key.get(row.key, row) for row in first.rows),
                  key=lambda r: (VERDICT_ORDER.index(r.verdict), r.key.chip, r.key.kernel, r.key.variant,
                                 r.key.dtype, r.key.shape_key))
    counts = {verdict: 0 for verdict in policy.VERDICTS}
    for row in rows:
        counts[row.verdict] += 1
    return replace(first, rows=tuple(rows), counts=counts)


def _settling_side(side: Side, chip: str, run_ids: list[str]) -> Side:
    return replace(side, kind="run", runs={chip: tuple(run_ids)}, dirty_runs=0)


def settle(request: SettleRequest, *, say: Callable[[str], None], progress: Progress | None = None,
           on_planned: Callable[[int], None] | None = None,
           measure: Measure | None = None) -> tuple[CompareReport, list[SettleRound]]:
    """Compare BASE with HEAD on this machine's chip (``ab.chip_label`` if given), then settle the undecided series
    (module docstring): the final report (stored verdicts, settled rows replaced) and the rounds measured. Each
    round is measured here, or by ``measure`` where given."""
    ab = request.ab
    chip = chip_id.detect(ab.chip_label).key
    store = outbox.open_store(ab.db_url)
    try:
        sides = (resolve_side(store, ab.base, chip), resolve_side(store, ab.head, chip))
        report = compare(store, ab.base, ab.head, chip=chip, min_effect=request.min_effect,
                         alpha=request.alpha, sides=sides)
        # a first round is sized from the stored runs of both commits (a later one from the round before it)
        stored_s = [query.trial_seconds(store, side.run_ids) for side in sides]
    finally:
        store.close()
    base_sha, head_sha = sides[0].sha, sides[1].sha  # a run id stands for its commit: settling measures commits
    rounds: list[SettleRound] = []
    settling: tuple[list[str], list[str]] = ([], [])
    spent_trials, started = 0, time.monotonic()
    current, settled_keys = report, set()
    while todo := undecided(current.rows, settled_keys):
        if request.budget.seconds is not None and time.monotonic() - started >= request.budget.seconds:
            say(f"settle: budget of {request.budget} spent with {len(todo)} series undecided")
            break
        trials = _round_trials(todo, spent_trials, request.budget, len(rounds), request.alpha)
        if request.budget.seconds is not None:  # a round that would overrun the time left is cut
            left_s = request.budget.seconds - (time.monotonic() - started)
            if rounds:  # the round before's seconds per trial a side, for at least as many series as now
                per_trial = rounds[-1].seconds / rounds[-1].trials * max(1.0, len(todo) / rounds[-1].series)
                trials = min(trials, int(left_s / per_trial) if per_trial > 0 else trials)
            else:
                known = [seconds for seconds in stored_s if seconds is not None]
                trial_s = 2 * max(known) if known else None  # both sides, at the slower side's pace
                trials, fit = fit_round(len(todo), trials, trial_s, left_s)
                if 0 < fit < len(todo):
                    say(f"settle: {len(todo)} series undecided; a trial of each takes about {trial_s:.1f} s a "
                        f"pair (the stored runs), so the first round measures the first {fit} of them")
                    todo = todo[:fit]
        if trials < 1:
            say(f"settle: budget of {request.budget} spent with {len(todo)} series undecided")
            break
        held = sum(bool(row.more_runs_needed) for row in todo)
        wide = sum(row.verdict == "unchanged" for row in todo)
        say(f"settle round {len(rounds) + 1}: {len(todo)} series undecided ({held} held against their run's shift, "
            f"{wide} unchanged on an interval reaching x{1 + policy.SETTLED_WITHIN:g}, "
            f"{len(todo) - held - wide} short of trials or straddling the band): measuring {base_sha[:12]} and "
            f"{head_sha[:12]} interleaved, {trials} trials a side: "
            + ", ".join(f"{r.key.kernel}/{r.key.variant} {r.key.dtype} {r.key.shape_key}" for r in todo[:5])
            + (f", ... ({len(todo)} in all)" if len(todo) > 5 else ""))
        keys = {row.key for row in todo}
        settled_keys |= keys
        round_started = time.monotonic()
        this_round = replace(ab, base=base_sha, head=head_sha, trials=trials, settle=True,
                             series=frozenset((k.kernel, k.variant, k.dtype, k.shape_key) for k in keys))
        if measure is None:
            base_run, head_run = execute_ab(this_round, progress=progress, on_planned=on_planned)
            base_id, head_id = base_run.run_id, head_run.run_id
        else:
            left_s = (None if request.budget.seconds is None
                      else max(0.0, request.budget.seconds - (time.monotonic() - started)))
            base_id, head_id = measure(this_round, left_s)
        settling[0].append(base_id)
        settling[1].append(head_id)
        spent_trials += trials
        store = outbox.open_store(ab.db_url)
        try:
            pooled = (_settling_side(sides[0], chip, settling[0]), _settling_side(sides[1], chip, settling[1]))
            settled = compare(store, base_sha, head_sha, chip=chip, min_effect=request.min_effect,
                              alpha=look_alpha(request.alpha, len(rounds) + 1), sides=pooled, paired=True)
        finally:
            store.close()
        current = _merged(current, settled, keys)  # a series decided at an earlier look keeps that look's verdict
        left = undecided(current.rows, settled_keys)
        rounds.append(SettleRound(len(keys), trials, base_id, head_id,
                                  time.monotonic() - round_started, len(left)))
        decided = {row.key: row.verdict for row in current.rows if row.key in keys and row not in left}
        say(f"settle round {len(rounds)}: {rounds[-1].seconds:.0f} s, settling runs {base_id[:12]} (base) "
            f"and {head_id[:12]} (head); decided {len(decided)}"
            + (" (" + ", ".join(f"{v} {sum(1 for x in decided.values() if x == v)}"
                                for v in ("regressed", "improved", "unchanged") if v in decided.values()) + ")"
               if decided else "") + f", {len(left)} still undecided")
    if not rounds and not undecided(current.rows):
        say("settle: nothing undecided, nothing measured")
    return current, rounds


def undecided_chips(request: SettleRequest) -> tuple[CompareReport, list[str]]:
    """The stored comparison on every chip, and the chips that have a series to settle (``undecided``)."""
    ab = request.ab
    store = outbox.open_store(ab.db_url)
    try:
        report = compare(store, ab.base, ab.head, min_effect=request.min_effect, alpha=request.alpha)
    finally:
        store.close()
    return report, sorted({row.key.chip for row in undecided(report.rows)})


def settle_chips(request: SettleRequest, report: CompareReport, chips: list[str], *, say: Callable[[str], None],
                 measure_on: Callable[[str], Measure]) -> CompareReport:
    """``report`` (``undecided_chips``) with the series of each of ``chips`` settled, one chip after the other, each
    round measured by ``measure_on(chip)``; budget and thresholds per chip as in :func:`settle`."""
    for chip in chips:
        say(f"settle: chip {chip}")
        settled, _ = settle(replace(request, ab=replace(request.ab, chip_label=chip)), say=say,
                            measure=measure_on(chip))
        report = _merged(report, settled, {row.key for row in settled.rows})
    return report
