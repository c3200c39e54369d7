"""Robust summaries of timing samples: the median and its interval, log spreads, safe exponentials
(docs/statistics.md, section 8)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from harness.stats.policy import MAD_TO_SIGMA

__all__ = [
    "Samples",
    "finite",
    "log_spread",
    "lower_rank",
    "mad_correction",
    "median_ci",
    "midpoint",
    "positive_finite",
    "relative_change",
    "safe_exp",
    "sorted_median",
]

Samples = Sequence[float] | npt.NDArray[np.floating]
# Mean-unbiasing factors for 1.4826 x MAD of n normal values (Monte Carlo, 4e5 draws each); n/(n-0.8) beyond
_MAD_SMALL_N = {2: 1.196, 3: 1.488, 4: 1.361, 5: 1.215, 6: 1.191, 7: 1.138, 8: 1.127, 9: 1.101}


def finite(samples: Samples) -> npt.NDArray[np.float64]:
    values = np.asarray(samples, dtype=np.float64).ravel()
    return values[np.isfinite(values)]


def positive_finite(samples: Samples) -> npt.NDArray[np.float64]:
    values = finite(samples)
    return values[values > 0]


def midpoint(lower: npt.NDArray[np.float64], upper: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """(lower + upper) / 2 without overflow for values near the float maximum."""
    return lower + 0.5 * (upper - lower)


def sorted_median(ordered: npt.NDArray[np.float64]) -> float:
    n = ordered.size
    return float(midpoint(ordered[(n - 1) // 2], ordered[n // 2]))


def median_ci(samples: Samples, confidence: float = 0.95) -> tuple[float, float, float]:
    """Return ``(median, lo, hi)``: an order-statistic CI of the median.

    n = 0 -> all nan; n < 3 -> nan bounds; when ``confidence`` is not
    attainable with n samples (n <= 5 at 95 %) -> ``(median, min, max)``.
    """
    values = np.sort(finite(samples))
    n = values.size
    if n == 0:
        return (math.nan, math.nan, math.nan)
    median = sorted_median(values)
    if n < 3:
        return (median, math.nan, math.nan)
    rank = lower_rank(n, confidence)
    if rank is None:
        return (median, float(values[0]), float(values[-1]))
    return (median, float(values[rank - 1]), float(values[n - rank]))


@functools.lru_cache(maxsize=4096)
def lower_rank(n: int, confidence: float) -> int | None:
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


def safe_exp(value: float) -> float:
    """exp(value), saturating to inf instead of raising on absurd inputs."""
    with np.errstate(over="ignore"):
        return float(np.exp(value))


def relative_change(log_change: float) -> float:
    """exp(log_change) - 1, saturating to inf instead of raising on absurd inputs."""
    with np.errstate(over="ignore"):
        return float(np.expm1(log_change))


def log_spread(*groups: npt.NDArray[np.float64]) -> float:
    """Robust pooled spread of log samples: 1.4826 x MAD about each group's median."""
    residuals = [np.log(g) - np.median(np.log(g)) for g in groups if g.size >= 2]
    if not residuals:
        return math.nan
    return float(MAD_TO_SIGMA * np.median(np.abs(np.concatenate(residuals))))


def mad_correction(n: int) -> float:
    """Makes 1.4826 x MAD of n normal values mean-unbiased for their sd."""
    return _MAD_SMALL_N.get(n, n / (n - 0.8))

