"""Per-series history on one chip: each commit's level -- the median of its trials' medians, one per job process
(over all its runs on the chip) -- with an interval, the commits in history order (along the branch's first-parent
line, then the commits off it: see ``harness.record.query.ChipHistory``), and the change points
``changepoints.detect_change_points`` finds along those levels on each line.  The chip's samples come as arrays from
``harness.record.query.chip_history``; ``series_histories`` builds the histories from per-cell levels alone (the
report's cache keeps those, ``harness.analysis.cache``), and ``detect_many`` is
``changepoints.detect_change_points`` of many histories at once."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from harness.analysis import segment_search
from harness.analysis.records import ChangeFlag, HistoryPoints, SeriesHistory
from harness.record import query
from harness.record.store import Store
from harness.stats import changepoints, policy, samples

__all__ = ["by_series_key", "cell_levels", "detect_many", "history", "series_histories", "trial_levels", "with_flags"]

MIN_TRIALS_FOR_CI = 3  # below this many trials a point's interval is its pooled samples' (one process: all we have)

# One series' change points as plain values: (kind, index, end_index, before, after, ratio), indices into its points.
Flags = list[tuple[str, int, int, float, float, float]]
# Finds the change points of many series, each given as its lines' levels (oldest first): ``detect_lines``.
ChangeFinder = Callable[[Sequence[Sequence[npt.NDArray[np.float64]]]], list[Flags]]


def _ci_ranks(n: int) -> tuple[int, int] | None:
    """The 1-based order statistics of ``samples.median_ci``'s interval for n values (None: no interval)."""
    _, low_rank, high_rank = samples.median_ci(np.arange(1.0, n + 1.0))  # ranks, as stats picks them
    return (int(low_rank), int(high_rank)) if math.isfinite(low_rank) else None


def _row_medians(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """np.median of each sorted row."""
    n = rows.shape[1]
    lower, upper = rows[:, (n - 1) // 2], rows[:, n // 2]
    return lower + 0.5 * (upper - lower)


def trial_levels(data: query.ChipHistory, cells: npt.NDArray[np.int64]
                 ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per flat cell index: the median of its trial medians, and its interval.

    With ``MIN_TRIALS_FOR_CI`` trials or more the interval is ``samples.median_ci`` over the trial medians (the spread
    of its processes: their min and max up to 5 trials); with fewer it is ``samples.median_ci`` of the pooled samples
    (a single process shows only its own noise).  Vectorised per trial count and per sample count; each cell's values
    depend on its own samples only.
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


def by_series_key(data: query.ChipHistory) -> query.ChipHistory:
    """``data`` with its series in key order.  The database returns them in an order of its own (which rows come
    first); sums across a commit's grid (the moderation prior of its family) then come out bit for bit the same
    whichever backend or path loaded them (``harness.analysis.cache`` assembles its histories in this order)."""
    order = sorted(range(len(data.series)), key=data.series.__getitem__)
    if order == list(range(len(data.series))):
        return data
    permutation = np.array(order, dtype=np.int64)
    trial_counts = data.trial_counts[:, permutation]
    first = data.trial_offsets[:, permutation].ravel()
    sizes = trial_counts.ravel()
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if sizes.size else sizes
    taken = np.repeat(first - starts, sizes) + np.arange(int(sizes.sum()))  # each trial, in the new cell order
    return dataclasses.replace(
        data, series=[data.series[i] for i in order], counts=data.counts[:, permutation],
        offsets=data.offsets[:, permutation], trial_counts=trial_counts, trial_offsets=starts.reshape(
            trial_counts.shape), trial_starts=data.trial_starts[taken], trial_sizes=data.trial_sizes[taken],
        trial_runs=data.trial_runs[taken],
        _trial_medians=None if data._trial_medians is None else data._trial_medians[taken])


def cell_levels(data: query.ChipHistory
                ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``trial_levels`` of every flat cell with samples (nan elsewhere)."""
    level, low, high = (np.full(data.counts.size, np.nan) for _ in range(3))
    cells = np.flatnonzero(data.counts.ravel() > 0)
    level[cells], low[cells], high[cells] = trial_levels(data, cells)
    return level, low, high


# ---------------------------------------------------------------------------------------------------------------
# Change points of many histories at once
# ---------------------------------------------------------------------------------------------------------------

_DETECT = changepoints.detect_change_points.__kwdefaults__  # its model's parameters: penalty, min_segment, ...
_BATCH = 256  # histories of one length searched together (memory: 6 x _BATCH x n doubles)
_MIN_BATCH = 16  # below this a batch shares too little of the per-step cost to be worth a thread of its own
_WORKERS = 8  # threads at most
_COMPILE_FROM = 1000 * changepoints.WINDOW ** 2  # search work (windows x length^2) from which numba pays its load


def _optimal_segments_many(values: npt.NDArray[np.float64], segment_penalty: npt.NDArray[np.float64],
                           slope_penalty: npt.NDArray[np.float64], *, min_segment: int, min_drift_length: int,
                           compiled: bool = True) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """``changepoints.optimal_segments`` of each row of ``values`` (one penalty pair per row), the same floating-point
    operations on the same numbers: per row and end, the chosen start (``previous``) and whether that segment is
    linear.  ``compiled`` (and numba importable): ``segment_search.search``, one compiled pass per end; else a step
    of the search for every row at once in numpy.  The starts the search skips (``best`` not finite: 1 up to
    ``min_segment - 1``) carry an infinite total here, which argmin never picks either."""
    rows, n = values.shape
    index = np.arange(n, dtype=np.float64)

    def prefix(column: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out = np.zeros((*column.shape[:-1], n + 1))
        np.cumsum(column, axis=-1, out=out[..., 1:])
        return out

    centred = values - np.array([np.median(row) for row in values])[:, None]
    x, xx, ix = prefix(centred), prefix(centred * centred), prefix(index * centred)
    i, ii = prefix(index), prefix(index * index)
    if compiled and segment_search.available():
        return segment_search.search(x, xx, ix, i, ii, segment_penalty, slope_penalty, min_segment=min_segment,
                                     min_drift=min_drift_length)
    # starts along the first axis, histories along the second: each step's slices are contiguous blocks (about
    # twice as fast as rows of a (histories x starts) array; the same operations on the same numbers)
    x, xx, ix = (np.ascontiguousarray(prefix_sums.T) for prefix_sums in (x, xx, ix))
    best = np.full((n + 1, rows), np.inf)
    best[0] = -segment_penalty
    previous = np.zeros((rows, n + 1), dtype=np.intp)
    is_linear = np.zeros((rows, n + 1), dtype=bool)
    every = np.arange(rows)
    segment, slope = segment_penalty[None, :], slope_penalty[None, :]
    sx_buffer, sxx_buffer, ix_buffer, constant_buffer, total_buffer, linear_buffer = (
        np.empty((n + 1, rows)) for _ in range(6))
    for stop in range(min_segment, n + 1):
        k = stop - min_segment + 1  # starts 0 .. k-1
        drifts = max(0, min(k, stop - min_drift_length + 1))  # starts that may carry a linear segment
        count = (stop - np.arange(k)).astype(np.float64)[:, None]
        sx = np.subtract(x[stop], x[:k], out=sx_buffer[:k])
        sxx = np.subtract(xx[stop], xx[:k], out=sxx_buffer[:k])
        constant = constant_buffer[:k]
        np.multiply(sx, sx, out=constant)
        np.divide(constant, count, out=constant)
        np.subtract(sxx, constant, out=constant)
        np.maximum(constant, 0.0, out=constant)
        total = total_buffer[:k]
        linear = linear_buffer[:drifts]
        if drifts:
            si = (i[stop] - i[:drifts])[:, None]
            sii = (ii[stop] - ii[:drifts])[:, None]
            centred_ii = sii - si * si / count[:drifts]
            six = np.subtract(ix[stop], ix[:drifts], out=ix_buffer[:drifts])
            centred_ix = sxx_buffer[:drifts]  # sxx is spent
            np.multiply(si, sx[:drifts], out=centred_ix)
            np.divide(centred_ix, count[:drifts], out=centred_ix)
            np.subtract(six, centred_ix, out=centred_ix)
            np.multiply(centred_ix, centred_ix, out=linear)
            with np.errstate(divide="ignore", invalid="ignore"):
                np.divide(linear, centred_ii, out=linear)
            flat = ~(centred_ii[:, 0] > 0)
            if flat.any():
                linear[flat] = 0.0
            np.subtract(constant[:drifts], linear, out=linear)
            np.maximum(linear, 0.0, out=linear)
            np.add(linear, slope, out=linear)
            np.minimum(constant[:drifts], linear, out=total[:drifts])
        total[drifts:] = constant[drifts:]
        np.add(best[:k], total, out=total)
        np.add(total, segment, out=total)
        choice = np.argmin(total, axis=0)
        best[stop] = total[choice, every]
        previous[:, stop] = choice
        if drifts:
            at = np.minimum(choice, drifts - 1)
            is_linear[:, stop] = (choice < drifts) & (linear[at, every] < constant[choice, every])
    return previous, is_linear


# Searches windows of histories (each at most ``changepoints.WINDOW`` commits) at once: each one's changes, indices into
# it (``detect_windows``; the report's cache passes one that reuses stored results).
WindowSearch = Callable[[Sequence[npt.NDArray[np.float64]]], list[list[changepoints.ChangePoint]]]


def _in_windows(histories: Sequence[Sequence[float] | npt.NDArray[np.float64]]
                ) -> tuple[list[npt.NDArray[np.float64]], list[tuple[int, changepoints.Window]]]:
    """Every window of every history (``changepoints.windows``): its values, and which history and window it is."""
    values_of, where = [], []
    for h, medians in enumerate(histories):
        values = np.asarray(medians, dtype=np.float64).ravel()
        for stretch in changepoints.windows(values.size):
            values_of.append(values[stretch.start:stretch.stop])
            where.append((h, stretch))
    return values_of, where


def detect_many(histories: Sequence[npt.NDArray[np.float64]], *, min_effect: float = policy.DEFAULT_MIN_EFFECT,
                alpha: float = policy.DEFAULT_ALPHA, search: WindowSearch | None = None
                ) -> list[list[changepoints.ChangePoint]]:
    """``changepoints.detect_change_points`` of each history (same results): every window of every history searched
    by ``search`` (default ``detect_windows``, all at once), then stitched (``changepoints.stitched``)."""
    values_of, where = _in_windows(histories)
    per_history: list[list[tuple[changepoints.Window, list[changepoints.ChangePoint]]]] = [[] for _ in histories]
    searched = (search or (lambda windows: detect_windows(windows, min_effect=min_effect, alpha=alpha)))(values_of)
    for (h, stretch), changes in zip(where, searched, strict=True):
        per_history[h].append((stretch, changes))
    return [changepoints.stitched(windows) for windows in per_history]


def detect_windows(windows: Sequence[npt.NDArray[np.float64]], *, min_effect: float = policy.DEFAULT_MIN_EFFECT,
                   alpha: float = policy.DEFAULT_ALPHA) -> list[list[changepoints.ChangePoint]]:
    """``changepoints.detect_in_window`` of each window (same results): its O(n^2) optimal-partitioning search runs
    for all windows of one length together (``_optimal_segments_many``), which shares the per-step cost of numpy
    calls, the batches on all cores (threads: numpy releases the GIL); the rest is ``detect_in_window``'s own steps."""
    penalty, min_segment, min_drift = _DETECT["penalty"], _DETECT["min_segment"], _DETECT["min_drift_length"]
    valid: dict[int, list[tuple[int, npt.NDArray[np.float64], npt.NDArray[np.intp]]]] = {}
    for h, medians in enumerate(windows):
        log_values, positions = changepoints.valid_history(medians)
        if log_values.size >= 2 * min_segment:
            valid.setdefault(log_values.size, []).append((h, log_values, positions))
    prepared: dict[int, list[tuple[int, npt.NDArray[np.float64], npt.NDArray[np.intp], float]]] = {}
    for n, group in valid.items():  # the noise and the winsorised values of a length's windows at once
        values = np.stack([log_values for _, log_values, _ in group])
        sigma = changepoints.robust_noise_rows(values)
        cleaned = changepoints.winsorise_rows(values, sigma)
        inflation = 1.0 + changepoints.SMALL_SAMPLE_INFLATION / math.sqrt(n)
        prepared[n] = [(h, cleaned[row], positions, penalty * s * s * inflation * math.log(n))
                       for row, ((h, _, positions), s) in enumerate(zip(group, sigma.tolist(), strict=True))]
    batches = []  # each a list of windows of one length, at most _BATCH, about one per core when few
    workers = max(1, min(os.cpu_count() or 1, _WORKERS))
    for group in prepared.values():
        size = min(_BATCH, max(_MIN_BATCH, -(-len(group) // workers)))
        batches += [group[start:start + size] for start in range(0, len(group), size)]
    compiled = _worth_compiling(sum(len(batch) * len(batch[0][1]) ** 2 for batch in batches))

    def search(batch: list) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
        per_parameter = np.array([p for *_, p in batch])
        return _optimal_segments_many(np.stack([cleaned for _, cleaned, _, _ in batch]), 2.0 * per_parameter,
                                      per_parameter, min_segment=min_segment, min_drift_length=min_drift,
                                      compiled=compiled)

    if len(batches) > 1 and workers > 1:  # numpy releases the GIL in its loops: the batches share the cores
        with ThreadPoolExecutor(min(workers, len(batches))) as pool:
            searched = list(pool.map(search, batches))
    else:
        searched = [search(batch) for batch in batches]
    found: list[list[changepoints.ChangePoint]] = [[] for _ in windows]
    for batch, (previous, is_linear) in zip(batches, searched, strict=True):
        for row, (h, cleaned, positions, threshold) in enumerate(batch):
            segments, stop = [], cleaned.size
            while stop > 0:
                begin = int(previous[row, stop])
                segments.append(changepoints.Segment(begin, stop, bool(is_linear[row, stop])))
                stop = begin
            found[h] = _change_points(cleaned, segments[::-1], positions, threshold, min_effect=min_effect,
                                      alpha=alpha, hinge_search=min_drift)
    return found


def _worth_compiling(work: int) -> bool:
    """Whether a search of ``work`` (windows x length^2, summed) is faster compiled: numba, once loaded, searches
    ~4x faster than numpy, but loading it costs ~0.3 s (much of it holding the GIL), about what numpy takes for
    1,000-1,500 windows of ``changepoints.WINDOW`` commits (measured: 400 windows 0.20 s in numpy, 0.48 s with the
    load; 2,000 windows 1.32 against 1.11 s); a search already loaded costs nothing."""
    return segment_search.loaded() or work >= _COMPILE_FROM


def _change_points(cleaned: npt.NDArray[np.float64], segments: list, positions: npt.NDArray[np.intp],
                   per_parameter: float, *, min_effect: float, alpha: float, hinge_search: int
                   ) -> list[changepoints.ChangePoint]:
    """``changepoints.detect_change_points`` after its segmentation: fit the segments, keep the supported steps and the
    trending drifts."""
    fitted = [changepoints.fit_segment(cleaned, s, min_effect=min_effect, alpha=alpha) for s in segments]
    found: list[changepoints.ChangePoint] = []
    for left, right in zip([None, *fitted[:-1]], fitted, strict=True):
        if left is not None:
            jump = right.start_level - left.end_level
            supported = changepoints.jump_is_supported(cleaned, left, right, threshold=per_parameter,
                                                 hinge_search=hinge_search)
            if abs(samples.relative_change(jump)) > min_effect and supported:
                index = positions[right.start]
                found.append(changepoints.change_point("step", index, index, left.end_level, right.start_level))
        if right.drifting:
            start, end = positions[right.start], positions[right.stop - 1]
            found.append(changepoints.change_point("drift", start, end, right.start_level, right.end_level))
    return found


def detect_lines(series: Sequence[Sequence[npt.NDArray[np.float64]]], *, min_effect: float = policy.DEFAULT_MIN_EFFECT,
                 alpha: float = policy.DEFAULT_ALPHA, search: WindowSearch | None = None) -> list[Flags]:
    """Per series (its lines' levels, oldest first, one line after the other): the change points of each line, as
    ``history`` reports them (indices into the series' points); ``search``: as ``detect_many``'s."""
    flat = [line for lines in series for line in lines]
    found = iter(detect_many(flat, min_effect=min_effect, alpha=alpha, search=search))
    out: list[Flags] = []
    for lines in series:
        flags: Flags = []
        start = 0
        for line in lines:
            flags.extend((cp.kind, start + cp.index, start + cp.end_index, cp.before, cp.after, cp.ratio)
                         for cp in next(found))
            start += len(line)
        out.append(flags)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Histories
# ---------------------------------------------------------------------------------------------------------------


def series_histories(data: query.ChipHistory, level: npt.NDArray[np.float64], low: npt.NDArray[np.float64],
                     high: npt.NDArray[np.float64], *, change_points: bool = True,
                     min_effect: float = policy.DEFAULT_MIN_EFFECT, alpha: float = policy.DEFAULT_ALPHA,
                     find: ChangeFinder | None = None) -> list[SeriesHistory]:
    """The histories of ``data``'s series from each flat cell's level and interval (``cell_levels``: only
    ``data``'s commits, series, history order and sample counts are read). ``find`` finds the change points
    (default ``detect_lines``; the report's cache passes one that reuses stored results)."""
    n_series = len(data.series)
    # series-major, history order within a series; commits only loaded behind the window are left out
    present_series, present_commit = np.nonzero((data.counts > 0).T & data.shown)
    flat = present_commit * n_series + present_series
    median, low, high = level[flat], low[flat], high[flat]
    counts = data.counts.ravel()[flat]
    bounds = np.searchsorted(present_series, np.arange(n_series + 1))
    points_of_commit = [(sha, message, branch, started) for _, sha, message, branch, started in data.commits]
    spans = [slice(int(bounds[s]), int(bounds[s + 1])) for s in range(n_series)]
    flags_of: list[Flags] = [[] for _ in spans]
    if change_points:
        lines_of = []
        for span in spans:
            lines = data.line[present_commit[span]]  # non-decreasing: the lines follow each other
            cuts = np.flatnonzero(np.diff(lines)) + 1
            lines_of.append(np.split(median[span], cuts) if len(lines) else [])
        flags_of = (find or (lambda s: detect_lines(s, min_effect=min_effect, alpha=alpha)))(lines_of)
    out = [with_flags(key, HistoryPoints(points_of_commit, present_commit[span], median[span], low[span], high[span],
                                         counts[span]), flags)
           for key, span, flags in zip(data.series, spans, flags_of, strict=True)]
    return sorted(out, key=lambda h: h.key)


def with_flags(key: query.SeriesKey, points: HistoryPoints, flags: Flags) -> SeriesHistory:
    """A series' history: its points and its change points, given as ``Flags`` (indices into the points)."""
    shas = points.shas if flags else []
    return SeriesHistory(key, points, tuple(ChangeFlag(kind, index, end, shas[index], shas[end], before, after, ratio)
                                            for kind, index, end, before, after, ratio in flags))


def history(
    store: Store,
    chip: str,
    kernel: str | None = None,
    *,
    include_dirty: bool = False,
    last: int | None = None,
    change_points: bool = True,
    min_effect: float = policy.DEFAULT_MIN_EFFECT,
    alpha: float = policy.DEFAULT_ALPHA,
) -> list[SeriesHistory]:
    """Per series on ``chip``: its commits in history order, each commit's level and interval, and change points.

    History order follows ancestry: the branch's first-parent line from its newest commit, oldest first, then the
    commits off that line (side branches...) as lines of their own, never interleaved into it; commits whose
    parents are unknown keep the time order of their first runs.  Change points are looked for along each line.
    A commit's level (``HistoryPoint.median``) is the median of the medians of its trials -- one per job process,
    over all its clean runs on the chip (``include_dirty`` adds runs of dirty trees) -- since each process sits at
    a level of its own; ``n`` counts its samples; the interval is ``trial_levels``'.
    ``last`` keeps the last N commits of the main line (and the commits off it run since).
    ``change_points=False`` skips ``changepoints.detect_change_points``, which costs O(n^2) per series (~0.01 s per
    series at 1000 commits, searched together: ``detect_many``).
    """
    query.check_chip(store, chip)
    data = by_series_key(query.chip_history(store, chip, kernel, include_dirty=include_dirty, last=last))
    return series_histories(data, *cell_levels(data), change_points=change_points, min_effect=min_effect,
                            alpha=alpha)
