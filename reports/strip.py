"""A strip plot of raw benchmark samples as inline SVG: one column per trial (job process), a point per sample.

x: the trials, grouped by side and run (``Column.group``: e.g. "base · run 817f18ab"), each column's points spread
sideways by a fixed, deterministic jitter (the golden-ratio sequence over the sample's rank: the same data always
gives the same picture); y: time per call in one unit (s, ms, µs or ns, chosen from the data) with an axis title.
A dark bar marks each trial's median: the value a trial contributes to a verdict (``harness.stats.trials`` works on
the log of trial medians). Every text is escaped; the result is ``Markup``. No script, nothing fetched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
from markupsafe import Markup, escape

from reports.svg import nice_ticks

__all__ = ["Column", "UNITS", "median", "strip_plot", "time_unit"]

UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))
GOLDEN = 0.6180339887498949


@dataclass(frozen=True)
class Column:
    """One trial's samples (seconds per call, finite and positive), in stored order."""

    group: str  # the label its group of columns shares (side and run)
    trial: int
    values: Sequence[float]
    color: str = "#2563eb"
    title: str = ""  # hover text of the median bar (default: the trial and its median)
    median: float | None = None  # ``median(values)`` when the caller has it already (else computed here)


def time_unit(largest: float) -> tuple[str, float]:
    """The unit (name, seconds) that writes ``largest`` with at least one digit before the point."""
    for name, scale in UNITS:
        if largest >= scale:
            return name, scale
    return UNITS[-1]


def _num(value: float) -> str:
    return f"{value:.4g}"


def median(values: Sequence[float]) -> float:
    """``np.median`` of a few values, bit for bit (an even count: the middle two's sum halved, as numpy's mean of
    them; nan when one is), without numpy's cost per call: a samples page takes two per trial."""
    if any(value != value for value in values):
        return math.nan
    ordered = sorted(values)
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def strip_plot(columns: Sequence[Column], *, label: str, width: int = 760, height: int = 320,
               plot_id: str = "") -> Markup:
    """The samples of ``columns`` (in order, consecutive columns of one ``group`` drawn together)."""
    left, right, top, bottom = 78, 14, 14, 62
    inner_w, inner_h = width - left - right, height - top - bottom
    attrs = f' id="{escape(plot_id)}"' if plot_id else ""
    head = (f'<svg class="plot strip" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"{attrs}>')
    arrays = [np.asarray(c.values, dtype=float) for c in columns]
    pooled = np.concatenate(arrays) if arrays else np.zeros(0)
    if pooled.size == 0:
        return Markup(f'{head}<text x="{left}" y="{height // 2}" class="tick">no samples</text></svg>')
    unit, scale = time_unit(float(pooled.max()))
    lo, hi = float(pooled.min()) / scale, float(pooled.max()) / scale
    pad = (hi - lo) * 0.08 or abs(hi) * 0.02 or 1.0
    lo, hi = max(0.0, lo - pad), hi + pad
    step = inner_w / len(columns)
    half = min(step * 0.42, 40.0)

    def sy(seconds: float) -> float:
        return top + (hi - seconds / scale) * inner_h / (hi - lo)

    parts = [head]
    for tick in nice_ticks(lo, hi, 5):
        ty = top + (hi - tick) * inner_h / (hi - lo)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" class="grid"/>'
                     f'<text x="{left - 5}" y="{ty + 4:.1f}" text-anchor="end" class="tick">{_num(tick)}</text>')
    mid_y = top + inner_h / 2
    parts.append(f'<text class="axis-title" x="14" y="{mid_y:.1f}" text-anchor="middle" font-size="11" '
                 f'transform="rotate(-90 14 {mid_y:.1f})">time per call ({escape(unit)})</text>')
    parts.append(f'<text class="axis-title" x="{left + inner_w / 2:.1f}" y="{height - 4}" text-anchor="middle" '
                 f'font-size="11">trial (one job process each), grouped by run</text>')
    groups: list[tuple[str, int, int]] = []  # (label, first column, last column)
    for i, column in enumerate(columns):
        if groups and groups[-1][0] == column.group and groups[-1][2] == i - 1:
            groups[-1] = (column.group, groups[-1][1], i)
        else:
            groups.append((column.group, i, i))
    for n, (text, first, last) in enumerate(groups):
        x0, x1 = left + first * step, left + (last + 1) * step
        if n:
            parts.append(f'<line x1="{x0:.1f}" x2="{x0:.1f}" y1="{top}" y2="{top + inner_h + 30}" stroke="#9ca3af" '
                         f'stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{top + inner_h + 30}" text-anchor="middle" class="tick" '
                     f'font-weight="600">{escape(text)}</text>')
    unit_text = str(escape(unit))
    # each sample's sideways offset by its rank (the same for every column): jitter * half * 0.8
    offsets = np.array([(((rank * GOLDEN) % 1.0) * 2.0 - 1.0) * half * 0.8 for rank in range(max(map(len, arrays)))])
    span = hi - lo
    scaled = pooled / scale  # every sample's value in the unit, its height sy(value) and its place in ``pooled``
    heights = top + (hi - scaled) * inner_h / span
    scaled_list, heights_list = scaled.tolist(), heights.tolist()
    start = 0
    for i, (column, values) in enumerate(zip(columns, arrays, strict=True)):
        cx = left + (i + 0.5) * step
        parts.append(f'<text x="{cx:.1f}" y="{top + inner_h + 14}" text-anchor="middle" class="tick">'
                     f"T{column.trial}</text>")
        n, trial = values.size, column.trial
        parts.append(f'<g class="samples" fill="{escape(column.color)}" fill-opacity="0.6" data-trial="{trial}">')
        if n:  # every circle of the column in one formatting: (cx, cy, rank, value) per sample
            circle = (f'<circle cx="%.1f" cy="%.1f" r="2.6"><title>trial {trial}, sample %d: %.4g '
                      f'{unit_text.replace("%", "%%")}</title></circle>')
            flat = chain.from_iterable(zip((cx + offsets[:n]).tolist(), heights_list[start:start + n],
                                           range(1, n + 1), scaled_list[start:start + n], strict=True))
            parts.append(circle * n % tuple(flat))
        parts.append("</g>")
        start += n
        if n:
            level = column.median if column.median is not None else median(values.tolist())
            my = sy(level)
            title = column.title or f"trial {column.trial}: median {_num(level / scale)} {unit} of {values.size}"
            parts.append(f'<line class="median" x1="{cx - half:.1f}" x2="{cx + half:.1f}" y1="{my:.1f}" '
                         f'y2="{my:.1f}" stroke="#111827" stroke-width="2.5"><title>{escape(title)}</title></line>')
    parts.append("</svg>")
    return Markup("".join(parts))


def finite_positive(values: Sequence[float]) -> list[float]:
    """The samples a plot can draw (the harness's statistics drop the same ones)."""
    return [v for v in values if math.isfinite(v) and v > 0]
