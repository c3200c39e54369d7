r"""Verdicts at trial level: the noise between processes and runs, not only inside one process.

Why trials
==========

``harness.core.stats`` compares the ~10 samples of one process with the ~10 of another and treats their
spread as the whole noise.  On real hardware it is not.  Three runs of one commit on an H200 (see
``shared/data/h200-null``): a series' run median moves 4.0 % between runs (median over series; p90
12.9 %), about 5x the standard error of a 10-sample median inside one run (log-sample sd 2.6 %).  Each
process lands on a level of its own (clock state, memory placement, the allocator, caches of compiled
kernels, ...) and keeps it for all its samples, so the samples of one process are not independent draws of
the commit's speed.  Mann-Whitney on those samples answers "were these two *processes* different?", which
they often are: identical code came out regressed or improved in 47 % of the series.

So each benchmark job is measured in R (``defaults.TRIALS`` = 3) independent fresh processes per run,
*trials*, interleaved in rounds, and this module decides from the spread *between* trials.  Everything is
a pure function of its inputs (no randomness at all), like ``stats``.

Model
=====

1. Trial values
---------------

A trial's value is :math:`x = \log \mathrm{median}(\text{its samples})`, after dropping non-finite and
non-positive samples (a trial left with no sample is dropped).  The median makes a trial immune to a few
slow samples; the log makes a relative change an additive shift and the noise homoscedastic across kernels
of very different speed.  For one series, side :math:`j` (base, head) has :math:`R_j` trials and the
estimate :math:`\bar x_j` = the mean of its trial values; the effect is :math:`d = \bar x_h - \bar x_b`,
``ratio`` :math:`= e^d` (head / base, > 1 is a slowdown).  With ~10 samples a trial's median is close
to normal in logs, and between-process levels are what vary, so the mean of trial values is the efficient
estimate; a whole outlier trial is not hidden, it inflates the spread below (the test gets conservative,
not wrong).

Between-trial variance of the series: the pooled variance of trial values about their side means,

.. math::

   s^2 = \frac{\sum_b (x - \bar x_b)^2 + \sum_h (x - \bar x_h)^2}{f}, \qquad f = (R_b - 1) + (R_h - 1).

It contains the within-trial noise (a median of n samples adds about :math:`\pi\sigma_w^2/2n`) as well as
the between-process part, so nothing is counted twice and nothing is left out.

2. Moderation across series (empirical Bayes)
---------------------------------------------

With 3 + 3 trials, :math:`s^2` has only 4 degrees of freedom: one series in seven has :math:`s^2` below a
third of its true value, and a series whose trials happen to agree would be declared significant on any
small shift.  The series of one call share a machine and a protocol, so their variances are related; we
borrow strength as limma does (Smyth 2004, "Linear models and empirical Bayes methods for assessing
differential expression in microarray experiments").  Model: :math:`\sigma_i^2 \sim s_0^2 d_0 /
\chi^2_{d_0}` (a scaled inverse chi-square prior) and :math:`s_i^2 \mid \sigma_i^2 \sim \sigma_i^2
\chi^2_{f_i} / f_i`.  Then :math:`\log s_i^2` has mean :math:`\log s_0^2 + \psi(f_i/2) - \log(f_i/2) -
\psi(d_0/2) + \log(d_0/2)` and variance :math:`\psi'(f_i/2) + \psi'(d_0/2)`, which gives the moment
estimates (limma's ``fitFDist``): with :math:`e_i = \log s_i^2 - \psi(f_i/2) + \log(f_i/2)`,

.. math::

   \psi'(d_0/2) = \widehat{\mathrm{Var}}(e) - \overline{\psi'(f_i/2)}, \qquad
   s_0^2 = \exp\bigl(\bar e + \psi(d_0/2) - \log(d_0/2)\bigr),

solving for :math:`d_0` by Newton's method on the trigamma function.  When the spread of :math:`\log
s^2` is no more than sampling alone explains, :math:`d_0 = \infty` (all series share one variance).  The
posterior variance and its degrees of freedom are

.. math::

   \tilde s_i^2 = \frac{d_0 s_0^2 + f_i s_i^2}{d_0 + f_i}, \qquad \tilde f_i = d_0 + f_i,

and the test uses Student t with :math:`\tilde f_i`.  Clamps: :math:`d_0 \le \sum_i f_i` (a prior
estimated from the series cannot carry more information than they hold, which also keeps
:math:`d_0 = \infty` finite); exactly zero variances are offset to :math:`10^{-5}` x their median, as in
limma, so that a lucky series cannot drive the spread estimate; at least 3 series with :math:`f_i \ge 1`
are needed, else there is no moderation (:math:`d_0 = 0`).  A series with :math:`f_i = 0` (one trial per
side) does *not* get the prior: it has shown none of its own noise, and the series differ too much (sd of
log sd about 0.9 on the H200) for the grid's typical variance to stand in for it.  Without a history
floor (next section) it is ``inconclusive`` (basis ``none``), asking for enough trials that each side has
3 (``defaults.TRIALS``).  Why moderate at all, then: a series with its own spread is shrunk towards the
grid, which stops the "two trials agreed exactly" false alarm while keeping a genuinely noisy series
noisy.

3. History floor
----------------

Trials of one run share that run's conditions (machine state, driver, thermal state, the other jobs of
the round), so their spread can understate how far a whole run moves.  The base branch's history measures
that directly: ``history_floor`` takes a series' run medians on the base branch (one value per run,
measured the same way as a side estimate here, i.e. with the same R) and returns their robust sd in logs,
:math:`1.4826 \cdot \mathrm{MAD}` times a small-sample factor that makes it mean-unbiased for normal data
(Monte Carlo, 4e5 draws: 1.196, 1.488, 1.361, 1.215, 1.191, 1.138, 1.127, 1.101 for n = 2..9; then
:math:`n/(n - 0.8)`).  A MAD ignores one wild run in three; the mean-unbiased factor is larger than the
variance-unbiased one, so the floor errs on the wide side.  Unless ``same_session``, the standard error
of :math:`d` is

.. math::

   \mathrm{SE}^2 = \max\Bigl(\tilde s^2 \bigl(\tfrac1{R_b} + \tfrac1{R_h}\bigr),\;
   s_{floor}^2 \bigl(\tfrac1{N_b} + \tfrac1{N_h}\bigr)\Bigr),

with :math:`(N_b, N_h)` = ``runs[key]`` the distinct runs behind each side (default (1, 1)).  When the
floor term wins the basis is ``history`` and the degrees of freedom are ``floor.runs - 1`` (at least 1); a
series with :math:`f = 0` but a floor is decided on the floor alone.  ``same_session`` (variant against
default, interleaved in one run) ignores floors: both sides share every run-level effect, which cancels.

*No floor, separate runs* (``separate_runs``: ``harness compare`` of runs or commits, the regression list).  The
trials of one run share its conditions, so a shift of the whole run is not in their spread: in CI, two runs of one
commit, 4 trials a side, under a load that lasted a whole run came out "regressed" x1.19, interval [1.04, 1.35],
and in another run both of its series "improved" (x0.87, x0.80), rank check passed.  Such a shift moves every
series of the run alike, a code change only the kernels it touches.  One rule, whatever the runs behind each side
(1, 2 or more): a series' between-run noise is either *measured* (a history floor, ``FLOOR_MIN_RUNS`` runs of the
base branch) or its verdict is *held*: a flag must also stand out from the median effect :math:`c` of the other
series measured in the same runs (the chip's).  Two runs of a side are no measure: their trials hold one draw of
the run effect each (on a loaded 2-core machine a second base run of one commit let an untouched kernel through as
"improved" x0.808 [0.678, 0.964]).  Each series also strays from :math:`c` by a run effect of its own (a load
phase over its jobs); the others' scatter about :math:`c` measures that: :math:`\tau` = 1.4826 x MAD of their
:math:`d_j - c`, small-n corrected.  The flag's :math:`d - c` is tested with variance
:math:`\max(\mathrm{SE}^2, \tau^2) + \mathrm{Var}(c)`, :math:`\mathrm{Var}(c)` = the mean of
:math:`\max(\mathrm{SE}_j^2, \tau^2)` / k (x pi/2 for k >= 3, a median's), on the degrees of freedom of the
larger term (the scatter's: k - 1), BH across the flags so tested, and its interval must clear the band in the
flag's direction.  Else it is ``inconclusive`` with ``run_shift`` = exp(c) (nan without other series) and
``more_runs_needed`` = the base runs that would give it a floor (``FLOOR_MIN_RUNS`` less those its history has).
With fewer than two other series nothing measures the scatter, so every verdict is held, ``unchanged`` too: one
or two series cannot tell a change from a shifted run (under load on 2 cores a real 2x slowdown of a one-series
suite came out "unchanged" x1.12 from one run a side); ``harness compare --settle`` measures both commits
interleaved instead, where run effects cancel.  A change of every series alike (a compiler flag) is inconclusive
until a floor exists, which is the honest answer from one run a side.

4. Test, interval, multiplicity, decision
-----------------------------------------

:math:`t = d / \mathrm{SE}`, two-sided p from Student t with the degrees of freedom in use; the interval
is :math:`\exp(d \mp t_{1-\alpha/2,\,df}\,\mathrm{SE})`, marginal like ``stats``'.  The raw p-values of
all tested series of the call go through Benjamini-Hochberg (``scipy.stats.false_discovery_control``),
then ``stats``' rules 2-6 (``stats._decide``) decide with the adjusted p-value: regressed / improved need
significance *and* the whole interval beyond the band :math:`[1-m, 1+m]`; unchanged means interval inside
the band, or not significant *and* an interval that contains 1; a significant change straddling the band is
inconclusive, and so is a change whose own interval excludes 1 and leaves the band but that does not survive
BH (on the H200 a planted 5-15 % slowdown of a 50 us kernel came out so: CI [1.03, 1.30], p(BH) 0.06 --
"unchanged" would be wrong and sure of itself).  Two sides measured differently (timed in different modes)
are ``incomparable``: inconclusive, outside the family, no trials settle it.  Rule 1 becomes
"no evidence of spread": a side with no valid trial, or :math:`f = 0` without a floor, is
``inconclusive`` with ``p_value`` nan and stays out of the BH family, as do ``broken`` series.

*Rank check.* A series judged on its own trials alone (no moderation prior: fewer than 3 series of the call show
their own spread; basis ``trials``) is flagged only if its trial values also separate by rank: the two-sided
Mann-Whitney p-value (exact at these sizes) is at most :math:`\alpha`.  The t-test's 4 degrees of freedom trust
normal trial values; on a machine whose load switches on and off at random the trials are a mixture of levels, and
3 + 3 trials that split by load look like a change (CI, an A/B of identical code: "improved" x0.90, interval
[0.85, 0.95]).  The rank check holds its level for any distribution that treats both sides alike; it needs
``min_trials_alone`` = 4 trials per side at :math:`\alpha` = 0.05 (2 / C(8, 4) = 0.029), so with fewer it
turns the flag into ``inconclusive`` asking for the rest.  Moderated series borrow the grid's spread, and a load
pattern spreads over the whole grid's trials, so they keep the t-test alone.

*more_trials_needed* (per side; 0 unless inconclusive; capped at ``MAX_MORE_TRIALS`` = 100, "not
resolvable in practice"; ``more_samples_needed`` carries the same number for older readers): for a
straddle, the smallest N trials per side at which :math:`t_{1-\alpha/2,\,d_0 + 2(N-1)} \cdot
\sqrt{\max(\tilde s^2 \cdot 2/N,\ \text{floor term})}` is below the distance from :math:`d` to the
nearest band edge, minus what the smaller side has.  It takes the observed effect at face value (the
winner's curse makes it a lower bound).  A straddle decided on the floor cannot be narrowed by trials of
the same runs: it gets the cap (it needs more runs).  For "no spread": :math:`\max(1, 3 - \min(R_b, R_h))`.

*detectable*: the smallest relative change this comparison finds significant with 80 % power,
:math:`\exp\bigl((t_{1-\alpha/2,\,df} + z_{0.8})\,\mathrm{SE}\bigr) - 1` -- e.g. 3 + 3 trials at 1 %
between-trial sd and 4 df detect about 3.0 %.  It ignores the BH adjustment (optimistic for a lone change
among many tested series) and the band: a *flag* also needs the interval beyond :math:`1 \pm m`, so the
change flagged with 80 % power is about :math:`(1 + m)(1 + \text{detectable}) - 1`.

5. Variants and the noise meter
-------------------------------

``variant_trials_grid`` compares each variant with the default of the same cell, measured interleaved in
one run (``same_session``): win = improved, lose = regressed, tie = unchanged, mapped like
``stats.variant_verdict_grid``.  ``noise_meter`` summarises one series' noise at each level -- within a
trial (pooled 1.4826 x MAD of log samples about each trial's median), between trials (sd of log trial
medians), between runs (the floor) -- and the change it could detect against itself at its trial count.

Calibration (``scripts/validate_stats.py``)
===========================================

Real H200 null runs (87 series in all three runs).  Two runs against one, for each choice of head run:
0 of 261 comparisons flagged, all unchanged; the old rule flags 32 %, asv's rule 17 %, a plain Mann-Whitney
58 %.  One run against one: all inconclusive (basis none), as they must be (old rule: 44-47 % flagged).  The
price is honest: with 2 + 1 single-process runs of this noise the median detectable change is 21 %, so
planted 5 % and 10 % shifts are not found either.  Synthetic two-level noise (between-trial sd lognormal,
median 4.0 %, p90 12.9 %; within 2.6 %; 3 trials a side; 5 x 300 series per cell): 0 % false alarms
(old rule 16 %), recall 0 / 0 / 7 % at 3 / 5 / 10 % steps (median detectable 9.9 %) -- the between-process
noise, not the rule, is the limit; with a quieter protocol (0.5 % between trials) 0.07 % false alarms and
recall 2 / 78 / 99 %.  A run-level shift shared by one side's trials (sd = the between-trial sd) raises
false alarms to 3.5 % without a floor and 0.13 % with a 10-run one: that is what the floor is for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from scipy import special

from harness.core import defaults, distributions, stats
from harness.core.stats import _MAD_TO_SIGMA, _NOISE_FLOOR, _as_variant_verdict, _decide, _log_spread

__all__ = [
    "BASES",
    "FLOOR_MIN_RUNS",
    "MAX_MORE_TRIALS",
    "Floor",
    "NoiseMeter",
    "TrialComparison",
    "Trials",
    "Measured",
    "compare_measured",
    "compare_trials",
    "concat_measured",
    "history_floor",
    "lacks_run_noise",
    "measure",
    "MIN_SERIES_TO_MODERATE",
    "min_trials_alone",
    "noise_meter",
    "variant_measured_grid",
    "variant_trials_grid",
]

K = TypeVar("K", bound=Hashable)
Trials = Sequence[stats.Samples]  # one inner sequence of raw samples (seconds per call) per trial (process)

BASES = ("trials", "history", "none", "incomparable")
MAX_MORE_TRIALS = 100
FLOOR_MIN_RUNS = 3  # history_floor: fewer runs on the base branch give no floor
_POWER = 0.8
MIN_SERIES_TO_MODERATE = 3
_ZERO_VARIANCE_OFFSET = 1e-5  # limma: exactly-zero variances -> 1e-5 x the median variance
# Mean-unbiasing factors for 1.4826 x MAD of n normal values (Monte Carlo, 4e5 draws each); n/(n-0.8) beyond
_MAD_SMALL_N = {2: 1.196, 3: 1.488, 4: 1.361, 5: 1.215, 6: 1.191, 7: 1.138, 8: 1.127, 9: 1.101}


def _default_trials() -> int:
    return int(getattr(defaults, "TRIALS", 3))


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    """A series' between-run noise from its history on the base branch."""

    sd: float  # robust sd of log run medians
    runs: int  # how many runs it came from


@dataclass(frozen=True)
class TrialComparison(stats.Comparison):
    """Head vs base of one series from trials; the ``stats.Comparison`` fields keep their meaning.

    ``ratio`` = exp(mean log trial median of head - that of base); ``n_base`` / ``n_head`` count valid
    samples, ``trials_base`` / ``trials_head`` valid trials.  ``basis`` says which spread decided
    (``trials``, ``history`` or ``none``), ``noise`` is that spread (log sd per trial or per run) and
    ``detectable`` the smallest relative change this comparison finds significant with 80 % power.
    """

    trials_base: int = 0
    trials_head: int = 0
    more_trials_needed: int = 0
    basis: str = ""
    noise: float = math.nan
    detectable: float = math.nan
    more_runs_needed: int = 0  # of the base, where trials cannot settle it: its between-run noise is unknown
    run_shift: float = math.nan  # held against the common shift of its run (ratio; nan: no other series to tell)


@dataclass(frozen=True)
class NoiseMeter:
    """One series' noise at each level, in log sd (~ relative sd)."""

    within: float  # pooled robust sd of log samples inside a trial
    between_trial: float  # sd of log trial medians
    between_run: float  # the history floor's sd
    trials: int
    detectable: float  # smallest relative change detectable against itself at this many trials per side


# ---------------------------------------------------------------------------
# History floor
# ---------------------------------------------------------------------------


def _mad_correction(n: int) -> float:
    return _MAD_SMALL_N.get(n, n / (n - 0.8))


def history_floor(run_medians: Sequence[float], min_runs: int = FLOOR_MIN_RUNS) -> Floor | None:
    """Robust sd of the log run medians (1.4826 x MAD, small-n corrected); None below ``min_runs`` valid runs."""
    values = np.asarray(run_medians, dtype=np.float64).ravel()
    values = values[np.isfinite(values) & (values > 0)]
    if values.size < max(min_runs, 2):
        return None
    logs = np.log(values)
    mad = float(np.median(np.abs(logs - np.median(logs))))
    sd = _MAD_TO_SIGMA * mad * _mad_correction(int(values.size))
    return Floor(max(sd, _NOISE_FLOOR), int(values.size))


# ---------------------------------------------------------------------------
# Per-series trial summaries
# ---------------------------------------------------------------------------


def _valid_trials(trials: Trials) -> list[npt.NDArray[np.float64]]:
    kept = [stats._positive_finite(trial) for trial in trials]
    return [trial for trial in kept if trial.size]


@dataclass(frozen=True)
class Measured:
    """Per-series arrays (one entry per series, in call order): what ``measure`` takes of each pair's trials, all a
    comparison reads of them (``compare_measured``)."""

    trials_base: npt.NDArray[np.int64]
    trials_head: npt.NDArray[np.int64]
    samples_base: npt.NDArray[np.int64]
    samples_head: npt.NDArray[np.int64]
    effect: npt.NDArray[np.float64]  # d = mean log head - mean log base (nan if a side has no trial)
    variance: npt.NDArray[np.float64]  # pooled between-trial variance s^2 (nan when df == 0)
    df: npt.NDArray[np.int64]
    # per series: (base, head) trial values, for the rank check (not kept by vectorised screens that never decide)
    logs: Sequence[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = ()


def _squared_deviations(logs: npt.NDArray[np.float64]) -> float:
    return float(np.sum((logs - logs.mean()) ** 2)) if logs.size else 0.0


def _batch_log_medians(sides: Sequence[Trials]) -> list[tuple[npt.NDArray[np.float64], int]]:
    """Per side: the log median of every valid trial, and the number of valid samples in them. The trials are
    grouped by length, one median per group (a grid's thousands of small per-trial medians cost more in numpy's call
    overhead than in the work)."""
    kept = [_valid_trials(side) for side in sides]
    flat = [trial for side in kept for trial in side]
    medians = np.empty(len(flat))
    by_length: dict[int, list[int]] = {}
    for index, trial in enumerate(flat):
        by_length.setdefault(trial.size, []).append(index)
    for indices in by_length.values():  # valid trials are never empty
        medians[indices] = np.median(np.stack([flat[i] for i in indices]), axis=1)
    logs = np.log(medians)
    out, start = [], 0
    for side in kept:
        out.append((logs[start:start + len(side)], sum(trial.size for trial in side)))
        start += len(side)
    return out


def measure(pairs: Sequence[tuple[Trials, Trials]]) -> Measured:
    """Each (base, head) pair's valid trials: their log medians, counts and pooled spread."""
    return _measure(pairs)


def concat_measured(parts: Sequence[Measured]) -> Measured:
    """The series of ``parts``, in order, as one ``Measured`` (each part's series measured alone: the same values)."""
    def joined(name: str, dtype: type) -> npt.NDArray[Any]:
        return np.concatenate([getattr(part, name) for part in parts]) if parts else np.zeros(0, dtype=dtype)

    return Measured(trials_base=joined("trials_base", np.int64), trials_head=joined("trials_head", np.int64),
                    samples_base=joined("samples_base", np.int64), samples_head=joined("samples_head", np.int64),
                    effect=joined("effect", np.float64), variance=joined("variance", np.float64),
                    df=joined("df", np.int64), logs=[pair for part in parts for pair in part.logs])


def _measure(pairs: Sequence[tuple[Trials, Trials]]) -> Measured:
    measured = _batch_log_medians([side for pair in pairs for side in pair])
    sides = list(zip(measured[0::2], measured[1::2], strict=True))
    trials_base = np.array([b[0].size for b, _ in sides], dtype=np.int64)
    trials_head = np.array([h[0].size for _, h in sides], dtype=np.int64)
    with np.errstate(invalid="ignore"):
        effect = np.array(
            [h[0].mean() - b[0].mean() if b[0].size and h[0].size else math.nan for b, h in sides], dtype=np.float64
        )
        df = np.maximum(trials_base - 1, 0) + np.maximum(trials_head - 1, 0)
        squares = np.array([_squared_deviations(b[0]) + _squared_deviations(h[0]) for b, h in sides])
        variance = np.where(df > 0, squares / np.maximum(df, 1), math.nan)
    return Measured(
        trials_base=trials_base,
        trials_head=trials_head,
        samples_base=np.array([b[1] for b, _ in sides], dtype=np.int64),
        samples_head=np.array([h[1] for _, h in sides], dtype=np.int64),
        effect=effect,
        variance=variance,
        df=df,
        logs=[(b[0], h[0]) for b, h in sides],
    )


# ---------------------------------------------------------------------------
# Empirical-Bayes moderation (limma's fitFDist, moment method)
# ---------------------------------------------------------------------------


def _trigamma_inverse(value: float) -> float:
    """y with trigamma(y) = value (> 0), by limma's Newton iteration."""
    if value > 1e7:
        return 1.0 / math.sqrt(value)
    if value < 1e-6:
        return 1.0 / value
    y = 0.5 + 1.0 / value
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1.0 - tri / value) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


@dataclass(frozen=True)
class _Prior:
    variance: float  # s0^2
    df: float  # d0; 0 = no moderation


_NO_PRIOR = _Prior(math.nan, 0.0)


def _fit_prior(variance: npt.NDArray[np.float64], df: npt.NDArray[np.int64]) -> _Prior:
    usable = (df >= 1) & np.isfinite(variance)
    if int(usable.sum()) < MIN_SERIES_TO_MODERATE:
        return _NO_PRIOR
    s2, f = variance[usable], df[usable].astype(np.float64)
    middle = float(np.median(s2))
    s2 = np.maximum(s2, _ZERO_VARIANCE_OFFSET * middle if middle > 0 else _NOISE_FLOOR**2)
    e = np.log(s2) - special.digamma(f / 2) + np.log(f / 2)
    excess = float(np.var(e, ddof=1) - np.mean(special.polygamma(1, f / 2)))
    most = float(f.sum())
    d0 = min(2.0 * _trigamma_inverse(excess), most) if excess > 0 else most
    s0_squared = math.exp(float(e.mean()) + float(special.digamma(d0 / 2)) - math.log(d0 / 2))
    return _Prior(s0_squared, d0)


def _moderate(measured: Measured, prior: _Prior) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Posterior variance and its df; series with df == 0 keep nan (they do not get the prior)."""
    df = measured.df.astype(np.float64)
    if prior.df > 0:
        with np.errstate(invalid="ignore"):
            variance = (prior.df * prior.variance + df * measured.variance) / (prior.df + df)
        total_df = df + prior.df
    else:
        variance, total_df = measured.variance.copy(), df
    own = measured.df >= 1
    variance = np.where(own, np.maximum(variance, _NOISE_FLOOR**2), math.nan)
    return variance, np.where(own, total_df, 0.0)


# ---------------------------------------------------------------------------
# Standard error: trials or history floor
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spread:
    se: npt.NDArray[np.float64]  # nan where untested
    df: npt.NDArray[np.float64]
    noise: npt.NDArray[np.float64]
    basis: list[str]
    floor_variance: npt.NDArray[np.float64]  # the floor term of SE^2 (0 without a floor)
    floor_df: npt.NDArray[np.float64]


def _floor_terms(
    keys: Sequence[K], floors: Mapping[K, Floor] | None, runs: Mapping[K, tuple[int, int]] | None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per series: the floor term of SE^2 (0 without a floor), its df and the floor sd (nan without)."""
    floors, runs = floors or {}, runs or {}
    term, df, sd = np.zeros(len(keys)), np.zeros(len(keys)), np.full(len(keys), math.nan)
    for i, key in enumerate(keys):
        floor = floors.get(key)
        if floor is None or not math.isfinite(floor.sd) or floor.sd <= 0:
            continue
        base_runs, head_runs = runs.get(key, (1, 1))
        term[i] = floor.sd**2 * (1.0 / max(base_runs, 1) + 1.0 / max(head_runs, 1))
        df[i], sd[i] = max(1.0, floor.runs - 1.0), floor.sd
    return term, df, sd


def lacks_run_noise(floor_term: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Per series of a comparison of separate runs: no history floor, whatever the runs behind each side. Trials of
    a run share its conditions, and trials pooled from two runs of a side hold one draw of the between-run noise per
    run, too few to measure it (a floor needs ``FLOOR_MIN_RUNS``); so a shift of a whole run, or of one series in it,
    is measured (the floor) or held (module docstring, "No floor, separate runs"). In CI a second base run of one
    commit turned the hold off: an untouched kernel came out "improved" x0.808 [0.678, 0.964]."""
    return floor_term <= 0


def _scatter(deviations: npt.NDArray[np.float64]) -> float:
    """Robust sd (1.4826 x MAD about 0, small-n corrected) of the other series' effects about their common shift:
    how far one series' run-level effect strays from its run's, on this machine now; nan below 2 series."""
    if deviations.size < 2:
        return math.nan
    mad = float(np.median(np.abs(deviations)))
    return _MAD_TO_SIGMA * mad * _mad_correction(int(deviations.size))


@dataclass(frozen=True)
class _Beyond:
    """One series' effect beyond its run's common shift (``_beyond_shift``)."""

    shift: float  # the common shift exp(c); nan without other series
    p_value: float  # two-sided, of d - c; nan where nothing tells (fewer than two other series)
    low: float  # interval of exp(d - c)
    high: float


def _beyond_shift(i: int, others: Sequence[int], effect: npt.NDArray[np.float64], se: npt.NDArray[np.float64],
                  df: npt.NDArray[np.float64], alpha: float) -> _Beyond:
    """Series ``i``'s effect against the common shift of its run, the median effect ``c`` of the ``others`` measured
    in the same runs. Each series of a run also strays from ``c`` by a run-level effect of its own (a load phase over
    its jobs), which no trial spread holds: the others' scatter about ``c`` measures it, so ``d - c`` is tested with
    the larger of its own variance and that scatter's, on the degrees of freedom of the larger (``k - 1`` for the
    scatter). With
    fewer than two other series nothing tells a change from a shift of the whole run or of the series in it."""
    if len(others) < 2:
        return _Beyond(math.exp(float(effect[others[0]])) if others else math.nan, math.nan, math.nan, math.nan)
    members = list(others)
    centre = float(np.median(effect[members]))
    k = len(members)
    scatter = _scatter(effect[members] - centre) ** 2
    null_variance = np.maximum(se[members] ** 2, scatter)
    # the variance of a median of k estimates: (pi / 2) x that of their mean for large k; a mean up to 2
    centre_variance = (math.pi / 2 if k >= 3 else 1.0) * float(np.mean(null_variance)) / k
    se_beyond = math.sqrt(max(float(se[i]) ** 2, scatter) + centre_variance)
    beyond = float(effect[i]) - centre
    by_scatter = scatter > float(se[i]) ** 2  # as the floor: the larger term gives the degrees of freedom
    df_i = np.array([min(float(df[i]), k - 1.0) if by_scatter else float(df[i])])
    p_value = float(2.0 * distributions.t_sf(np.array([abs(beyond) / se_beyond]), df_i)[0])
    half = float(distributions.t_ppf(1.0 - alpha / 2.0, df_i)[0]) * se_beyond
    return _Beyond(math.exp(centre), p_value, math.exp(beyond - half), math.exp(beyond + half))


def _hold_run_shifts(keys: Sequence[K], result: dict[K, TrialComparison], measured: Measured, spread: _Spread,
                     unmeasured: npt.NDArray[np.bool_], in_family: npt.NDArray[np.bool_],
                     groups: Mapping[K, Hashable] | None, history_runs: Mapping[K, int] | None,
                     runs_base: npt.NDArray[np.int64], settings: _Settings) -> None:
    """A flag of a series without between-run noise (``unmeasured``: no floor) must also stand out from its run's
    common shift (``_beyond_shift``, BH across the flags so tested; ``groups``:
    series of one value share their runs, default all) with its interval beyond the band in the flag's direction;
    else ``inconclusive``, asking for the base runs that would give it a floor (``FLOOR_MIN_RUNS`` less its
    history's runs). An ``unchanged`` series with fewer than two other series is held too: nothing measures its
    run's noise, so it has no verdict either way."""
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if in_family[i]:
            members.setdefault((groups or {}).get(key), []).append(i)
    tested = [i for i, key in enumerate(keys)
              if unmeasured[i] and in_family[i] and result[key].verdict in ("regressed", "improved")]
    beyond = {i: _beyond_shift(i, [j for j in members.get((groups or {}).get(keys[i]), []) if j != i],
                               measured.effect, spread.se, spread.df, settings.alpha) for i in tested}
    p_values = np.array([beyond[i].p_value for i in tested])
    adjusted = dict(zip(tested, _benjamini_hochberg(p_values, np.isfinite(p_values)), strict=True))
    for i, key in enumerate(keys):
        comparison = result[key]
        if not unmeasured[i] or not in_family[i]:
            continue
        others = [j for j in members.get((groups or {}).get(key), []) if j != i]
        if comparison.verdict == "unchanged":
            # nothing measures its run's noise (no floor, fewer than two other series): no verdict either way
            clear = len(others) >= 2
            found = _Beyond(math.exp(float(measured.effect[others[0]])) if others else math.nan, math.nan,
                            math.nan, math.nan)
        elif comparison.verdict in ("regressed", "improved"):
            found = beyond[i]
            if comparison.verdict == "regressed":
                clear = found.low > 1.0 + settings.min_effect and adjusted[i] <= settings.alpha
            else:
                clear = found.high < 1.0 - settings.min_effect and adjusted[i] <= settings.alpha
        else:
            continue
        if not clear:
            known = (history_runs or {}).get(key, int(runs_base[i]))
            result[key] = dataclasses.replace(comparison, verdict="inconclusive", more_samples_needed=0,
                                              more_trials_needed=0, more_runs_needed=max(1, FLOOR_MIN_RUNS - known),
                                              run_shift=found.shift)


def _run_counts(keys: Sequence[K], runs: Mapping[K, tuple[int, int]] | None
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per series: the distinct runs behind the base side and the head side ((1, 1) where not given)."""
    counts = np.array([(runs or {}).get(key, (1, 1)) for key in keys], dtype=np.int64).reshape(len(keys), 2)
    return counts[:, 0], counts[:, 1]


def _spread(
    measured: Measured,
    variance: npt.NDArray[np.float64],
    total_df: npt.NDArray[np.float64],
    floor_term: npt.NDArray[np.float64],
    floor_df: npt.NDArray[np.float64],
    floor_sd: npt.NDArray[np.float64],
) -> _Spread:
    with np.errstate(invalid="ignore", divide="ignore"):
        trial_term = variance * (1.0 / measured.trials_base + 1.0 / measured.trials_head)
    has_sides = np.isfinite(measured.effect)
    by_floor = has_sides & (floor_term > 0) & ~(trial_term >= floor_term)  # a nan trial term loses
    by_trials = has_sides & ~by_floor & np.isfinite(trial_term)
    se = np.where(by_floor, np.sqrt(floor_term), np.where(by_trials, np.sqrt(trial_term), math.nan))
    df = np.where(by_floor, floor_df, np.where(by_trials, total_df, math.nan))
    noise = np.where(by_floor, floor_sd, np.where(by_trials, np.sqrt(variance), math.nan))
    basis = ["history" if f else "trials" if t else "none" for f, t in zip(by_floor, by_trials, strict=True)]
    return _Spread(se, df, noise, basis, floor_term, floor_df)


# ---------------------------------------------------------------------------
# Test, interval, detectable change
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tested:
    p_value: npt.NDArray[np.float64]
    ci_low: npt.NDArray[np.float64]
    ci_high: npt.NDArray[np.float64]
    detectable: npt.NDArray[np.float64]


def _test(effect: npt.NDArray[np.float64], spread: _Spread, alpha: float) -> _Tested:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = np.where(spread.se > 0, effect / spread.se, math.nan)
        p_value = 2.0 * distributions.t_sf(np.abs(t), spread.df)
        quantile = distributions.t_ppf(1.0 - alpha / 2.0, spread.df)
        half = quantile * spread.se
        ci_low, ci_high = np.exp(effect - half), np.exp(effect + half)
        detectable = np.expm1((quantile + distributions.norm_ppf(_POWER)) * spread.se)
    return _Tested(p_value, ci_low, ci_high, detectable)


def _benjamini_hochberg(p_value: npt.NDArray[np.float64], in_family: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    adjusted = np.full(p_value.shape, math.nan)
    if in_family.any():
        adjusted[in_family] = distributions.bh(p_value[in_family])
    return adjusted


def _clamp_more(count: float) -> int:
    if not math.isfinite(count):
        return MAX_MORE_TRIALS
    return int(min(MAX_MORE_TRIALS, max(1, math.ceil(count))))


def _more_trials_to_clear_band(
    effect: float,
    variance: float,
    prior_df: float,
    floor_term: float,
    floor_df: float,
    have: tuple[int, int],
    *,
    min_effect: float,
    alpha: float,
) -> int:
    """Trials per side (beyond the smaller side's) at which the interval clears the nearest band edge."""
    edges = (math.log1p(min_effect), math.log1p(-min_effect) if min_effect < 1 else -math.inf)
    distance = min(abs(effect - edge) for edge in edges)
    if not distance > 0 or not math.isfinite(variance):
        return MAX_MORE_TRIALS
    per_side = np.arange(1, MAX_MORE_TRIALS + max(have) + 1, dtype=np.float64)
    trial_term = variance * 2.0 / per_side
    by_trials = trial_term >= floor_term
    df = np.where(by_trials, prior_df + 2.0 * (per_side - 1.0), floor_df)
    with np.errstate(invalid="ignore"):
        half = distributions.t_ppf(1.0 - alpha / 2.0, df) * np.sqrt(np.maximum(trial_term, floor_term))
    clears = np.flatnonzero(half < distance)
    if clears.size == 0:
        return MAX_MORE_TRIALS
    return _clamp_more(per_side[clears[0]] - min(have))


def min_trials_alone(alpha: float = defaults.ALPHA) -> int:
    """Trials per side at which a series judged on its own spread can pass the rank check at level ``alpha``:
    the smallest n whose perfect separation of n against n trials has exact two-sided p = 2 / C(2n, n) <= alpha."""
    n = 2
    while 2.0 / math.comb(2 * n, n) > alpha:
        n += 1
    return n


def rank_p_value(base: npt.NDArray[np.float64], head: npt.NDArray[np.float64]) -> float:
    """Two-sided Mann-Whitney p-value of two sides' trial values (exact for small sides): distribution-free."""
    if base.size < 1 or head.size < 1:
        return math.nan
    from scipy import stats as scipy_stats  # ~1 s to load: only for a one-process comparison

    return float(scipy_stats.mannwhitneyu(head, base, alternative="two-sided").pvalue)


def _no_spread_more(have: tuple[int, int]) -> int:
    return max(1, _default_trials() - min(have))


# ---------------------------------------------------------------------------
# Public comparisons
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    min_effect: float
    alpha: float


@dataclass(frozen=True)
class _Row:
    """Everything known about one series before the BH step."""

    effect: float
    tested: bool
    p_value: float
    ci: tuple[float, float]
    counts: tuple[int, int, int, int]  # samples base/head, trials base/head
    basis: str
    noise: float
    detectable: float
    variance: float
    floor: tuple[float, float]  # floor term of SE^2, floor df
    rank_p: float = math.nan  # set only where the series is judged on its own spread alone (see _lacks_rank_support)


def _lacks_rank_support(row: _Row, settings: _Settings) -> bool:
    """A flag decided on the series' own trials alone (no moderation prior; its trials' spread, not a history floor,
    decided) whose trials do not separate beyond chance by rank. Four degrees of freedom of a t-test trust normal
    trial values; under load that switches on and off at random they are a mixture, and 3 + 3 trials that happen to
    split by load look like a change: in CI, an A/B of identical code came out "improved" x0.90, interval
    [0.85, 0.95]."""
    return math.isfinite(row.rank_p) and not row.rank_p <= settings.alpha


def _shows_a_change(ci: tuple[float, float], min_effect: float) -> bool:
    """The series' own interval excludes 1 and leaves the band: a change that did not survive the multiplicity
    correction. Not "unchanged" (measured on the H200: a planted 5-15 % slowdown with CI [1.03, 1.30] and
    p(BH) 0.06), but "inconclusive", with the trials that would settle it."""
    low, high = ci
    inside_band = 1.0 - min_effect <= low and high <= 1.0 + min_effect
    return not inside_band and (low > 1.0 or high < 1.0)


def _decide_row(row: _Row, p_adjusted: float, prior_df: float, settings: _Settings) -> TrialComparison:
    samples_base, samples_head, trials_base, trials_head = row.counts
    have = (trials_base, trials_head)
    ratio = stats._safe_exp(row.effect) if math.isfinite(row.effect) else math.nan
    if not row.tested:
        verdict, more, p_adjusted = "inconclusive", _no_spread_more(have), math.nan
    else:
        rule = {"min_effect": settings.min_effect, "alpha": settings.alpha}
        verdict, _ = _decide(ratio, *row.ci, p_adjusted, trials_base, trials_head, **rule)
        if verdict == "unchanged" and _shows_a_change(row.ci, settings.min_effect):
            verdict = "inconclusive"
        more = 0
        if verdict in ("regressed", "improved") and _lacks_rank_support(row, settings):
            verdict, more = "inconclusive", max(1, min_trials_alone(settings.alpha) - min(have))
        elif verdict == "inconclusive":
            more = _more_trials_to_clear_band(row.effect, row.variance, prior_df, *row.floor, have, **rule)
    return TrialComparison(
        verdict=verdict,
        ratio=ratio,
        ci_low=row.ci[0],
        ci_high=row.ci[1],
        p_value=row.p_value,
        p_adjusted=p_adjusted,
        n_base=samples_base,
        n_head=samples_head,
        more_samples_needed=more,
        trials_base=trials_base,
        trials_head=trials_head,
        more_trials_needed=more,
        basis=row.basis,
        noise=row.noise,
        detectable=row.detectable,
    )


def _rows(measured: Measured, spread: _Spread, tested: _Tested, variance: npt.NDArray[np.float64],
          alone: bool) -> list[_Row]:
    """``alone``: no moderation prior, so a series on basis ``trials`` is judged on its own trials only."""
    rows = []
    for i in range(measured.effect.size):
        is_tested = spread.basis[i] != "none" and bool(np.isfinite(tested.p_value[i]))
        by_own_trials = alone and is_tested and spread.basis[i] == "trials"
        rows.append(
            _Row(
                effect=float(measured.effect[i]),
                tested=is_tested,
                p_value=float(tested.p_value[i]) if is_tested else math.nan,
                ci=(float(tested.ci_low[i]), float(tested.ci_high[i])) if is_tested else (math.nan, math.nan),
                counts=(
                    int(measured.samples_base[i]),
                    int(measured.samples_head[i]),
                    int(measured.trials_base[i]),
                    int(measured.trials_head[i]),
                ),
                basis=spread.basis[i] if is_tested else "none",
                noise=float(spread.noise[i]) if is_tested else math.nan,
                detectable=float(tested.detectable[i]) if is_tested else math.nan,
                variance=float(variance[i]),
                floor=(float(spread.floor_variance[i]), float(spread.floor_df[i])),
                rank_p=rank_p_value(*measured.logs[i]) if by_own_trials else math.nan,
            )
        )
    return rows


def _broken(comparison: TrialComparison) -> TrialComparison:
    return dataclasses.replace(
        comparison, verdict="broken", p_adjusted=comparison.p_value, more_samples_needed=0, more_trials_needed=0
    )


def _incomparable(comparison: TrialComparison) -> TrialComparison:
    return dataclasses.replace(
        comparison, verdict="inconclusive", p_adjusted=comparison.p_value, more_samples_needed=0,
        more_trials_needed=0, basis="incomparable"
    )


def compare_trials(
    pairs: Mapping[K, tuple[Trials, Trials]],
    *,
    floors: Mapping[K, Floor] | None = None,
    runs: Mapping[K, tuple[int, int]] | None = None,
    same_session: bool = False,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
    rank_check: bool = True,
    separate_runs: bool = False,
    history_runs: Mapping[K, int] | None = None,
    run_groups: Mapping[K, Hashable] | None = None,
) -> dict[K, TrialComparison]:
    """Head vs base of every ``key -> (base trials, head trials)``, from the spread between trials.

    Variances are moderated across the series of the call, the history floor (unless ``same_session``)
    bounds the standard error from below, and Benjamini-Hochberg runs across all tested series; keys in
    ``broken`` get verdict ``broken`` and stay out of the family (and out of the moderation prior).  ``runs``
    gives the distinct runs behind each side, (1, 1) when absent.  Keys in ``incomparable`` (the two sides were
    not measured alike, e.g. timed in different modes) are ``inconclusive`` with basis ``incomparable``, also
    outside the family and the prior: no amount of trials settles them.  ``rank_check``: the rank check of a
    series judged on its own trials alone (module docstring); bisect, whose probes must agree with one endpoint
    and differ from the other on run-level evidence, turns it off.  ``separate_runs``: the sides are separate
    runs (``harness compare``, the regression list): a flag of a series without a floor whose side is a single run
    must stand out from the common shift of the series measured in the same runs (``run_groups``: one value per
    run pair, e.g. the chip; default one group), else it is ``inconclusive`` asking for the base runs that would
    give it a floor, ``FLOOR_MIN_RUNS`` less those of its base branch's history (``history_runs``; default the
    base side's runs).  See the module docstring.
    """
    keys = list(pairs)
    return compare_measured(keys, _measure([pairs[key] for key in keys]), floors=floors, runs=runs,
                            same_session=same_session, min_effect=min_effect, alpha=alpha, broken=broken,
                            incomparable=incomparable, rank_check=rank_check, separate_runs=separate_runs,
                            history_runs=history_runs, run_groups=run_groups)


def compare_measured(
    keys: Sequence[K],
    measured: Measured,
    *,
    floors: Mapping[K, Floor] | None = None,
    runs: Mapping[K, tuple[int, int]] | None = None,
    same_session: bool = False,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
    rank_check: bool = True,
    separate_runs: bool = False,
    history_runs: Mapping[K, int] | None = None,
    run_groups: Mapping[K, Hashable] | None = None,
) -> dict[K, TrialComparison]:
    """``compare_trials`` of the pairs ``measure`` measured, ``keys`` naming them in its order."""
    is_broken, not_alike = set(broken), set(incomparable)
    # The timings of wrong code, or of sides measured differently, say nothing about the noise of the others
    healthy = np.array([key not in is_broken and key not in not_alike for key in keys], dtype=bool)
    prior = _fit_prior(measured.variance, np.where(healthy, measured.df, 0))
    variance, total_df = _moderate(measured, prior)
    floor_term, floor_df, floor_sd = _floor_terms(keys, None if same_session else floors, runs)
    spread = _spread(measured, variance, total_df, floor_term, floor_df, floor_sd)
    tested = _test(measured.effect, spread, alpha)
    rows = _rows(measured, spread, tested, variance, alone=rank_check and prior.df == 0)
    in_family = np.array([row.tested for row in rows], dtype=bool) & healthy
    adjusted = _benjamini_hochberg(np.array([row.p_value for row in rows]), in_family)
    settings = _Settings(min_effect, alpha)
    result: dict[K, TrialComparison] = {}
    for i, (key, row) in enumerate(zip(keys, rows, strict=True)):
        p_adjusted = float(adjusted[i]) if in_family[i] else row.p_value
        comparison = _decide_row(row, p_adjusted, prior.df, settings)
        if key in is_broken:
            comparison = _broken(comparison)
        elif key in not_alike:
            comparison = _incomparable(comparison)
        result[key] = comparison
    if separate_runs and not same_session:
        runs_base, _ = _run_counts(keys, runs)
        _hold_run_shifts(keys, result, measured, spread, lacks_run_noise(floor_term), in_family, run_groups,
                         history_runs, runs_base, settings)
    return result


def variant_trials_grid(
    cells: Mapping[K, tuple[Trials, Trials]],
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
) -> dict[K, stats.VariantVerdict]:
    """Variant vs default per cell ``key -> (default trials, variant trials)``, measured interleaved in one run.

    ``win`` means the variant is faster; BH across all cells; floors do not apply (``same_session``);
    ``incomparable`` cells are ``inconclusive`` (see ``compare_trials``).
    """
    keys = list(cells)
    return variant_measured_grid(keys, _measure([cells[key] for key in keys]), min_effect=min_effect, alpha=alpha,
                                 broken=broken, incomparable=incomparable)


def variant_measured_grid(
    keys: Sequence[K],
    measured: Measured,
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
) -> dict[K, stats.VariantVerdict]:
    """``variant_trials_grid`` of the cells ``measure`` measured (default side first), ``keys`` in its order."""
    comparisons = compare_measured(keys, measured, same_session=True, min_effect=min_effect, alpha=alpha,
                                   broken=broken, incomparable=incomparable)
    return {key: _as_variant_verdict(comparison) for key, comparison in comparisons.items()}


# ---------------------------------------------------------------------------
# Noise meter
# ---------------------------------------------------------------------------


def _detectable_against_itself(between_trial: float, trials: int, floor: Floor | None, alpha: float) -> float:
    """As ``compare_trials``' detectable, for this series against itself: ``trials`` per side, one run each."""
    trial_term = between_trial**2 * 2.0 / trials if trials >= 2 and math.isfinite(between_trial) else math.nan
    if floor is not None and not trial_term >= 2.0 * floor.sd**2:
        variance, df = 2.0 * floor.sd**2, max(1.0, floor.runs - 1.0)
    elif math.isfinite(trial_term):
        variance, df = trial_term, 2.0 * (trials - 1)
    else:
        return math.nan
    quantile = float(distributions.t_ppf(1.0 - alpha / 2.0, df)) + float(distributions.norm_ppf(_POWER))
    return stats._relative_change(quantile * math.sqrt(variance))


def noise_meter(trials: Trials, floor: Floor | None = None, *, alpha: float = defaults.ALPHA) -> NoiseMeter:
    """One series' noise within a trial, between trials and between runs, and what it could detect.

    ``detectable`` compares the series with itself at its trial count per side, one run each (the floor,
    when given, bounds it from below as in ``compare_trials``).
    """
    kept = _valid_trials(trials)
    within = _log_spread(*kept) if kept else math.nan
    logs = np.log(np.array([np.median(trial) for trial in kept], dtype=np.float64))
    between_trial = max(float(np.std(logs, ddof=1)), _NOISE_FLOOR) if logs.size >= 2 else math.nan
    between_run = floor.sd if floor is not None else math.nan
    detectable = _detectable_against_itself(between_trial, logs.size, floor, alpha)
    return NoiseMeter(within, between_trial, between_run, int(logs.size), detectable)
