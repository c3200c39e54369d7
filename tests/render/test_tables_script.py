"""The report's one inline script (``reports/static/report.js``: sortable, filterable tables): the page's
Content-Security-Policy allows it by its SHA-256 and nothing else, and in Chromium it sorts by value ("950 µs" before
"1.2 ms"), keeps empty cells and rows spanning columns last, and filters rows; a changed script is refused."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

import pytest

from harness.analysis.site_inputs import SiteData
from harness.render.pages import write_site
from reports.render import STATIC, environment, page_script
from tests.render.test_report_site import Watched, browser  # noqa: F401 - the module's Chromium fixture

CHIP = {"key": "cpu-x", "backend": "cpu", "device_name": "CPU", "architecture": "x86_64", "gpu_cores": None,
        "memory_bytes": None, "record": {"os": "Linux", "mlx_version": "0.32"}}
ROWS = [  # name, time, rate, note (data-sort), ratio
    ("alpha", "1.2 ms", "2.59 TB/s", ("fast", "3"), "×1.302 [1.28, 1.33]"),
    ("beta", "950 µs", "700 GB/s", ("slow", "10"), "×0.950"),
    ("gamma", "2 s", "1.5 TB/s", ("medium", "5"), "–"),
    ("delta", "–", "–", ("", ""), "×1.000"),
    ("epsilon", "12 ns", "64 kB/s", ("fastest", "1"), "×2.5 [2.1, 3]"),
]


def csp_and_scripts(text: str) -> tuple[dict[str, list[str]], list[str]]:
    meta = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', text)
    assert meta, "no CSP meta"
    policy = {}
    for directive in html.unescape(meta.group(1)).split(";"):
        name, *sources = directive.split()
        policy[name] = sources
    return policy, re.findall(r"<script>(.*?)</script>", text, re.S)


def sha256_source(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'"


def test_every_page_allows_exactly_its_inline_script_by_hash(tmp_path):
    write_site(tmp_path, SiteData([CHIP], {"cpu-x": None}, db_label="sqlite:///x.db"))
    pages = list(tmp_path.glob("*.html"))
    assert len(pages) >= 3
    source = (STATIC / "report.js").read_text(encoding="utf-8")
    for page in pages:
        policy, scripts = csp_and_scripts(page.read_text(encoding="utf-8"))
        assert scripts == [source], page.name  # inlined byte for byte (not escaped)
        assert policy["script-src"] == [sha256_source(scripts[0])], page.name  # its hash, and nothing else
        assert policy["default-src"] == ["'none'"] and "'unsafe-inline'" not in policy["script-src"]
    assert page_script()["page_script_csp"] == sha256_source(source)


def test_a_script_that_would_close_its_element_is_refused(monkeypatch, tmp_path):
    static = tmp_path / "static"
    static.mkdir()
    (static / "report.js").write_text("var x = '</script><script>alert(1)';")
    monkeypatch.setattr("reports.render.STATIC", static)
    with pytest.raises(ValueError, match="must not contain"):
        page_script()


def table_page(path: Path, script: str | None = None) -> Path:
    """A page of the report's base template with one sortable table (and optionally another script in place of the
    real one, under the real one's CSP)."""
    cells = "".join(
        f'<tr><td>{name}</td><td class="num">{time}</td><td class="num">{rate}</td>'
        f'<td{f" data-sort={sort!r}" if sort else ""}>{note}</td><td class="num">{ratio}</td></tr>'
        for name, time, rate, (note, sort), ratio in ROWS)
    body = ('<table id="t" class="sortable"><tr><th>Name</th><th>Median</th><th>Rate</th><th>Note</th><th>Ratio</th>'
            f'</tr>{cells}<tr class="summary"><td colspan="5">2 skipped: not on this chip</td></tr></table>')
    env = environment()
    template = env.from_string('{% extends "base.html.j2" %}{% block body %}' + body + "{% endblock %}")
    text = template.render(css=(STATIC / "report.css").read_text(), db_label="sqlite:///x.db")
    if script is not None:
        text = text.replace(str(env.globals["page_script"]), script)
    path.write_text(text, encoding="utf-8")
    return path


def test_in_chromium_headers_sort_by_value_and_the_box_filters(browser, tmp_path):  # noqa: F811
    w = Watched(browser)
    shot = tmp_path / "table.png"
    try:
        page = w.open(table_page(tmp_path / "table.html"))

        def names() -> list[str]:
            return page.eval_on_selector_all("#t tr:not([hidden])", "rows => rows.slice(1).map(r => r.cells[0]"
                                             ".textContent)")

        def header(text: str):
            return page.locator("#t th", has_text=text)

        original = names()
        header("Median").click()
        assert names() == ["epsilon", "beta", "alpha", "gamma", "delta", "2 skipped: not on this chip"]
        assert header("Median").get_attribute("aria-sort") == "ascending"
        header("Median").click()  # the other way; the empty cell and the spanning row stay last
        assert names() == ["gamma", "alpha", "beta", "epsilon", "delta", "2 skipped: not on this chip"]
        header("Rate").click()  # 64 kB/s < 700 GB/s < 1.5 TB/s < 2.59 TB/s
        assert names()[:4] == ["epsilon", "beta", "gamma", "alpha"]
        header("Note").click()  # data-sort (3, 10, 5, 1), not the words
        assert names()[:4] == ["epsilon", "alpha", "gamma", "beta"]
        header("Ratio").focus()
        page.keyboard.press("Enter")  # by keyboard too; "×1.302 [1.28, 1.33]" is 1.302
        assert names()[:4] == ["beta", "delta", "alpha", "epsilon"]
        header("Name").click()
        assert names()[:5] == sorted(original[:5])
        page.fill("#filter-t", "TB/s")
        assert names() == ["alpha", "gamma"]
        assert page.locator(".table-count").text_content() == "2 of 6 rows"
        page.fill("#filter-t", "alpha 1.2")  # every word must match
        assert names() == ["alpha"]
        page.fill("#filter-t", "")
        assert len(names()) == 6
        page.screenshot(path=str(shot), full_page=True)
        w.assert_clean()
    finally:
        w.context.close()
    print("screenshot:", shot)


def test_in_chromium_a_changed_script_is_blocked_by_the_policy(browser, tmp_path):  # noqa: F811
    """The CSP names the real script's hash: one more character and Chromium refuses to run it."""
    tampered = str(page_script()["page_script"]).replace('"use strict";', '"use strict"; window.ran = 1;')
    w = Watched(browser)
    try:
        page = w.open(table_page(tmp_path / "tampered.html", tampered))
        assert page.evaluate("typeof window.ran") == "undefined"
        assert page.locator("input.table-filter").count() == 0  # nothing of it ran
        assert any("script-src" in v for v in page.evaluate("window.cspViolations")), w.errors
    finally:
        w.context.close()


def test_in_chromium_a_long_historys_bucket_shows_its_commits_and_medians_on_hover_and_links_to_its_row(
        browser, tmp_path):  # noqa: F811
    """A bucket's hover text is written by the script from its data (the SVG has no element per bucket): the same
    text the Python side would write (``fmt_time``), and a click goes to the bucket's first commit."""
    from reports.render import commit_anchor, fmt_time, history_page_name
    from tests.render.test_history_plots import history, sha

    chip = "nvidia-h200-sm90"
    long = {chip: [history(chip, "sdpa", 1.0e-3, range(300)), history(chip, "flash_bq16_bk32", 0.5e-3, range(300))]}
    write_site(tmp_path, SiteData([{**CHIP, "key": chip}], {chip: None}, db_label="sqlite:///x.db", histories=long))
    w = Watched(browser)
    shot = tmp_path / "bucket-hover.png"
    try:
        page = w.open(tmp_path / history_page_name("flash_prefill", chip))
        group = page.locator("svg.plot g[data-series='flash_bq16_bk32'] g.hits")  # its level steps ×1.3 at commit 6
        x, _, first, last, count, lowest, highest = group.get_attribute("data-hits").split(";")[2].split(" ")
        where = group.locator("path.dots.lin").evaluate(
            """path => { const m = path.getAttribute("d").match(/M([\\d.]+),([\\d.]+)h0/g)[2].slice(1, -2)
                         .split(",").map(Number); const p = path.ownerSVGElement.createSVGPoint();
                         [p.x, p.y] = m; const s = p.matrixTransform(path.getScreenCTM());
                         return [s.x, s.y]; }""")
        assert abs(float(x) - float(group.locator("path.dots.lin").get_attribute("d").split("M")[3].split(",")[0])
                   ) < 0.05  # the third bucket's data is the third dot's
        page.mouse.move(*where)
        tip = page.locator(".plot-tip")
        n = int(count)
        assert tip.is_visible()
        assert tip.text_content() == (f"{n} commits {first} … {last}\nflash_bq16_bk32 on {chip}: median "
                                      f"{fmt_time(float(lowest))} – {fmt_time(float(highest))}")
        assert (first, last) == (sha(5)[:10], sha(7)[:10])  # commits 5..7: the step is inside the bucket
        assert (fmt_time(float(lowest)), fmt_time(float(highest))) == ("500 µs", "650 µs")
        page.screenshot(path=str(shot))
        page.mouse.click(*where)
        assert page.evaluate("location.hash") == "#" + commit_anchor(sha(5))
        assert page.locator("#commits tr:target td").first.is_visible()
        page.mouse.move(5, 5)  # off every dot: the text goes
        assert not tip.is_visible()
        w.assert_clean()
    finally:
        w.context.close()
    print("screenshot:", shot)
