"""Per-series history on one chip: each commit's pooled samples (in order of the commit's first run) as a median
with its confidence interval, and the change points ``stats.detect_change_points`` finds along the medians.  The
chip's samples come as arrays from ``harness.record.query.chip_history``."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from harness.analysis.records import ChangeFlag, HistoryPoint, SeriesHistory
from harness.core import stats
from harness.record import query
from harness.record.store import Store

__all__ = ["history"]


def _medians_and_ci(data: query.ChipHistory, cells: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.float64], ...]:
    """stats.median_ci of every cell, vectorised per sample count (the order-statistic ranks depend on n only)."""
    # Kept beside stats.median_ci (identical results, ranks taken from it): one call per cell is ~50x slower.
    counts = data.counts.ravel()[cells]
    median = np.full(cells.size, np.nan)
    low, high = np.full(cells.size, np.nan), np.full(cells.size, np.nan)
    for n in np.unique(counts):
        n = int(n)
        if n == 0:
            continue
        where = np.flatnonzero(counts == n)
        rows = data.cell_rows(cells[where], n)
        lower, upper = rows[:, (n - 1) // 2], rows[:, n // 2]
        median[where] = lower + 0.5 * (upper - lower)
        _, low_rank, high_rank = stats.median_ci(np.arange(1.0, n + 1.0))  # ranks, as stats picks them
        if math.isfinite(low_rank):
            low[where], high[where] = rows[:, int(low_rank) - 1], rows[:, int(high_rank) - 1]
    return median, low, high


def history(
    store: Store,
    chip: str,
    kernel: str | None = None,
    *,
    include_dirty: bool = False,
    last: int | None = None,
    change_points: bool = True,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
) -> list[SeriesHistory]:
    """Per series on ``chip``: its commits in run order (first run's start), median + CI, and change points.

    All clean runs of a commit on the chip pool their samples (``include_dirty`` adds runs of dirty trees);
    ``last`` keeps the chip's last N commits only.  ``change_points=False`` skips
    ``stats.detect_change_points``, which costs O(n^2) per series (~0.1 s per series at 1000 commits).
    """
    query.check_chip(store, chip)
    data = query.chip_history(store, chip, kernel, include_dirty=include_dirty, last=last)
    n_series = len(data.series)
    present_series, present_commit = np.nonzero(data.counts.T > 0)  # series-major, commit order within a series
    flat = present_commit * n_series + present_series
    median, low, high = _medians_and_ci(data, flat)
    counts = data.counts.ravel()[flat]
    bounds = np.searchsorted(present_series, np.arange(n_series + 1))
    points_of_commit = [(sha, message, branch, started) for _, sha, message, branch, started in data.commits]
    out = []
    for s, key in enumerate(data.series):
        span = slice(bounds[s], bounds[s + 1])
        commit_ids = present_commit[span].tolist()
        points = tuple(HistoryPoint(*points_of_commit[c], m, lo, hi, n) for c, m, lo, hi, n in zip(
            commit_ids, median[span].tolist(), low[span].tolist(), high[span].tolist(), counts[span].tolist(),
            strict=True))
        flags: tuple[ChangeFlag, ...] = ()
        if change_points:
            found = stats.detect_change_points(median[span], min_effect=min_effect, alpha=alpha)
            flags = tuple(ChangeFlag(cp.kind, cp.index, cp.end_index, points[cp.index].sha, points[cp.end_index].sha,
                                     cp.before, cp.after, cp.ratio) for cp in found)
        out.append(SeriesHistory(key, points, flags))
    return sorted(out, key=lambda h: h.key)
