"""Change points along a per-commit history: steps and drifts by penalised optimal partitioning
(docs/statistics.md, section 11)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from harness.stats import distributions
from harness.stats.policy import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT, NOISE_FLOOR
from harness.stats.samples import relative_change, safe_exp

__all__ = [
    "CHANGE_KINDS",
    "SMALL_SAMPLE_INFLATION",
    "WINDOW",
    "ChangeKind",
    "ChangePoint",
    "Window",
    "FittedSegment",
    "Segment",
    "change_point",
    "detect_change_points",
    "fit_segment",
    "jump_is_supported",
    "optimal_segments",
    "robust_noise",
    "robust_noise_rows",
    "stitched",
    "valid_history",
    "windows",
    "winsorise",
    "winsorise_rows",
]

ChangeKind = Literal["step", "drift"]
CHANGE_KINDS: tuple[ChangeKind, ...] = ("step", "drift")

_WINSOR_WIDTH = 5  # running-median window used to winsorise a history
_WINSOR_CLIP = 3.0  # ... and the clip, in noise sigmas
_TRIM_KEEP = 0.8  # fraction of first differences kept by the noise estimate
_TRIM_QUANTILE = float(distributions.norm_ppf(0.5 + _TRIM_KEEP / 2.0))
# E[Z^2 | |Z| <= q] for standard normal Z: makes the trimmed mean square consistent for sigma^2
_TRIMMED_VARIANCE_FACTOR = 1.0 - 2.0 * _TRIM_QUANTILE * float(distributions.norm_pdf(_TRIM_QUANTILE)) / _TRIM_KEEP
SMALL_SAMPLE_INFLATION = 3.0  # penalty x (1 + 3/sqrt(n)): ~2 standard errors of sigma-hat^2 above it
WINDOW = 256  # a longer history is searched in windows of this many commits, half overlapping (``windows``)


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



def robust_noise(values: npt.NDArray[np.float64]) -> float:
    """Noise sigma from first differences: trimmed RMS about their median, / sqrt(2)."""
    return float(robust_noise_rows(np.asarray(values, dtype=np.float64)[None, :])[0])


def robust_noise_rows(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``robust_noise`` of each row of ``values`` (rows of one length), at once."""
    differences = np.diff(values, axis=1)
    if differences.shape[1] < 2:
        return np.full(values.shape[0], NOISE_FLOOR)
    deviations = np.sort(np.abs(differences - np.median(differences, axis=1, keepdims=True)), axis=1)
    kept = deviations[:, : max(2, int(_TRIM_KEEP * deviations.shape[1]))]
    variance_of_differences = np.mean(kept * kept, axis=1) / _TRIMMED_VARIANCE_FACTOR
    return np.maximum(NOISE_FLOOR, np.sqrt(variance_of_differences / 2.0))


def _running_median(values: npt.NDArray[np.float64], width: int) -> npt.NDArray[np.float64]:
    """``scipy.ndimage.median_filter(row, size=width, mode="nearest")`` along the last axis of ``values`` (a history,
    or rows of them), odd ``width``: each value's window, the ends repeated, and its middle value (a selection:
    exact)."""
    half = width // 2
    padded = np.pad(values, [(0, 0)] * (values.ndim - 1) + [(half, half)], mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., half]


def winsorise(values: npt.NDArray[np.float64], sigma: float) -> npt.NDArray[np.float64]:
    return winsorise_rows(np.asarray(values, dtype=np.float64)[None, :], np.array([sigma]))[0]


def winsorise_rows(values: npt.NDArray[np.float64], sigma: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``winsorise`` of each row of ``values`` (rows of one length) with its own ``sigma``, at once."""
    running_median = _running_median(values, _WINSOR_WIDTH)
    limit = (_WINSOR_CLIP * sigma)[:, None]
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
class Segment:
    start: int
    stop: int  # exclusive
    linear: bool


def optimal_segments(
    values: npt.NDArray[np.float64],
    *,
    segment_penalty: float,
    slope_penalty: float,
    min_segment: int,
    min_drift_length: int,
) -> list[Segment]:
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
    segments: list[Segment] = []
    stop = n
    while stop > 0:
        start = int(previous[stop])
        segments.append(Segment(start, stop, bool(is_linear[stop])))
        stop = start
    return segments[::-1]


@dataclass(frozen=True)
class FittedSegment:
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


def fit_segment(
    values: npt.NDArray[np.float64], segment: Segment, *, min_effect: float, alpha: float
) -> FittedSegment:
    """A ramp is kept only if Mann-Kendall says it trends and its total change is material."""
    chunk = values[segment.start : segment.stop]
    plateau = FittedSegment(segment.start, segment.stop, False, float(np.mean(chunk)), 0.0)
    if not segment.linear or chunk.size < 3 or np.ptp(chunk) == 0:
        return plateau
    index = np.arange(chunk.size, dtype=np.float64)
    trend_p = distributions.kendall_trend_p(chunk)
    slope, intercept = np.polyfit(index, chunk, 1)
    material = abs(relative_change(slope * index[-1])) > min_effect
    if math.isfinite(trend_p) and trend_p < alpha and material:
        return FittedSegment(segment.start, segment.stop, True, float(intercept), float(slope))
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


def jump_is_supported(
    values: npt.NDArray[np.float64],
    left: FittedSegment,
    right: FittedSegment,
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


def valid_history(medians: Sequence[float]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp]]:
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
    window: int | None = WINDOW,
) -> list[ChangePoint]:
    """Steps and drifts in a per-commit history (commit order; lower is better).

    Entries that are nan, infinite or <= 0 are treated as missing commits. A history longer than ``window`` is
    searched in ``windows`` of that many commits, each on its own (``None``: the whole history at once).
    See docs/statistics.md, section 11, for the model and defaults.
    """
    values = np.asarray(medians, dtype=np.float64).ravel()
    return stitched([(stretch, detect_in_window(values[stretch.start:stretch.stop], min_effect=min_effect, alpha=alpha,
                                                penalty=penalty, min_segment=min_segment,
                                                min_drift_length=min_drift_length))
                     for stretch in windows(values.size, window)])


def detect_in_window(medians: Sequence[float], *, min_effect: float, alpha: float, penalty: float, min_segment: int,
                     min_drift_length: int) -> list[ChangePoint]:
    """``detect_change_points`` of the whole of ``medians``, searched at once (no windows); the parameters are its
    (their defaults are there)."""
    log_values, positions = valid_history(medians)
    n = log_values.size
    if n < 2 * min_segment:
        return []
    sigma = robust_noise(log_values)
    per_parameter = penalty * sigma * sigma * (1.0 + SMALL_SAMPLE_INFLATION / math.sqrt(n)) * math.log(n)
    cleaned = winsorise(log_values, sigma)
    segments = optimal_segments(
        cleaned,
        segment_penalty=2.0 * per_parameter,
        slope_penalty=per_parameter,
        min_segment=min_segment,
        min_drift_length=min_drift_length,
    )
    fitted = [fit_segment(cleaned, s, min_effect=min_effect, alpha=alpha) for s in segments]
    found: list[ChangePoint] = []
    for left, right in zip([None, *fitted[:-1]], fitted, strict=True):
        if left is not None:
            jump = right.start_level - left.end_level
            supported = jump_is_supported(cleaned, left, right, threshold=per_parameter, hinge_search=min_drift_length)
            if abs(relative_change(jump)) > min_effect and supported:
                index = positions[right.start]
                found.append(change_point("step", index, index, left.end_level, right.start_level))
        if right.drifting:
            start, end = positions[right.start], positions[right.stop - 1]
            found.append(change_point("drift", start, end, right.start_level, right.end_level))
    return found


@dataclass(frozen=True)
class Window:
    """A stretch of a history searched on its own: commits ``start`` to ``stop`` (exclusive); of what it finds, the
    changes whose first commit lies from ``own_start`` to ``own_stop`` (exclusive) count (``stitched``)."""

    start: int
    stop: int
    own_start: int
    own_stop: int


def windows(n: int, window: int | None = WINDOW) -> list[Window]:
    """The windows a history of ``n`` commits is searched in: the whole of it up to ``window`` commits; beyond,
    windows of ``window`` commits starting every ``window // 2`` (fixed: a new commit changes none of them) and one
    ending at the newest commit. Each change counts in one window only, one that has at least ``window // 4``
    commits on either side of it, or the history's end: a regular window owns its middle half (the first, from
    the oldest commit), the last window what follows."""
    if window is None or n <= window:
        return [Window(0, n, 0, n)]
    stride = window // 2
    regular = [Window(k * stride, k * stride + window, 0 if k == 0 else k * stride + stride // 2,
                      k * stride + stride // 2 + stride) for k in range((n - window) // stride + 1)]
    last = regular[-1]
    if last.stop == n:
        return [*regular[:-1], Window(last.start, n, last.own_start, n)]
    return [*regular, Window(n - window, n, last.own_stop, n)]


def stitched(searched: Sequence[tuple[Window, Sequence[ChangePoint]]]) -> list[ChangePoint]:
    """A history's changes from what each of its windows found (indices into the window; the windows in order): each
    window's own changes, and a drift still going at the end of its window carried on by the drift of the next window
    that overlaps it (its end and level then the later one's). Two windows can place one change on either side of the
    commit where the first one's own commits end (a drift's start, most of all): near it (``window // 16`` commits
    either side) the changes are the later window's where it found one there, else the earlier one's."""
    shifted = [[dataclasses.replace(c, index=c.index + stretch.start, end_index=c.end_index + stretch.start)
                for c in changes] for stretch, changes in searched]
    bounds = [[stretch.own_start, stretch.own_stop] for stretch, _ in searched]
    for k in range(len(searched) - 1):
        stretch = searched[k][0]
        boundary, near = stretch.own_stop, (stretch.stop - stretch.start) // 16
        later = any(boundary - near <= c.index < boundary + near for c in shifted[k + 1])
        bounds[k][1] = bounds[k + 1][0] = boundary - near if later else boundary + near
    found: list[ChangePoint] = []
    cut_at = -1  # the last commit of the window before: a drift ending there ran to its window's end
    for (stretch, _), changes, (low, high) in zip(searched, shifted, bounds, strict=True):
        going_on = None
        if found and found[-1].kind == "drift" and found[-1].end_index == cut_at:
            going_on = next((c for c in changes if c.kind == "drift" and c.index <= cut_at < c.end_index), None)
        if going_on is not None:
            drift = found[-1]
            found[-1] = ChangePoint(drift.index, "drift", drift.before, going_on.after, going_on.after / drift.before,
                                    going_on.end_index)
        found += [c for c in changes if c is not going_on and low <= c.index < high]
        cut_at = stretch.stop - 1
    return found


def change_point(kind: ChangeKind, index: int, end_index: int, log_before: float, log_after: float) -> ChangePoint:
    before, after = safe_exp(log_before), safe_exp(log_after)
    return ChangePoint(int(index), kind, before, after, safe_exp(log_after - log_before), int(end_index))

