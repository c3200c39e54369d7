"""The report as a kernel engineer reads it, in Chromium at 1366x900, on a site built from the committed example
bundles (``testkit.recorded``) plus a generated regression (the planted H200 head with ``sdpa_twin`` x1.08):
the answer first (a per-variant roll-up naming a divergent variant), pages that fit the screen, a scrolled matrix
that keeps its chip headers, the regression -> compare row -> samples path with every link on screen, an
acknowledged regression surviving a rebuild, a filtered URL reopening filtered, the scaling and roofline plots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reports.render import chip_page_name
from testkit.e2e import harness
from testkit.paths import ROOT
from testkit.recorded import import_examples, scaled_bundle

from .test_report_site import (
    CHROMIUM,
    CHROMIUM_ARGS,
    _unavailable,  # noqa: F401 - the same skip/fail rule
)

WIDTH, HEIGHT = 1366, 900
H200 = "nvidia-h200-sm90"
BUNDLES = ["h200-planted-gpu-base.bundle", "cpu-cross-chip-ee285b2.bundle", "h200-3c1c045.bundle"]
COMMIT_URL = "https://github.com/example/kernels/commit/{sha}"
DOCS_IMG = ROOT / "test-artifacts" / "report"  # the best of them are copied to docs/img


def _report(folder: Path, db: str) -> Path:
    out = folder / "site"
    done = harness("report", "--db", db, "--out", str(out), "--commit-url", COMMIT_URL, cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("ux")
    head = scaled_bundle("h200-planted-gpu-head.bundle", folder / "head-x108.bundle", "sdpa_twin", 1.08)
    db = import_examples(folder, BUNDLES)
    done = harness("import", "--db", db, str(head), cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"folder": folder, "db": db, "out": _report(folder, db)}


@pytest.fixture(scope="module")
def page():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        _unavailable(f"playwright is not installed: {exc}")
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} not found (apt-get install chromium)")
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # noqa: BLE001 - any launch failure means no browser here
            _unavailable(f"cannot launch {CHROMIUM}: {exc}")
        tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.errors = errors
        yield tab
        browser.close()


def _open(page, url: str):
    page.goto(url)
    page.wait_for_load_state("load")
    return page


def _page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def _on_screen(page, locator) -> bool:
    """Inside the viewport horizontally (no sideways scrolling needed) once scrolled to vertically."""
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH and \
        page.evaluate("window.scrollX") == 0


def test_the_rollup_names_a_divergent_variant(built, page):
    _open(page, (built["out"] / "variants.html").as_uri())
    divergent = page.locator("#rollup-list tr.divergent")
    assert divergent.count() >= 1
    first = divergent.first.inner_text()
    assert re.search(r"wins \d+/\d+", first) and re.search(r"loses \d+/\d+", first), first
    assert "flash_" in first and "median ×" in first
    # the roll-up comes before the matrix, divergent variants on top
    rows = page.locator("#rollup-list tbody tr")
    assert "divergent" in (rows.first.get_attribute("class") or "")
    assert page.evaluate("document.querySelector('#rollup-list').getBoundingClientRect().top < "
                         "document.querySelector('#matrix').getBoundingClientRect().top")
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS_IMG / "report-variants-rollup.png"))
    # its link opens the matrix filtered to the variant's cells
    name = divergent.first.locator("td.vname strong").inner_text()
    divergent.first.locator("a:text('its cells')").click()
    page.wait_for_load_state("load")
    assert page.locator("#filter-matrix").input_value().endswith(name)
    shown = page.locator("#matrix tbody tr:not([hidden])")
    assert shown.count() >= 1 and all(name in text for text in shown.all_inner_texts())
    assert page.errors == []


def test_no_page_is_wider_than_the_viewport(built, page):
    names = sorted(p.name for p in built["out"].glob("*.html") if not p.name.startswith("samples-"))
    names += sorted(p.name for p in built["out"].glob("samples-*.html"))[:3]
    wide = {}
    for name in names:
        _open(page, (built["out"] / name).as_uri())
        if _page_width(page) > WIDTH:
            wide[name] = _page_width(page)
    assert wide == {}
    assert page.errors == []


def test_a_scrolled_matrix_still_shows_its_chip_headers(built, page):
    _open(page, (built["out"] / "variants.html").as_uri() + "?c.hide-no-verdict=0")
    assert not page.locator("#hide-no-verdict").is_checked()
    box = page.locator("#matrix-box")
    box.scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, document.querySelector('#matrix-box').getBoundingClientRect().top)")
    page.evaluate("document.querySelector('#matrix-box').scrollTop = 3000")
    assert page.evaluate("document.querySelector('#matrix-box').scrollTop") > 1000  # it did scroll
    header = page.locator("#matrix thead th", has_text=H200)
    top = box.bounding_box()["y"]
    rect = header.bounding_box()
    assert abs(rect["y"] - top) < 3  # stuck at the top of the box
    hit = page.evaluate(f"document.elementFromPoint({rect['x'] + rect['width'] / 2}, {rect['y'] + rect['height'] / 2})"
                        ".closest('th') && document.elementFromPoint("
                        f"{rect['x'] + rect['width'] / 2}, {rect['y'] + rect['height'] / 2}).closest('th')"
                        ".textContent")
    assert hit == H200  # on top: no row covers it
    assert page.errors == []


def test_a_url_with_a_filter_reopens_filtered(built, page):
    url = (built["out"] / "variants.html").as_uri() + "?f.matrix=bq16_bk16%20float16&s.matrix=-5"
    _open(page, url)
    assert page.locator("#filter-matrix").input_value() == "bq16_bk16 float16"
    shown = page.locator("#matrix tbody tr:not([hidden])").all_inner_texts()
    total = page.locator("#matrix tbody tr").count()
    assert 0 < len(shown) < total and all("bq16_bk16" in t and "float16" in t for t in shown)
    assert page.locator("#matrix thead th").nth(5).get_attribute("aria-sort") == "descending"
    # typing changes the URL, so that the view can be shared
    page.locator("#filter-matrix").fill("bq32")
    page.locator("#filter-matrix").dispatch_event("input")
    assert "f.matrix=bq32" in page.url
    _open(page, page.url)
    assert page.locator("#filter-matrix").input_value() == "bq32"
    assert page.errors == []


def test_a_regression_reaches_its_compare_row_and_samples_with_every_link_on_screen(built, page):
    _open(page, (built["out"] / "regressions.html").as_uri())
    block = page.locator("section.reg-group", has=page.locator("table.performance-list")).first
    assert "21 slower series" in block.locator("h3").inner_text()  # one block for the commit, its series inside
    range_link = block.locator("a.range-link")
    assert range_link.get_attribute("href").startswith("https://github.com/example/kernels/compare/1d8c492d90d1")
    row = block.locator("tbody tr").first
    for link in ("td.lose a", "a:text('compare')", "a:text('samples')"):
        assert _on_screen(page, row.locator(link)), link
    assert re.fullmatch(r"3 / 3", row.locator("td").nth(7).inner_text())  # trials, not samples
    row.locator("td.lose a").click()
    page.wait_for_load_state("load")
    target = page.url.split("#")[1]
    compare_row = page.locator(f"tr#{target}")
    assert "regressed" in compare_row.inner_text()
    assert _on_screen(page, compare_row.locator("a.samples-link"))
    assert _page_width(page) <= WIDTH
    compare_row.locator("a.samples-link").click()
    page.wait_for_load_state("load")
    assert page.locator("svg.plot.strip").count() == 1
    assert page.errors == []


def test_an_acknowledged_regression_shows_as_such_after_a_rebuild(built, page):
    html = (built["out"] / "regressions.html").read_text(encoding="utf-8")
    perf = html[html.index('id="performance"'):]
    rid = re.search(r'<code class="reg-id"[^>]*>([0-9a-f]{12})</code>', perf).group(1)
    done = harness("ack", rid, "--note", "expected: twin made slower on purpose", "--db", built["db"],
                   cwd=built["folder"])
    assert done.returncode == 0, done.stderr
    bad = harness("ack", "not-an-id", "--db", built["db"], cwd=built["folder"])
    assert bad.returncode == 2 and "12 hex digits" in bad.stderr + bad.stdout
    out = _report(built["folder"], built["db"])
    _open(page, (out / "regressions.html").as_uri())
    row = page.locator("tr", has=page.locator(f"code.reg-id:text('{rid}')"))
    assert "acknowledged" in row.inner_text() and "expected: twin made slower on purpose" in row.inner_text()
    assert "acked" in row.get_attribute("class")
    page.locator("#hide-acked").check()
    assert not row.is_visible()
    assert "c.hide-acked=1" in page.url
    feed = (out / "regressions.atom").read_text(encoding="utf-8")
    assert f"[{rid} acknowledged]" in feed and feed.startswith('<?xml version="1.0"')
    assert page.errors == []


def test_the_chip_page_opens_with_a_table_of_contents_and_benchmarks_first(built, page):
    _open(page, (built["out"] / chip_page_name(H200)).as_uri())
    toc = page.locator("#toc a").all_inner_texts()
    assert toc[:3] == ["Latest run", "Variant comparison", "Benchmarks"] and "Correctness" in toc
    order = page.evaluate("['variant-comparison', 'benchmarks-section', 'correctness-section']"
                          ".map(id => document.getElementById(id).getBoundingClientRect().top)")
    assert order == sorted(order)
    assert _page_width(page) <= WIDTH
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS_IMG / "report-chip-page.png"))
    assert page.errors == []


def test_the_index_words_what_it_counts(built):
    html = (built["out"] / "index.html").read_text(encoding="utf-8")
    rows = {m[1]: m[0] for m in re.finditer(r'<tr>\s*<td><a href="chip-([^"]+)\.html">.*?</tr>', html, re.S)}
    cross = rows["cpu-x86_64-intel-r-xeon-r-processor"]
    assert "no correctness jobs" in cross and ">pass 0<" not in cross  # no green pass without a correctness job
    h200 = rows[H200]
    assert "4 correctness failures" in h200 and "confirmed" not in h200  # failures are not "confirmed" slowdowns
    variants = (built["out"] / "variants.html").read_text(encoding="utf-8")
    assert re.search(r"trials \d+ default / \d+ variant", variants) and "samples per side" not in variants


def test_the_roofline_and_scaling_plots_render_with_ceilings_and_one_mark_per_variant(built, page):
    _open(page, (built["out"] / chip_page_name(H200)).as_uri() + "#scaling")
    views = page.locator("details.kernel-views")
    assert views.count() >= 5
    rows = page.locator("#benchmarks tbody tr").evaluate_all(
        "rows => rows.filter(r => r.cells.length > 5).map(r => [r.cells[0].textContent, r.cells[1].textContent,"
        " r.cells[4].textContent.trim().split(' ')[0]])")
    checked = 0
    for i in range(views.count()):
        view = views.nth(i)
        kernel = view.locator("summary h3").inner_text()
        view.evaluate("d => d.open = true")
        roofline = view.locator("figure.roofline svg")
        assert roofline.count() == 1, kernel
        assert roofline.locator("g.ceiling").count() == 2  # the calibrated bandwidth and compute ceilings
        labels = roofline.locator("text.ceiling-label").all_text_contents()
        assert any("copy bandwidth" in t for t in labels) and any("matmul peak" in t for t in labels)
        marked = roofline.locator("g.variant").evaluate_all("gs => gs.map(g => g.getAttribute('data-variant'))")
        measured = {v for k, v, status in rows if k == kernel and status == "passed"}
        assert len(marked) == len(set(marked)) and set(marked) == measured, kernel  # one mark group per variant
        assert roofline.locator("g.variant circle").count() >= 2 * len(marked)  # marks and legend dots
        for plot in view.locator("figure.scaling svg").all():
            lines = plot.locator("g.variant").evaluate_all("gs => gs.map(g => g.getAttribute('data-variant'))")
            assert lines and len(lines) == len(set(lines)) and set(lines) <= measured
            assert plot.locator("g.variant polyline.line").count() >= 1
            checked += 1
    assert checked >= 1  # at least one kernel has a grid parameter with two values or more
    assert _page_width(page) <= WIDTH
    first = page.locator("details.kernel-views").first
    first.scroll_into_view_if_needed()
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    first.screenshot(path=str(DOCS_IMG / "report-roofline.png"))
    assert page.errors == []
