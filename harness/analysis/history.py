"""Per-series history on one chip: each commit's pooled samples as a median with its confidence interval, the
commits in history order (along the branch's first-parent line, then the commits off it: see
``harness.record.query.ChipHistory``), and the change points ``stats.detect_change_points`` finds along the medians
of each line.  The chip's samples come as arrays from ``harness.record.query.chip_history``."""

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
    """Per series on ``chip``: its commits in history order, median + CI, and change points.

    History order follows ancestry: the branch's first-parent line from its newest commit, oldest first, then the
    commits off that line (side branches...) as lines of their own, never interleaved into it; commits whose
    parents are unknown keep the time order of their first runs.  Change points are looked for along each line.
    All clean runs of a commit on the chip pool their samples (``include_dirty`` adds runs of dirty trees);
    ``last`` keeps the last N commits of the main line (and the commits off it run since).
    ``change_points=False`` skips ``stats.detect_change_points``, which costs O(n^2) per series (~0.1 s per
    series at 1000 commits).
    """
    query.check_chip(store, chip)
    data = query.chip_history(store, chip, kernel, include_dirty=include_dirty, last=last)
    n_series = len(data.series)
    # series-major, history order within a series; commits only loaded as bases of the window are left out
    present_series, present_commit = np.nonzero((data.counts > 0).T & data.shown)
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
        flags: list[ChangeFlag] = []
        if change_points:
            lines = data.line[present_commit[span]]  # non-decreasing: the lines follow each other
            bounds_of_lines = [0, *(np.flatnonzero(np.diff(lines)) + 1).tolist(), len(points)]
            for start, stop in zip(bounds_of_lines[:-1], bounds_of_lines[1:], strict=True):
                found = stats.detect_change_points(median[span][start:stop], min_effect=min_effect, alpha=alpha)
                flags.extend(ChangeFlag(cp.kind, start + cp.index, start + cp.end_index, points[start + cp.index].sha,
                                        points[start + cp.end_index].sha, cp.before, cp.after, cp.ratio)
                             for cp in found)
        out.append(SeriesHistory(key, points, tuple(flags)))
    return sorted(out, key=lambda h: h.key)
