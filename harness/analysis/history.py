"""Per-series history on one chip: each commit's level -- the median of its trials' medians, one per job process
(over all its runs on the chip) -- with an interval, the commits in history order (along the branch's first-parent
line, then the commits off it: see ``harness.record.query.ChipHistory``), and the change points
``stats.detect_change_points`` finds along those levels on each line.  The chip's samples come as arrays from
``harness.record.query.chip_history``."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from harness.analysis.records import ChangeFlag, HistoryPoint, SeriesHistory
from harness.core import stats
from harness.record import query
from harness.record.store import Store

__all__ = ["history", "trial_levels"]

MIN_TRIALS_FOR_CI = 3  # below this many trials a point's interval is its pooled samples' (one process: all we have)


def _ci_ranks(n: int) -> tuple[int, int] | None:
    """The 1-based order statistics of ``stats.median_ci``'s interval for n values (None: no interval)."""
    _, low_rank, high_rank = stats.median_ci(np.arange(1.0, n + 1.0))  # ranks, as stats picks them
    return (int(low_rank), int(high_rank)) if math.isfinite(low_rank) else None


def _row_medians(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """np.median of each sorted row."""
    n = rows.shape[1]
    lower, upper = rows[:, (n - 1) // 2], rows[:, n // 2]
    return lower + 0.5 * (upper - lower)


def trial_levels(data: query.ChipHistory, cells: npt.NDArray[np.int64]
                 ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per flat cell index: the median of its trial medians, and its interval.

    With ``MIN_TRIALS_FOR_CI`` trials or more the interval is ``stats.median_ci`` over the trial medians (the spread
    of its processes: their min and max up to 5 trials); with fewer it is ``stats.median_ci`` of the pooled samples
    (a single process shows only its own noise).  Vectorised per trial count and per sample count.
    """
    medians = data.trial_medians()
    trial_counts = data.trial_counts.ravel()[cells]
    trial_offsets = data.trial_offsets.ravel()[cells]
    level = np.full(cells.size, np.nan)
    low, high = np.full(cells.size, np.nan), np.full(cells.size, np.nan)
    for k in np.unique(trial_counts).tolist():
        if k == 0:
            continue
        where = np.flatnonzero(trial_counts == k)
        rows = np.sort(medians[trial_offsets[where][:, None] + np.arange(k)], axis=1)
        level[where] = _row_medians(rows)
        ranks = _ci_ranks(k) if k >= MIN_TRIALS_FOR_CI else None
        if ranks is not None:
            low[where], high[where] = rows[:, ranks[0] - 1], rows[:, ranks[1] - 1]
    few = np.flatnonzero((trial_counts > 0) & (trial_counts < MIN_TRIALS_FOR_CI))
    counts = data.counts.ravel()[cells[few]]
    for n in np.unique(counts).tolist():
        where = few[counts == n]
        ranks = _ci_ranks(n)
        if ranks is not None:
            rows = data.cell_rows(cells[where], n)
            low[where], high[where] = rows[:, ranks[0] - 1], rows[:, ranks[1] - 1]
    return level, low, high


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
    """Per series on ``chip``: its commits in history order, each commit's level and interval, and change points.

    History order follows ancestry: the branch's first-parent line from its newest commit, oldest first, then the
    commits off that line (side branches...) as lines of their own, never interleaved into it; commits whose
    parents are unknown keep the time order of their first runs.  Change points are looked for along each line.
    A commit's level (``HistoryPoint.median``) is the median of the medians of its trials -- one per job process,
    over all its clean runs on the chip (``include_dirty`` adds runs of dirty trees) -- since each process sits at
    a level of its own; ``n`` counts its samples; the interval is ``trial_levels``'.
    ``last`` keeps the last N commits of the main line (and the commits off it run since).
    ``change_points=False`` skips ``stats.detect_change_points``, which costs O(n^2) per series (~0.1 s per
    series at 1000 commits).
    """
    query.check_chip(store, chip)
    data = query.chip_history(store, chip, kernel, include_dirty=include_dirty, last=last)
    n_series = len(data.series)
    # series-major, history order within a series; commits only loaded behind the window are left out
    present_series, present_commit = np.nonzero((data.counts > 0).T & data.shown)
    flat = present_commit * n_series + present_series
    median, low, high = trial_levels(data, flat)
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
