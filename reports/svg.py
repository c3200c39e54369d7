"""Inline SVG plots for the static report, written in Python: no JavaScript, nothing fetched.

:func:`history_plot` draws a per-commit history: a polyline of the medians, a polygon for their confidence band,
and markers (change points, regressions, correctness failures), each with a ``<title>`` (the browser shows it on
hover) and a link. Every piece of text that reaches the SVG goes through ``markupsafe.escape``; the result is a
``Markup`` object, so a template inserts it without ``|safe``.

Long histories are downsampled to at most ``max_points`` buckets of consecutive commits: the polyline goes through
each bucket's median of the medians, the band spans each bucket's lowest ``low`` to highest ``high`` (so a one-commit
spike still shows), and there is one hover/link target per bucket (its commit range and the lowest and highest
median in it) instead of one dot per commit; markers always sit at their exact commit.
The geometry is computed with numpy and the hover texts only for what is drawn (callbacks), so a 1000-commit
history costs about what its buckets cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from markupsafe import Markup, escape

MARKER_STYLES = {
    # kind: (shape, fill, stroke)
    "step": ("diamond", "#f59e0b", "#92400e"),
    "drift": ("diamond", "#fde68a", "#92400e"),
    "regression": ("triangle", "#dc2626", "#7f1d1d"),
    "broken": ("cross", "#dc2626", "#7f1d1d"),
}


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


def _f(value: float) -> str:
    return f"{value:.1f}"


def _points(xs: np.ndarray, ys: np.ndarray) -> str:
    """'x,y x,y ...' with one decimal (one % over the whole array: twice as fast as a join of f-strings)."""
    flat = np.empty(2 * xs.size)
    flat[0::2], flat[1::2] = xs, ys
    return ("%.1f,%.1f " * xs.size % tuple(flat.tolist())).rstrip()


def nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k apart) covering [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def _marker(shape: str, cx: float, cy: float, fill: str, stroke: str) -> str:
    if shape == "diamond":
        pts = f"{_f(cx)},{_f(cy - 6)} {_f(cx + 6)},{_f(cy)} {_f(cx)},{_f(cy + 6)} {_f(cx - 6)},{_f(cy)}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{stroke}"/>'
    if shape == "triangle":
        pts = f"{_f(cx)},{_f(cy - 8)} {_f(cx + 6)},{_f(cy + 3)} {_f(cx - 6)},{_f(cy + 3)}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{stroke}"/>'
    return (f'<path d="M{_f(cx - 5)},{_f(cy - 5)}L{_f(cx + 5)},{_f(cy + 5)}M{_f(cx - 5)},{_f(cy + 5)}'
            f'L{_f(cx + 5)},{_f(cy - 5)}" stroke="{fill}" stroke-width="2.5"/>')


def _esc(text: str) -> str:
    """``escape``, skipping text the caller marked as already escaped (``Markup``): the hot path of big plots."""
    return text if isinstance(text, Markup) else escape(text)


def _linked(body: str, title: str, href: str) -> str:
    inner = f"<title>{escape(title)}</title>{body}" if title else body
    return f'<a href="{escape(href)}">{inner}</a>' if href else f"<g>{inner}</g>"


def history_plot(x: Sequence[int], y: Sequence[float | None], low: Sequence[float | None],
                 high: Sequence[float | None], *, n_x: int, y_format: Callable[[float], str],
                 point_title: Callable[[int], str], point_href: Callable[[int], str],
                 bucket_title: Callable[[int, int, float, float], str] | None = None,
                 markers: Sequence[Marker] = (), x_labels: Sequence[str] = (), x_ticks: int = 6,
                 label: str = "", color: str = "#2563eb", width: int = 720, height: int = 210,
                 max_points: int = 120, plot_id: str = "") -> Markup:
    """One history as inline SVG.

    ``x`` are positions on an axis of ``n_x`` commits (ascending), ``y`` / ``low`` / ``high`` the median and its
    interval there (None or nan: missing). ``point_title(i)`` / ``point_href(i)`` give the hover text and link of
    point ``i``; ``bucket_title(first, last, y_min, y_max)`` the hover text of the points ``first..last`` drawn as
    one bucket (default: ``point_title(first)``), whose link is ``point_href(first)``. Texts are escaped here,
    except ``Markup`` ones, which the caller has escaped already. ``y_format`` labels the y axis (e.g. seconds as
    '1.2 ms'); ``x_labels`` names each axis position, ``x_ticks`` of them evenly spaced are written.
    """
    left, right, top, bottom = 64, 12, 20, 26  # markers of change points and failures sit above ``top``
    inner_w, inner_h = width - left - right, height - top - bottom
    attrs = f' id="{escape(plot_id)}"' if plot_id else ""
    head = (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"{attrs}>')
    ya = np.array(y, dtype=float)
    keep = np.flatnonzero(np.isfinite(ya))
    xa = np.array(x, dtype=float)[keep]
    ya = ya[keep]
    la = np.array(low, dtype=float)[keep]
    ha = np.array(high, dtype=float)[keep]
    marker_ys = [m.y for m in markers if m.y is not None and math.isfinite(m.y)]
    pool = [ya, la[np.isfinite(la)], ha[np.isfinite(ha)], np.array(marker_ys, dtype=float)]
    values = np.concatenate(pool)
    if values.size == 0:
        return Markup(f'{head}<text x="{left}" y="{height // 2}" class="tick">no data</text></svg>')
    y_lo, y_hi = float(values.min()), float(values.max())
    pad = (y_hi - y_lo) * 0.08 or abs(y_hi) * 0.05 or 1.0
    y_lo, y_hi = (max(0.0, y_lo - pad) if y_lo >= 0 else y_lo - pad), y_hi + pad
    x_scale = inner_w / max(n_x - 1, 1)
    x_off = left if n_x > 1 else left + inner_w / 2
    y_scale = inner_h / (y_hi - y_lo)

    def sx(value):
        return x_off + value * x_scale

    def sy(value):
        return top + (y_hi - value) * y_scale

    parts = [head]
    for tick in nice_ticks(y_lo, y_hi):
        ty = _f(sy(tick))
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{ty}" y2="{ty}" class="grid"/>'
                     f'<text x="{left - 4}" y="{_f(sy(tick) + 4)}" text-anchor="end" class="tick">'
                     f"{escape(y_format(tick))}</text>")
    if x_labels:
        count = min(len(x_labels), x_ticks)
        for i in sorted({round(k * (len(x_labels) - 1) / max(count - 1, 1)) for k in range(count)}):
            anchor = "start" if i == 0 else "end" if i == len(x_labels) - 1 else "middle"
            parts.append(f'<text x="{_f(sx(i))}" y="{height - 6}" text-anchor="{anchor}" class="tick">'
                         f"{escape(x_labels[i])}</text>")
    n = ya.size
    targets: list[str] = []
    if n <= max_points:
        px, py = sx(xa), sy(ya)
        line = _points(px, py)
        banded = np.flatnonzero(np.isfinite(la) & np.isfinite(ha))
        upper, lower = _points(px[banded], sy(ha[banded])), _points(px[banded][::-1], sy(la[banded][::-1]))
        for i, cx, cy in zip(keep.tolist(), px.tolist(), py.tolist(), strict=True):
            targets.append(f'<a href="{_esc(point_href(i))}"><title>{_esc(point_title(i))}</title>'
                           f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5"/></a>')
    else:
        bounds = np.unique(np.round(np.linspace(0, n, max_points + 1)).astype(np.int64))
        starts, stops = bounds[:-1], bounds[1:]
        bucket = np.repeat(np.arange(starts.size), stops - starts)
        order = np.lexsort((ya, bucket))  # sorted by median within each bucket
        lowest, middle, highest = order[starts], order[(starts + stops - 1) // 2], order[stops - 1]
        mid = sx((xa[starts] + xa[stops - 1]) / 2)
        line = _points(mid, sy(ya[middle]))
        with np.errstate(invalid="ignore"):
            band_hi, band_lo = np.fmax.reduceat(ha, starts), np.fmin.reduceat(la, starts)
        banded = np.flatnonzero(np.isfinite(band_hi) & np.isfinite(band_lo))
        upper = _points(mid[banded], sy(band_hi[banded]))
        lower = _points(mid[banded][::-1], sy(band_lo[banded][::-1]))
        column = inner_w / starts.size
        tail = f'" y="{top}" width="{column:.1f}" height="{inner_h}"/></a>'
        for first, last, y_min, y_max, x0 in zip(keep[starts].tolist(), keep[stops - 1].tolist(),
                                                 ya[lowest].tolist(), ya[highest].tolist(),
                                                 (sx(xa[starts]) - column / 2).tolist(), strict=True):
            title = bucket_title(first, last, y_min, y_max) if bucket_title else point_title(first)
            targets.append(f'<a href="{_esc(point_href(first))}"><title>{_esc(title)}</title><rect x="{x0:.1f}'
                           + tail)
    if upper:
        parts.append(f'<polygon class="band" fill="{color}" points="{upper} {lower}"/>')
    parts.append(f'<polyline class="line" stroke="{color}" points="{line}"/>')
    parts.append(f'<g class="{"pts" if n <= max_points else "hits"}" fill="{color}">{"".join(targets)}</g>')
    for m in sorted(markers, key=lambda m: m.kind in ("step", "drift"), reverse=True):
        shape, fill, stroke = MARKER_STYLES.get(m.kind, MARKER_STYLES["step"])
        cx = sx(m.x)
        if m.kind in ("step", "drift"):
            body = ""
            if m.x_end is not None and m.x_end > m.x:
                body += (f'<rect class="span" x="{_f(cx)}" y="{top}" width="{_f(sx(m.x_end) - cx)}" '
                         f'height="{inner_h}" fill="{fill}"/>')
            body += (f'<line class="cp" x1="{_f(cx)}" x2="{_f(cx)}" y1="{top - 4}" y2="{top + inner_h}" '
                     f'stroke="{stroke}"/>' + _marker(shape, cx, top - 10, fill, stroke))
        else:
            cy = sy(m.y) if m.kind != "broken" and m.y is not None and math.isfinite(m.y) else top - 10
            body = _marker(shape, cx, cy, fill, stroke)
        parts.append(_linked(f'<g class="marker {escape(m.kind)}">{body}</g>', m.title, m.href))
    parts.append("</svg>")
    return Markup("".join(parts))


def legend() -> Markup:
    """A small inline legend for the marker kinds."""
    items = []
    for kind, label in (("step", "change point (step)"), ("drift", "change point (drift)"),
                        ("regression", "confirmed regression"), ("broken", "correctness failure")):
        shape, fill, stroke = MARKER_STYLES[kind]
        items.append(f'<svg width="16" height="16" viewBox="0 0 16 16" aria-hidden="true">'
                     f"{_marker(shape, 8, 9, fill, stroke)}</svg> {escape(label)}")
    return Markup('<span class="legend">' + " &nbsp; ".join(items) + "</span>")
