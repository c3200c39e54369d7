"""Inline SVG plots for the static report, written in Python: nothing fetched, no script needed to read them.

:func:`overlay_plot` draws the histories of several series (e.g. every tuning variant of one kernel, dtype and shape
on one chip) on one commit axis and one shared y axis: per series a polyline of the medians in its own colour (and
dash pattern, past ten series), a polygon for their confidence band, a dot per commit with a ``<title>`` (the browser
shows it on hover) and a link; a series of one point gets an error bar instead of a band. Markers (change points,
regressions, correctness failures) carry their evidence the same way. A legend inside the SVG names each series
(hovering a series or its legend entry highlights it, through CSS only), the axes have titles with units (the time
unit is chosen from the range: s, ms, µs or ns), and ``log=True`` draws the plot on a logarithmic y axis, ``log=None``
on both, as two layers (``g.lin``, ``g.log``) of one SVG that share each hover text (the page's CSS shows one).
Every piece of text that reaches the SVG goes through ``markupsafe.escape``; the result is a ``Markup`` object, so a
template inserts it without ``|safe``. :func:`history_plot` is the one-series form.

Long histories are downsampled to at most ``max_points`` buckets of consecutive commits per series: the polyline
goes through each bucket's median of the medians, the band spans each bucket's lowest ``low`` to highest ``high``
(so a one-commit spike still shows), and there is one dot per bucket instead of one per commit; markers always sit at
their exact commit. A bucket's dots are one ``<path class="dots">`` per layer, and its hover text (its commit range
and the lowest and highest median in it) and link are data (``data-hits``) that the page's script
(``static/report.js``) shows: as ``<a>``/``<title>`` elements they were most of a long history page's bytes and of
its drawing time. The geometry is computed with numpy and the hover texts only for what is drawn (callbacks), so a
1000-commit history costs about what its buckets cost.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from itertools import chain
from urllib.parse import quote

import numpy as np
from markupsafe import Markup, escape

MARKER_STYLES = {
    # kind: (shape, fill, stroke)
    "step": ("diamond", "#f59e0b", "#92400e"),
    "drift": ("diamond", "#fde68a", "#92400e"),
    "regression": ("triangle", "#dc2626", "#7f1d1d"),
    "broken": ("cross", "#dc2626", "#7f1d1d"),
}

# 22 distinct series colours (d3's category10, then twelve of Kelly's colours of maximum contrast that none of those
# resembles), then the same colours dashed, then dotted: a kernel's 20-odd variants each get a colour of their own.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#f3c300", "#875692", "#a1caf1", "#c2b280", "#008856", "#e68fac", "#604e97", "#882d17",
           "#8db600", "#654522", "#2b3d26", "#f99379")
DASHES = ("", "7 3", "2 2")

TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))

WIDTH = 720
LEFT, RIGHT, TOP = 74, 14, 22  # change-point and failure markers sit above ``TOP``
X_LABELS_H, X_TITLE_H = 18, 18
LEGEND_ROW = 18


def style_of(index: int) -> tuple[str, str]:
    """The colour and dash pattern of the ``index``-th series of a family (stable across plots)."""
    return PALETTE[index % len(PALETTE)], DASHES[(index // len(PALETTE)) % len(DASHES)]


@dataclass(frozen=True)
class Marker:
    """A change point (``step`` / ``drift``: a dashed line across the plot, a diamond above it, a drift's span
    shaded up to ``x_end``), a ``regression`` (a triangle on the point) or a ``broken`` commit (a cross above)."""

    x: int
    y: float
    kind: str  # a key of MARKER_STYLES
    title: str = ""
    href: str = ""
    x_end: int | None = None


@dataclass(frozen=True)
class Series:
    """One line of an :func:`overlay_plot`: positions ``x`` on the commit axis (ascending), the median ``y`` and its
    interval ``low`` / ``high`` there (None or nan: missing). ``point_title(i)`` / ``point_href(i)`` give the hover
    text and link of point ``i``. A bucket of points ``first..last`` links to ``point_href(first)``; the page's
    script writes its hover text from ``point_name`` of both ends (e.g. a short sha; default: the index),
    ``bucket_label`` (what the series is, e.g. "sdpa on chip-a") and its lowest and highest median.
    ``markers`` belong to this series (drawn in its colour, at its points); ``legend_title`` is the hover text of
    its legend entry; ``emphasis`` draws it thicker (e.g. the kernel's default variant)."""

    name: str
    x: Sequence[int]
    y: Sequence[float | None]
    low: Sequence[float | None]
    high: Sequence[float | None]
    point_title: Callable[[int], str]
    point_href: Callable[[int], str]
    point_name: Callable[[int], str] = str
    bucket_label: str = ""
    color: str = PALETTE[0]
    dash: str = ""
    markers: Sequence[Marker] = field(default_factory=tuple)
    legend_title: str = ""
    emphasis: bool = False
    threshold: tuple[float, float, float, str] | None = None  # (from x, low, high, hover text): a band to the end


def fx(value: float) -> str:
    return f"{value:.1f}"


_TEXT_TENTHS = 1 << 14
"""Coordinates below this many tenths of a pixel (1638.4; a plot is ``WIDTH`` wide) are written from a table."""


@functools.cache
def _tenths_texts() -> tuple[np.ndarray, np.ndarray]:
    """Each whole number of tenths below ``_TEXT_TENTHS`` as an x coordinate's text ("12.3,") and a y's ("4.5 "):
    made once a process (~10 ms), then a series' coordinates are texts taken by index, not formatted one by one."""
    texts = [f"{i // 10}.{i % 10}" for i in range(_TEXT_TENTHS)]
    return np.array([t + "," for t in texts], dtype=object), np.array([t + " " for t in texts], dtype=object)


def _points(xs: np.ndarray, ys: np.ndarray) -> str:
    """'x,y x,y ...' with one decimal: each coordinate rounded to whole tenths and its text taken from a table
    (``_tenths_texts``: four times as fast as one % over the whole array, itself twice as fast as a join of
    f-strings); past the table, by one % over whole tenths as two integers each; where one is negative, every
    coordinate by "%.1f"."""
    if xs.size == 0:
        return ""
    flat = np.empty(2 * xs.size)
    flat[0::2], flat[1::2] = xs, ys
    tenths = np.rint(flat * 10.0)
    if not tenths.min() >= 0:
        return ("%.1f,%.1f " * xs.size % tuple(flat.tolist())).rstrip()
    whole = tenths.astype(np.int64)
    if whole.max() >= _TEXT_TENTHS:  # whole tenths as two integers each
        digits = np.empty(2 * whole.size, dtype=np.int64)
        digits[0::2], digits[1::2] = np.divmod(whole, 10)
        return ("%d.%d,%d.%d " * xs.size % tuple(digits.tolist())).rstrip()
    x_texts, y_texts = _tenths_texts()
    pieces = np.empty(2 * xs.size, dtype=object)
    pieces[0::2], pieces[1::2] = x_texts[whole[0::2]], y_texts[whole[1::2]]
    return "".join(pieces.tolist())[:-1]


def nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k apart) covering [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a logarithmic axis over [lo, hi] (0 < lo): 1, 2, 5 × 10^k; only the powers of ten over many decades;
    over less than about half a decade (too few of those inside) the round values of a linear axis."""
    if not (0 < lo < hi):
        return [lo] if lo > 0 else []
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = [m * 10.0 ** k for k in decades for m in (1, 2, 5) if lo <= m * 10.0 ** k <= hi * (1 + 1e-9)]
    if len(ticks) > 9:
        ticks = [t for t in ticks if f"{t:e}".startswith("1")]
        while len(ticks) > 9:
            ticks = ticks[::2]
    if len(ticks) < 3:
        ticks = [t for t in nice_ticks(lo, hi, 6) if t > 0]
    return ticks


def pick_unit(value: float, units: Sequence[tuple[float, str]] = TIME_UNITS) -> tuple[float, str]:
    """The largest unit (scale, name) that ``value`` is at least one of; the smallest one below them all."""
    for scale, name in units:
        if abs(value) >= scale:
            return scale, name
    return units[-1]


def tick_text(value: float, scale: float) -> str:
    text = f"{value / scale:.4g}"
    return text if "e" not in text else f"{value / scale:.2g}"


def _marker(shape: str, cx: float, cy: float, fill: str, stroke: str) -> str:
    if shape == "diamond":
        pts = f"{fx(cx)},{fx(cy - 6)} {fx(cx + 6)},{fx(cy)} {fx(cx)},{fx(cy + 6)} {fx(cx - 6)},{fx(cy)}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{stroke}"/>'
    if shape == "triangle":
        pts = f"{fx(cx)},{fx(cy - 8)} {fx(cx + 6)},{fx(cy + 3)} {fx(cx - 6)},{fx(cy + 3)}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{stroke}"/>'
    return (f'<path d="M{fx(cx - 5)},{fx(cy - 5)}L{fx(cx + 5)},{fx(cy + 5)}M{fx(cx - 5)},{fx(cy + 5)}'
            f'L{fx(cx + 5)},{fx(cy - 5)}" stroke="{fill}" stroke-width="2.5"/>')


def _esc(text: str) -> str:
    """``escape``, skipping text the caller marked as already escaped (``Markup``): the hot path of big plots."""
    return text if isinstance(text, Markup) else escape(text)


def _linked(body: str, title: str, href: str) -> str:
    inner = f"<title>{_esc(title)}</title>{body}" if title else body
    return f'<a href="{_esc(href)}">{inner}</a>' if href else f"<g>{inner}</g>"


def _text_width(text: str, size: float = 12.0) -> float:
    """A generous estimate of a text's width in a sans-serif font (no font metrics here)."""
    return 0.56 * size * len(text)


def legend_layout(names: Sequence[str], width: float) -> tuple[list[tuple[float, int]], int]:
    """(x, row) of each legend entry, wrapping at ``width``; and the number of rows."""
    places, x, row = [], 0.0, 0
    for name in names:
        item = 26 + _text_width(name) + 16
        if x > 0 and x + item > width:
            x, row = 0.0, row + 1
        places.append((x, row))
        x += item
    return places, (row + 1 if names else 0)


@dataclass
class _Prepared:
    """A series' finite points, in plot order (``keep``: their indices in the caller's arrays)."""

    keep: np.ndarray
    x: np.ndarray
    y: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _prepare(series: Series) -> _Prepared:
    ya = np.asarray(series.y, dtype=float)
    keep = np.flatnonzero(np.isfinite(ya))
    return _Prepared(keep, np.asarray(series.x, dtype=float)[keep], ya[keep],
                     np.asarray(series.low, dtype=float)[keep], np.asarray(series.high, dtype=float)[keep])


@dataclass
class _Scale:
    """One y axis of a plot: linear or logarithmic (``cls``: the class of its layer, "lin" or "log")."""

    log: bool
    t_lo: float  # the axis' ends, in log10 units on a log axis
    t_hi: float
    per_unit: float  # pixels per axis unit

    @property
    def cls(self) -> str:
        return "log" if self.log else "lin"

    def sy(self, value):
        """Pixel heights of values (an array or a number); nan where the axis cannot show them (<= 0 on a log axis)."""
        v = np.asarray(value, dtype=float)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.log10(np.where(v > 0, v, np.nan))
        return TOP + (self.t_hi - v) * self.per_unit

    def ticks(self) -> list[float]:
        return log_ticks(10 ** self.t_lo, 10 ** self.t_hi) if self.log else nice_ticks(self.t_lo, self.t_hi, 5)


def _scale(values: np.ndarray, log: bool, inner_h: float) -> _Scale | None:
    values = values[np.isfinite(values) & (values > 0)] if log else values[np.isfinite(values)]
    if values.size == 0:
        return None
    y_lo, y_hi = float(values.min()), float(values.max())
    if log:
        t_lo, t_hi = math.log10(y_lo), math.log10(y_hi)
        pad = (t_hi - t_lo) * 0.08 or 0.02
        t_lo, t_hi = t_lo - pad, t_hi + pad
    else:
        pad = (y_hi - y_lo) * 0.08 or abs(y_hi) * 0.05 or 1.0
        t_lo, t_hi = (max(0.0, y_lo - pad) if y_lo >= 0 else y_lo - pad), y_hi + pad
    return _Scale(log, t_lo, t_hi, inner_h / (t_hi - t_lo))


@dataclass(frozen=True)
class PlotOptions:
    """How an :func:`overlay_plot` is drawn: its axes, markers, size and id (each field as its docstring says)."""

    n_x: int
    y_title: str = ""
    y_units: Sequence[tuple[float, str]] | None = TIME_UNITS
    y_format: Callable[[float], str] | None = None
    log: bool | None = False
    markers: Sequence[Marker] = ()
    x_labels: Sequence[str] = ()
    x_title: str = ""
    x_ticks: int = 6
    label: str = ""
    width: int = WIDTH
    plot_height: int = 190
    max_points: int = 120
    plot_id: str = ""
    legend: bool = True
    dodge: bool = True


def overlay_plot(series: Sequence[Series], options: PlotOptions) -> Markup:
    """Several histories on one commit axis of ``options.n_x`` positions and one y axis, as inline SVG.

    ``log``: False, a linear y axis; True, a logarithmic one (values <= 0 are left out); None, both, as two layers
    of one plot (``<g class="lin">`` and ``<g class="log">``: axis, lines, bands, markers), which share everything
    else: each hover dot's link holds one circle per layer, the linear one first, under one ``<title>``, so a page
    carries each hover text once (the stylesheet shows one layer). ``y_units``: (scale, name) pairs, largest first:
    the tick labels are numbers in the unit chosen from the range and ``y_title`` gets it in parentheses (e.g.
    "median time per call (µs)"); with ``y_units=None`` the ticks are ``y_format(value)`` and the title is
    ``y_title`` as is. ``x_labels`` names each axis position, ``x_ticks`` of them evenly spaced are written,
    ``x_title`` under them. ``markers`` are the plot's own (e.g. a correctness failure of every series); a series'
    markers are in ``Series.markers``. ``dodge``: on a short axis each series is shifted a little sideways so that
    points of one commit do not hide each other. Texts are escaped here, except ``Markup`` ones, which the caller
    has escaped already.
    """
    (n_x, y_title, y_units, y_format, log, markers, x_labels, x_title, x_ticks, label, width, plot_height, max_points,
     plot_id, legend, dodge) = (getattr(options, f.name) for f in fields(options))
    inner_w, inner_h = width - LEFT - RIGHT, plot_height
    names = [s.name for s in series] if legend else []
    places, rows = legend_layout(names, inner_w)
    height = TOP + inner_h + X_LABELS_H + (X_TITLE_H if x_title else 0) + (rows * LEGEND_ROW + 6 if rows else 0)
    attrs = f' id="{escape(plot_id)}"' if plot_id else ""
    head = (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"{attrs}>')
    prepared = [_prepare(s) for s in series]
    marker_ys = [m.y for s in series for m in s.markers] + [m.y for m in markers] + [
        y for s in series if s.threshold is not None for y in s.threshold[1:3]]
    values = np.concatenate([*(a for p in prepared for a in (p.y, p.low, p.high)), np.array(marker_ys, dtype=float)])
    scales = [sc for flag in ((False, True) if log is None else (bool(log),))
              if (sc := _scale(values, flag, inner_h)) is not None]
    if not scales or (log is None and scales[0].log):  # nothing finite (or, for both axes, nothing linear)
        return Markup(f'{head}<text x="{LEFT}" y="{TOP + inner_h // 2}" class="tick">no data</text></svg>')
    finite = values[np.isfinite(values)]
    unit = pick_unit(float(np.abs(finite).max()), y_units) if y_units else (1.0, "")
    slot = inner_w / max(n_x, 1)
    active = [i for i, p in enumerate(prepared) if p.y.size]
    step = min(5.0, 0.6 * slot / len(active)) if dodge and len(active) > 1 else 0.0
    shift = dict.fromkeys(range(len(series)), 0.0)
    for rank, i in enumerate(active):
        shift[i] = (rank - (len(active) - 1) / 2) * step

    def sx(value):
        return LEFT + (np.asarray(value, dtype=float) + 0.5) * slot

    bottom = TOP + inner_h
    parts = [head]
    for sc in scales:
        parts.append(f'<g class="{sc.cls}">' + _y_axis(sc, unit, y_units, y_format, y_title, width, inner_h) + "</g>")
    parts.append(f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{bottom}" y2="{bottom}" class="axis"/>')
    if x_labels:
        count = min(len(x_labels), x_ticks)
        edge = slot < 60  # labels wider than half a slot: the end ones are anchored inside the plot
        for i in sorted({round(k * (len(x_labels) - 1) / max(count - 1, 1)) for k in range(count)}):
            anchor = ("start" if i == 0 else "end" if i == len(x_labels) - 1 else "middle") if edge else "middle"
            x = fx(float(sx(i)))
            parts.append(f'<line x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}" class="axis"/>'
                         f'<text x="{x}" y="{bottom + 15}" text-anchor="{anchor}" class="tick">'
                         f"{escape(x_labels[i])}</text>")
    if x_title:
        parts.append(f'<text class="axis-title" x="{fx(LEFT + inner_w / 2)}" y="{bottom + X_LABELS_H + 13}" '
                     f'text-anchor="middle">{escape(x_title)}</text>')
    legend_top = bottom + X_LABELS_H + (X_TITLE_H if x_title else 0) + 6
    for k, (s, p) in enumerate(zip(series, prepared, strict=True)):
        parts.append(_series_svg(s, p, sx, scales, shift[k], bottom, max_points, places[k] if legend else None,
                                 legend_top))
    for m in sorted(markers, key=lambda m: m.kind in ("step", "drift"), reverse=True):
        parts.append(_marker_svg(m, sx, scales, 0.0, "", bottom))
    parts.append("</svg>")
    return Markup("".join(parts))


def _y_axis(sc: _Scale, unit: tuple[float, str], y_units, y_format, y_title: str, width: int, inner_h: float) -> str:
    """A scale's grid lines, tick labels and title."""
    parts = []
    for tick in sc.ticks():
        ty = float(sc.sy(tick))
        if not TOP - 1 <= ty <= TOP + inner_h + 1:
            continue
        text = tick_text(tick, unit[0]) if y_units else (y_format(tick) if y_format else f"{tick:g}")
        parts.append(f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{fx(ty)}" y2="{fx(ty)}" class="grid"/>'
                     f'<text x="{LEFT - 5}" y="{fx(ty + 4)}" text-anchor="end" class="tick">{escape(text)}</text>')
    if y_title:
        title = f"{y_title} ({unit[1]}{', log scale' if sc.log else ''})" if y_units else (
            f"{y_title}{' (log scale)' if sc.log else ''}")
        parts.append(f'<text class="axis-title" transform="rotate(-90)" x="{fx(-(TOP + inner_h / 2))}" y="14" '
                     f'text-anchor="middle">{escape(title)}</text>')
    return "".join(parts)


def _series_svg(s: Series, p: _Prepared, sx, scales: list[_Scale], dx: float, bottom: float, max_points: int,
                place: tuple[float, int] | None, legend_top: float) -> str:
    """One series in one ``<g>``: per scale a layer of its band or error bar and its line; its hover dots (one
    link and title each, a circle per scale); its markers; its legend entry."""
    color, dash = s.color, s.dash
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    out = [f'<g class="series{" main" if s.emphasis else ""}" data-series="{escape(s.name)}">']
    n = p.y.size
    if n <= max_points:
        xs, ys, lows, highs = sx(p.x) + dx, p.y, p.low, p.high
        first = last = p.keep
        titles = None
    else:  # buckets of consecutive points: the line through their medians, the band over their widest interval
        starts, stops, bucket, rank = _buckets(n, max_points)
        ranked = np.full((starts.size, int((stops - starts).max())), np.inf)  # each bucket's medians, sorted
        ranked[bucket, rank] = p.y
        ranked.sort(axis=1)
        every = np.arange(starts.size)
        xs, ys = sx((p.x[starts] + p.x[stops - 1]) / 2) + dx, ranked[every, (stops - starts - 1) // 2]
        with np.errstate(invalid="ignore"):
            highs, lows = np.fmax.reduceat(p.high, starts), np.fmin.reduceat(p.low, starts)
        first, last = p.keep[starts], p.keep[stops - 1]
        titles = (ranked[:, 0].tolist(), ranked[every, stops - starts - 1].tolist())
    heights, lines = [], []
    for sc in scales:
        py = sc.sy(ys)
        heights.append(py)
        drawn = np.flatnonzero(np.isfinite(py))
        line = _points(xs[drawn], py[drawn]) if drawn.size else ""
        lines.append(line)
        out.append(f'<g class="{sc.cls}">{_layer(s, sc, xs, py, lows, highs, drawn, line, sx, dx)}</g>')
    if titles is None:
        out.append(_point_targets(s, first.tolist(), xs, heights, color))
    else:
        out.append(_bucket_targets(s, first.tolist(), last.tolist(), *titles, xs, lines, scales, color))
    for m in sorted(s.markers, key=lambda m: m.kind in ("step", "drift"), reverse=True):
        out.append(_marker_svg(m, sx, scales, dx, color, bottom))
    if place is not None:
        x0, row = LEFT + place[0], legend_top + place[1] * LEGEND_ROW
        entry = (f'<line x1="{fx(x0)}" x2="{fx(x0 + 20)}" y1="{fx(row + 8)}" y2="{fx(row + 8)}" stroke="{color}"'
                 f'{dash_attr} class="swatch"/><circle cx="{fx(x0 + 10)}" cy="{fx(row + 8)}" r="2.5" fill="{color}"/>'
                 f'<text x="{fx(x0 + 26)}" y="{fx(row + 12)}" class="legend-text">{escape(s.name)}</text>')
        out.append(f'<g class="legend-entry">{f"<title>{_esc(s.legend_title)}</title>" if s.legend_title else ""}'
                   f"{entry}</g>")
    out.append("</g>")
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _buckets(n: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``n`` consecutive points in at most ``count`` buckets of (nearly) equal size: their starts and stops, and
    each point's place in its bucket (the same for every series of ``n`` points: made once; read only)."""
    bounds = np.unique(np.round(np.linspace(0, n, count + 1)).astype(np.int64))
    starts, stops = bounds[:-1], bounds[1:]
    bucket = np.repeat(np.arange(starts.size), stops - starts)
    rank = np.arange(n) - starts[bucket]
    for array in (starts, stops, bucket, rank):
        array.flags.writeable = False
    return starts, stops, bucket, rank


def _point_targets(s: Series, indices: list[int], xs: np.ndarray, heights: list[np.ndarray], color: str) -> str:
    """One linked dot with its ``<title>`` per point (a circle per layer)."""
    rows = zip(*(h.tolist() for h in heights), strict=True)
    isfinite = math.isfinite
    targets = [f'<a href="{_esc(href)}"><title>{_esc(s.point_title(i))}</title>'
               + "".join([f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5"/>' for cy in hs if isfinite(cy)]) + "</a>"
               for i, href, cx, hs in zip(indices, map(s.point_href, indices), xs.tolist(), rows, strict=True)]
    return f'<g class="pts" fill="{color}">{"".join(targets)}</g>' if targets else ""


@functools.lru_cache(maxsize=1 << 16)
def _token(text: str) -> str:
    """``text`` as one token of ``data-hits``: no space, ``;``, quote or markup (URL-quoted; a ``#`` is kept)."""
    return quote(str(text), safe="#")


def _layer(s: Series, sc: _Scale, xs: np.ndarray, py: np.ndarray, lows: np.ndarray, highs: np.ndarray,
           drawn: np.ndarray, line: str, sx, dx: float) -> str:
    """A series' band (or error bar), threshold and line on one scale: ``py`` its points' heights, ``drawn`` those
    the scale shows, ``line`` their 'x,y ...' text."""
    color, dash = s.color, s.dash
    layer = []
    low_y, high_y = sc.sy(lows), sc.sy(highs)
    banded = drawn[(np.isfinite(low_y) & np.isfinite(high_y) & (highs > lows))[drawn]]
    if drawn.size > 1 and banded.size:  # the upper edge left to right, then the lower one back
        band = _points(np.concatenate((xs[banded], xs[banded][::-1])),
                       np.concatenate((high_y[banded], low_y[banded][::-1])))
        layer.append(f'<polygon class="band" fill="{color}" points="{band}"/>')
    elif drawn.size == 1 and banded.size:  # one point: an error bar, not a band of no width
        cx, y1, y2 = float(xs[banded[0]]), float(high_y[banded[0]]), float(low_y[banded[0]])
        layer.append(f'<path class="whisker" stroke="{color}" d="M{fx(cx)},{fx(y1)}V{fx(y2)}'
                     f'M{fx(cx - 4)},{fx(y1)}h8M{fx(cx - 4)},{fx(y2)}h8"/>')
    if s.threshold is not None and drawn.size:
        x_from, t_low, t_high, t_title = s.threshold
        y_top, y_bottom = sc.sy(np.array([t_high, t_low]))
        if np.isfinite(y_top) and np.isfinite(y_bottom):
            x0, x1 = float(sx(x_from)) + dx, float(xs[drawn[-1]]) + 6.0
            layer.append(f'<rect class="threshold" stroke="{color}" x="{fx(x0 - 6.0)}" y="{fx(y_top)}" '
                         f'width="{fx(max(x1 - x0 + 6.0, 12.0))}" height="{fx(max(y_bottom - y_top, 1.0))}">'
                         f'<title>{_esc(t_title)}</title></rect>')
    if drawn.size > 1:
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        layer.append(f'<polyline class="line" stroke="{color}"{dash_attr} points="{line}"/>')
    return "".join(layer)


def _bucket_targets(s: Series, firsts: list[int], lasts: list[int], lowest: list[float], highest: list[float],
                    xs: np.ndarray, lines: list[str], scales: list[_Scale], color: str) -> str:
    """A bucketed series' dots, one ``<path>`` per layer (``lines``: each layer's drawn points as 'x,y ...'), and
    its buckets as ``data-hits`` for the page's script: per bucket, ``;`` apart, "x link first last count lowest
    highest" (x in the plot's units; names URL-quoted)."""
    dots = [f'<path class="dots {sc.cls}" stroke="{color}" d="M{line.replace(" ", "h0M")}h0"/>'
            for sc, line in zip(scales, lines, strict=True) if line]
    if not dots:
        return ""
    name, href = s.point_name, s.point_href
    counts = [b - a + 1 for a, b in zip(firsts, lasts, strict=True)]
    columns = (xs.tolist(), list(map(_token, map(href, firsts))), list(map(_token, map(name, firsts))),
               list(map(_token, map(name, lasts))), counts, lowest, highest)
    data = ("%.1f %s %s %s %d %.4g %.4g;" * len(counts) % tuple(chain.from_iterable(zip(*columns, strict=True)))
            ).rstrip(";")
    return (f'<g class="hits" data-label="{escape(s.bucket_label)}" data-hits="{data}">{"".join(dots)}</g>')


def _marker_svg(m: Marker, sx, scales: list[_Scale], dx: float, color: str, bottom: float) -> str:
    """A marker with its title and link; one drawn at a value (a regression) has a shape per scale's layer."""
    shape, fill, stroke = MARKER_STYLES.get(m.kind, MARKER_STYLES["step"])
    cx = float(sx(m.x))
    if m.kind in ("step", "drift"):
        body = ""
        if m.x_end is not None and m.x_end > m.x:
            body += (f'<rect class="span" x="{fx(cx)}" y="{TOP}" width="{fx(float(sx(m.x_end)) - cx)}" '
                     f'height="{fx(bottom - TOP)}" fill="{fill}"/>')
        body += (f'<line class="cp" x1="{fx(cx)}" x2="{fx(cx)}" y1="{TOP - 4}" y2="{fx(bottom)}" '
                 f'stroke="{color or stroke}"/>' + _marker(shape, cx, TOP - 10, fill, stroke))
    elif m.kind == "broken":
        body = _marker(shape, cx, TOP - 10, fill, stroke)
    else:
        layers = []
        for sc in scales:
            cy = float(sc.sy(m.y)) if m.y is not None else math.nan
            cy = cy if math.isfinite(cy) else TOP - 10
            layers.append(f'<g class="{sc.cls}">{_marker(shape, cx + dx, cy, fill, stroke)}</g>')
        body = "".join(layers)
    return _linked(f'<g class="marker {escape(m.kind)}">{body}</g>', m.title, m.href)


def history_plot(one: Series, options: PlotOptions, height: int = 210) -> Markup:
    """One history as inline SVG, ``height`` pixels in all (:func:`overlay_plot` of one series, no legend; the ticks
    are ``options.y_format``'s).

    ``one.markers`` sit on this series (a regression's triangle at its point)."""
    plot_height = height - TOP - X_LABELS_H - (X_TITLE_H if options.x_title else 0)
    return overlay_plot([one], replace(options, y_units=None, plot_height=plot_height, legend=False))


def legend() -> Markup:
    """A small inline legend for the marker kinds."""
    items = []
    for kind, label in (("step", "change point (step)"), ("drift", "change point (drift)"),
                        ("regression", "confirmed regression"), ("broken", "correctness failure")):
        shape, fill, stroke = MARKER_STYLES[kind]
        items.append(f'<svg width="16" height="16" viewBox="0 0 16 16" aria-hidden="true">'
                     f"{_marker(shape, 8, 9, fill, stroke)}</svg> {escape(label)}")
    return Markup('<span class="legend">' + " &nbsp; ".join(items) + "</span>")
