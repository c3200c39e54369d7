"""Scaling and roofline plots as inline SVG: x/y plots on logarithmic axes, with ceilings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

from markupsafe import Markup, escape

from reports.svg import LEGEND_ROW, X_LABELS_H, X_TITLE_H, fx, legend_layout, log_ticks, pick_unit, tick_text


@dataclass
class XYSeries:
    """One variant's points of an x/y plot: (x, y, hover text) each, drawn as marks joined by a line when
    ``line``; ``color`` and ``dash`` as in the history plots (``style_of``)."""

    name: str
    points: list[tuple[float, float, str]]
    color: str
    dash: str = ""
    line: bool = True


@dataclass
class Ceiling:
    """A roofline ceiling: a polyline through (x, y) points with its label (drawn dashed, grey)."""

    label: str
    points: list[tuple[float, float]]


def _log_span(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi <= lo:
        lo, hi = lo / 2, hi * 2
    pad = (math.log10(hi) - math.log10(lo)) * 0.06
    return 10 ** (math.log10(lo) - pad), 10 ** (math.log10(hi) + pad)


def _format_si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def _axis_text(value: float, unit: str) -> str:
    if unit == "s":
        scale, name = pick_unit(value)
        return f"{tick_text(value, scale)} {name}"
    return _format_si(value, "").replace(" ", "") if unit else f"{value:.4g}"


@dataclass(frozen=True)
class XYOptions:
    """How an :func:`xy_plot` is drawn: its axes' titles and units, ``ceilings``, label, id, size and x ticks."""

    x_title: str
    y_title: str
    x_unit: str = ""
    y_unit: str = ""
    ceilings: Sequence[Ceiling] = ()
    label: str = ""
    plot_id: str = ""
    width: int = 600
    plot_height: int = 240
    x_ticks: Sequence[float] = ()


def xy_plot(series: Sequence[XYSeries], options: XYOptions) -> Markup:
    """Variants' points on logarithmic x and y axes, as inline SVG: each series a ``<g class="variant">`` of marks
    (one ``circle`` per point with its hover text) and its line; ``ceilings`` as labelled dashed lines (a
    ``<g class="ceiling">`` each); a legend of the series under the plot; ``x_ticks``: the x axis' ticks (e.g. a
    grid parameter's values; default: 1, 2, 5 x 10^k). Texts are escaped here."""
    (x_title, y_title, x_unit, y_unit, ceilings, label, plot_id, width, plot_height, x_ticks) = (
        getattr(options, f.name) for f in fields(options))
    left, right, top = 84, 16, 14
    inner_w, inner_h = width - left - right, plot_height
    xs = [x for s in series for x, y, _ in s.points if x > 0 and y > 0]
    ys = [y for s in series for x, y, _ in s.points if x > 0 and y > 0]
    names = [s.name for s in series]
    places, rows = legend_layout(names, inner_w)
    height = top + inner_h + X_LABELS_H + X_TITLE_H + (rows * LEGEND_ROW + 6 if rows else 0)
    attrs = f' id="{escape(plot_id)}"' if plot_id else ""
    head = (f'<svg class="plot xy" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"{attrs}>')
    if not xs:
        return Markup(f'{head}<text x="{left}" y="{top + inner_h // 2}" class="tick">no data</text></svg>')
    y_all = ys + [y for c in ceilings for x, y in c.points if y > 0 and min(xs) / 2 <= x <= max(xs) * 2]
    x_lo, x_hi = _log_span(xs)
    y_lo, y_hi = _log_span(y_all)

    def sx(x: float) -> float:
        return left + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * inner_w

    def sy(y: float) -> float:
        return top + inner_h - (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * inner_h

    bottom = top + inner_h
    parts = [head, f'<defs><clipPath id="clip-{escape(plot_id)}"><rect x="{left}" y="{top}" width="{inner_w}" '
                   f'height="{inner_h}"/></clipPath></defs>']
    for t in log_ticks(y_lo, y_hi):
        y = fx(sy(t))
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y}" y2="{y}" class="grid"/>'
                     f'<text x="{left - 6}" y="{y}" dy="4" text-anchor="end" class="tick">'
                     f'{escape(_axis_text(t, y_unit))}</text>')
    for t in x_ticks or log_ticks(x_lo, x_hi):
        x = fx(sx(t))
        parts.append(f'<line x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}" class="axis"/>'
                     f'<text x="{x}" y="{bottom + 15}" text-anchor="middle" class="tick">'
                     f'{escape(_axis_text(t, x_unit))}</text>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{bottom}" y2="{bottom}" class="axis"/>'
                 f'<line x1="{left}" x2="{left}" y1="{top}" y2="{bottom}" class="axis"/>')
    parts.append(f'<text class="axis-title" x="{fx(left + inner_w / 2)}" y="{bottom + X_LABELS_H + 13}" '
                 f'text-anchor="middle">{escape(x_title)}</text>'
                 f'<text class="axis-title" transform="translate(14,{fx(top + inner_h / 2)}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y_title)}</text>')  # a rate's unit is in the title: ticks say 100T
    for c in ceilings:
        pts = " ".join(f"{fx(sx(x))},{fx(sy(y))}" for x, y in c.points if x > 0 and y > 0)
        lx, ly = c.points[-1]
        parts.append(f'<g class="ceiling" clip-path="url(#clip-{escape(plot_id)})"><title>{escape(c.label)}</title>'
                     f'<polyline points="{pts}" fill="none" stroke="#6b7280" stroke-width="1.5" '
                     f'stroke-dasharray="6 3"/></g>'
                     f'<text class="ceiling-label tick" x="{fx(min(sx(lx), width - right) - 4)}" '
                     f'y="{fx(sy(ly) + 15 if sy(ly) < top + 16 else sy(ly) - 5)}" text-anchor="end">'
                     f'{escape(c.label)}</text>')
    legend_top = bottom + X_LABELS_H + X_TITLE_H + 6
    for s, (lx, row) in zip(series, places, strict=True):
        pts = sorted((x, y, t) for x, y, t in s.points if x > 0 and y > 0)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        body = [f'<g class="variant series" data-variant="{escape(s.name)}">']
        if s.line and len(pts) > 1:
            body.append(f'<polyline class="line" points="{" ".join(f"{fx(sx(x))},{fx(sy(y))}" for x, y, _ in pts)}"'
                        f' stroke="{s.color}"{dash}/>')
        for x, y, text in pts:
            body.append(f'<circle cx="{fx(sx(x))}" cy="{fx(sy(y))}" r="3.5" fill="{s.color}"><title>'
                        f'{escape(text)}</title></circle>')
        ly = legend_top + row * LEGEND_ROW + 9
        body.append(f'<line class="swatch" x1="{fx(left + lx)}" x2="{fx(left + lx + 20)}" y1="{ly}" y2="{ly}" '
                    f'stroke="{s.color}"{dash}/><circle cx="{fx(left + lx + 10)}" cy="{ly}" r="3" fill="{s.color}"/>'
                    f'<text class="legend-text" x="{fx(left + lx + 26)}" y="{ly + 4}">{escape(s.name)}</text></g>')
        parts.append("".join(body))
    parts.append("</svg>")
    return Markup("".join(parts))
