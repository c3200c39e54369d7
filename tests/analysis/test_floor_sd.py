"""The vectorised history floor (``regressions._floor_sd``) is ``runshift.history_floor``'s numbers, bit for bit."""

from __future__ import annotations

import numpy as np

from harness.analysis import regressions
from harness.stats import policy, samples


def _reference(levels: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """np.median, as the floor was computed before (and as ``runshift.history_floor`` computes it)."""
    sd = np.full(filled.size, np.nan)
    for n in np.unique(filled[filled >= policy.FLOOR_MIN_RUNS]).tolist():
        where = np.flatnonzero(filled == n)
        rows = levels[where, :n]
        middle = np.median(rows, axis=1)
        mad = np.median(np.abs(rows - middle[:, None]), axis=1)
        sd[where] = np.maximum(policy.MAD_TO_SIGMA * mad * samples.mad_correction(n), policy.NOISE_FLOOR)
    return sd


def test_floor_sd_is_the_median_floor_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    rows, limit = 20_000, 20
    levels = rng.normal(0.0, 1.0, (rows, limit)) * 10.0 ** rng.uniform(-6, 2, (rows, 1)) + rng.normal(0, 5, (rows, 1))
    tied = rng.random((rows, limit)) < 0.3
    levels[tied] = np.round(levels[tied], 2)  # ties
    levels[rng.integers(rows, size=50), rng.integers(limit, size=50)] = np.nan
    levels[rng.integers(rows, size=20), rng.integers(limit, size=20)] = np.inf
    filled = rng.integers(0, limit + 1, rows)
    got, want = regressions._floor_sd(levels, filled), _reference(levels, filled)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(got).any() and np.isfinite(got).sum() > rows // 2
