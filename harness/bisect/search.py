r"""The k-ary bisection search: the first bad commit among plain shas, skipping broken commits.

Everything here is pure: commits are plain shas, measurements arrive through callbacks, no I/O, no ORM.  What a
performance probe says is :mod:`harness.bisect.perf` and :mod:`harness.bisect.prober`; the I/O side (running a
commit's suite, reading its stored trials) is :mod:`harness.bisect.run`; the CLI verb is
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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.stats import decide

__all__ = [
    "BisectResult",
    "Classification",
    "Round",
    "SetAside",
    "max_rounds_needed",
    "search",
    "split_points",
]

State = Literal["good", "bad", "skip", "inconclusive"]
Status = Literal["found", "hidden", "stopped", "inconclusive"]


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
