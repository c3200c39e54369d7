"""A history's sparkline for the index and chip pages: its default variant's last commits as a small inline SVG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from markupsafe import Markup, escape

SPARK_POINTS = 100  # a sparkline's last commits (it is 120 pixels wide)


def sparkline(series_list: Sequence[Any], default: str | None = None) -> Markup:
    """A kernel's recent history on one chip in a line of 120 x 22 pixels (an index cell): per commit of its last
    ``SPARK_POINTS``, the geometric mean
    over its series (the default variant's, when it has any) of the median relative to the series' own geometric
    mean, on a log scale; the last change point of those series is a red dot. Empty when under two commits."""
    chosen = [s for s in series_list if s.points and s.key.variant == default] or [s for s in series_list if s.points]
    sums: dict[str, list[float]] = {}
    order: dict[str, int] = {}
    last_change: tuple[int, str] | None = None
    for series in chosen:
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(np.asarray(series.points.median, dtype=float)[-SPARK_POINTS:])
        ok = np.isfinite(logs)
        if not ok.any():
            continue
        relative = (logs - logs[ok].mean()).tolist()
        for sha, value, good in zip(series.points.shas[-SPARK_POINTS:], relative, ok.tolist(), strict=True):
            order.setdefault(sha, len(order))
            if good:
                sums.setdefault(sha, []).append(value)
        for cp in series.change_points:
            if cp.sha in order and (last_change is None or order[cp.sha] > last_change[0]):
                last_change = (order[cp.sha], cp.sha)
    shas = sorted(sums, key=order.__getitem__)
    if len(shas) < 2:
        return Markup("")
    ys = np.array([sum(sums[sha]) / len(sums[sha]) for sha in shas])
    lo, hi = float(ys.min()), float(ys.max())
    span = max(hi - lo, 0.02)  # a flat history stays flat: 2% of range at least
    width, height, pad = 120, 22, 3
    xs = np.linspace(pad, width - pad, len(shas))
    py = height - pad - (ys - lo) / span * (height - 2 * pad)
    dot = ""
    if last_change is not None and last_change[1] in sums:
        i = shas.index(last_change[1])
        dot = f'<circle cx="{xs[i]:.1f}" cy="{py[i]:.1f}" r="2.5" fill="#dc2626"/>'
    change = f", last change at {last_change[1][:8]}" if last_change else ""
    title = (f"{len(shas)} commits, spread ×{math.exp(hi - lo):.2f} (geometric mean of "
             f"{'the default variant' if chosen and chosen[0].key.variant == default else 'its series'}){change}")
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs.tolist(), py.tolist(), strict=True))
    return Markup(f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                  f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
                  f'<polyline points="{points}" fill="none" stroke="#1d4ed8" stroke-width="1.5"/>{dot}</svg>')
