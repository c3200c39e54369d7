r"""Bisection: find the first commit that made a kernel slower or wrong, noise-aware, skipping broken commits.

Everything here is pure: commits are plain shas, measurements arrive through callbacks, no I/O, no ORM.  The
I/O side (running a commit's suite, reading its stored trials) is :mod:`harness.bisect.run`; the CLI verb is
:mod:`harness.cli.bisect`.

The search (``search``)
=======================

Input: the candidate commits oldest first, as ``git rev-list --ancestry-path --reverse GOOD..BAD`` lists them
(the good endpoint excluded, the bad endpoint last), and a ``probe(shas) -> {sha: Classification}`` callback that
classifies a batch of commits as ``good``, ``bad``, ``skip`` (does not install, crashed, failed the correctness
gate, no data) or ``inconclusive`` (measured as often as allowed and still not shown to be either).  The culprit
is the first bad commit: it lies in ``(lo, hi]``, where ``lo`` is the last commit known good (-1: the good
endpoint) and ``hi`` the first known bad (initially the bad endpoint).

k-ary rounds.  With ``P`` probes per round, the ``M = hi - lo`` positions the culprit can take are cut into
``P + 1`` parts by probing ``t_j = lo + floor(j M / (P + 1))``, j = 1..P.  Each part has at most
``ceil(M / (P + 1))`` positions, and whatever the outcomes the culprit is left in one part, so after ``r``
rounds at most ``ceil(N / (P + 1)^r)`` positions remain: ``ceil(log_{P+1} N)`` rounds name it among ``N``
commits (10 rounds for 1,024 commits one probe at a time, 5 with four probes per round).  All probes of a
round are classified in one ``probe`` call, so an executor with several nodes of the chip runs them at once.

Skips work like ``git bisect skip``: a skipped commit is never probed again, and a split point that falls on a
skipped (or already used) commit moves to the nearest commit still unknown (ties: the older).  When every
commit strictly between ``lo`` and ``hi`` is skipped the search stops: the culprit is one of ``lo+1 .. hi``
(reported as ``candidates``, status ``hidden``), as git reports "the first bad commit could be any of".

An ``inconclusive`` commit strictly inside the remaining range stops the search (status ``inconclusive``): the
culprit is one of ``lo+1 .. hi`` and nothing more can be said without better measurements.  Nothing is guessed;
an inconclusive commit outside the range (a round's other probes made it irrelevant) does not matter.

Confirmation.  With a ``confirm`` callback, before the search ends -- with a culprit, a range hidden by skips,
or a range left by an inconclusive probe -- the two commits that bound the answer (the last good and the first
bad, unless they are the endpoints) are handed to ``confirm``, which re-classifies them on stronger evidence
(``PerfProber.confirm_bounds``, below).  A commit whose class changes moves the bounds and the search goes on,
so a named culprit is always a confirmed bad commit right after a confirmed good one.  Why the bounds: when the
change is a single step, a bad commit right after a good one *is* the culprit if both classes are right, so a
wrong culprit needs one of these two commits misclassified -- and the search converges on whichever commit was
misclassified, which is why they, and only they, are measured again.

Non-monotone outcomes (a commit classified good after a bad one: a flaky probe, or a change that was reverted
and made again) are not an error: ``hi`` is the oldest bad commit seen and ``lo`` the newest good one before
it, and the contradiction is listed in ``notes``.  ``max_rounds`` stops early (status ``stopped``) with the
remaining range.

Performance probes (``classify_perf``, ``PerfProber``)
=====================================================

Trials, not samples.  The unit of evidence is the *trial*: one fresh process of the benchmark job, ~10
samples.  A commit is measured by runs of its suite; each run holds ``[timing] trials`` trials (default 3) of
the job.  Samples of one process share its level (clocks, placement, allocator, a background load), so they
are not independent draws of the commit's speed: every comparison here is ``harness.stats.trials.
compare_trials`` on trials (one sample array per (run, trial)), never on pooled samples, so one process can
never decide anything (one trial a side shows no spread: inconclusive).

Runs that agree.  The trials of one run share that run's conditions, so a whole run can be off: a shared
runner under load, or a stale stored run from a noisy day.  Interference only ever adds time (``timeit``'s
documentation: higher values are typically caused by other processes interfering, not by variability in the
code's speed), so a commit's runs --
stored ones it reuses and new ones -- are taken fastest first: the fastest run is kept, and each slower run
joins it unless ``compare_trials(kept runs, that run)`` calls it ``regressed`` with the materiality band
``max(min_effect, exp(3 s) - 1)``, where ``s`` is a rough between-run sd (``rough_run_sd``: the median
residual of run levels about their commit's median, over every commit measured more than once, scaled for
normal data; a minority of wild runs hardly moves it).  So ordinary run-to-run drift is pooled and a run
slower than the commit's others beyond it is *set aside*: listed with its ratio to the kept runs, never
pooled.  Because a set-aside run shows that this commit's runs can be off, the commit then needs
``CORROBORATE`` (2) agreeing runs before it is classified.  A stale or loaded run therefore cannot keep its
answer after a clean re-run: it is set aside, and the clean run must be corroborated by another.  (The newest
run is not the reference: a loaded re-run would then overrule a clean stored one.)

Between-run floor.  The spread of the trials of one run understates how far whole runs move (on an H200 a
run's median moves ~4 % between runs).  Every commit with two or more kept runs gives the levels of its runs
(a run's level: the mean log median of its trials); their pooled sd about each commit's mean, with
``sum(kept runs - 1)`` degrees of freedom (``run_floor``), is passed to ``compare_trials`` as the floor
(``runshift.Floor``) with each side's run count: the standard error of a comparison is at least
``floor * sqrt(1/runs_a + 1/runs_b)``, so a one-run commit is never judged more precisely than runs repeat.

Endpoints (``PerfProber.confirm``).  Good and bad are measured until the good one has ``CORROBORATE`` (2)
agreeing runs, the bad one ``confirm_runs`` (4, as the culprit: see below; a bad endpoint whose kept runs were
all loaded would make every truly slow commit of a small step look fast), and ``compare_trials(good, bad)``
settles: ``regressed`` (the bisect starts), or ``unchanged`` / ``improved`` with an interval that does not reach
past ``1 + min_effect`` (nothing to bisect).  Inconclusive, or
"unchanged" only for lack of evidence, is measured again up to the cap; if it does not settle the bisect says
so (``endpoints_settled`` False: status ``inconclusive`` in :mod:`harness.bisect.run`) instead of guessing.

Probes.  A probe's kept trials ``x`` are compared with both endpoints' kept trials (``min_effect`` band,
level ``alpha``, the floor):

* ``bad``  -- ``vs good`` is ``regressed`` (materially slower than good) and ``vs bad`` is ``unchanged`` or
  ``inconclusive`` (not shown to differ from bad: with a material step between the endpoints the question is
  which side the probe is on, not whether it matches bad to the last percent; *slower* than bad is not
  accepted, since that is what a loaded run looks like);
* ``good`` -- ``vs bad`` is ``improved`` and ``vs good`` is not ``regressed`` (a commit faster than good, a
  speed-up before the slowdown, is on the good side);
* otherwise undecided (regressed against good *and* improved against bad: an intermediate level; or
  materially different from neither: not enough evidence for the noise).  The commit is run again (a new run),
  up to ``max_runs`` new runs per commit (stored runs it reuses do not count), and re-classified on its kept
  runs.  A commit still undecided at the cap is ``inconclusive``, with both comparisons as its evidence and,
  as a hint only, which endpoint its level is nearer in log time; it is never classified by that hint, and
  inside the range it stops the search (status ``inconclusive``, exit 1 in the CLI).

Confirming the bounds (``PerfProber.confirm_bounds``).  The search converges on any misclassified commit, so the
two bounds it ends with are the most extreme of the probes made: they are re-classified at level
``alpha / (commits probed)`` (Bonferroni over the commits the search could have converged on), the culprit on
``confirm_runs`` (default 4) agreeing runs, the last good commit on ``CORROBORATE`` (2), running them again as
needed (within ``max_runs``).  The asymmetry follows the interference argument: only a slow verdict can be
manufactured by a loaded run, and a wrong culprit from loads needs every kept run of the culprit loaded alike.

What it buys (``bench/bench_bisect.py --noisy-positions 200``: 1,024 commits, 3 trials of 10 samples per run,
the defaults).  Quiet machine (2 % noise within a process, a +10 % step): every culprit exact, 10 rounds serial
(5 with 4 probes per round), 20 runs per bisection where the old rule took 12 (the endpoints' and the bounds'
extra runs).  Shared runner (between-run sd 4-10 %, 10 % of the runs loaded x1.5-3), 200 bisections each, serial
and 4 probes per round: with a 2x step 169 / 168 exact, 22 / 23 inconclusive, 9 endpoints unsettled, *no* wrong
culprit; with a +10 % step (the size of the run-to-run noise) 1 / 2 exact, the rest inconclusive or unsettled,
no wrong culprit.  The rule this replaced (pooled samples, Mann-Whitney, the nearer endpoint at the cap),
simulated on the same shared runner, named a wrong culprit with exit 0 in 42-78 % of the bisections.  With half
as much load again (15 % of the runs) about 1 bisection in 100-200 still ends wrong: every kept run of a bound
loaded alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from harness.core import defaults
from harness.stats import decide, runshift, trials
from harness.stats.policy import NOISE_FLOOR

__all__ = [
    "BisectResult",
    "Classification",
    "Measured",
    "PerfCall",
    "PerfProber",
    "Round",
    "RunTrials",
    "SetAside",
    "agreeing_runs",
    "classify_perf",
    "describe",
    "max_rounds_needed",
    "nearest_endpoint",
    "run_floor",
    "search",
    "split_points",
]

State = Literal["good", "bad", "skip", "inconclusive"]
Status = Literal["found", "hidden", "stopped", "inconclusive"]
DEFAULT_MAX_RUNS = defaults.BISECT_MAX_RUNS  # new runs of one commit at most
DEFAULT_CONFIRM_RUNS = defaults.BISECT_CONFIRM_RUNS  # agreeing runs the named culprit needs
CORROBORATE = 2  # agreeing runs the endpoints, the last good commit and a commit with a run set aside need
_SAME = ("unchanged", "inconclusive")  # no material difference shown (see the module docstring)
_CHANGED = ("regressed", "improved")


@dataclass(frozen=True)
class SetAside:
    """A run of a commit left out of its evidence: slower than the commit's fastest runs beyond the noise.

    ``vs_kept``: this run against the kept runs (ratio = this run / kept), at the agreement band.
    """

    run_id: str
    vs_kept: decide.TrialComparison


@dataclass(frozen=True)
class Classification:
    """What a probe said about one commit, with its evidence.

    ``vs_good`` / ``vs_bad``: the probe's trials against each endpoint's (ratio = probe / endpoint), for
    performance probes; ``n`` samples in ``trials`` trials of the runs ``run_ids`` (the evidence), ``runs`` the
    commit's runs read in all (set-aside ones included); ``set_aside`` the runs left out; ``confirmed``:
    re-checked as a bound of the culprit on ``confirm_runs`` agreeing runs; ``nearer``: for an inconclusive
    probe, the endpoint its level is nearer (a hint, never used to classify).  ``reason`` says why a commit was
    skipped or is inconclusive (or what failed, for a correctness probe).
    """

    state: State
    reason: str = ""
    vs_good: decide.TrialComparison | None = None
    vs_bad: decide.TrialComparison | None = None
    n: int = 0
    runs: int = 0
    trials: int = 0
    run_ids: tuple[str, ...] = ()
    set_aside: tuple[SetAside, ...] = ()
    confirmed: bool = False
    nearer: str = ""


@dataclass(frozen=True)
class Round:
    """One k-ary step (or, ``confirm``, the re-check of the culprit's bounds): the commits and their classes."""

    index: int
    lo: int  # the range (lo, hi] before the round, as indices into the commit list (-1: the good endpoint)
    hi: int
    probes: tuple[tuple[str, Classification], ...]
    confirm: bool = False


@dataclass(frozen=True)
class BisectResult:
    """The outcome of ``search``.

    ``found``: ``culprit`` is the first bad commit.  ``hidden``: skipped commits hide it; it is one of
    ``candidates`` (oldest first).  ``stopped``: ``max_rounds`` ran out; it is one of ``candidates``.
    ``inconclusive``: a probe inside the range could not be classified; it is one of ``candidates``.
    ``last_good`` is the newest commit known good before the culprit or the candidates (None: the good
    endpoint); with ``found`` it is the culprit's parent on the ancestry path.  ``rounds`` counts the k-ary
    rounds, ``confirmations`` the confirmation steps (both are in ``history``).
    """

    status: Status
    culprit: str | None
    last_good: str | None
    candidates: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (sha, reason), in commit order
    rounds: int
    probes: int  # commits classified (each once; repeats of a commit are counted in its ``runs``)
    history: tuple[Round, ...]
    classifications: dict[str, Classification]
    notes: tuple[str, ...] = ()
    confirmations: int = 0
    inconclusive: tuple[str, ...] = ()  # the inconclusive commits inside the range (status inconclusive)


ProbeFn = Callable[[Sequence[str]], Mapping[str, Classification]]


def split_points(lo: int, hi: int, parts: int) -> list[int]:
    """The ideal probes cutting positions ``lo+1 .. hi`` into ``parts`` near-equal parts (strictly inside)."""
    span = hi - lo
    points = {lo + (j * span) // parts for j in range(1, parts)}
    return sorted(p for p in points if lo < p < hi)


def _nearest(target: int, available: list[int]) -> int:
    return min(available, key=lambda i: (abs(i - target), i))


def _choose(lo: int, hi: int, known: Mapping[int, State], probes_per_round: int) -> list[int]:
    """This round's probes: the split points, each moved to the nearest commit still unknown."""
    available = [i for i in range(lo + 1, hi) if i not in known]
    if len(available) <= probes_per_round:
        return available
    chosen: list[int] = []
    for target in split_points(lo, hi, probes_per_round + 1):
        pick = _nearest(target, [i for i in available if i not in chosen])
        chosen.append(pick)
    return sorted(chosen)


def _bounds(n: int, known: Mapping[int, State]) -> tuple[int, int, list[int]]:
    """(lo, hi) from everything classified so far, and the good commits after hi (contradictions)."""
    bads = [i for i, s in known.items() if s == "bad"]
    hi = min(bads, default=n - 1)
    goods = [i for i, s in known.items() if s == "good"]
    lo = max((i for i in goods if i < hi), default=-1)
    late = sorted(i for i in goods if i > hi)
    return lo, hi, late


@dataclass
class _SearchState:
    commits: Sequence[str]
    known: dict[int, State] = field(default_factory=dict)
    classifications: dict[str, Classification] = field(default_factory=dict)
    history: list[Round] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    confirmed: set[int] = field(default_factory=set)

    def record(self, indices: Sequence[int], answers: Mapping[str, Classification], *, confirm: bool,
               lo: int, hi: int, on_round: Callable[[Round], None] | None) -> None:
        shas = [self.commits[i] for i in indices]
        missing = [sha for sha in shas if sha not in answers]
        if missing:
            raise ValueError(f"probe did not classify {', '.join(s[:12] for s in missing)}")
        for i, sha in zip(indices, shas, strict=True):
            before = self.known.get(i)
            self.known[i] = answers[sha].state
            self.classifications[sha] = answers[sha]
            if confirm:
                self.confirmed.add(i)
                if before is not None and before != answers[sha].state:
                    self.notes.append(f"{sha[:12]} was {before}, re-measured to confirm it is "
                                      f"{answers[sha].state}: searching on")
        done = Round(len(self.history) + 1, lo, hi, tuple((sha, answers[sha]) for sha in shas), confirm)
        self.history.append(done)
        if on_round:
            on_round(done)
        _, new_hi, late = _bounds(len(self.commits), self.known)
        for i in late:
            note = (f"{self.commits[i][:12]} was classified good after the bad {self.commits[new_hi][:12]}: the "
                    "change is not monotone (a flaky probe, or a revert); searching before the oldest bad commit")
            if note not in self.notes:
                self.notes.append(note)


def search(commits: Sequence[str], probe: ProbeFn, *, probes_per_round: int = 1, max_rounds: int | None = None,
           on_round: Callable[[Round], None] | None = None, confirm: ProbeFn | None = None) -> BisectResult:
    """Find the first bad commit of ``commits`` (oldest first; the last one is the known-bad endpoint).

    ``probe`` gets each round's commits at once and must classify every one of them; ``confirm`` (optional)
    re-classifies the commits that bound the answer before the search ends with it (module docstring).
    """
    if not commits:
        raise ValueError("no commits to bisect: the bad commit must come after the good one")
    if probes_per_round < 1:
        raise ValueError(f"probes_per_round must be at least 1, not {probes_per_round}")
    n = len(commits)
    state = _SearchState(commits)
    status: Status = "found"
    rounds = 0
    blocked: list[int] = []
    while True:
        lo, hi, _late = _bounds(n, state.known)
        blocked = [i for i in range(lo + 1, hi) if state.known.get(i) == "inconclusive"]
        chosen = _choose(lo, hi, state.known, probes_per_round) if hi - lo > 1 and not blocked else []
        if not chosen:  # an answer (a commit; a range hidden by skips or an inconclusive probe): confirm its bounds
            bounds = [i for i in (lo, hi) if 0 <= i < n - 1 and i not in state.confirmed]
            if confirm is not None and bounds:
                state.record(bounds, confirm([commits[i] for i in bounds]), confirm=True, lo=lo, hi=hi,
                             on_round=on_round)
                continue
            status = "inconclusive" if blocked else "found" if hi - lo <= 1 else "hidden"
            break
        if max_rounds is not None and rounds >= max_rounds:
            status = "stopped"
            break
        state.record(chosen, probe([commits[i] for i in chosen]), confirm=False, lo=lo, hi=hi, on_round=on_round)
        rounds += 1
    lo, hi, _ = _bounds(n, state.known)
    known, classifications = state.known, state.classifications
    skipped = tuple((commits[i], classifications[commits[i]].reason) for i in sorted(known) if known[i] == "skip")
    last_good = commits[lo] if lo >= 0 else None
    if status == "found":
        culprit, candidates = commits[hi], (commits[hi],)
    else:
        culprit, candidates = None, tuple(commits[lo + 1:hi + 1])
    confirmations = sum(r.confirm for r in state.history)
    return BisectResult(status, culprit, last_good, candidates, skipped, rounds, len(classifications),
                        tuple(state.history), classifications, tuple(state.notes), confirmations,
                        tuple(commits[i] for i in blocked))


def max_rounds_needed(n_commits: int, probes_per_round: int = 1) -> int:
    """ceil(log_{P+1} N): the rounds the k-ary search needs at most for N commits without skips."""
    rounds, positions = 0, n_commits
    while positions > 1:
        positions = -(-positions // (probes_per_round + 1))
        rounds += 1
    return rounds


# ---------------------------------------------------------------------------------------------------------------
# Performance probes
# ---------------------------------------------------------------------------------------------------------------


TrialSamples = Sequence[Sequence[float]]  # one sample sequence (seconds per call) per trial (process)


@dataclass(frozen=True)
class RunTrials:
    """One run's timing of a commit: its trials of the benchmark job, one tuple of samples per process."""

    run_id: str
    trials: tuple[tuple[float, ...], ...]
    reused: bool = False  # stored before this bisect

    @property
    def level(self) -> float:
        """The run's level: the mean log median of its valid trials (nan without one)."""
        return _level(self.trials)

    @property
    def n(self) -> int:
        return sum(1 for trial in self.trials for s in trial if math.isfinite(s) and s > 0)


def _valid(trial: Sequence[float]) -> np.ndarray:
    values = np.asarray(trial, dtype=np.float64)
    return values[np.isfinite(values) & (values > 0)]


def _level(side: TrialSamples) -> float:
    medians = [float(np.median(v)) for v in map(_valid, side) if v.size]
    return float(np.mean(np.log(medians))) if medians else math.nan


def _flat(runs: Sequence[RunTrials]) -> list[tuple[float, ...]]:
    return [trial for run in runs for trial in run.trials]


def _count_trials(runs: Sequence[RunTrials]) -> int:
    return sum(1 for trial in _flat(runs) if _valid(trial).size)


@dataclass(frozen=True)
class Measured:
    """One measurement of a commit: the runs read (new, or stored ones it reuses), or why it must be skipped.

    ``runs``: the runs that timed the job, oldest first; ``untimed``: further runs read that did not (the job
    crashed, failed, or is missing there); ``skip``: why, when no run timed it; ``reused``: of all runs read,
    how many were stored before.
    """

    runs: tuple[RunTrials, ...] = ()
    skip: str = ""
    untimed: int = 0
    reused: int = 0

    @property
    def count(self) -> int:
        return len(self.runs) + self.untimed


MeasureFn = Callable[[Sequence[str]], Mapping[str, Measured]]


@dataclass(frozen=True)
class PerfCall:
    """A probe's trials against both endpoints' (ratio = probe / endpoint)."""

    state: Literal["good", "bad", "inconclusive"]
    vs_good: decide.TrialComparison
    vs_bad: decide.TrialComparison


def _compare(base: TrialSamples, head: TrialSamples, *, runs: tuple[int, int] = (1, 1),
             floor: runshift.Floor | None = None, min_effect: float, alpha: float) -> decide.TrialComparison:
    """``head`` against ``base`` at trial level (ratio = head / base), one series, optionally floored.

    Without the rank check of a lone series: a probe is classified only when it differs from one endpoint and not
    from the other, each on run-level evidence (module docstring), which is what guards bisect against a lucky split.
    """
    return trials.compare_trials({0: (base, head)}, floors={0: floor} if floor is not None else None,
                                 runs={0: runs}, min_effect=min_effect, alpha=alpha, rank_check=False)[0]


def classify_perf(good: TrialSamples, bad: TrialSamples, probe: TrialSamples, *, runs: tuple[int, int, int] = (1, 1, 1),
                  floor: runshift.Floor | None = None, min_effect: float = defaults.MIN_EFFECT,
                  alpha: float = defaults.ALPHA) -> PerfCall:
    """good-like, bad-like or inconclusive: the probe's trials against each endpoint's with ``compare_trials``.

    ``runs`` = the distinct runs behind (good, bad, probe), used with the between-run ``floor`` (module
    docstring).
    """
    vs_good = _compare(good, probe, runs=(runs[0], runs[2]), floor=floor, min_effect=min_effect, alpha=alpha)
    vs_bad = _compare(bad, probe, runs=(runs[1], runs[2]), floor=floor, min_effect=min_effect, alpha=alpha)
    if vs_good.verdict == "regressed" and vs_bad.verdict in _SAME:
        return PerfCall("bad", vs_good, vs_bad)
    if vs_bad.verdict == "improved" and vs_good.verdict != "regressed":
        return PerfCall("good", vs_good, vs_bad)
    return PerfCall("inconclusive", vs_good, vs_bad)


def nearest_endpoint(good: TrialSamples, bad: TrialSamples, probe: TrialSamples) -> Literal["good", "bad"]:
    """The endpoint whose level (mean log trial median) is nearer the probe's (ties: bad).  A hint only."""
    g, b, x = _level(good), _level(bad), _level(probe)
    return "good" if abs(x - g) < abs(x - b) else "bad"


def agreeing_runs(runs: Sequence[RunTrials], *, band: float, alpha: float = defaults.ALPHA
                  ) -> tuple[tuple[RunTrials, ...], tuple[SetAside, ...]]:
    """(the runs kept, the runs set aside), both in the given (time) order: the fastest run, and each slower run
    (fastest first) that ``compare_trials`` does not call regressed against the runs kept so far at materiality
    ``band`` (module docstring)."""
    if not runs:
        return (), ()
    order = sorted(range(len(runs)), key=lambda i: (_nan_last(runs[i].level), -i))
    kept = [order[0]]
    aside: dict[int, SetAside] = {}
    for i in order[1:]:
        against = _compare(_flat([runs[k] for k in kept]), runs[i].trials, runs=(len(kept), 1), min_effect=band,
                           alpha=alpha)
        if against.verdict in _CHANGED:
            aside[i] = SetAside(runs[i].run_id, against)
        else:
            kept.append(i)
    return tuple(runs[i] for i in sorted(kept)), tuple(aside[i] for i in sorted(aside))


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


# 1 / median |x - median(x)| of k standard normal draws (the middle draw of an odd k left out), Monte Carlo with
# 2e5 draws each: the rough between-run sd from the residuals of a commit's run levels about their median
_RESIDUAL_SCALE = {2: 2.085, 3: 1.449, 4: 2.062, 5: 1.462, 6: 1.900, 7: 1.465, 8: 1.778}
_MAD_TO_SIGMA = 1.4826
_OUTLIER_SDS = 3.0  # runs of one commit further apart than this many rough sds are not mere run-to-run drift


def _levels(group: Sequence[RunTrials]) -> list[float]:
    return [level for level in (run.level for run in group) if math.isfinite(level)]


def rough_run_sd(groups: Iterable[Sequence[RunTrials]]) -> float | None:
    """A robust (rough) between-run sd in log time from *all* runs of the commits measured more than once: per
    commit, the median residual of its run levels about their median (scaled for normal data), then the median
    over those commits.  Wild runs (a loaded machine, stale results) hardly move it as long as they do not make up
    half of some commit's runs in half of the commits; None without a commit of two or more runs."""
    scales: list[float] = []
    for group in groups:
        levels = _levels(group)
        if len(levels) < 2:
            continue
        middle = float(np.median(levels))
        residuals = sorted(abs(level - middle) for level in levels)
        if len(levels) % 2:
            residuals = residuals[1:]
        scales.append(float(np.median(residuals)) * _RESIDUAL_SCALE.get(len(levels), _MAD_TO_SIGMA))
    return float(np.median(scales)) if scales else None


def run_floor(groups: Iterable[Sequence[RunTrials]]) -> runshift.Floor | None:
    """The between-run floor: the pooled sd of run levels about their commit's mean, over the commits with two or
    more (kept) runs; ``runs`` - 1 = the degrees of freedom, sum of (runs - 1).  None without such a commit."""
    squares, df = 0.0, 0
    for group in groups:
        levels = np.array(_levels(group), dtype=np.float64)
        if levels.size >= 2:
            squares += float(np.sum((levels - levels.mean()) ** 2))
            df += int(levels.size) - 1
    if df < 1:
        return None
    return runshift.Floor(max(math.sqrt(squares / df), NOISE_FLOOR), df + 1)


def describe(c: decide.TrialComparison | None, what: str) -> str:
    """'1.43x good (95% CI 1.12-1.83, regressed, 3/3 trials)' -- one comparison in words."""
    if c is None:
        return f"no comparison with {what}"
    ci = f"95% CI {c.ci_low:.3f}-{c.ci_high:.3f}, " if math.isfinite(c.ci_low) else ""
    return f"{c.ratio:.3f}x {what} ({ci}{c.verdict}, {c.trials_head}/{c.trials_base} trials)"


@dataclass(frozen=True)
class _Evidence:
    kept: tuple[RunTrials, ...]
    aside: tuple[SetAside, ...]


@dataclass
class PerfProber:
    """A ``probe`` (and ``confirm``) callback for ``search``: measures commits and classifies them on the trials
    of their agreeing runs, running undecided ones again (module docstring).

    ``measure(shas)`` measures every commit given once (all at once on a cluster): the first time a commit is
    asked for, its stored runs (if any) or one new run, afterwards one new run each; the prober keeps every run.
    ``confirm`` measures the endpoints first (call it before ``search``); ``confirm_bounds`` is ``search``'s
    ``confirm``.  ``batches`` counts ``measure`` calls (sequential steps), ``runs`` / ``reused`` the runs read.
    ``max_runs`` caps the *new* runs of one commit; ``need`` says how many agreeing runs a classification needs
    (``confirm_runs`` for the bad endpoint and the culprit, ``CORROBORATE`` for the good endpoint, the last good
    commit and a commit with a run set aside, else one).
    """

    measure: MeasureFn
    good_sha: str
    bad_sha: str
    max_runs: int = DEFAULT_MAX_RUNS
    confirm_runs: int = DEFAULT_CONFIRM_RUNS
    min_effect: float = defaults.MIN_EFFECT
    alpha: float = defaults.ALPHA
    measured: dict[str, list[RunTrials]] = field(default_factory=dict)
    run_counts: dict[str, int] = field(default_factory=dict)  # runs read per commit (stored and new)
    new_counts: dict[str, int] = field(default_factory=dict)  # runs made per commit (the cap)
    skips: dict[str, str] = field(default_factory=dict)
    batches: int = 0
    runs: int = 0
    reused: int = 0
    endpoints: decide.TrialComparison | None = None
    endpoints_settled: bool = False
    probed: set[str] = field(default_factory=set)  # the commits the search asked about (the confirmation's family)
    _cache: dict[tuple[str, int, float], _Evidence] = field(default_factory=dict, repr=False)
    _version: int = field(default=0, repr=False)  # bumped by every measurement: band and floor are cached per version
    _derived: dict[str, tuple[int, object]] = field(default_factory=dict, repr=False)

    def need(self, state: str = "good", *, confirming: bool = True, aside: bool = False) -> int:
        """Agreeing runs a classification needs: a bad verdict the answer rests on (the bad endpoint, the culprit: a
        bad bound being confirmed) ``confirm_runs``; the good endpoint, the last good commit and a commit with a run
        set aside ``CORROBORATE``; any other probe one.  Never more than ``max_runs`` (``--max-runs 1`` trusts single
        runs)."""
        if confirming and state == "bad":
            wanted = self.confirm_runs
        elif confirming or aside:
            wanted = CORROBORATE
        else:
            wanted = 1
        return max(1, min(wanted, self.max_runs))

    # -- measuring ------------------------------------------------------------------------------------------

    def _measure(self, shas: Sequence[str]) -> None:
        got = dict(self.measure(list(shas)))
        self.batches += 1
        self._version += 1
        for sha in shas:
            m = got[sha]
            self.runs += m.count
            self.reused += m.reused
            self.run_counts[sha] = self.run_counts.get(sha, 0) + m.count
            made = m.count - m.reused
            if not made and not m.reused:  # a new run was asked for and none could be made: it counts to the cap
                made = 1
            self.new_counts[sha] = self.new_counts.get(sha, 0) + made
            timed = [run for run in m.runs if _count_trials([run])]
            self.measured.setdefault(sha, []).extend(timed)
            if not self.measured[sha]:
                self.skips[sha] = m.skip or "no timing"
            else:
                self.skips.pop(sha, None)

    def _capped(self, sha: str) -> bool:
        return self.new_counts.get(sha, 0) >= self.max_runs

    # -- evidence -------------------------------------------------------------------------------------------

    def _multi(self) -> list[list[RunTrials]]:
        return [runs for sha, runs in self.measured.items() if len(runs) >= 2 and sha not in self.skips]

    def band(self) -> float:
        """The agreement band between runs of one commit: three rough between-run sds, at least ``min_effect``
        (module docstring)."""
        cached = self._derived.get("band")
        if cached is None or cached[0] != self._version:
            rough = rough_run_sd(self._multi())
            drift = math.expm1(_OUTLIER_SDS * rough) if rough is not None else 0.0
            cached = self._derived["band"] = (self._version, max(self.min_effect, drift))
        return float(cached[1])  # type: ignore[arg-type]

    def evidence(self, sha: str) -> _Evidence:
        """The commit's runs kept as evidence and those set aside (``agreeing_runs`` at ``band``)."""
        band = self.band()
        runs = self.measured.get(sha, [])
        key = (sha, len(runs), band)
        if key not in self._cache:
            self._cache[key] = _Evidence(*agreeing_runs(runs, band=band, alpha=self.alpha))
        return self._cache[key]

    def floor(self) -> runshift.Floor | None:
        """The between-run floor from the kept runs of every commit measured more than once (module docstring)."""
        cached = self._derived.get("floor")
        if cached is None or cached[0] != self._version:
            found = run_floor(self.evidence(sha).kept for sha, runs in self.measured.items()
                              if len(runs) >= 2 and sha not in self.skips)
            cached = self._derived["floor"] = (self._version, found)
        return cached[1]  # type: ignore[return-value]

    # -- endpoints ------------------------------------------------------------------------------------------

    def confirm(self) -> decide.TrialComparison | None:
        """Measure both endpoints until each has ``need`` agreeing runs and their comparison settles (module
        docstring), or the cap; the bad-vs-good comparison (``endpoints_settled`` says whether it settled).

        None when an endpoint cannot be measured (its reason is in ``skips``).
        """
        ends = (self.good_sha, self.bad_sha)
        pending = list(ends)
        while True:
            self._measure(pending)
            if any(sha in self.skips for sha in ends):
                return None
            good, bad = (self.evidence(sha) for sha in ends)
            self.endpoints = _compare(_flat(good.kept), _flat(bad.kept), runs=(len(good.kept), len(bad.kept)),
                                      floor=self.floor(), min_effect=self.min_effect, alpha=self.alpha)
            short = [sha for sha, e, state in zip(ends, (good, bad), ("good", "bad"), strict=True)
                     if len(e.kept) < self.need(state)]
            unsure = self._needs_more(self.endpoints)
            self.endpoints_settled = not short and not unsure
            if self.endpoints_settled:
                break
            pending = [sha for sha in (ends if unsure else short) if not self._capped(sha)]
            if not pending:
                break
        return self.endpoints

    def _needs_more(self, comparison: decide.TrialComparison) -> bool:
        """Inconclusive, or "unchanged" only for lack of evidence while a material slowdown is still in the CI."""
        if comparison.verdict == "inconclusive":
            return True
        return comparison.verdict == "unchanged" and not comparison.ci_high <= 1.0 + self.min_effect

    # -- probes ---------------------------------------------------------------------------------------------

    def classification(self, sha: str, final: bool, confirming: bool = False) -> Classification | None:
        """The commit's classification from its kept runs; None while undecided and not ``final``."""
        runs = self.run_counts.get(sha, 0)
        if sha in self.skips:
            return Classification("skip", self.skips[sha], runs=runs)
        good, bad, probe = (self.evidence(s) for s in (self.good_sha, self.bad_sha, sha))
        call = classify_perf(_flat(good.kept), _flat(bad.kept), _flat(probe.kept),
                             runs=(len(good.kept), len(bad.kept), len(probe.kept)), floor=self.floor(),
                             min_effect=self.min_effect, alpha=self.confirm_alpha() if confirming else self.alpha)
        need = self.need(call.state, confirming=confirming, aside=bool(probe.aside))
        facts = dict(vs_good=call.vs_good, vs_bad=call.vs_bad, n=sum(run.n for run in probe.kept), runs=runs,
                     trials=_count_trials(probe.kept), run_ids=tuple(run.run_id for run in probe.kept),
                     set_aside=probe.aside)
        aside = self._aside_note(probe)
        if call.state != "inconclusive" and len(probe.kept) >= need:
            return Classification(call.state, aside, confirmed=confirming, **facts)
        if not final:
            return None
        nearer = nearest_endpoint(_flat(good.kept), _flat(bad.kept), _flat(probe.kept))
        if call.state != "inconclusive":
            why = (f"looks {call.state} on {len(probe.kept)} run(s), but needs {need} agreeing runs"
                   f"{' to confirm it' if confirming else ''} and {self.new_counts.get(sha, 0)} new run(s) did not "
                   "give them")
        else:
            why = (f"inconclusive after {runs} run(s): {describe(call.vs_good, 'good')}, "
                   f"{describe(call.vs_bad, 'bad')}; its level is nearer the {nearer} endpoint (a hint only)")
        return Classification("inconclusive", why + (f"; {aside}" if aside else ""), nearer=nearer, **facts)

    @staticmethod
    def _aside_note(evidence: _Evidence) -> str:
        if not evidence.aside:
            return ""
        parts = [f"{a.run_id[:12]} ({a.vs_kept.ratio:.3f}x the kept runs)" for a in evidence.aside]
        return f"run(s) set aside, slower than the commit's fastest runs beyond the noise: {', '.join(parts)}"

    def _classify(self, shas: Sequence[str], confirming: bool) -> dict[str, Classification]:
        decided: dict[str, Classification] = {}
        pending = list(shas)
        if not confirming:
            self._measure(pending)
        while pending:
            again = []
            for sha in pending:
                verdict = self.classification(sha, final=self._capped(sha), confirming=confirming)
                if verdict is None:
                    again.append(sha)
                else:
                    decided[sha] = verdict
            pending = again
            if pending:
                self._measure(pending)
        return decided

    def __call__(self, shas: Sequence[str]) -> dict[str, Classification]:
        self.probed.update(shas)
        return self._classify(shas, confirming=False)

    def confirm_alpha(self) -> float:
        """The level of a confirmation: ``alpha`` / the commits probed so far (Bonferroni: the search converges on
        whichever probe was misclassified, so the bounds it ends with are the most extreme of that many tests)."""
        return self.alpha / max(1, len(self.probed))

    def confirm_bounds(self, shas: Sequence[str]) -> dict[str, Classification]:
        """``search``'s ``confirm``: re-classify commits already probed on ``need`` agreeing runs (running them
        again as needed)."""
        return self._classify(shas, confirming=True)

    def evidence_between(self, before: str, after: str) -> decide.TrialComparison | None:
        """``after`` against ``before`` (ratio = after / before) on their kept trials, if both have some."""
        base, head = self.evidence(before), self.evidence(after)
        if not base.kept or not head.kept:
            return None
        return _compare(_flat(base.kept), _flat(head.kept), runs=(len(base.kept), len(head.kept)),
                        floor=self.floor(), min_effect=self.min_effect, alpha=self.alpha)
