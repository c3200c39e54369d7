r"""Bisection: find the first commit that made a kernel slower or wrong, noise-aware, skipping broken commits.

Everything here is pure: commits are plain shas, measurements arrive through callbacks, no I/O, no ORM.  The
I/O side (running a commit's suite, reading its stored samples) is :mod:`harness.bisect.run`; the CLI verb is
:mod:`harness.cli.bisect`.

The search (``search``)
=======================

Input: the candidate commits oldest first, as ``git rev-list --ancestry-path --reverse GOOD..BAD`` lists them
(the good endpoint excluded, the bad endpoint last), and a ``probe(shas) -> {sha: Classification}`` callback that
classifies a batch of commits as ``good``, ``bad`` or ``skip`` (does not install, crashed, failed the correctness
gate, no data).  The culprit is the first bad commit: it lies in ``(lo, hi]``, where ``lo`` is the last commit
known good (-1: the good endpoint) and ``hi`` the first known bad (initially the bad endpoint).

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

Non-monotone outcomes (a commit classified good after a bad one: a flaky probe, or a change that was reverted
and made again) are not an error: ``hi`` is the oldest bad commit seen and ``lo`` the newest good one before
it, and the contradiction is listed in ``notes``.  ``max_rounds`` stops early (status ``stopped``) with the
remaining range.

Performance probes (``classify_perf``, ``PerfProber``)
=====================================================

The bad endpoint must first be slower than the good one: ``stats.compare_samples(good, bad)`` must say
``regressed``.  An ``inconclusive`` comparison, or an ``unchanged`` one whose interval still reaches past
``1 + min_effect`` (not significant, but no evidence of equivalence either), is measured again, both
endpoints, up to the cap, before giving up.  A probe's pooled samples ``x`` are then compared with both
endpoints' pooled samples by the same test (Mann-Whitney, bootstrap interval of the median ratio,
materiality band ``min_effect``; see :mod:`harness.core.stats`):

* ``bad``  -- ``compare_samples(good, x)`` is ``regressed`` (materially slower than good) and
  ``compare_samples(bad, x)`` does not tell it from bad: ``unchanged``, or ``inconclusive`` (a difference
  too small to be shown material; with a material step between the endpoints the question is which side
  the probe is on, not whether it matches bad to the last percent);
* ``good`` -- ``compare_samples(bad, x)`` is ``improved`` and ``compare_samples(good, x)`` is ``unchanged``
  or ``inconclusive``;
* otherwise ``inconclusive`` (regressed against good *and* improved against bad: an intermediate level; or
  materially different from neither: too few samples for the noise).  The commit is measured again (another
  run of its suite), its samples pooled, up to ``max_runs`` runs per commit.  A commit still inconclusive at
  the cap is classified by the nearer endpoint in log time (the geometric midpoint of the two medians is the
  threshold) and marked ``weak``: threshold bisection, so an intermediate level (two steps between the
  endpoints) bisects to one of the two steps.

Both comparisons are single tests, not a family: each probe asks one binary question of its pooled samples.
A misclassification needs both tests wrong at once (a truly slow commit that is not materially slower than
good *and* materially faster than bad), which never happened in ``scripts/bench_bisect.py`` (1,024 commits,
a 10 % step, 2 % noise, 10 samples per run: 100 bisections serial and 100 with 4 probes per round, every
culprit exact, no commit needing a repeat).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from harness.core import stats

__all__ = [
    "BisectResult",
    "Classification",
    "Measured",
    "PerfCall",
    "PerfProber",
    "Round",
    "classify_perf",
    "max_rounds_needed",
    "nearest_endpoint",
    "search",
    "split_points",
]

State = Literal["good", "bad", "skip"]
Status = Literal["found", "hidden", "stopped"]
DEFAULT_MAX_RUNS = 3
_SAME = ("unchanged", "inconclusive")  # no material difference shown (see the module docstring)


@dataclass(frozen=True)
class Classification:
    """What a probe said about one commit, with its evidence.

    ``vs_good`` / ``vs_bad``: the probe's samples against each endpoint (ratio = probe / endpoint), for
    performance probes; ``n`` its pooled samples over ``runs`` runs; ``weak``: classified by the nearer endpoint
    after the repeat cap.  ``reason`` says why a commit was skipped (or what failed, for a correctness probe).
    """

    state: State
    reason: str = ""
    vs_good: stats.Comparison | None = None
    vs_bad: stats.Comparison | None = None
    n: int = 0
    runs: int = 0
    weak: bool = False


@dataclass(frozen=True)
class Round:
    """One k-ary step: the commits probed together and what each was found to be."""

    index: int
    lo: int  # the range (lo, hi] before the round, as indices into the commit list (-1: the good endpoint)
    hi: int
    probes: tuple[tuple[str, Classification], ...]


@dataclass(frozen=True)
class BisectResult:
    """The outcome of ``search``.

    ``found``: ``culprit`` is the first bad commit.  ``hidden``: skipped commits hide it; it is one of
    ``candidates`` (oldest first).  ``stopped``: ``max_rounds`` ran out; it is one of ``candidates``.
    ``last_good`` is the newest commit known good before the culprit or the candidates (None: the good
    endpoint); with ``found`` it is the culprit's parent on the ancestry path.
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


def _bounds(n: int, known: Mapping[int, State]) -> tuple[int, int, list[str]]:
    """(lo, hi) from everything classified so far, and notes on contradictions."""
    bads = [i for i, s in known.items() if s == "bad"]
    hi = min(bads, default=n - 1)
    goods = [i for i, s in known.items() if s == "good"]
    lo = max((i for i in goods if i < hi), default=-1)
    late = sorted(i for i in goods if i > hi)
    return lo, hi, late


def search(commits: Sequence[str], probe: ProbeFn, *, probes_per_round: int = 1, max_rounds: int | None = None,
           on_round: Callable[[Round], None] | None = None) -> BisectResult:
    """Find the first bad commit of ``commits`` (oldest first; the last one is the known-bad endpoint).

    ``probe`` gets each round's commits at once and must classify every one of them.
    """
    if not commits:
        raise ValueError("no commits to bisect: the bad commit must come after the good one")
    if probes_per_round < 1:
        raise ValueError(f"probes_per_round must be at least 1, not {probes_per_round}")
    n = len(commits)
    known: dict[int, State] = {}
    classifications: dict[str, Classification] = {}
    history: list[Round] = []
    notes: list[str] = []
    status: Status = "found"
    while True:
        lo, hi, _late = _bounds(n, known)
        if hi - lo <= 1:
            break
        chosen = _choose(lo, hi, known, probes_per_round)
        if not chosen:
            status = "hidden"
            break
        if max_rounds is not None and len(history) >= max_rounds:
            status = "stopped"
            break
        shas = [commits[i] for i in chosen]
        answers = probe(shas)
        missing = [sha for sha in shas if sha not in answers]
        if missing:
            raise ValueError(f"probe did not classify {', '.join(s[:12] for s in missing)}")
        for i, sha in zip(chosen, shas, strict=True):
            known[i] = answers[sha].state
            classifications[sha] = answers[sha]
        done = Round(len(history) + 1, lo, hi, tuple((sha, answers[sha]) for sha in shas))
        history.append(done)
        if on_round:
            on_round(done)
        _, new_hi, late = _bounds(n, known)
        for i in late:
            note = (f"{commits[i][:12]} was classified good after the bad {commits[new_hi][:12]}: the change is not "
                    "monotone (a flaky probe, or a revert); searching before the oldest bad commit")
            if note not in notes:
                notes.append(note)
    lo, hi, _ = _bounds(n, known)
    skipped = tuple((commits[i], classifications[commits[i]].reason) for i in sorted(known) if known[i] == "skip")
    last_good = commits[lo] if lo >= 0 else None
    if status == "found":
        culprit, candidates = commits[hi], (commits[hi],)
    else:
        culprit, candidates = None, tuple(commits[lo + 1:hi + 1])
    return BisectResult(status, culprit, last_good, candidates, skipped, len(history), len(classifications),
                        tuple(history), classifications, tuple(notes))


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


@dataclass(frozen=True)
class PerfCall:
    """A probe's samples against both endpoints' (ratio = probe / endpoint)."""

    state: Literal["good", "bad", "inconclusive"]
    vs_good: stats.Comparison
    vs_bad: stats.Comparison


Samples = Sequence[float] | npt.NDArray[np.floating]


def classify_perf(good: Samples, bad: Samples, probe: Samples, *, min_effect: float = stats.DEFAULT_MIN_EFFECT,
                  alpha: float = stats.DEFAULT_ALPHA, seed: int = 0) -> PerfCall:
    """good-like, bad-like or inconclusive, by ``stats.compare_samples`` against each endpoint (module docstring)."""
    vs_good = stats.compare_samples(good, probe, min_effect=min_effect, alpha=alpha, seed=seed)
    vs_bad = stats.compare_samples(bad, probe, min_effect=min_effect, alpha=alpha, seed=seed)
    if vs_good.verdict == "regressed" and vs_bad.verdict in _SAME:
        return PerfCall("bad", vs_good, vs_bad)
    if vs_bad.verdict == "improved" and vs_good.verdict in _SAME:
        return PerfCall("good", vs_good, vs_bad)
    return PerfCall("inconclusive", vs_good, vs_bad)


def _log_median(samples: Samples) -> float:
    values = np.asarray(samples, dtype=np.float64)
    values = values[np.isfinite(values) & (values > 0)]
    return float(np.log(np.median(values))) if values.size else math.nan


def nearest_endpoint(good: Samples, bad: Samples, probe: Samples) -> Literal["good", "bad"]:
    """The endpoint whose median is nearer the probe's in log time (ties: bad)."""
    g, b, x = _log_median(good), _log_median(bad), _log_median(probe)
    return "good" if abs(x - g) < abs(x - b) else "bad"


@dataclass(frozen=True)
class Measured:
    """One measurement of a commit: new samples (from ``runs`` runs), or why the commit must be skipped."""

    samples: tuple[float, ...] = ()
    runs: int = 1
    skip: str = ""
    reused: int = 0  # of ``runs``, how many were already stored


MeasureFn = Callable[[Sequence[str]], Mapping[str, Measured]]


@dataclass
class PerfProber:
    """A ``probe`` callback for ``search``: measures commits, pools their samples, repeats inconclusive ones.

    ``measure(shas)`` measures every commit given once (all at once on a cluster) and returns its *new*
    samples; the prober pools them per commit.  ``confirm`` measures the endpoints first (call it before
    ``search``).  ``batches`` counts ``measure`` calls (sequential steps), ``runs`` / ``reused`` the runs.
    """

    measure: MeasureFn
    good_sha: str
    bad_sha: str
    max_runs: int = DEFAULT_MAX_RUNS
    min_effect: float = stats.DEFAULT_MIN_EFFECT
    alpha: float = stats.DEFAULT_ALPHA
    pooled: dict[str, list[float]] = field(default_factory=dict)
    run_counts: dict[str, int] = field(default_factory=dict)
    skips: dict[str, str] = field(default_factory=dict)
    batches: int = 0
    runs: int = 0
    reused: int = 0
    endpoints: stats.Comparison | None = None

    def _measure(self, shas: Sequence[str]) -> dict[str, Measured]:
        got = dict(self.measure(list(shas)))
        self.batches += 1
        for sha in shas:
            m = got[sha]
            self.runs += m.runs
            self.reused += m.reused
            self.run_counts[sha] = self.run_counts.get(sha, 0) + m.runs
            if m.skip and not m.samples:
                self.skips[sha] = m.skip
            else:
                self.pooled.setdefault(sha, []).extend(m.samples)
        return got

    def samples(self, sha: str) -> list[float]:
        return self.pooled.get(sha, [])

    def confirm(self) -> stats.Comparison | None:
        """Measure both endpoints (again while inconclusive, up to the cap); the bad-vs-good comparison.

        "Unchanged" for want of significance while the interval still reaches past ``1 + min_effect`` is
        measured again too: it does not yet show that the bad endpoint is *not* slower.

        None when an endpoint cannot be measured (its reason is in ``skips``).
        """
        pending = [self.good_sha, self.bad_sha]
        while pending:
            self._measure(pending)
            if any(sha in self.skips for sha in (self.good_sha, self.bad_sha)):
                return None
            self.endpoints = stats.compare_samples(self.samples(self.good_sha), self.samples(self.bad_sha),
                                                   min_effect=self.min_effect, alpha=self.alpha)
            if not self._needs_more(self.endpoints):
                break
            pending = [sha for sha in (self.good_sha, self.bad_sha) if self.run_counts[sha] < self.max_runs]
        return self.endpoints

    def _needs_more(self, comparison: stats.Comparison) -> bool:
        """Inconclusive, or "unchanged" only for lack of evidence while a material slowdown is still in the CI."""
        if comparison.verdict == "inconclusive":
            return True
        return comparison.verdict == "unchanged" and not comparison.ci_high <= 1.0 + self.min_effect

    def classification(self, sha: str, final: bool) -> Classification | None:
        """The commit's classification from its pooled samples; None while inconclusive and not ``final``."""
        if sha in self.skips:
            return Classification("skip", self.skips[sha], runs=self.run_counts.get(sha, 0))
        good, bad, probe = self.samples(self.good_sha), self.samples(self.bad_sha), self.samples(sha)
        call = classify_perf(good, bad, probe, min_effect=self.min_effect, alpha=self.alpha)
        runs = self.run_counts.get(sha, 0)
        if call.state != "inconclusive":
            return Classification(call.state, "", call.vs_good, call.vs_bad, len(probe), runs)
        if not final:
            return None
        state = nearest_endpoint(good, bad, probe)
        why = f"inconclusive after {runs} run(s), {len(probe)} samples: nearer the {state} endpoint"
        return Classification(state, why, call.vs_good, call.vs_bad, len(probe), runs, weak=True)

    def __call__(self, shas: Sequence[str]) -> dict[str, Classification]:
        decided: dict[str, Classification] = {}
        pending = list(shas)
        while pending:
            self._measure(pending)
            again = []
            for sha in pending:
                verdict = self.classification(sha, final=self.run_counts[sha] >= self.max_runs)
                if verdict is None:
                    again.append(sha)
                else:
                    decided[sha] = verdict
            pending = again
        return decided

    def evidence(self, before: str, after: str) -> stats.Comparison | None:
        """``after`` against ``before`` (ratio = after / before) on their pooled samples, if both have some."""
        base, head = self.samples(before), self.samples(after)
        if not base or not head:
            return None
        return stats.compare_samples(base, head, min_effect=self.min_effect, alpha=self.alpha)
