"""The report's summaries of plain records: the per-variant roll-up, the regression groups and their range links,
numeric shape order, the sparkline, the scaling and roofline views (no database, no browser)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from types import SimpleNamespace

from harness.analysis.records import ChangeFlag, RegressionEvidence, SeriesHistory
from harness.record.query import SeriesKey
from reports.chip import chip_views
from reports.history import _axis, _svg_series, shape_order, threshold_band
from reports.regressions import range_url, regression_groups, regression_id
from reports.sparkline import sparkline
from reports.svg import PALETTE, PlotOptions, overlay_plot
from reports.variants import variant_rollup


def cell(chip, variant, shape, outcome, ratio):
    return SimpleNamespace(kernel="flash", variant=variant, dtype="float16", shape_key=shape, chip=chip,
                           default_variant="sdpa", outcome=outcome, ratio=ratio)


def test_the_rollup_counts_each_chip_and_puts_the_divergent_variant_first():
    cells = [cell("cpu", "bq16", "S=64", "win", 0.6), cell("gpu", "bq16", "S=64", "lose", 90.0),
             *(cell("gpu", "bq16", f"S={s}", "lose", 50.0 + s) for s in (128, 256)),
             cell("cpu", "bq8", "S=64", "tie", 1.0), cell("gpu", "bq8", "S=64", "tie", 1.01)]
    first, second = variant_rollup(SimpleNamespace(cells=cells))
    assert (first.variant, first.divergent, second.variant, second.divergent) == ("bq16", True, "bq8", False)
    cpu, gpu = first.chips
    assert (cpu.chip, cpu.wins, cpu.cells, cpu.shared, cpu.shared_wins) == ("cpu", 1, 1, 1, 1)
    assert (gpu.chip, gpu.losses, gpu.cells, gpu.shared, gpu.shared_losses) == ("gpu", 3, 3, 1, 1)
    assert gpu.median_ratio == 178.0 and cpu.median_ratio == 0.6
    assert variant_rollup(None) == []


def regression(kind="performance", chip="gpu", variant="twin", shape="S=64", base="a" * 40, head="b" * 40, ratio=1.1):
    return RegressionEvidence(kind, chip, "flash", variant, "float16", shape, head, "head", datetime(2026, 12, 1,
                              tzinfo=UTC), base, ratio=ratio, ci_low=ratio - 0.01, ci_high=ratio + 0.01)


def test_regressions_are_grouped_by_commit_with_a_range_link_and_acknowledgements():
    regs = [regression(shape="S=64"), regression(shape="S=128", ratio=1.3), regression(kind="correctness", base=None),
            regression(chip="cpu")]
    rid = regression_id(regs[1])
    assert re.fullmatch(r"[0-9a-f]{12}", rid) and rid == regression_id(regression(shape="S=128", ratio=1.3))
    web = {"b" * 40: "https://github.com/o/r/commit/" + "b" * 40}
    groups = regression_groups(regs, {rid: object()}, web)
    assert [(g.kind, g.chip, len(g.items)) for g in groups] == [("correctness", "gpu", 1), ("performance", "gpu", 2),
                                                                ("performance", "cpu", 1)]
    slow = groups[1]
    assert slow.range_url == f"https://github.com/o/r/compare/{'a' * 40}...{'b' * 40}"
    assert slow.acked == {rid} and not slow.all_acked and slow.worst.ratio == 1.3
    assert groups[0].range_url is None  # a first failure has no previous commit


def test_range_links_only_for_hosts_whose_compare_view_is_known():
    head, base = "b" * 40, "a" * 40
    assert range_url(f"https://gitlab.com/g/s/p/-/commit/{head}", head, base) == \
        f"https://gitlab.com/g/s/p/-/compare/{base}...{head}"
    assert range_url(f"https://bitbucket.org/o/r/commits/{head}", head, base) == \
        f"https://bitbucket.org/o/r/branches/compare/{head}%0D{base}"
    assert range_url(f"https://git.example.com/r/commit/{head}", head, base) is None  # a template of another host
    assert range_url(f"https://github.com/o/r/commit/{head}", head, None) is None


def test_shapes_sort_by_their_numbers():
    keys = ["B=1,D=128,S=64", "B=1,D=64,S=128", "B=1,D=64,S=64", "B=2,D=64,S=64"]
    assert sorted(keys, key=lambda k: shape_order("float16", k)) == [
        "B=1,D=64,S=64", "B=1,D=64,S=128", "B=1,D=128,S=64", "B=2,D=64,S=64"]
    assert len(set(PALETTE)) >= 20


def history(variant, medians, change_at=None):
    shas = [f"{i:040x}" for i in range(len(medians))]
    points = [SimpleNamespace(sha=sha, message="m", branch="main", started_at=None, median=m, ci_low=m, ci_high=m,
                              n=3) for sha, m in zip(shas, medians, strict=True)]
    flags = () if change_at is None else (ChangeFlag("step", change_at, change_at, shas[change_at], shas[change_at],
                                                      medians[0], medians[-1], medians[-1] / medians[0]),)
    return SeriesHistory(SeriesKey("flash", variant, "float16", "S=64", "gpu"), points, flags)


def test_the_sparkline_follows_the_default_variant_and_marks_the_last_change():
    spark = str(sparkline([history("sdpa", [1.0, 1.0, 2.0, 2.0], change_at=2), history("other", [5.0, 1.0, 5.0, 1.0])],
                          "sdpa"))
    ys = [float(p.split(",")[1]) for p in re.search(r'points="([^"]+)"', spark).group(1).split()]
    assert ys[0] == ys[1] > ys[2] == ys[3]  # the default's step up (higher time: drawn higher, smaller y)
    assert '<circle' in spark and "last change at 00000000" in spark
    assert str(sparkline([history("sdpa", [1.0])], "sdpa")) == ""  # one commit: nothing to draw


def job(variant, S, median, flops=1e9, moved=1e7):
    return {"kind": "benchmark", "status": "passed", "kernel": "flash", "variant": variant, "dtype": "float16",
            "shape": {"B": 1, "S": S}, "shape_key": f"B=1,S={S}", "median_s": median, "flops": flops * S,
            "bytes_moved": moved}


def test_chip_views_draw_a_roofline_under_both_ceilings_and_a_line_per_variant_against_the_grid_parameter():
    jobs = [job(v, S, t * S) for v, t in (("sdpa", 1e-6), ("tiled", 2e-6)) for S in (64, 128, 256)]
    jobs.append({**job("sdpa", 512, 1.0), "status": "failed"})  # not measured: not drawn
    (view,) = chip_views(jobs, 100e12, 1e12, {"flash": "sdpa"})
    assert view.kernel == "flash" and view.variants == 2
    roof = str(view.roofline)
    assert roof.count('class="ceiling"') == 2 and "copy bandwidth 1 TB/s" in roof and "matmul peak 100 TFLOP/s" in roof
    assert re.findall(r'data-variant="([^"]+)"', roof) == ["sdpa", "tiled"]
    assert roof.count("<circle cx") == 6 + 2  # a mark per job, a legend dot per variant
    ((title, image),) = view.scaling
    assert "against S" in title and "B=1" in title
    assert str(image).count('<polyline class="line"') == 2
    assert "at 6400 FLOP/B" in roof  # 1e9 * 64 / 1e7
    assert chip_views(jobs, None, None, {})[0].roofline.count('class="ceiling"') == 0  # no calibration: no roof


def test_the_threshold_band_sits_around_the_level_since_the_last_change():
    steady = [1.0, 1.01, 0.99, 1.02, 2.0, 2.02, 1.98, 2.01, 2.0]
    start, low, high, level, detectable = threshold_band(history("sdpa", steady, change_at=4))
    assert start == 4 and level == 2.0 and 0 < detectable < 0.2  # the level after the step, its noise alone
    assert low < 1.98 and high > 2.02 and math.isclose(high / level, 1 + detectable)
    assert threshold_band(history("sdpa", [1.0, 1.01])) is None  # under the noise meter's floor of 3 commits
    series = _svg_series(history("sdpa", steady, change_at=4), _axis([history("sdpa", steady)]),
                         {"sdpa": ("#000", "")}, True, "gpu", [])
    svg_text = str(overlay_plot([series], PlotOptions(n_x=len(steady), log=None)))
    assert svg_text.count('class="threshold"') == 2 and "detects ±" in svg_text  # linear and log layers
