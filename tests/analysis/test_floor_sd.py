"""The vectorised history floor (``regressions._floor_sd``) is ``runshift.history_floor``'s numbers, bit for bit."""

from __future__ import annotations

import numpy as np

from harness.analysis import regressions
from harness.record import query
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
    rows, limit = 40_000, 20
    levels = rng.normal(0.0, 1.0, (rows, limit)) * 10.0 ** rng.uniform(-6, 2, (rows, 1)) + rng.normal(0, 5, (rows, 1))
    tied = rng.random((rows, limit)) < 0.3
    levels[tied] = np.round(levels[tied], 2)  # ties
    levels[rng.integers(rows, size=50), rng.integers(limit, size=50)] = np.nan
    levels[rng.integers(rows, size=20), rng.integers(limit, size=20)] = np.inf
    filled = rng.integers(0, limit + 1, rows)
    got, want = regressions._floor_sd(levels, filled), _reference(levels, filled)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(got).any() and np.isfinite(got).sum() > rows // 2


def test_floor_runs_built_per_commit_are_the_walked_chains() -> None:
    """``_floor_runs`` with the commits' order (each commit's runs before it built from its previous point's) gives
    each pair the same levels and counts as walking the pair's chain, on branchy histories with points of several
    runs, gaps and more pairs than the walk's threshold."""
    rng = np.random.default_rng(3)
    for trial in range(30):
        n_commits, n_series = int(rng.integers(5, 80)), int(rng.integers(1, 9))
        order = rng.permutation(n_commits)  # a commit's previous one comes anywhere in the index order
        previous = np.full(n_commits, -1, dtype=np.int64)
        for i in range(1, n_commits):
            if rng.random() < 0.95:
                previous[order[i]] = order[rng.integers(max(0, i - 3), i)] if rng.random() < 0.3 else order[i - 1]
        present = rng.random((n_commits, n_series)) < 0.8
        runs = np.where(present, rng.choice([1, 1, 1, 2, 3], size=present.shape), 0).ravel().astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64)
        levels = rng.normal(size=int(runs.sum()))
        if trial % 3 == 0:
            levels[rng.integers(levels.size, size=3)] = np.nan
        cells = regressions._Cells(runs, np.zeros(runs.size), np.zeros(runs.size), runs, offsets, levels)
        data = query.ChipHistory("chip", [(i, f"{i:040x}", "", "main", None) for i in range(n_commits)],
                                 [], present.astype(np.int64), np.zeros_like(present, dtype=np.int64), np.zeros(0),
                                 previous)
        base_of = data.nearest_with(present)
        head, series = np.nonzero(present & (base_of >= 0))
        base = base_of[head, series]
        limit = int(rng.integers(1, 25))
        walked = regressions._floor_runs(cells, base_of, base, series, n_series, limit)
        built = regressions._floor_runs(cells, base_of, base, series, n_series, limit,
                                        order=data.ancestors_first())
        assert np.array_equal(walked[0], built[0], equal_nan=True) and np.array_equal(walked[1], built[1])
        # and every pair's chain is built, whatever the threshold
        built_here = regressions._floors_of_commits(cells, base_of, n_series, limit, data.ancestors_first())
        cell = base * n_series + series
        assert np.array_equal(walked[0], built_here[0][cell], equal_nan=True)
        assert np.array_equal(walked[1], built_here[1][cell])
