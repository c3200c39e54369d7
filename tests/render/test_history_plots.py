"""History plots: one plot per (chip, dtype, shape) overlaying the variants, axis titles with units, a log-axis twin,
hover texts with the commit and the interval, single-point series drawn as error bars, the chip selector's pages."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta

from harness.analysis.records import ChangeFlag, HistoryPoint, RegressionEvidence, SeriesHistory
from harness.analysis.site_inputs import SiteData
from harness.record.query import SeriesKey
from harness.render.pages import write_site
from reports.history import COMMIT_AXIS_TITLE, history_pages, kernel_history_page_name
from reports.render import commit_anchor, history_page_name
from reports.svg import PALETTE, PlotOptions, Series, log_ticks, overlay_plot, pick_unit

NS = {"s": "http://www.w3.org/2000/svg"}
CHIPS = ("nvidia-h200-sm90", "apple-m4-pro-20c")
VARIANTS = {"sdpa": 1.0e-3, "flash_bq8_bk16": 2.0e-3, "flash_bq16_bk32": 0.5e-3}


def sha(i: int) -> str:
    return f"{i:02d}" + "c0ffee" * 6 + "ab"


def history(chip: str, variant: str, level: float, commits: range, shape: str = "S=128", dtype: str = "float16",
            kernel: str = "flash_prefill", changes: tuple = ()) -> SeriesHistory:
    start = datetime(2026, 1, 1)
    points = tuple(HistoryPoint(sha(i), f"commit {i}: subject line\n\nbody", "main", start + timedelta(minutes=i),
                                level * (1.3 if i >= 6 and variant == "flash_bq16_bk32" else 1.0),
                                level * 0.98, level * 1.02, 30) for i in commits)
    return SeriesHistory(SeriesKey(kernel, variant, dtype, shape, chip), points, changes)


def histories(commits: range = range(10)) -> dict[str, list[SeriesHistory]]:
    return {chip: [history(chip, variant, level * (0.2 if chip == CHIPS[0] else 1.0), commits)
                   for variant, level in VARIANTS.items()] for chip in CHIPS}


def parse(markup) -> ET.Element:
    return ET.fromstring(str(markup))


def test_one_plot_per_shape_overlays_every_variant_with_its_own_colour_and_a_legend():
    pages = history_pages(histories(), [], {"flash_prefill": "sdpa"})
    page = next(p for p in pages if p.name == history_page_name("flash_prefill", CHIPS[0]))
    (plot,) = page.plots
    svg = parse(plot.svg)
    series = svg.findall("./s:g[@data-series]", NS)
    assert [g.get("data-series") for g in series] == ["sdpa", "flash_bq16_bk32", "flash_bq8_bk16"]  # default first
    assert series[0].get("class") == "series main"  # the default variant is drawn thicker
    lines = svg.findall("./s:g[@data-series]/s:g[@class='lin']/s:polyline[@class='line']", NS)
    assert len(lines) == 3 and len({line.get("stroke") for line in lines}) == 3  # one line per variant, distinct
    assert all(len(line.get("points").split()) == 10 for line in lines)
    legend = [t.text for t in svg.findall(".//s:g[@class='legend-entry']/s:text", NS)]
    assert legend == ["sdpa", "flash_bq16_bk32", "flash_bq8_bk16"]
    # one y axis shared by all: every line's points lie inside the one plot area
    ys = [float(xy.split(",")[1]) for line in lines for xy in line.get("points").split()]
    assert 0 < min(ys) and max(ys) < float(svg.get("height"))
    # a variant keeps its colour on every plot of the kernel, on every chip
    colours = {}
    for p in pages:
        for line in p.plots[0].lines:
            colours.setdefault(line.name, set()).add((line.color, line.dash))
    assert all(len(c) == 1 for c in colours.values()) and colours["sdpa"] == {(PALETTE[0], "")}


def test_axis_titles_name_the_unit_and_the_commit_order_and_the_ticks_are_numbers():
    page = history_pages(histories(), [])[0]
    svg = parse(page.plots[0].svg)
    titles = [t.text for t in svg.findall("./s:g[@class='lin']/s:text[@class='axis-title']", NS)
              + svg.findall("./s:text[@class='axis-title']", NS)]
    assert titles == ["median time per call (ms)", COMMIT_AXIS_TITLE]
    assert "first-parent" in COMMIT_AXIS_TITLE and "oldest → newest" in COMMIT_AXIS_TITLE
    ticks = [t.text for t in svg.findall("./s:g[@class='lin']/s:text[@class='tick']", NS)
             + svg.findall("./s:text[@class='tick']", NS)]
    y_ticks = [t for t in ticks if re.fullmatch(r"[\d.]+", t)]
    assert len(y_ticks) >= 3 and all(0.1 < float(t) < 3 for t in y_ticks)  # 0.5-2 ms written in ms
    assert sha(0)[:8] in ticks and sha(9)[:8] in ticks  # the commit axis names its commits
    h200 = parse(next(p for p in history_pages(histories(), []) if p.chip == CHIPS[0]).plots[0].svg)
    assert h200.find(".//s:text[@class='axis-title']", NS).text == "median time per call (µs)"  # 0.1-0.4 ms
    assert pick_unit(3e-4) == (1e-6, "µs") and pick_unit(2.0) == (1.0, "s") and pick_unit(5e-10)[1] == "ns"


def test_every_plot_has_a_log_axis_layer_sharing_the_hover_texts():
    page = history_pages(histories(), [])[0]
    svg = parse(page.plots[0].svg)
    assert svg.get("class") == "plot"
    axes = {g.get("class"): g for g in svg.findall("./s:g", NS) if g.get("class") in ("lin", "log")}
    assert set(axes) == {"lin", "log"}  # one layer per axis (the page's checkbox shows one)
    assert axes["lin"].find("s:text[@class='axis-title']", NS).text == "median time per call (ms)"
    assert axes["log"].find("s:text[@class='axis-title']", NS).text == "median time per call (ms, log scale)"
    for g in svg.findall("./s:g[@data-series]", NS):  # each series: a line per layer, one link per point
        assert len(g.findall("s:g[@class='lin']/s:polyline", NS)) == len(g.findall("s:g[@class='log']/s:polyline",
                                                                                    NS)) == 1
        links = g.findall("s:g[@class='pts']/s:a", NS)
        assert len(links) == 10 and all(len(a.findall("s:title", NS)) == 1 and len(a.findall("s:circle", NS)) == 2
                                        for a in links)

    def heights(layer: int) -> dict[str, float]:  # each series' first point, on the linear (0) or log (1) layer
        return {g.get("data-series"): float(g.findall("s:g[@class='pts']/s:a", NS)[0].findall("s:circle", NS)[layer]
                                            .get("cy")) for g in svg.findall("./s:g[@data-series]", NS)}

    # on a log axis equal ratios are equal distances: 0.5 -> 1 ms and 1 -> 2 ms; on a linear one, twice as far
    log = heights(1)
    low, mid, high = log["flash_bq16_bk32"], log["sdpa"], log["flash_bq8_bk16"]
    assert low > mid > high and math.isclose(low - mid, mid - high, rel_tol=1e-2)
    lin = heights(0)
    assert math.isclose(lin["sdpa"] - lin["flash_bq8_bk16"], 2 * (lin["flash_bq16_bk32"] - lin["sdpa"]), rel_tol=1e-2)
    one = Series("v", [0, 1], [1.0, 2.0], [None] * 2, [None] * 2, str, str)
    one_axis = parse(overlay_plot([one], PlotOptions(n_x=2, log=True)))
    assert [g.get("class") for g in one_axis.findall("./s:g", NS)][0] == "log"
    assert [f"{t:.0e}" for t in log_ticks(1e-4, 1e-1)] == ["1e-04", "1e-03", "1e-02", "1e-01"]  # only decades
    assert [f"{t:g}" for t in log_ticks(0.1, 1.0)] == ["0.1", "0.2", "0.5", "1"]
    assert len(log_ticks(1.0e-3, 1.3e-3)) >= 3  # less than a decade: round values of a linear axis


def test_hover_texts_name_the_commit_the_median_and_its_interval():
    page = next(p for p in history_pages(histories(), []) if p.chip == CHIPS[1])
    svg = parse(page.plots[0].svg)
    titles = [a.find("s:title", NS).text for a in svg.findall(".//s:g[@class='pts']/s:a", NS)]
    assert len(titles) == 3 * 10
    first = next(t for t in titles if "sdpa" in t)
    assert first == (f"{sha(0)[:10]} commit 0: subject line\n"
                     f"sdpa on {CHIPS[1]}: median 1 ms, 95% interval [980 µs, 1.02 ms], 30 samples")
    assert all(a.get("href").startswith("#c-") for a in svg.findall(".//s:g[@class='pts']/s:a", NS))
    every = next(p for p in history_pages(histories(), []) if not p.chip)
    assert f"sdpa on {every.plots[0].chip}: median" in str(every.plots[0].svg)  # the every-chip page names chips


def test_a_single_point_series_is_an_error_bar_not_a_band_and_says_1_commit(tmp_path):
    one = {CHIPS[0]: [history(CHIPS[0], "sdpa", 1e-3, range(1)), history(CHIPS[0], "flash_bq8_bk16", 2e-3, range(3))]}
    (page,) = history_pages(one, [])
    svg = parse(page.plots[0].svg)
    sdpa, flash = (svg.find(f"./s:g[@data-series='{name}']", NS) for name in ("sdpa", "flash_bq8_bk16"))
    for layer in ("lin", "log"):
        assert sdpa.find(f"s:g[@class='{layer}']/s:polygon", NS) is None
        assert sdpa.find(f"s:g[@class='{layer}']/s:polyline", NS) is None
        assert sdpa.find(f"s:g[@class='{layer}']/s:path[@class='whisker']", NS) is not None
        assert flash.find(f"s:g[@class='{layer}']/s:polygon[@class='band']", NS) is not None
        assert flash.find(f"s:g[@class='{layer}']/s:path[@class='whisker']", NS) is None
    assert len(sdpa.findall("s:g[@class='pts']/s:a", NS)) == 1
    # one commit on the axis: the points sit in the middle, side by side (not on top of each other at the border)
    single = {CHIPS[0]: [history(CHIPS[0], v, 1e-3, range(1)) for v in VARIANTS]}
    dots = parse(history_pages(single, [])[0].plots[0].svg).findall(".//s:g[@class='pts']/s:a/s:circle[1]", NS)
    xs = [float(c.get("cx")) for c in dots]
    assert len(set(xs)) == 3 and 300 < min(xs) < max(xs) < 420
    chip = {"key": CHIPS[0], "backend": "cuda", "device_name": "H200", "architecture": "sm_90", "gpu_cores": None,
            "memory_bytes": None, "record": {"os": "Linux", "mlx_version": "0.32"}}
    write_site(tmp_path, SiteData([chip], {CHIPS[0]: None}, db_label="sqlite:///x.db", histories=single))
    html = (tmp_path / history_page_name("flash_prefill", CHIPS[0])).read_text()
    assert "1 commit" in html and "1 commits" not in html


def test_long_histories_are_bucketed_per_series_with_a_hover_dot_per_bucket():
    long = {CHIPS[0]: [history(CHIPS[0], v, level, range(300)) for v, level in VARIANTS.items()]}
    (page,) = history_pages(long, [])
    svg = parse(page.plots[0].svg)
    for g in svg.findall("./s:g[@data-series]", NS):
        (hits,) = g.findall("s:g[@class='hits']", NS)
        assert hits.get("data-label") == f"{g.get('data-series')} on {CHIPS[0]}"
        buckets = [b.split(" ") for b in hits.get("data-hits").split(";")]
        assert 100 <= len(buckets) <= 120
        _, href, first, last, count, *_ = buckets[0]  # the page's script writes "3 commits <first> … <last>"
        n = int(count)
        assert 2 <= n <= 3 and (href, first, last) == (f"#{commit_anchor(sha(0))}", sha(0)[:10], sha(n - 1)[:10])
        assert sum(int(b[4]) for b in buckets) == 300


def test_markers_are_drawn_on_their_variant_and_the_commit_table_names_them():
    cp = ChangeFlag("step", 6, 6, sha(6), sha(6), 0.5e-3, 0.65e-3, 1.3)
    data = {CHIPS[1]: [history(CHIPS[1], v, level, range(10), changes=(cp,) if v == "flash_bq16_bk32" else ())
                       for v, level in VARIANTS.items()]}
    reg = RegressionEvidence("performance", CHIPS[1], "flash_prefill", "flash_bq16_bk32", "float16", "S=128", sha(6),
                             "commit 6", None, sha(5), 1.3, 1.28, 1.32, 1e-4, 1e-3, 30, 30, 0.5e-3, 0.65e-3)
    broken = RegressionEvidence("correctness", CHIPS[1], "flash_prefill", "sdpa", "float16", "S=64", sha(8),
                                "commit 8", None, sha(7), check="reference", status="failed", detail="max error 1")
    (page,) = history_pages(data, [reg, broken])
    svg = parse(page.plots[0].svg)
    flash = svg.find("./s:g[@data-series='flash_bq16_bk32']", NS)
    assert flash.find(".//s:g[@class='marker step']", NS) is not None
    assert flash.find(".//s:g[@class='marker regression']", NS) is not None
    assert svg.find("./s:a/s:g[@class='marker broken']", NS) is not None  # failed on every shape of that dtype
    assert page.n_changes == 1 and page.n_regressions == 1
    notes = [text for row in page.commits for _, text, _ in row.notes]
    assert any(n.startswith("regression ×1.300") for n in notes) and any(n.startswith("step ×1.300") for n in notes)
    assert any(n.startswith("correctness failed: sdpa reference") for n in notes)


def test_pages_per_chip_keep_their_names_and_a_kernel_on_two_chips_gets_a_page_of_every_chip():
    pages = history_pages({**histories(), "cpu-x": [history("cpu-x", "sdpa", 1e-2, range(3), kernel="swiglu")]}, [])
    names = {p.name for p in pages}
    assert names == {history_page_name("flash_prefill", CHIPS[0]), history_page_name("flash_prefill", CHIPS[1]),
                     kernel_history_page_name("flash_prefill"), history_page_name("swiglu", "cpu-x")}
    every = next(p for p in pages if p.name == kernel_history_page_name("flash_prefill"))
    assert every.chip == "" and every.chips == sorted(CHIPS) and len(every.plots) == 2
    assert [plot.chip_index for plot in every.plots] == [0, 1]  # one (dtype, shape): a plot per chip, side by side
    css = str(every.chip_css)
    assert css.count("display: none") == 2 and "#show-chip-1:not(:checked)) .chip-1" in css
    per_chip = next(p for p in pages if p.name == history_page_name("flash_prefill", CHIPS[0]))
    assert (kernel_history_page_name("flash_prefill") in dict((href, label) for label, href in per_chip.links))
    assert next(p for p in pages if p.kernel == "swiglu").links == [("cpu-x", history_page_name("swiglu", "cpu-x"))]
    assert not kernel_history_page_name("a--b").startswith("history-")  # never a per-chip page's name


def test_series_overlay_without_legend_and_no_data():
    empty = overlay_plot([], PlotOptions(n_x=0))
    assert "no data" in str(empty)
    one = overlay_plot([Series("v", [0, 1], [1.0, 2.0], [None, None], [None, None], str, lambda i: "#")],
                       PlotOptions(n_x=2, legend=False, y_units=None, y_format=lambda v: f"{v:.1f} u"))
    svg = parse(one)
    assert svg.find(".//s:g[@class='legend-entry']", NS) is None
    assert "1.0 u" in [t.text for t in svg.findall(".//s:text[@class='tick']", NS)]


def test_a_plot_is_drawn_on_its_own_chips_axis_the_same_on_every_page():
    """A chip's plot on the page of every chip is its own page's plot, byte for byte, and a new commit on another
    chip changes the page's commit table, not that plot (so an incremental build need not draw it again)."""
    from reports.history import history_plans, plot_svgs

    def drawn(data):
        pages = {p.name: p for p in history_pages(data, [])}
        return pages, plot_svgs(pages[kernel_history_page_name("flash_prefill")])

    before = histories()
    pages, every = drawn(before)
    for chip in CHIPS:
        assert plot_svgs(pages[history_page_name("flash_prefill", chip)]).items() <= every.items()
    # drawn without the chip pages' SVGs: the same plots
    (plan,) = [p for p in history_plans(before, []) if not p.chip]
    assert plot_svgs(plan.draw()) == every
    after = histories()
    after[CHIPS[0]] = [history(CHIPS[0], s.key.variant, s.points[0].median / 0.2 * 0.2, range(11))
                       for s in before[CHIPS[0]]]  # a new commit on one chip only
    pages_after, every_after = drawn(after)
    assert len(pages_after[kernel_history_page_name("flash_prefill")].commits) == 11
    changed = {key for key in every if every[key] != every_after[key]}
    assert changed == set(plot_svgs(pages_after[history_page_name("flash_prefill", CHIPS[0])]))
