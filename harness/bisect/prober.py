r"""``PerfProber``: measures commits, runs undecided ones again, and classifies them on their agreeing runs.

It is the ``probe`` and ``confirm`` callback of :func:`harness.bisect.search.search` in perf mode.  Trials, runs
that agree, the between-run floor and the probe rule it applies: :mod:`harness.bisect.perf`.

Endpoints (``PerfProber.confirm``).  Good and bad are measured until the good one has ``CORROBORATE`` (2)
agreeing runs, the bad one ``confirm_runs`` (4, as the culprit: see below; a bad endpoint whose kept runs were
all loaded would make every truly slow commit of a small step look fast), and ``compare_trials(good, bad)``
settles: ``regressed`` (the bisect starts), or ``unchanged`` / ``improved`` with an interval that does not reach
past ``1 + min_effect`` (nothing to bisect).  Inconclusive, or
"unchanged" only for lack of evidence, is measured again up to the cap; if it does not settle the bisect says
so (``endpoints_settled`` False: status ``inconclusive`` in :mod:`harness.bisect.run`) instead of guessing.

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
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.bisect.perf import (
    OUTLIER_SDS,
    MeasureFn,
    RunTrials,
    agreeing_runs,
    classify_perf,
    compare_sides,
    count_trials,
    describe,
    flat_trials,
    nearest_endpoint,
    rough_run_sd,
    run_floor,
)
from harness.bisect.search import Classification, SetAside
from harness.core import defaults
from harness.stats import decide, runshift

__all__ = ["CORROBORATE", "DEFAULT_CONFIRM_RUNS", "DEFAULT_MAX_RUNS", "PerfProber"]

DEFAULT_MAX_RUNS = defaults.BISECT_MAX_RUNS  # new runs of one commit at most
DEFAULT_CONFIRM_RUNS = defaults.BISECT_CONFIRM_RUNS  # agreeing runs the named culprit needs
CORROBORATE = 2  # agreeing runs the endpoints, the last good commit and a commit with a run set aside need


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
            timed = [run for run in m.runs if count_trials([run])]
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
            drift = math.expm1(OUTLIER_SDS * rough) if rough is not None else 0.0
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
            self.endpoints = compare_sides(flat_trials(good.kept), flat_trials(bad.kept),
                                           runs=(len(good.kept), len(bad.kept)), floor=self.floor(),
                                           min_effect=self.min_effect, alpha=self.alpha)
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
        call = classify_perf(flat_trials(good.kept), flat_trials(bad.kept), flat_trials(probe.kept),
                             runs=(len(good.kept), len(bad.kept), len(probe.kept)), floor=self.floor(),
                             min_effect=self.min_effect, alpha=self.confirm_alpha() if confirming else self.alpha)
        need = self.need(call.state, confirming=confirming, aside=bool(probe.aside))
        facts = dict(vs_good=call.vs_good, vs_bad=call.vs_bad, n=sum(run.n for run in probe.kept), runs=runs,
                     trials=count_trials(probe.kept), run_ids=tuple(run.run_id for run in probe.kept),
                     set_aside=probe.aside)
        aside = self._aside_note(probe)
        if call.state != "inconclusive" and len(probe.kept) >= need:
            return Classification(call.state, aside, confirmed=confirming, **facts)
        if not final:
            return None
        nearer = nearest_endpoint(flat_trials(good.kept), flat_trials(bad.kept), flat_trials(probe.kept))
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
        return compare_sides(flat_trials(base.kept), flat_trials(head.kept), runs=(len(base.kept), len(head.kept)),
                             floor=self.floor(), min_effect=self.min_effect, alpha=self.alpha)
