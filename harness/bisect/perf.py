r"""Performance probes: a run's trials, the runs of a commit that agree, the between-run floor, a probe's class.

Pure, like :mod:`harness.bisect.search`: the trials arrive as plain sample tuples.  The prober that measures
commits with these pieces, runs undecided ones again and confirms the bounds is :mod:`harness.bisect.prober`.

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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from harness.bisect.search import SetAside
from harness.core import defaults
from harness.stats import decide, runshift, trials
from harness.stats.policy import NOISE_FLOOR

__all__ = [
    "OUTLIER_SDS",
    "Measured",
    "MeasureFn",
    "PerfCall",
    "RunTrials",
    "TrialSamples",
    "agreeing_runs",
    "classify_perf",
    "compare_sides",
    "count_trials",
    "describe",
    "flat_trials",
    "nearest_endpoint",
    "rough_run_sd",
    "run_floor",
]

_SAME = ("unchanged", "inconclusive")  # no material difference shown (see the module docstring)
_CHANGED = ("regressed", "improved")


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


def flat_trials(runs: Sequence[RunTrials]) -> list[tuple[float, ...]]:
    """Every trial of the runs, in order: one sample tuple per process."""
    return [trial for run in runs for trial in run.trials]


def count_trials(runs: Sequence[RunTrials]) -> int:
    """The trials of the runs with at least one valid (finite, positive) sample."""
    return sum(1 for trial in flat_trials(runs) if _valid(trial).size)


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


def compare_sides(base: TrialSamples, head: TrialSamples, *, runs: tuple[int, int] = (1, 1),
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
    vs_good = compare_sides(good, probe, runs=(runs[0], runs[2]), floor=floor, min_effect=min_effect, alpha=alpha)
    vs_bad = compare_sides(bad, probe, runs=(runs[1], runs[2]), floor=floor, min_effect=min_effect, alpha=alpha)
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
        against = compare_sides(flat_trials([runs[k] for k in kept]), runs[i].trials, runs=(len(kept), 1),
                                min_effect=band, alpha=alpha)
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
OUTLIER_SDS = 3.0  # runs of one commit further apart than this many rough sds are not mere run-to-run drift


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
