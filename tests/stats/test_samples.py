"""Tests for harness.stats.samples: the order-statistic interval of a median."""

from __future__ import annotations

import math

import numpy as np

from harness.stats.samples import median_ci


def test_median_ci_uses_binomial_order_statistics() -> None:
    samples = np.arange(1.0, 11.0)[::-1]  # unsorted on purpose
    assert median_ci(samples) == (5.5, 2.0, 9.0)  # n = 10 at 95 %: x(2), x(9), coverage 97.9 %
    median, lo, hi = median_ci(np.arange(1.0, 101.0))
    assert (median, lo, hi) == (50.5, 40.0, 61.0)  # textbook ranks 40 and 61 for n = 100


def test_median_ci_small_samples() -> None:
    assert all(math.isnan(v) for v in median_ci([]))
    median, lo, hi = median_ci([3.0])
    assert median == 3.0 and math.isnan(lo) and math.isnan(hi)
    median, lo, hi = median_ci([1.0, 2.0])
    assert median == 1.5 and math.isnan(lo) and math.isnan(hi)
    assert median_ci([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 1.0, 5.0)  # 95 % not attainable: min, max
    assert median_ci([1.0, 2.0, 3.0, math.nan, math.inf]) == (2.0, 1.0, 3.0)  # non-finite dropped

