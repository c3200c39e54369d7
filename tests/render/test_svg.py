"""The inline SVG history plot: geometry, downsampling, markers, and every text escaped."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from markupsafe import Markup

from reports.svg import Marker, PlotOptions, Series, history_plot, legend, nice_ticks

EVIL = "<script>alert(1)</script>"
NS = {"s": "http://www.w3.org/2000/svg"}


def plot(n: int, max_points: int = 120, markers=(), title=lambda i: f"commit {i}", **kwargs) -> Markup:
    y = [1e-3 * (1.3 if i >= n // 2 else 1.0) for i in range(n)]
    one = Series("", list(range(n)), y, [v * 0.98 for v in y], [v * 1.02 for v in y], title, lambda i: f"#c-{i}",
                 markers=tuple(markers))
    return history_plot(one, PlotOptions(n_x=n, y_format=lambda v: f"{v * 1e3:.2f} ms", max_points=max_points,
                                         x_labels=[f"sha{i}" for i in range(n)], **kwargs))


def points_of(svg: ET.Element, tag: str) -> list[tuple[float, float]]:
    text = svg.find(f".//s:{tag}", NS).get("points")
    return [tuple(map(float, pair.split(","))) for pair in text.split()]


def test_short_history_draws_a_linked_dot_with_a_title_per_commit():
    svg = ET.fromstring(str(plot(10)))
    links = svg.findall(".//s:g[@class='pts']/s:a", NS)
    assert len(links) == 10
    assert [a.get("href") for a in links] == [f"#c-{i}" for i in range(10)]
    assert [a.find("s:title", NS).text for a in links] == [f"commit {i}" for i in range(10)]
    line = points_of(svg, "polyline")
    assert len(line) == 10 and line[0][1] > line[-1][1]  # slower later: higher on the plot (smaller y)
    assert len(points_of(svg, "polygon[@class='band']")) == 20


def test_long_history_is_downsampled_to_buckets():
    svg = ET.fromstring(str(plot(1000, max_points=50)))
    assert svg.findall(".//s:g[@class='pts']", NS) == []
    # one dot per bucket (not a full-height column: overlaid series would hide each other's), one path of them, and
    # one bucket of hover data each, in the dots' order (the page's script writes the text: report.js)
    (hits,) = svg.findall(".//s:g[@class='hits']", NS)
    (dots,) = hits.findall("s:path[@class='dots lin']", NS)
    xs_of_dots = [float(m) for m in re.findall(r"M([\d.]+),", dots.get("d"))]
    buckets = [b.split(" ") for b in hits.get("data-hits").split(";")]
    assert len(xs_of_dots) == len(buckets) == 50 and dots.get("d").count("h0") == 50
    assert [float(b[0]) for b in buckets] == xs_of_dots
    x, href, first, last, count, lowest, highest = buckets[0]
    assert (href, first, last, int(count)) == ("#c-0", "0", "19", 20) and float(lowest) == float(highest) == 1e-3
    assert svg.findall(".//s:g[@class='hits']//s:a", NS) == []  # no element a bucket: most of a page's bytes
    assert len(points_of(svg, "polyline")) == 50
    assert len(points_of(svg, "polygon[@class='band']")) == 100
    xs = [x for x, _ in points_of(svg, "polyline")]
    assert xs == sorted(xs)


def test_markers_sit_at_their_commit_and_carry_their_evidence():
    markers = [Marker(500, 1.3e-3, "step", "step at sha500", "#c-500"),
               Marker(500, 1.3e-3, "regression", "regression ×1.30", "regressions.html#r-0"),
               Marker(700, math.nan, "broken", "failed", "regressions.html#r-1"),
               Marker(100, 1e-3, "drift", "drift", "#c-100", x_end=200)]
    svg = ET.fromstring(str(plot(1000, markers=markers)))
    kinds = {g.get("class") for g in svg.iter("{http://www.w3.org/2000/svg}g") if "marker" in (g.get("class") or "")}
    assert kinds == {"marker step", "marker regression", "marker broken", "marker drift"}
    hrefs = [a.get("href") for a in svg.findall(".//s:a", NS)]  # a series' markers sit in its <g>
    assert {"#c-500", "regressions.html#r-0", "regressions.html#r-1", "#c-100"} <= set(hrefs)
    assert svg.find(".//s:rect[@class='span']", NS) is not None


def test_every_text_is_escaped():
    out = plot(5, title=lambda i: EVIL, markers=[Marker(1, 1e-3, "regression", EVIL, "#x")], label=EVIL)
    assert isinstance(out, Markup)
    assert "<script" not in str(out) and "&lt;script&gt;" in str(out)
    ET.fromstring(str(out))  # still well-formed XML
    evil = Series("", [0], [1.0], [None], [None], lambda i: EVIL, lambda i: '"><script>')
    assert "<script" not in str(history_plot(evil, PlotOptions(n_x=1, y_format=str, x_labels=[EVIL])))


def test_missing_values_and_no_data():
    out = history_plot(Series("", [0, 1, 2], [None, math.nan, 2.0], [None] * 3, [None] * 3, str, lambda i: "#"),
                       PlotOptions(n_x=3, y_format=str))
    assert len(ET.fromstring(str(out)).findall(".//s:circle", NS)) == 1
    empty = history_plot(Series("", [], [], [], [], str, str), PlotOptions(n_x=0, y_format=str))
    assert "no data" in str(empty)


def test_ticks_and_legend():
    assert nice_ticks(0.0, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(2.0, 2.0) == [2.0]
    assert all(re.fullmatch(r"[\d.]+", f"{t:g}") for t in nice_ticks(1.3e-3, 1.9e-3))
    assert str(legend()).count("<svg") == 4


def test_coordinates_are_written_as_one_decimal_in_every_range():
    """``_points`` takes a coordinate's text from a table below ``_TEXT_TENTHS`` tenths, formats whole tenths past
    it and writes every coordinate by "%.1f" where one is negative: each is the coordinate rounded to a tenth (half
    to even, as numpy's ``rint``), in the same text either way."""
    import numpy as np

    from reports.svg import _TEXT_TENTHS, _points

    def expected(xs, ys) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(np.rint(xs * 10) / 10, np.rint(ys * 10) / 10, strict=True))

    rng = np.random.default_rng(7)
    edge = _TEXT_TENTHS / 10
    cases = [
        (rng.uniform(0, 720, 240), rng.uniform(0, 300, 240)),  # a plot's range: the table
        (np.array([0.0, 0.04, 0.05, 0.15, 0.25, edge - 0.06]), np.array([9.95, 10.05, 0.0, 1.0, 2.5, 3.0])),
        (rng.uniform(0, 720, 50), np.r_[rng.uniform(0, 300, 49), edge + 3.3]),  # past the table
        (rng.uniform(-5, 720, 50), rng.uniform(0, 300, 50)),  # a negative x
    ]
    for xs, ys in cases:
        assert _points(xs, ys) == expected(xs, ys)
    assert _points(np.array([]), np.array([])) == ""
