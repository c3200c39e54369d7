r"""Statistics that turn raw benchmark timing samples into verdicts.

Everything here is a pure function: sequences / numpy arrays of timings in,
frozen dataclasses out.  No I/O, no ORM, no global state; randomness (the
bootstrap) is seeded per call, so equal inputs always give equal outputs.

Vocabulary
==========

A *series* is one (kernel, shape, variant, chip) benchmark.  Comparing a head
commit with its base gives a ``Verdict``:

``regressed``     head is slower by more than ``min_effect``, with evidence;
``improved``      head is faster by more than ``min_effect``, with evidence;
``unchanged``     no material change (see the exact rule in section 2);
``inconclusive``  too few samples, or a real change whose size cannot yet be
                  placed on either side of ``min_effect``; the comparison
                  then says how many more samples per side would settle it;
``broken``        the head commit failed a correctness job for this kernel on
                  this chip, so no performance verdict is given (section 6).

Comparing a tuning variant with the default variant of the same kernel on the
same chip gives a ``VariantOutcome``: ``win`` (variant faster), ``lose``,
``tie``, ``inconclusive`` or ``broken``, under exactly the same rules.

Model
=====

For one series and one commit we have samples :math:`t_1..t_n > 0`
(seconds).  We assume the samples of one run are exchangeable draws from a
distribution whose *scale* may change between commits:
:math:`t^{head} \sim r \cdot t^{base}`, so the quantity of interest is the
ratio :math:`r` (head / base; lower time is better, :math:`r > 1` is a
slowdown).  We do **not** assume normality: kernel timings are right-skewed
and carry occasional slow outliers (pre-emption, clock ramp-up, a cold
cache), so every estimator below is built from medians, order statistics and
ranks, which a few outliers cannot move.

1. Confidence interval of one median (``median_ci``)
----------------------------------------------------

Distribution-free, from order statistics.  For sorted samples
:math:`x_{(1)} \le \dots \le x_{(n)}` the number :math:`B` of samples below
the true median is :math:`\mathrm{Binomial}(n, 1/2)`, hence

.. math::

   P\bigl(x_{(l)} \le m \le x_{(n+1-l)}\bigr) = 1 - 2\,P(B \le l-1).

We take the largest :math:`l` whose coverage is still at least
``confidence`` (the tightest symmetric interval that keeps the promise); for
n = 10 and 95 % this is :math:`[x_{(2)}, x_{(9)}]` with exact coverage
97.9 %.  Small n: the widest interval :math:`[x_{(1)}, x_{(n)}]` only covers
with probability :math:`1 - 2^{1-n}` (75 %, 87.5 %, 93.75 % for n = 3, 4, 5),
so for 3 <= n <= 5 at 95 % we return ``(median, min, max)`` -- the most that
the data can say, with lower coverage than asked.  For n < 3 the "interval"
would cover with probability 0 (n = 1) or 1/2 (n = 2), which is not a
confidence interval at all, so the bounds are ``nan``.  n = 0 gives three
``nan``.  Non-finite samples are dropped first.

2. Comparing base and head of one series (``compare_samples``)
--------------------------------------------------------------

*Effect size.*  :math:`\hat r = \mathrm{median}(head) / \mathrm{median}(base)`.

*Interval.*  Percentile bootstrap of :math:`\hat r`: both samples are
resampled with replacement ``n_boot`` times and the :math:`\alpha/2` and
:math:`1-\alpha/2` quantiles of the resampled log ratio give
``[ci_low, ci_high]``.  Vectorised without sorting any resample: a
resample's median is the order statistic at which the running count of
draws per order statistic reaches rank :math:`\lceil n/2 \rceil` (average
with rank :math:`n/2+1` for even n).  Those positions depend only on the
random draws, so every series with the same :math:`(n_b, n_h)` is
bootstrapped in one array operation from ``default_rng(seed)``: a series'
interval depends on its own data and ``seed`` only (common random numbers
across series; 500 series take ~0.2 s including the rank tests).  Percentile
rather than BCa: the BCa acceleration is estimated by a jackknife, and the
jackknife of a median is degenerate (it takes at most two values), which
makes BCa erratic at n ~ 10.  Measured coverage of the nominal 95 %
interval on lognormal nulls (CV 2 %, 2000 series each): 97.8 % at n = 5,
96.5 % at n = 10, 97.3 % at n = 20 per side -- slightly conservative.
The interval is marginal (not widened for multiplicity); multiplicity is
handled by the adjusted p-value, which the decision also requires.

*Test.*  Two-sided Mann-Whitney U (``scipy.stats.mannwhitneyu``) of head
against base, one vectorised call per batch of equal sizes.  It is
rank-based, so a single 10x outlier changes it by at most one rank.  The
*exact* null distribution is used whenever there are no
ties and both sides have at most ``_EXACT_MWU_MAX_N`` = 100 samples, else the
tie-corrected normal approximation.  Exactness matters under multiplicity:
with 10 + 10 samples the smallest attainable p-value is
:math:`2/\binom{20}{10} \approx 1.1\cdot10^{-5}` exactly, but only
:math:`\approx 1.8\cdot10^{-4}` under the normal approximation -- too large to
survive Benjamini-Hochberg across a grid of 500 series (needs
:math:`p \le 0.05/500 = 10^{-4}` for a lone change).

*Decision rule* (``p`` is the BH-adjusted p-value, section 3; for a single
series it equals the raw one; :math:`m` = ``min_effect``), first match wins:

1. fewer than ``min_samples`` valid samples on either side
   -> ``inconclusive``;
2. :math:`p < \alpha` and ``ci_low`` :math:`> 1 + m` -> ``regressed``;
3. :math:`p < \alpha` and ``ci_high`` :math:`< 1 - m` -> ``improved``;
4. :math:`1 - m \le` ``ci_low`` and ``ci_high`` :math:`\le 1 + m`
   -> ``unchanged`` (equivalence shown: any change is immaterial, whether
   or not it is statistically detectable);
5. :math:`p \ge \alpha` and :math:`1/L \le \hat r \le L` -> ``unchanged``
   (no evidence of any change; the interval may still be wide -- narrow it
   with more samples if it matters);
6. otherwise -> ``inconclusive``: the change is significant but its interval
   straddles an edge of the band :math:`[1-m, 1+m]`, so we cannot yet say
   whether it is material; or it is not significant but the observed ratio
   is beyond :math:`L` = ``LARGEST_UNCHANGED`` = 2 (a doubling or a halving
   is never "unchanged": the noise is too wide to tell, and "unchanged"
   would be wrong and sure of itself -- in CI, code that runs 8x the work
   came out "unchanged" against a history floor of 3 runs of a loaded
   machine; identical kernels on the H200 reach x1.55).

Hence a flagged change (regressed / improved) needs *both* statistical
significance after FDR control and a whole interval beyond the materiality
band, and ``unchanged`` means exactly "interval inside the band, or not
significant with an observed ratio within [1/2, 2]".

*more_samples_needed* (per side; 0 unless the verdict is ``inconclusive``,
capped at ``MAX_MORE_SAMPLES`` = 1000, meaning "not resolvable in practice"):

* too few samples: the larger of ``min_samples - n`` and a power-style
  count on the observed noise: with robust log-scale spread
  :math:`\sigma` (1.4826 x MAD of the log samples about each side's
  median, pooled) the log ratio of two medians of N samples each has
  standard error :math:`\sqrt{\pi/2}\,\sigma\sqrt{2/N}`, so the interval
  half-width :math:`z_{1-\alpha/2}\,\sigma\sqrt{\pi/N}` fits inside the band
  (an ``unchanged`` verdict becomes reachable when nothing changed) once
  :math:`N \ge \pi\,(z_{1-\alpha/2}\sigma / \log(1+m))^2`.  E.g. CV 2 %,
  m = 2 % -> N = 13; CV 5 % -> N = 77.  With fewer than two samples the
  spread is unknown and only the minimum count is reported.
* straddling (rule 6): interval half-widths shrink like :math:`1/\sqrt N`.
  With observed log half-width :math:`h` and log distance :math:`d` from
  :math:`\hat r` to the nearest band edge, the interval clears that edge at
  :math:`N = n_{eff}\,(h/d)^2` per side, :math:`n_{eff} = 2/(1/n_b + 1/n_h)`.
  This takes the observed ratio at face value; since only significant
  changes land here, the observed effect tends to be inflated (winner's
  curse) and the count is a lower bound, not a guarantee.

*Defaults and why.*

* ``min_effect = 0.02``: a well-pinned GPU kernel benchmark typically has
  run-to-run noise of 1-2 % CV, so 2 % is the smallest slowdown that is both
  worth a human's attention and resolvable with ~10-15 samples per side.
* ``alpha = 0.05``: the conventional FDR level; with BH it means at most
  ~5 % of the flagged series are expected to be false alarms.
* ``n_boot = 2000``: Monte-Carlo error of a 2.5 % quantile position is
  :math:`\sqrt{0.025\cdot0.975/2000} \approx 0.35` percentage points,
  well below the sampling error at n ~ 10; it costs well under 1 ms per series.
* ``min_samples = 5``: with 3 + 3 samples the smallest exact two-sided
  Mann-Whitney p-value is 0.10, with 4 + 4 it is 0.029, with 5 + 5 it is
  0.0079 -- the first size at which a change can survive even a small BH
  family; below 5, the bootstrap median takes only a handful of values.

3. Many series at once (``compare_grid``, ``apply_fdr``, ``compare_each``)
--------------------------------------------------------------------------

One commit produces hundreds of series, so testing each at :math:`\alpha`
would raise ~:math:`\alpha` x (number of series) false alarms.  We control
the false discovery rate with Benjamini-Hochberg
(``scipy.stats.false_discovery_control``, method ``"bh"``):

.. math::

   p^{adj}_{(i)} = \min_{j \ge i} \min\bigl(1, p_{(j)}\,M / j\bigr)

over the :math:`M` series that were actually tested (enough samples, not
``broken``).  The decision rule of section 2 then runs with
:math:`p^{adj}`.  BH is valid for independent or positively dependent
(PRDS) p-values -- the plausible case for series sharing a runner, where a
noisy machine pushes them the same way; arbitrary dependence would need
Benjamini-Yekutieli.  Because verdicts need both :math:`p^{adj} < \alpha`
and an interval beyond the band, false ``regressed`` / ``improved`` verdicts
on null grids are far below :math:`\alpha` in practice (1 in 2000 null
series in ``scripts/validate_stats.py``).  The price is power for a lone
change: it must reach :math:`p \lesssim \alpha / M`, which is why the exact
Mann-Whitney distribution matters (section 2) and why noisy series need
more than 10 samples.  ``compare_each`` gives the unadjusted, batched
comparisons, for composing a family by hand with ``apply_fdr``;
``compare_grid`` is ``apply_fdr`` of the gated ``compare_each``.

4. Change points along a history (``detect_change_points``)
-----------------------------------------------------------

Input: one value per commit (typically the per-commit median), in commit
order.  Work in logs, :math:`x_i = \log y_i`, so that a relative change is
an additive shift and the noise is homoscedastic.  Model:

.. math::

   x_i = \mu(i) + \varepsilon_i, \qquad \varepsilon_i \sim (0, \sigma^2)
   \text{ i.i.d.}

with :math:`\mu` piecewise *constant or linear*: each segment is either a
plateau or a ramp.  A *step* is a jump between segments, a *drift* is a
ramp.  The fit minimises

.. math::

   \sum_{\text{segments } S} \Bigl[\mathrm{SSE}(S) + \beta
   + [S \text{ is a ramp}]\,\beta_{slope}\Bigr],
   \qquad \beta = 2c\,\tilde\sigma^2\log n,\ \beta_{slope} = c\,\tilde\sigma^2\log n,
   \qquad \tilde\sigma^2 = \hat\sigma^2\,(1 + 3/\sqrt n),

exactly, by optimal-partitioning dynamic programming, :math:`F(t) = \min_s
F(s) + \min(C_{flat}(s, t),\ C_{ramp}(s, t) + \beta_{slope}) + \beta`.
Segment costs come in O(1) from prefix sums of :math:`1, i, i^2, x, x^2,
ix` (the ramp SSE is the plateau SSE minus :math:`S_{ix}^2 / S_{ii}` in
centred sums), so the fit is :math:`O(n^2)` time and :math:`O(n)` memory,
vectorised over :math:`s` (~0.15 s for n = 1000).  The penalty is
BIC-shaped -- a new segment adds two parameters (location and level), a
slope one more, each worth :math:`\sigma^2\log n` of SSE -- scaled by
``penalty`` = c; :math:`\hat\sigma` and the :math:`1 + 3/\sqrt n` are
explained below.  Calibration on
flat Gaussian histories, counting any reported change with ``min_effect``
= 0: c = 1 (plain BIC) gives a spurious change in 6.8 %, 6.5 %, 4.3 % of
15-, 30-, 50-commit histories; c = 2 in 1.8 %, 0.8 %, 0.5 %; the default
c = 3 in 0.9 % at n = 15 and in none of 1000 runs at n = 30 and 50 (nor
of 300 at n = 200, 60 at n = 1000).  Power at c = 3: a step of 4 sigma
(exactly one step, at the right commit) is found in 79 % of 30-commit and
99 % of 100-commit histories, one of 5 sigma in 95 % and 100 %.

The noise level is estimated robustly from first differences:
:math:`\hat\sigma^2 = \overline{d^2}_{80\%} / (2\kappa)`, where
:math:`\overline{d^2}_{80\%}` is the mean square of the 80 % of differences
closest to their median and :math:`\kappa = 1 - 2q\varphi(q)/0.8` (q =
:math:`\Phi^{-1}(0.9)`) makes it consistent for normal noise.  A step or an
outlier only produces one or two large differences, which the trimming
drops; a drift only shifts the median of the differences, which the
centring removes.  Trimming is more efficient than a MAD (5 % quantile of
:math:`\hat\sigma/\sigma` at n = 30: 0.71 vs 0.64), but with few commits
:math:`\hat\sigma^2` is still uncertain (standard error about
:math:`1.6\,\sigma^2/\sqrt n`), and an underestimate is what causes
spurious segments; so the penalty uses :math:`\tilde\sigma^2 =
\hat\sigma^2 (1 + 3/\sqrt n)`, about two standard errors above the
estimate.  Floor:
:math:`\hat\sigma \ge 10^{-4}`, so an exactly constant history does not get
a zero penalty.

Robustness: an l2 cost would let one outlier commit buy its own segment.
Before fitting, each point is winsorised towards a running median of width
5: :math:`x_i \leftarrow \tilde x_i + \mathrm{clip}(x_i - \tilde x_i,
\pm 3\hat\sigma)`.  A running median follows steps and ramps without delay,
so only isolated points (up to two in any five) are touched.  Segments are
at least ``min_segment`` = 3 commits long (a change that lasts one or two
commits is an outlier, not a level; the newest commits are judged by
``compare_samples`` instead), and a ramp at least ``min_drift_length`` = 8
commits (a Mann-Kendall test needs >= 5 points to reach p < 0.05 at all,
and a reader wants a short ramp reported as a step).

Reporting.  Each segment's levels are its least-squares fit on the
winsorised logs (mean for a plateau, line for a ramp).  A ramp is kept as a
``drift`` only if a Mann-Kendall test (Kendall's tau of value against
index, ``scipy.stats.kendalltau``) gives p < ``alpha`` *and* the fitted
total change over the ramp exceeds ``min_effect``; otherwise it is refitted
as a plateau.  At each boundary the jump from the left segment's end level
to the right segment's start level is reported as a ``step`` if it exceeds
``min_effect`` *and* the jump is needed: the two segments fitted by one
continuous curve (one plateau, or plateau and ramp joined at a hinge placed
anywhere within ``min_drift_length`` commits of the boundary) must cost
more than one parameter's penalty :math:`c\tilde\sigma^2\log n` extra SSE.
Without that test the noisy ends of a ramp read as small spurious steps.
``ratio`` is always after / before, so > 1 is a slowdown.  A 1 %/commit
drift over 20 commits (+22 %) is one ``drift`` -- in all calibration runs
at 1 % per-commit noise, in ~78 % at 2 % (else a drift and a step, or a
few steps): a ramp costs :math:`3c\tilde\sigma^2\log n`, a staircase two
parameters per stair plus its residual.  When the noise is several times
the per-commit slope the ramp is honestly reported as a few steps.

Limits: the noise is assumed independent from commit to commit.  Positively
autocorrelated noise (a runner slowly warming, a fleet change) makes
:math:`\hat\sigma` from differences too small and yields spurious
segments; clusters of outliers (three in five commits) look like a level.
The ``min_effect`` filter is the backstop in both cases.

Missing commits (nan, inf, <= 0) are skipped and reported indices refer to
the original positions.

5. Variants (``variant_verdict``, ``find_divergent``, ``best_variant``)
-----------------------------------------------------------------------

A variant is compared with the default variant exactly as head with base
(section 2): ratio = variant time / default time, ``win`` = ``improved``,
``lose`` = ``regressed``, ``tie`` = ``unchanged``.  Use
``variant_verdict_grid`` to apply BH across all cells of a tuning sweep.
``find_divergent`` flags a variant that wins on one chip and loses on
another (one record per winning/losing chip pair, carrying both verdicts).
``best_variant`` picks, per chip, the winning variant with the smallest
ratio (ties: smaller ``ci_high``, then name), or the default if none wins:
a variant is never preferred on a non-significant difference, so the
chosen best does not flap with noise against the default.  Among several
winners the pick is by point estimate; winners whose intervals overlap are
not told apart, so the choice between them can flip from commit to commit
and show up as tuning drift (check the two verdicts' intervals before
acting on it).  ``best_variants`` applies ``best_variant`` to a whole
``find_divergent``-shaped grid, keyed by (kernel, shape, chip), and
``tuning_drift`` lists the keys whose best variant changed between two
commits (keys present on one side only are coverage changes, not drift).

6. Correctness gating (``gate``)
--------------------------------

Performance of wrong code is meaningless.  ``gate(result, True)`` returns
the same record with verdict / outcome ``broken`` and
``more_samples_needed = 0``; the measured numbers are kept for reference
but carry no verdict.  ``compare_grid(..., broken=keys)`` does the same for
a grid and leaves broken series out of the BH family.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, TypeVar

import numpy as np
import numpy.typing as npt

from harness.core import defaults, distributions

__all__ = [
    "CHANGE_KINDS",
    "MAX_MORE_SAMPLES",
    "VARIANT_OUTCOMES",
    "VERDICTS",
    "ChangePoint",
    "Comparison",
    "Divergence",
    "TuningChange",
    "VariantVerdict",
    "apply_fdr",
    "best_variant",
    "best_variants",
    "compare_each",
    "compare_grid",
    "compare_samples",
    "detect_change_points",
    "find_divergent",
    "gate",
    "mann_whitney_pvalues",
    "median_ci",
    "tuning_drift",
    "variant_verdict",
    "variant_verdict_grid",
]

Verdict = Literal["regressed", "improved", "unchanged", "inconclusive", "broken"]
VariantOutcome = Literal["win", "lose", "tie", "inconclusive", "broken"]
ChangeKind = Literal["step", "drift"]

VERDICTS: tuple[Verdict, ...] = ("regressed", "improved", "unchanged", "inconclusive", "broken")
VARIANT_OUTCOMES: tuple[VariantOutcome, ...] = ("win", "lose", "tie", "inconclusive", "broken")
CHANGE_KINDS: tuple[ChangeKind, ...] = ("step", "drift")

DEFAULT_MIN_EFFECT = defaults.MIN_EFFECT
DEFAULT_ALPHA = defaults.ALPHA
DEFAULT_N_BOOT = defaults.N_BOOT
DEFAULT_MIN_SAMPLES = defaults.MIN_SAMPLES
MAX_MORE_SAMPLES = 1000

_EXACT_MWU_MAX_N = 100
_MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD of a normal sample -> its standard deviation
_NOISE_FLOOR = 1e-4  # log units (0.01 %): no timing history is more precise than this
_WINSOR_WIDTH = 5  # running-median window used to winsorise a history
_WINSOR_CLIP = 3.0  # ... and the clip, in noise sigmas
_TRIM_KEEP = 0.8  # fraction of first differences kept by the noise estimate
_TRIM_QUANTILE = float(distributions.norm_ppf(0.5 + _TRIM_KEEP / 2.0))
# E[Z^2 | |Z| <= q] for standard normal Z: makes the trimmed mean square consistent for sigma^2
_TRIMMED_VARIANCE_FACTOR = 1.0 - 2.0 * _TRIM_QUANTILE * float(distributions.norm_pdf(_TRIM_QUANTILE)) / _TRIM_KEEP
_SMALL_SAMPLE_INFLATION = 3.0  # penalty x (1 + 3/sqrt(n)): ~2 standard errors of sigma-hat^2 above it

_VERDICT_TO_OUTCOME: dict[Verdict, VariantOutcome] = {
    "regressed": "lose",
    "improved": "win",
    "unchanged": "tie",
    "inconclusive": "inconclusive",
    "broken": "broken",
}

K = TypeVar("K", bound=Hashable)
Samples = Sequence[float] | npt.NDArray[np.floating]


# ---------------------------------------------------------------------------
# Result records
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Head vs base of one series.  ``ratio`` = median(head) / median(base)."""

    verdict: Verdict
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_base: int
    n_head: int
    more_samples_needed: int


@dataclass(frozen=True)
class VariantVerdict:
    """Variant vs default variant on one chip.  ``ratio`` = variant / default time."""

    outcome: VariantOutcome
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_default: int
    n_variant: int
    more_samples_needed: int


@dataclass(frozen=True)
class ChangePoint:
    """A level change in a per-commit history.

    ``index`` is the first commit at the new level (step) or the first commit
    of the ramp (drift); ``end_index`` equals ``index`` for a step and is the
    last commit of the ramp for a drift.  ``before`` / ``after`` are levels in
    the input's units and ``ratio`` = after / before.
    """

    index: int
    kind: ChangeKind
    before: float
    after: float
    ratio: float
    end_index: int


@dataclass(frozen=True)
class Divergence:
    """A variant that wins on ``winning_chip`` and loses on ``losing_chip``."""

    kernel: Hashable
    shape: Hashable
    variant: Hashable
    winning_chip: Hashable
    losing_chip: Hashable
    win_evidence: VariantVerdict
    lose_evidence: VariantVerdict


@dataclass(frozen=True)
class TuningChange:
    """The best variant for ``key`` changed from ``before`` to ``after``."""

    key: Hashable
    before: str
    after: str


# ---------------------------------------------------------------------------
# 1. Median confidence interval
# ---------------------------------------------------------------------------


def _finite(samples: Samples) -> npt.NDArray[np.float64]:
    values = np.asarray(samples, dtype=np.float64).ravel()
    return values[np.isfinite(values)]


def _positive_finite(samples: Samples) -> npt.NDArray[np.float64]:
    values = _finite(samples)
    return values[values > 0]


def _midpoint(lower: npt.NDArray[np.float64], upper: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """(lower + upper) / 2 without overflow for values near the float maximum."""
    return lower + 0.5 * (upper - lower)


def _sorted_median(ordered: npt.NDArray[np.float64]) -> float:
    n = ordered.size
    return float(_midpoint(ordered[(n - 1) // 2], ordered[n // 2]))


def median_ci(samples: Samples, confidence: float = 0.95) -> tuple[float, float, float]:
    """Return ``(median, lo, hi)``: an order-statistic CI of the median.

    n = 0 -> all nan; n < 3 -> nan bounds; when ``confidence`` is not
    attainable with n samples (n <= 5 at 95 %) -> ``(median, min, max)``.
    """
    values = np.sort(_finite(samples))
    n = values.size
    if n == 0:
        return (math.nan, math.nan, math.nan)
    median = _sorted_median(values)
    if n < 3:
        return (median, math.nan, math.nan)
    lower_rank = _lower_rank(n, confidence)
    if lower_rank is None:
        return (median, float(values[0]), float(values[-1]))
    return (median, float(values[lower_rank - 1]), float(values[n - lower_rank]))


@functools.lru_cache(maxsize=4096)
def _lower_rank(n: int, confidence: float) -> int | None:
    """The largest l (1-based) with P(Binomial(n, 1/2) <= l - 1) <= the tail (+ 1e-12), l - 1 <= n // 2; None
    when there is none. The binomial sums are exact integers, compared with the tail's float value exactly."""
    threshold = Fraction((1.0 - confidence) / 2.0 + 1e-12) * 2**n
    chosen, term, total = None, 1, 0  # term = C(n, k), total = sum of C(n, i) for i <= k
    for k in range(n // 2 + 1):
        if k:
            term = term * (n - k + 1) // k
        total += term
        if total > threshold:
            break
        chosen = k + 1
    return chosen


# ---------------------------------------------------------------------------
# 2. One series: base vs head
# ---------------------------------------------------------------------------


def mann_whitney_pvalues(
    base_rows: npt.NDArray[np.float64], head_rows: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Two-sided Mann-Whitney p-value per row (rows: series of equal sizes).

    Exact null distribution for rows without ties and <= 100 samples per
    side, tie-corrected normal approximation otherwise, p = 1 when all values
    are equal; one vectorised scipy call per method.
    """
    pooled = np.sort(np.concatenate([base_rows, head_rows], axis=1), axis=1)
    constant = pooled[:, -1] == pooled[:, 0]
    has_ties = (np.diff(pooled, axis=1) == 0).any(axis=1)
    small = max(base_rows.shape[1], head_rows.shape[1]) <= _EXACT_MWU_MAX_N
    exact = ~constant & ~has_ties & small
    from scipy import stats as scipy_stats  # ~1 s to load: only when samples are tested

    p_values = np.ones(len(base_rows))
    for method, rows in (("exact", exact), ("asymptotic", ~constant & ~exact)):
        if rows.any():
            result = scipy_stats.mannwhitneyu(
                head_rows[rows], base_rows[rows], alternative="two-sided", method=method, axis=1
            )
            p_values[rows] = np.asarray(result.pvalue, dtype=np.float64)
    return np.where(np.isfinite(p_values), p_values, 1.0)


def _bootstrap_median_ranks(
    n: int, rng: np.random.Generator, n_boot: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Order-statistic positions of the median of ``n_boot`` resamples of size n.

    A resample is summarised by how often it draws each order statistic; its
    median is the order statistic at which the running count first reaches
    rank (n+1)//2 (and n//2+1, averaged, for even n).  The positions depend
    only on the draws, so one set serves every series with n samples:
    O(n_boot * n), no per-row sort.
    """
    draws = rng.integers(0, n, size=(n_boot, n))
    row_offsets = (np.arange(n_boot) * n)[:, None]
    counts = np.bincount((draws + row_offsets).ravel(), minlength=n_boot * n).reshape(n_boot, n)
    running = np.cumsum(counts, axis=1)
    lower = (running < (n + 1) // 2).sum(axis=1)
    upper = (running < n // 2 + 1).sum(axis=1)
    return lower, upper


def _bootstrap_log_ratio_ci(
    base_sorted: npt.NDArray[np.float64],
    head_sorted: npt.NDArray[np.float64],
    *,
    alpha: float,
    n_boot: int,
    seed: int,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Percentile CI of log(median head / median base) per row (rows: series of equal sizes)."""
    rng = np.random.default_rng(seed)
    head_lower, head_upper = _bootstrap_median_ranks(head_sorted.shape[1], rng, n_boot)
    base_lower, base_upper = _bootstrap_median_ranks(base_sorted.shape[1], rng, n_boot)
    head_medians = _midpoint(head_sorted[:, head_lower], head_sorted[:, head_upper])
    base_medians = _midpoint(base_sorted[:, base_lower], base_sorted[:, base_upper])
    log_ratios = np.log(head_medians) - np.log(base_medians)
    low, high = np.quantile(log_ratios, [alpha / 2.0, 1.0 - alpha / 2.0], axis=1)
    return low, high


def _safe_exp(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.exp(value))


def _relative_change(log_change: float) -> float:
    """exp(log_change) - 1, saturating to inf instead of raising on absurd inputs."""
    with np.errstate(over="ignore"):
        return float(np.expm1(log_change))


def _log_spread(*groups: npt.NDArray[np.float64]) -> float:
    """Robust pooled spread of log samples: 1.4826 x MAD about each group's median."""
    residuals = [np.log(g) - np.median(np.log(g)) for g in groups if g.size >= 2]
    if not residuals:
        return math.nan
    return float(_MAD_TO_SIGMA * np.median(np.abs(np.concatenate(residuals))))


def _clamp_more(count: float) -> int:
    if not math.isfinite(count):
        return MAX_MORE_SAMPLES
    return int(min(MAX_MORE_SAMPLES, max(1, math.ceil(count))))


def _more_samples_for_too_few(
    base: npt.NDArray[np.float64],
    head: npt.NDArray[np.float64],
    *,
    min_effect: float,
    alpha: float,
    min_samples: int,
) -> int:
    have = min(base.size, head.size)
    shortfall = min_samples - have
    sigma = _log_spread(base, head)
    if not math.isfinite(sigma) or sigma <= 0:
        return _clamp_more(shortfall)
    z = distributions.norm_ppf(1.0 - alpha / 2.0)
    target = math.log1p(min_effect)
    with np.errstate(over="ignore"):
        needed_per_side = np.pi * np.square(z * sigma / target) if target > 0 else math.inf
    return _clamp_more(max(shortfall, float(needed_per_side) - have))


def _safe_log(value: float) -> float:
    """log that maps 0 (an underflowed ratio) to -inf instead of raising."""
    return math.log(value) if value > 0 else -math.inf


def _more_samples_to_clear_band(
    ratio: float, ci_low: float, ci_high: float, n_base: int, n_head: int, min_effect: float
) -> int:
    log_ratio = _safe_log(ratio)
    half_width = max(log_ratio - _safe_log(ci_low), _safe_log(ci_high) - log_ratio)
    edges = (math.log1p(min_effect), math.log1p(-min_effect) if min_effect < 1 else -math.inf)
    distance = min(abs(log_ratio - edge) for edge in edges)
    if not distance > 0:
        return MAX_MORE_SAMPLES
    effective_n = 2.0 / (1.0 / n_base + 1.0 / n_head)
    with np.errstate(over="ignore", invalid="ignore"):
        needed_per_side = float(effective_n * np.square(np.float64(half_width) / distance))
    return _clamp_more(needed_per_side - min(n_base, n_head))


def _decide(
    ratio: float,
    ci_low: float,
    ci_high: float,
    p_adjusted: float,
    n_base: int,
    n_head: int,
    *,
    min_effect: float,
    alpha: float,
) -> tuple[Verdict, int]:
    """Rules 2-6 of the module docstring (rule 1 is applied by the caller)."""
    significant = p_adjusted < alpha
    if significant and ci_low > 1.0 + min_effect:
        return "regressed", 0
    if significant and ci_high < 1.0 - min_effect:
        return "improved", 0
    if 1.0 - min_effect <= ci_low and ci_high <= 1.0 + min_effect:
        return "unchanged", 0
    if not significant and 1.0 / defaults.LARGEST_UNCHANGED <= ratio <= defaults.LARGEST_UNCHANGED:
        return "unchanged", 0
    return "inconclusive", _more_samples_to_clear_band(ratio, ci_low, ci_high, n_base, n_head, min_effect)


def _too_few_samples(
    base: npt.NDArray[np.float64],
    head: npt.NDArray[np.float64],
    *,
    min_effect: float,
    alpha: float,
    min_samples: int,
) -> Comparison:
    ratio = _median_ratio(base, head) if base.size and head.size else math.nan
    more = _more_samples_for_too_few(base, head, min_effect=min_effect, alpha=alpha, min_samples=min_samples)
    return Comparison("inconclusive", ratio, math.nan, math.nan, math.nan, math.nan, base.size, head.size, more)


def _median_ratio(base: npt.NDArray[np.float64], head: npt.NDArray[np.float64]) -> float:
    return _safe_exp(math.log(_sorted_median(np.sort(head))) - math.log(_sorted_median(np.sort(base))))


def _compare_equal_sizes(
    base_rows: npt.NDArray[np.float64],
    head_rows: npt.NDArray[np.float64],
    *,
    min_effect: float,
    alpha: float,
    n_boot: int,
    seed: int,
) -> list[Comparison]:
    """Test and bootstrap every row at once; rows are series with the same (n_base, n_head)."""
    base_sorted, head_sorted = np.sort(base_rows, axis=1), np.sort(head_rows, axis=1)
    n_base, n_head = base_sorted.shape[1], head_sorted.shape[1]
    p_values = mann_whitney_pvalues(base_sorted, head_sorted)
    log_low, log_high = _bootstrap_log_ratio_ci(base_sorted, head_sorted, alpha=alpha, n_boot=n_boot, seed=seed)
    comparisons = []
    for row, p_value in enumerate(p_values.tolist()):
        ratio = _median_ratio(base_sorted[row], head_sorted[row])
        ci_low, ci_high = _safe_exp(log_low[row]), _safe_exp(log_high[row])
        verdict, more = _decide(ratio, ci_low, ci_high, p_value, n_base, n_head, min_effect=min_effect, alpha=alpha)
        comparisons.append(Comparison(verdict, ratio, ci_low, ci_high, p_value, p_value, n_base, n_head, more))
    return comparisons


def _compare_many(
    pairs: Sequence[tuple[Samples, Samples]],
    *,
    min_effect: float,
    alpha: float,
    n_boot: int,
    seed: int,
    min_samples: int,
) -> list[Comparison]:
    """Unadjusted comparisons (``p_adjusted == p_value``), batched by sample sizes.

    Every series draws its bootstrap resamples from ``default_rng(seed)``, so
    a series' interval depends only on its own data and ``seed``, never on
    which other series share the batch.
    """
    cleaned = [(_positive_finite(base), _positive_finite(head)) for base, head in pairs]
    results: list[Comparison | None] = [None] * len(cleaned)
    by_sizes: dict[tuple[int, int], list[int]] = {}
    for position, (base, head) in enumerate(cleaned):
        if min(base.size, head.size) < min_samples:
            results[position] = _too_few_samples(
                base, head, min_effect=min_effect, alpha=alpha, min_samples=min_samples
            )
        else:
            by_sizes.setdefault((base.size, head.size), []).append(position)
    for positions in by_sizes.values():
        base_rows = np.stack([cleaned[p][0] for p in positions])
        head_rows = np.stack([cleaned[p][1] for p in positions])
        batch = _compare_equal_sizes(base_rows, head_rows, min_effect=min_effect, alpha=alpha, n_boot=n_boot, seed=seed)
        for position, comparison in zip(positions, batch, strict=True):
            results[position] = comparison
    return [comparison for comparison in results if comparison is not None]


def compare_samples(
    base: Samples,
    head: Samples,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> Comparison:
    """Compare head with base timings of one series (seconds; lower is better).

    Non-finite and non-positive samples are dropped.  ``p_adjusted`` equals
    ``p_value`` (a family of one); use ``compare_grid`` for many series.
    """
    (comparison,) = _compare_many(
        [(base, head)], min_effect=min_effect, alpha=alpha, n_boot=n_boot, seed=seed, min_samples=min_samples
    )
    return comparison


# ---------------------------------------------------------------------------
# 3. Many series: Benjamini-Hochberg
# ---------------------------------------------------------------------------


def _is_tested(comparison: Comparison) -> bool:
    return comparison.verdict != "broken" and math.isfinite(comparison.p_value)


def apply_fdr(
    comparisons: Mapping[K, Comparison],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
) -> dict[K, Comparison]:
    """Benjamini-Hochberg-adjust the raw p-values of tested series and re-decide.

    Only ``p_value`` (raw) is read, so applying it twice gives the same
    result.  Untested series (too few samples, ``broken``) are returned
    unchanged and do not count towards the family size.
    """
    tested = [key for key, comparison in comparisons.items() if _is_tested(comparison)]
    adjusted: dict[K, float] = {}
    if tested:
        raw = np.array([comparisons[key].p_value for key in tested])
        adjusted = dict(zip(tested, distributions.bh(raw).tolist(), strict=True))
    result: dict[K, Comparison] = {}
    for key, c in comparisons.items():
        if key not in adjusted:
            result[key] = c
            continue
        p_adjusted = adjusted[key]
        verdict, more = _decide(
            c.ratio, c.ci_low, c.ci_high, p_adjusted, c.n_base, c.n_head, min_effect=min_effect, alpha=alpha
        )
        result[key] = Comparison(verdict, c.ratio, c.ci_low, c.ci_high, c.p_value, p_adjusted, c.n_base, c.n_head, more)
    return result


def compare_each(
    pairs: Mapping[K, tuple[Samples, Samples]],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> dict[K, Comparison]:
    """``compare_samples`` on every ``key -> (base, head)``, batched, *without* multiplicity control.

    Each result equals ``compare_samples`` on that pair (a family of one).
    Meant for composing families by hand with ``apply_fdr``; for one commit's
    grid use ``compare_grid``.
    """
    keys = list(pairs)
    measured = _compare_many(
        [pairs[key] for key in keys],
        min_effect=min_effect,
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
        min_samples=min_samples,
    )
    return dict(zip(keys, measured, strict=True))


def compare_grid(
    pairs: Mapping[K, tuple[Samples, Samples]],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    broken: Collection[K] = (),
) -> dict[K, Comparison]:
    """``compare_samples`` on every ``key -> (base, head)``, then BH across the grid.

    Every series uses the same ``seed``, so a series' interval does not depend
    on which other series share the grid.  Keys in ``broken`` get verdict
    ``broken`` and stay out of the BH family.
    """
    raw = compare_each(pairs, min_effect=min_effect, alpha=alpha, n_boot=n_boot, seed=seed, min_samples=min_samples)
    gated = {key: gate(comparison, key in broken) for key, comparison in raw.items()}
    return apply_fdr(gated, min_effect=min_effect, alpha=alpha)


# ---------------------------------------------------------------------------
# 4. Change points along a history
# ---------------------------------------------------------------------------


def _robust_noise(values: npt.NDArray[np.float64]) -> float:
    """Noise sigma from first differences: trimmed RMS about their median, / sqrt(2)."""
    differences = np.diff(values)
    if differences.size < 2:
        return _NOISE_FLOOR
    deviations = np.sort(np.abs(differences - np.median(differences)))
    kept = deviations[: max(2, int(_TRIM_KEEP * deviations.size))]
    variance_of_differences = float(np.mean(kept * kept)) / _TRIMMED_VARIANCE_FACTOR
    return max(_NOISE_FLOOR, math.sqrt(variance_of_differences / 2.0))


def _running_median(values: npt.NDArray[np.float64], width: int) -> npt.NDArray[np.float64]:
    """``scipy.ndimage.median_filter(values, size=width, mode="nearest")`` of a 1-d array, odd ``width``: each
    value's window, the ends repeated, and its middle value (a selection: exact)."""
    half = width // 2
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(values, half, mode="edge"), width)
    return np.sort(windows, axis=1)[:, half]


def _winsorise(values: npt.NDArray[np.float64], sigma: float) -> npt.NDArray[np.float64]:
    running_median = _running_median(values, _WINSOR_WIDTH)
    limit = _WINSOR_CLIP * sigma
    return running_median + np.clip(values - running_median, -limit, limit)


class _SegmentCosts:
    """O(1) SSE of constant and linear fits on ``values[start:stop]`` via prefix sums."""

    def __init__(self, values: npt.NDArray[np.float64]) -> None:
        index = np.arange(values.size, dtype=np.float64)

        def prefix(column: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            return np.concatenate([[0.0], np.cumsum(column)])

        self._x = prefix(values)
        self._xx = prefix(values * values)
        self._i = prefix(index)
        self._ii = prefix(index * index)
        self._ix = prefix(index * values)

    def constant_and_linear(
        self, starts: npt.NDArray[np.intp], stop: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        count = (stop - starts).astype(np.float64)
        sx = self._x[stop] - self._x[starts]
        sxx = self._xx[stop] - self._xx[starts]
        si = self._i[stop] - self._i[starts]
        sii = self._ii[stop] - self._ii[starts]
        six = self._ix[stop] - self._ix[starts]
        constant = np.maximum(sxx - sx * sx / count, 0.0)
        centred_ii = sii - si * si / count
        centred_ix = six - si * sx / count
        with np.errstate(divide="ignore", invalid="ignore"):
            explained = np.where(centred_ii > 0, centred_ix * centred_ix / centred_ii, 0.0)
        linear = np.maximum(constant - explained, 0.0)
        return constant, linear


@dataclass(frozen=True)
class _Segment:
    start: int
    stop: int  # exclusive
    linear: bool


def _optimal_segments(
    values: npt.NDArray[np.float64],
    *,
    segment_penalty: float,
    slope_penalty: float,
    min_segment: int,
    min_drift_length: int,
) -> list[_Segment]:
    """Exact penalised piecewise constant/linear least-squares fit (optimal partitioning)."""
    n = values.size
    costs = _SegmentCosts(values - np.median(values))
    best = np.full(n + 1, np.inf)
    best[0] = -segment_penalty
    previous = np.zeros(n + 1, dtype=np.intp)
    is_linear = np.zeros(n + 1, dtype=bool)
    for stop in range(min_segment, n + 1):
        starts = np.arange(0, stop - min_segment + 1)
        starts = starts[np.isfinite(best[starts])]
        constant, linear = costs.constant_and_linear(starts, stop)
        linear = np.where(stop - starts >= min_drift_length, linear + slope_penalty, np.inf)
        use_linear = linear < constant
        total = best[starts] + np.minimum(constant, linear) + segment_penalty
        choice = int(np.argmin(total))
        best[stop] = total[choice]
        previous[stop] = starts[choice]
        is_linear[stop] = use_linear[choice]
    segments: list[_Segment] = []
    stop = n
    while stop > 0:
        start = int(previous[stop])
        segments.append(_Segment(start, stop, bool(is_linear[stop])))
        stop = start
    return segments[::-1]


@dataclass(frozen=True)
class _FittedSegment:
    """Least-squares fit of one segment in log units: ``intercept + slope * (i - start)``."""

    start: int
    stop: int  # exclusive
    drifting: bool
    intercept: float
    slope: float

    def level_at(self, index: int) -> float:
        return self.intercept + self.slope * (index - self.start)

    @property
    def start_level(self) -> float:
        return self.level_at(self.start)

    @property
    def end_level(self) -> float:
        return self.level_at(self.stop - 1)

    def sse(self, values: npt.NDArray[np.float64]) -> float:
        index = np.arange(self.start, self.stop)
        residuals = values[self.start : self.stop] - (self.intercept + self.slope * (index - self.start))
        return float(residuals @ residuals)


def _fit_segment(
    values: npt.NDArray[np.float64], segment: _Segment, *, min_effect: float, alpha: float
) -> _FittedSegment:
    """A ramp is kept only if Mann-Kendall says it trends and its total change is material."""
    chunk = values[segment.start : segment.stop]
    plateau = _FittedSegment(segment.start, segment.stop, False, float(np.mean(chunk)), 0.0)
    if not segment.linear or chunk.size < 3 or np.ptp(chunk) == 0:
        return plateau
    index = np.arange(chunk.size, dtype=np.float64)
    trend_p = distributions.kendall_trend_p(chunk)
    slope, intercept = np.polyfit(index, chunk, 1)
    material = abs(_relative_change(slope * index[-1])) > min_effect
    if math.isfinite(trend_p) and trend_p < alpha and material:
        return _FittedSegment(segment.start, segment.stop, True, float(intercept), float(slope))
    return plateau


def _continuous_sse(
    union: npt.NDArray[np.float64], offset: npt.NDArray[np.float64], left_ramp: bool, right_ramp: bool
) -> float:
    columns = [np.ones_like(offset)]
    if left_ramp:
        columns.append(np.minimum(offset, 0.0))
    if right_ramp:
        columns.append(np.maximum(offset, 0.0))
    design = np.column_stack(columns)
    coefficients = np.linalg.lstsq(design, union, rcond=None)[0]
    residuals = union - design @ coefficients
    return float(residuals @ residuals)


def _jump_is_supported(
    values: npt.NDArray[np.float64],
    left: _FittedSegment,
    right: _FittedSegment,
    *,
    threshold: float,
    hinge_search: int,
) -> bool:
    """Does a jump at the boundary reduce the SSE by more than one parameter's penalty?

    The alternative fits both segments with one continuous curve -- a single
    plateau, or a plateau/ramp hinged within ``hinge_search`` commits of the
    boundary (the fit chose the boundary for a discontinuous model, so the
    continuous one gets to choose its hinge too) -- with one parameter fewer.
    """
    union = values[left.start : right.stop]
    index = np.arange(left.start, right.stop, dtype=np.float64)
    separate_sse = left.sse(values) + right.sse(values)
    if not (left.drifting or right.drifting):
        hinges = [right.start - 0.5]
    else:
        lowest = max(left.start + 1, right.start - hinge_search)
        highest = min(right.stop - 1, right.start + hinge_search)
        hinges = [h - 0.5 for h in range(lowest, highest + 1)]
    best_continuous = min(_continuous_sse(union, index - hinge, left.drifting, right.drifting) for hinge in hinges)
    return best_continuous - separate_sse > threshold


def _valid_history(medians: Sequence[float]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp]]:
    values = np.asarray(medians, dtype=np.float64).ravel()
    valid = np.flatnonzero(np.isfinite(values) & (values > 0))
    return np.log(values[valid]), valid


def detect_change_points(
    medians: Sequence[float],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    penalty: float = 3.0,
    min_segment: int = 3,
    min_drift_length: int = 8,
) -> list[ChangePoint]:
    """Steps and drifts in a per-commit history (commit order; lower is better).

    Entries that are nan, infinite or <= 0 are treated as missing commits.
    See section 4 of the module docstring for the model and defaults.
    """
    log_values, positions = _valid_history(medians)
    n = log_values.size
    if n < 2 * min_segment:
        return []
    sigma = _robust_noise(log_values)
    per_parameter = penalty * sigma * sigma * (1.0 + _SMALL_SAMPLE_INFLATION / math.sqrt(n)) * math.log(n)
    cleaned = _winsorise(log_values, sigma)
    segments = _optimal_segments(
        cleaned,
        segment_penalty=2.0 * per_parameter,
        slope_penalty=per_parameter,
        min_segment=min_segment,
        min_drift_length=min_drift_length,
    )
    fitted = [_fit_segment(cleaned, s, min_effect=min_effect, alpha=alpha) for s in segments]
    found: list[ChangePoint] = []
    for left, right in zip([None, *fitted[:-1]], fitted, strict=True):
        if left is not None:
            jump = right.start_level - left.end_level
            supported = _jump_is_supported(cleaned, left, right, threshold=per_parameter, hinge_search=min_drift_length)
            if abs(_relative_change(jump)) > min_effect and supported:
                index = positions[right.start]
                found.append(_change_point("step", index, index, left.end_level, right.start_level))
        if right.drifting:
            start, end = positions[right.start], positions[right.stop - 1]
            found.append(_change_point("drift", start, end, right.start_level, right.end_level))
    return found


def _change_point(kind: ChangeKind, index: int, end_index: int, log_before: float, log_after: float) -> ChangePoint:
    before, after = _safe_exp(log_before), _safe_exp(log_after)
    return ChangePoint(int(index), kind, before, after, _safe_exp(log_after - log_before), int(end_index))


# ---------------------------------------------------------------------------
# 5. Variants
# ---------------------------------------------------------------------------


def _as_variant_verdict(comparison: Comparison) -> VariantVerdict:
    return VariantVerdict(
        outcome=_VERDICT_TO_OUTCOME[comparison.verdict],
        ratio=comparison.ratio,
        ci_low=comparison.ci_low,
        ci_high=comparison.ci_high,
        p_value=comparison.p_value,
        p_adjusted=comparison.p_adjusted,
        n_default=comparison.n_base,
        n_variant=comparison.n_head,
        more_samples_needed=comparison.more_samples_needed,
    )


def variant_verdict(
    default_samples: Samples,
    variant_samples: Samples,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> VariantVerdict:
    """Variant vs default on one chip: ``win`` means the variant is faster."""
    comparison = compare_samples(
        default_samples,
        variant_samples,
        min_effect=min_effect,
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
        min_samples=min_samples,
    )
    return _as_variant_verdict(comparison)


def variant_verdict_grid(
    cells: Mapping[K, tuple[Samples, Samples]],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    broken: Collection[K] = (),
) -> dict[K, VariantVerdict]:
    """``variant_verdict`` on every ``key -> (default, variant)`` with BH across all keys."""
    comparisons = compare_grid(
        cells, min_effect=min_effect, alpha=alpha, n_boot=n_boot, seed=seed, min_samples=min_samples, broken=broken
    )
    return {key: _as_variant_verdict(comparison) for key, comparison in comparisons.items()}


def _chip_order(chip: Hashable) -> str:
    return str(chip)


def find_divergent(
    cells: Mapping[tuple[Hashable, Hashable, Hashable], Mapping[Hashable, VariantVerdict]],
) -> list[Divergence]:
    """Variants that win on one chip and lose on another, one record per (winner, loser) chip pair."""
    divergences: list[Divergence] = []
    for (kernel, shape, variant), per_chip in cells.items():
        winners = sorted((c for c, v in per_chip.items() if v.outcome == "win"), key=_chip_order)
        losers = sorted((c for c, v in per_chip.items() if v.outcome == "lose"), key=_chip_order)
        divergences.extend(
            Divergence(kernel, shape, variant, win_chip, lose_chip, per_chip[win_chip], per_chip[lose_chip])
            for win_chip in winners
            for lose_chip in losers
        )
    return divergences


def best_variant(verdicts: Mapping[str, VariantVerdict], default: str = "default") -> str:
    """The winning variant with the smallest ratio (then ``ci_high``, then name), else ``default``."""
    winners = [(v.ratio, v.ci_high, name) for name, v in verdicts.items() if v.outcome == "win"]
    return min(winners)[2] if winners else default


def best_variants(
    cells: Mapping[tuple[Hashable, Hashable, str], Mapping[Hashable, VariantVerdict]],
    default: str = "default",
) -> dict[tuple[Hashable, Hashable, Hashable], str]:
    """``best_variant`` for every (kernel, shape, chip) of a ``find_divergent``-shaped grid."""
    per_key: dict[tuple[Hashable, Hashable, Hashable], dict[str, VariantVerdict]] = {}
    for (kernel, shape, variant), per_chip in cells.items():
        for chip, verdict in per_chip.items():
            per_key.setdefault((kernel, shape, chip), {})[variant] = verdict
    return {key: best_variant(verdicts, default) for key, verdicts in per_key.items()}


def tuning_drift(best_before: Mapping[K, str], best_after: Mapping[K, str]) -> list[TuningChange]:
    """Keys present in both mappings whose best variant changed (in ``best_after`` order).

    Keys present on one side only are coverage changes, not tuning drift, and
    are not reported.
    """
    return [
        TuningChange(key, best_before[key], after)
        for key, after in best_after.items()
        if key in best_before and best_before[key] != after
    ]


# ---------------------------------------------------------------------------
# 6. Correctness gating
# ---------------------------------------------------------------------------

_Gated = TypeVar("_Gated", Comparison, VariantVerdict)


def gate(result: _Gated, correctness_failed: bool) -> _Gated:
    """``result`` with verdict / outcome ``broken`` if the correctness job failed, else unchanged."""
    if not correctness_failed:
        return result
    if isinstance(result, Comparison):
        return dataclasses.replace(result, verdict="broken", more_samples_needed=0)
    return dataclasses.replace(result, outcome="broken", more_samples_needed=0)
