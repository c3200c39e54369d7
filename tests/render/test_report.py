"""Report rendering: pages per chip, variant ratios against the baseline, everything user-written escaped."""

from __future__ import annotations

from datetime import UTC, datetime

from harness.analysis.site_inputs import SiteData
from harness.record.query import RunView
from harness.render.pages import write_site
from reports.chip import variant_rows
from reports.render import chip_page_name, fmt_rate, fmt_time


def bench(variant: str, median: float, shape: str = "S=64") -> dict:
    return {"kind": "benchmark", "kernel": "flash_prefill", "variant": variant, "dtype": "float16",
            "shape_key": shape, "median_s": median, "pct_peak": 10.0}


def test_variant_rows_are_ratios_to_the_baseline():
    rows = variant_rows([bench("sdpa", 2.0), bench("flash_bq8_bk16", 1.0), bench("flash_bq16_bk32", 4.0)],
                        {"flash_prefill": "sdpa"})
    (row,) = rows
    assert row.baseline == "sdpa"
    assert row.cells["flash_bq8_bk16"]["ratio"] == 0.5 and row.cells["flash_bq16_bk32"]["ratio"] == 2.0
    assert row.cells["sdpa"]["ratio"] == 1.0


def test_a_missing_baseline_gives_no_ratio():
    (row,) = variant_rows([bench("flash_bq8_bk16", 1.0)], {"flash_prefill": "sdpa"})
    assert row.cells["flash_bq8_bk16"]["ratio"] is None


def test_formatting():
    assert fmt_time(0.0021) == "2.1 ms" and fmt_time(3.2e-6) == "3.2 µs" and fmt_time(None) == "–"
    assert fmt_rate(2.5e12, "FLOP/s") == "2.5 TFLOP/s" and fmt_rate(None, "B/s") == "–"
    assert chip_page_name("a/b:c") == "chip-a_b_c.html"


def test_user_text_is_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    chip = {"key": "cpu-x", "backend": "cpu", "device_name": evil, "architecture": "x86_64", "gpu_cores": None,
            "memory_bytes": None, "record": {"os": "Linux", "mlx_version": "0.32"}}
    job = {"kind": "correctness", "kernel": evil, "variant": evil, "dtype": "float32", "shape_key": "N=1",
           "check_name": evil, "status": "failed", "detail": evil, "output_tail": evil, "max_error": 1.0,
           "tolerance": 0.1}
    run = RunView("r1", "cpu-x", "abc", evil, evil, True, "s", "complete", datetime.now(UTC), None, None, None, 1,
                  "host", [job])
    index = write_site(tmp_path, SiteData([chip], {"cpu-x": run}, db_label="sqlite:///x.db"))
    for page in (index, tmp_path / chip_page_name("cpu-x")):
        html = page.read_text()
        assert "<script>alert(1)</script>" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_history_page_orders_commits_as_the_series_do_not_by_start_time():
    """A bisect runs old commits last: the page's commit axis follows the histories' (ancestry) order."""
    from types import SimpleNamespace as NS

    from harness.analysis.records import HistoryPoint, HistoryPoints
    from reports.history import _commit_axis

    def point(sha: str, minute: int) -> HistoryPoint:
        return HistoryPoint(sha, "", "", datetime(2026, 1, 1, 0, minute), 1.0, 0.9, 1.1, 10)

    # m8 was run last (a bisect probe) but sits between m7 and m9 on the branch; one series lacks m7.
    series = [NS(points=HistoryPoints.of((point("m0", 0), point("m7", 5), point("m8", 9), point("m9", 6)))),
              NS(points=HistoryPoints.of((point("m0", 0), point("m8", 9), point("m9", 6), point("m11", 7))))]
    assert _commit_axis(series)[0] == ["m0", "m7", "m8", "m9", "m11"]


def test_a_commit_axis_holding_every_other_order_is_the_merge_of_them():
    """Where one series' order holds every other's as a subsequence (the chips of a page of every chip, one with a
    newer run), the axis is taken from it without merging: the same commits, order and points as the merge, on
    random orders; where none holds the rest, the merge decides."""
    import random
    from types import SimpleNamespace
    from typing import Any

    from harness.analysis.records import HistoryPoint, HistoryPoints
    from reports import history as history_page

    def series(shas: list[str], branch: str = "main") -> Any:
        return SimpleNamespace(points=HistoryPoints.of(
            HistoryPoint(sha, f"m {sha}", branch, datetime(2026, 1, 1), 1.0, 0.9, 1.1, 10) for sha in shas))

    def merged(series_list: list[Any]) -> tuple[list[str], dict[str, Any]]:
        distinct: dict[tuple[str, ...], Any] = {}
        for one in series_list:
            distinct.setdefault(tuple(one.points.shas), one.points)
        return history_page._merged(distinct)

    rng = random.Random(3)
    for _ in range(200):
        full = [f"c{i}" for i in range(rng.randint(2, 30))]
        orders = [full] + [[sha for sha in full if rng.random() < 0.7] for _ in range(rng.randint(1, 4))]
        rng.shuffle(orders)
        listed = [series(order, rng.choice(["main", "dev"])) for order in orders for _ in range(2)]
        shas, info = history_page._commit_axis(listed)
        expected = merged(listed)
        assert (shas, info) == expected and shas == full
    apart = [series(["a", "b", "d"]), series(["a", "c", "d"])]  # none holds the other: merged
    assert history_page._holding_all({tuple(s.points.shas): s.points for s in apart}) is None
    assert history_page._commit_axis(apart) == merged(apart)


def test_each_history_pages_commits_are_its_series_commits():
    """``HistoryPages`` reads each page's commits (its links' fingerprint, the summaries' counts) once per kernel and
    chip and once per distinct order of points: the same sets as every series' shas, per page, where series of a
    chip share a commit table, a chip has other commits in another kernel, and a series misses some commits."""
    from types import SimpleNamespace

    from harness.analysis.records import HistoryPoint, HistoryPoints
    from harness.render.history import history_specs
    from reports import history as history_page

    def table(shas: list[str]) -> HistoryPoints:
        return HistoryPoints.of(HistoryPoint(sha, f"m {sha}", "main", datetime(2026, 1, 1), 1.0, 0.9, 1.1, 10)
                                for sha in shas)

    def series(kernel: str, chip: str, variant: str, points: HistoryPoints) -> SimpleNamespace:
        key = SimpleNamespace(kernel=kernel, chip=chip, variant=variant, dtype="float16", shape_key="S=64")
        return SimpleNamespace(key=key, points=points, change_points=[])

    a, b = table([f"a{i}" for i in range(6)]), table([f"b{i}" for i in range(4)])
    histories = {
        "chip-a": [series("k1", "chip-a", "v1", a), series("k1", "chip-a", "v2", a[1:]),
                   series("k1", "chip-a", "v3", a[::2]), series("k2", "chip-a", "v1", table(["x0", "x1"]))],
        "chip-b": [series("k1", "chip-b", "v1", b), series("k1", "chip-b", "v2", b[:2]),
                   series("k2", "chip-b", "v1", b[2:])],
    }
    specs = history_specs(histories, [], {})
    known: dict = {}
    found = {spec.name: spec.shas(known) for spec in specs}
    assert len(found) == 6  # per kernel: two chip pages and the page of every chip
    for spec in specs:
        assert found[spec.name] == {sha for series_list in spec.chips.values() for s in series_list
                                    for sha in s.points.shas}
    assert found[history_page.kernel_history_page_name("k2")] == {"x0", "x1", "b2", "b3"}
