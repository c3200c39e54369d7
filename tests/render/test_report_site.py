"""The static report site from a real run plus synthetic history, checked as text and in headless Chromium.

The DB: one real ``harness run`` of a tiny suite (the CPU chip of this machine) into a temporary SQLite file, then
synthetic history written through ``store.create_run`` / ``record_result`` on two more chips, ten commits each,
with a planted regression, a variant that wins on one chip and loses on the other, and user-written text
(a commit message, a branch, a kernel, a variant, a check name) that is ``<script>alert(1)</script>``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest

from harness.analysis.regressions import regressions as find_regressions
from harness.core.chip import ChipIdentity
from harness.core.job import JobResult, KernelJob
from harness.pipeline.report import ReportOptions, build_report
from harness.record.outbox import open_store
from harness.record.store import Store, create_run, finish_run, record_result, set_peaks
from reports.history import kernel_history_page_name
from reports.render import chip_page_name, commit_anchor, history_page_name, page_script
from testkit.e2e import git, harness, write_suite
from testkit.paths import ROOT

EVIL = "<script>alert(1)</script>"
SCRIPT = page_script()["page_script"]
ARTIFACTS = ROOT / "test-artifacts" / "report"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

APPLE = ChipIdentity("apple-m4-pro-20c", "metal", "Apple M4 Pro", "applegpu_g16s", 48 * 2**30, 20, "macOS 15.3",
                     "0.32.4")
NVIDIA = ChipIdentity("nvidia-h200-sm90", "cuda", "NVIDIA H200", "sm_90", 141 * 2**30, None, "Linux", "0.32.4")
PEAKS = {APPLE.key: (30e12, 270e9), NVIDIA.key: (700e12, 4.0e12)}
N_COMMITS = 10
REGRESSION_AT = 6  # flash_bq16_bk32 at S=256 gets 30% slower on the H200 from this commit on
SHAPES = [{"B": 1, "H": 8, "S_q": 128, "S_kv": 128, "D": 64}, {"B": 1, "H": 8, "S_q": 256, "S_kv": 256, "D": 64}]
BASE_TIME = {"sdpa": 1.0e-3, "flash_bq8_bk16": 1.0e-3, "flash_bq16_bk32": 1.1e-3, EVIL: 2.0e-3}


def sha_of(i: int) -> str:
    return f"{i:02d}" + "ab12cd34ef" * 3 + "5678ab90"


def message_of(i: int) -> str:
    return EVIL if i == 4 else f"commit {i}: tune the flash tiles\n\nlonger body line"


def speed(chip: str, variant: str, shape: dict[str, int], commit: int) -> float:
    """The planted truth: per chip and variant scale, the divergent variant, the regression."""
    t = BASE_TIME[variant] * shape["S_q"] / 128 * (0.2 if chip == NVIDIA.key else 1.0)
    if variant == "flash_bq8_bk16":
        t *= 0.7 if chip == APPLE.key else 1.4  # wins on the M4 Pro, loses on the H200: divergent
    if chip == NVIDIA.key and variant == "flash_bq16_bk32" and shape["S_q"] == 256 and commit >= REGRESSION_AT:
        t *= 1.3
    return t


def add_synthetic_history(store: Store) -> None:
    rng = np.random.default_rng(7)
    for i in range(N_COMMITS):
        commit = {"sha": sha_of(i), "message": message_of(i), "branch": "main" if (i + 1) % 3 else "<b>feature</b>",
                  "parents": [sha_of(i - 1)] if i else []}  # one line, its newest on main: ancestry orders it
        for ident in (APPLE, NVIDIA):
            run_id = create_run(store, ident=ident, facts={"hostname": f"{ident.key}-host"}, commit=commit,
                                suite="synthetic", dirty=False, executor="local", planned_jobs=0)
            set_peaks(store, run_id, *PEAKS[ident.key])
            for variant in ("sdpa", "flash_bq8_bk16", "flash_bq16_bk32"):
                for shape in SHAPES:
                    job = KernelJob.of("benchmark", "flash_prefill", variant, shape, "float16", name="flash-bench")
                    t = speed(ident.key, variant, shape, i)
                    for trial in range(3):  # three job processes, each at its own level
                        level = t * np.exp(rng.normal(0.0, 0.005))
                        samples = (level * np.exp(rng.normal(0.0, 0.005, 12))).tolist()
                        record_result(store, run_id, job, JobResult(job.key, "passed", samples=samples, inner=4,
                                                                    flops=4 * shape["S_q"] ** 2 * 64 * 8,
                                                                    bytes_moved=4 * shape["S_q"] * 64 * 8 * 2,
                                                                    trial=trial),
                                      PEAKS[ident.key])
                    check = KernelJob.of("correctness", "flash_prefill", variant, shape, "float16", "reference",
                                         name="flash-small")
                    record_result(store, run_id, check, JobResult(check.key, "passed", max_error=1e-4 * (1 + i % 3),
                                                                  tolerance=2e-3))
            # A hostile kernel / variant / check name: benchmarked on every commit, failing correctness from commit 7.
            shape = SHAPES[0]
            job = KernelJob.of("benchmark", EVIL, EVIL, shape, "float16", name=EVIL)
            samples = (speed(ident.key, EVIL, shape, i) * np.exp(rng.normal(0.0, 0.005, 12))).tolist()
            record_result(store, run_id, job, JobResult(job.key, "passed", samples=samples, inner=1))
            check = KernelJob.of("correctness", EVIL, EVIL, shape, "float16", EVIL, name=EVIL)
            failing = ident.key == APPLE.key and i >= 7
            record_result(store, run_id, check, JobResult(check.key, "failed" if failing else "passed",
                                                          detail=EVIL if failing else "", max_error=0.5 if failing
                                                          else 1e-5, tolerance=1e-3))
            finish_run(store, run_id, "complete")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """The real CLI run + synthetic history, rendered once through the real ``harness report``."""
    repo = tmp_path_factory.mktemp("repo")
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "T")
    suite = write_suite(repo, '["sdpa", "flash_bq8_bk16"]')
    db = repo / "results.db"
    url = f"sqlite:///{db}"
    done = harness("run", "--suite", str(suite), "--db", url, "--no-report", cwd=repo)
    assert done.returncode == 0, done.stderr
    store = open_store(url)
    try:
        add_synthetic_history(store)
        regressions = find_regressions(store)
    finally:
        store.close()
    out = repo / "site"
    rendered = harness("report", "--db", url, "--out", str(out), cwd=repo)
    assert rendered.returncode == 0, rendered.stderr
    return {"out": out, "url": url, "db": db, "regressions": regressions, "cpu_chip": _cpu_chip(out)}


def _cpu_chip(out: Path) -> str:
    (page,) = [p.name for p in out.glob("chip-*.html") if p.name not in (chip_page_name(APPLE.key),
                                                                          chip_page_name(NVIDIA.key))]
    return page[len("chip-"):-len(".html")]


def read(site: dict, name: str) -> str:
    return (site["out"] / name).read_text(encoding="utf-8")


# --- the pages as text -------------------------------------------------------------------------------------------


def test_every_page_is_written(site):
    names = {p.name for p in site["out"].iterdir()}
    expected = {"index.html", "variants.html", "regressions.html", chip_page_name(APPLE.key),
                chip_page_name(NVIDIA.key), history_page_name("flash_prefill", APPLE.key),
                history_page_name("flash_prefill", NVIDIA.key), history_page_name(EVIL, APPLE.key),
                history_page_name(EVIL, NVIDIA.key)}
    assert expected <= names
    assert history_page_name("flash_prefill", site["cpu_chip"]) in names  # the real run's benchmarks
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.html", name) for name in names - {"regressions.atom"})


def test_user_text_is_escaped_everywhere(site):
    own = f"<script>{page_script()['page_script']}</script>"  # the tables' script, the only one the CSP allows
    for page in site["out"].glob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert html.count(own) == 1, page.name
        assert "<script" not in html.replace(own, "").lower(), page.name
        assert "<b>feature" not in html and "<b>suite" not in html, page.name
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in read(site, "regressions.html")
    history = read(site, history_page_name("flash_prefill", NVIDIA.key))
    assert re.search(r"<title>[^<]*&lt;script&gt;alert\(1\)&lt;/script&gt;", history)  # SVG hover text


def test_index_shows_each_chip_latest_commit_and_status(site):
    html = read(site, "index.html")
    for chip in (APPLE.key, NVIDIA.key, site["cpu_chip"]):
        assert f'href="{chip_page_name(chip)}"' in html
    assert sha_of(N_COMMITS - 1)[:12] in html
    assert 'href="variants.html"' in html and 'href="regressions.html"' in html
    assert f'href="{history_page_name("flash_prefill", NVIDIA.key)}"' in html
    row = re.search(rf'<a href="{chip_page_name(APPLE.key)}">.*?</tr>', html, re.S).group(0)
    assert "fail 1" in row and "pass 6" in row  # the hostile check fails on the M4 Pro at the latest commit
    assert len(html.encode()) < 200_000


def test_chip_page_has_identity_peaks_correctness_matrix_and_benchmarks(site):
    html = read(site, chip_page_name(NVIDIA.key))
    assert "NVIDIA H200" in html and "700 TFLOP/s" in html and "4 TB/s" in html
    assert 'id="correctness"' in html and 'class="cmatrix"' in html and 'id="variants"' in html
    assert 'title="passed · max error 0.0001 · tolerance 0.002"' in html  # max error on hover
    assert 'id="benchmarks"' in html and "% <span" in html
    # the noise meter of each series of the latest run: between trials, between runs (its history), detectable
    benchmarks = html[html.index('id="benchmarks"'):]
    benchmarks = benchmarks[:benchmarks.index("</table>")]
    assert "Between trials" in benchmarks and "Between runs" in benchmarks and "Detects" in benchmarks
    assert "in 3 trials" in benchmarks and re.search(r'class="num noise">\d+\.\d%</td>', benchmarks)
    assert re.search(r'class="num noise">\d+\.\d% <span class="muted">\(\d+ runs\)</span>', benchmarks)
    assert 'id="cell-legend"' in html and "max |error|" in html  # the number in a cell is named
    checks = html[html.index('<dl id="checks">'):html.index("</dl>")]
    assert "<dt>reference</dt>" in checks and "float64 reference" in checks  # each check explained in one line
    apple = read(site, chip_page_name(APPLE.key))
    assert 'class="cell failed"' in apple and "&lt;script&gt;" in apple
    # the variant that wins outright (trial-level verdict of the matrix) is starred, each variant's verdict shown
    variants = apple[apple.index('id="variants"'):]
    variants = variants[:variants.index("</table>")]
    assert 'winner">★ flash_bq8_bk16' in variants and '<span class="badge win">win</span>' in variants
    assert '<span class="badge lose">lose</span>' in read(site, chip_page_name(NVIDIA.key))


def test_variant_matrix_lists_the_divergent_variant_first(site):
    html = read(site, "variants.html")
    assert html.index('id="divergent-list"') < html.index('id="matrix"')
    divergent = html[html.index('id="divergent-list"'):html.index('id="matrix"')]
    assert "flash_bq8_bk16" in divergent and APPLE.key in divergent and NVIDIA.key in divergent
    assert "win" in divergent and "lose" in divergent
    ratios = sorted(float(r) for r in re.findall(r"×([0-9.]+) \[", divergent))
    assert ratios[0] == pytest.approx(0.7, rel=0.02) and ratios[-1] == pytest.approx(1.4, rel=0.02), ratios
    matrix = html[html.index('id="matrix"'):]
    for chip in (APPLE.key, NVIDIA.key):
        assert f">{chip}</a></th>" in matrix
    assert "★" in matrix and "p(FDR)" in matrix


def test_regression_list_has_correctness_first_and_the_planted_regression(site):
    html = read(site, "regressions.html")
    assert html.index('id="correctness"') < html.index('id="performance"')
    perf = html[html.index('id="performance"'):]
    perf = perf[:perf.index("</table>")]  # the page's inline script (its comments) follows
    planted = [r for r in site["regressions"] if r.kind == "performance"]
    assert [(r.chip, r.variant, r.head_sha) for r in planted] == [(NVIDIA.key, "flash_bq16_bk32",
                                                                   sha_of(REGRESSION_AT))]
    assert sha_of(REGRESSION_AT)[:12] in perf and sha_of(REGRESSION_AT - 1)[:12] in perf
    # Judged at trial level: three job processes of 12 samples a side, their spread (or the history's) the noise
    (found,) = planted
    assert found.trials_base == found.trials_head == 3 and found.basis in ("trials", "history")
    assert found.n_base == found.n_head == 36 and found.ci_low > 1.02 and found.p_adjusted < 0.05
    assert found.ratio == pytest.approx(1.3, rel=0.03) and 0 < found.noise < 0.02
    (ratio,) = re.findall(r"×([0-9.]+) \[", perf)
    assert float(ratio) == pytest.approx(found.ratio, abs=5e-4) and "3 / 3" in perf  # trials, not samples
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html[:html.index('id="performance"')]


def test_history_page_marks_change_point_and_regression(site):
    html = read(site, history_page_name("flash_prefill", NVIDIA.key))
    # one plot per shape overlaying the 3 variants, with a layer for a linear and one for a log time axis
    assert html.count('<svg class="plot"') == 2 and html.count('<polyline class="line"') == 2 * 3 * 2
    assert len(re.findall(r"median time per call \(\w+, log scale\)", html)) == 2
    assert html.count('<polyline class="line"') == 2 * 2 * 3
    assert 'class="band"' in html and 'class="line"' in html
    assert 'class="marker regression"' in html and 'class="marker step"' in html
    anchor = commit_anchor(sha_of(REGRESSION_AT))
    assert f'<tr id="{anchor}" class="flagged">' in html  # the commit's row, which the markers link to
    assert f'href="#{anchor}"' in html
    assert "confirmed regression of flash_bq16_bk32 at " + sha_of(REGRESSION_AT)[:10] in html


def test_db_url_is_masked(site, tmp_path):
    store = open_store(site["url"])
    try:
        masked = Store(store.engine, "postgresql+psycopg://ci:hunter2@db.example/results")
        index = build_report(masked, tmp_path / "masked", ReportOptions(change_points=False))
    finally:
        store.close()
    html = index.read_text()
    assert "hunter2" not in html and "ci:***@db.example" in html


def test_last_n_commits_limits_histories_and_says_so(site, tmp_path):
    store = open_store(site["url"])
    try:
        index = build_report(store, tmp_path / "last", ReportOptions(last=4))
    finally:
        store.close()
    history = (tmp_path / "last" / history_page_name("flash_prefill", NVIDIA.key)).read_text()
    assert history.count('<tr id="c-') == 4 and "last 4 at most" in history
    rows = re.findall(r'<tr id="(c-[0-9a-z]+)"', history)
    assert rows == [commit_anchor(sha_of(i)) for i in range(N_COMMITS - 4, N_COMMITS)]
    assert "last 4 commits" in index.read_text()


# --- in a browser ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        _unavailable(f"playwright is not installed: {exc}")
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} not found (apt-get install chromium)")
    with sync_playwright() as p:
        try:
            instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # noqa: BLE001 - any launch failure means no browser here
            _unavailable(f"cannot launch {CHROMIUM}: {exc}")
        yield instance
        instance.close()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser check required in CI: {reason}")
    pytest.skip(reason)


class Watched:
    """A page whose dialogs, requests, console errors, uncaught exceptions and CSP violations are recorded, with
    window.alert replaced by a tripwire."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.add_init_script("window.alert = () => { window.alertCalled = true; };"
                                     "window.cspViolations = [];"
                                     "document.addEventListener('securitypolicyviolation', e => "
                                     "window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));")
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: Path):
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")
        return self.page

    def assert_clean(self):
        assert self.dialogs == []
        assert self.errors == [], self.errors  # a blocked script or style is reported here too
        assert self.page.evaluate("window.cspViolations") == []
        assert self.page.evaluate("typeof window.alertCalled") == "undefined"
        # the one script every page carries: the tables' script, exactly as rendered (the CSP allows its hash only)
        assert self.page.evaluate("Array.from(document.scripts, s => s.textContent)") == [str(SCRIPT)]
        assert self.requests and all(url.startswith("file:") for url in self.requests), self.requests


def _target(base: Path, href: str) -> tuple[Path, str]:
    parsed = urlparse(href)
    assert parsed.scheme in ("file", ""), href
    return Path(unquote(parsed.path)) if parsed.scheme else base.parent / unquote(parsed.path), parsed.fragment


def test_in_chromium_links_resolve_and_nothing_executes_or_leaves_file(site, browser):
    out: Path = site["out"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    w = Watched(browser)
    try:
        index = w.open(out / "index.html")
        hrefs = index.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        assert len(hrefs) >= 3 + 3 + 2
        index.screenshot(path=str(ARTIFACTS / "index.png"), full_page=True)
        w.assert_clean()
        visited = set()
        for href in hrefs:  # every link of the index opens an existing page (and its anchor, if any)
            path, fragment = _target(out / "index.html", href)
            assert path.is_file(), href
            page = w.open(path)
            visited.add(path)
            assert page.title()
            if fragment:
                assert page.locator(f"[id='{fragment}']").count() == 1, href
            w.assert_clean()
        # One level further: every link of those pages (plots, tables, badges) reaches an existing page and anchor.
        assert {p.name for p in visited} >= {"variants.html", "regressions.html", chip_page_name(APPLE.key),
                                              history_page_name("flash_prefill", NVIDIA.key)}
        for path in sorted(visited):
            page = w.open(path)
            for href in set(page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")):
                target, fragment = _target(path, href) if not href.startswith("#") else (path, href[1:])
                assert target.is_file(), (path.name, href)
                if fragment:
                    assert f'id="{fragment}"' in target.read_text(encoding="utf-8"), (path.name, href)
            w.assert_clean()

        variants = w.open(out / "variants.html")
        assert variants.locator("#matrix tr").count() >= 1 + len(SHAPES)
        divergent = variants.locator("#divergent-list tr.divergent")
        assert divergent.count() >= 1 and "flash_bq8_bk16" in divergent.first.inner_text()
        variants.screenshot(path=str(ARTIFACTS / "variants.png"), full_page=True)

        history = w.open(out / history_page_name("flash_prefill", NVIDIA.key))
        plots = history.locator("svg.plot")  # their log-axis layers are hidden until asked for
        assert plots.count() == 2 and history.locator("svg.plot g.log").first.is_hidden()
        assert history.locator("svg.plot .lin polyline.line").count() == 6
        assert history.locator("svg.plot .lin polygon.band").count() == 6
        assert history.locator("svg.plot .marker.regression").count() == 1
        titles = history.eval_on_selector_all("svg.plot title", "els => els.map(e => e.textContent)")
        assert any(t.startswith(sha_of(REGRESSION_AT)[:10]) for t in titles)
        assert any(EVIL in t for t in titles)  # the hostile commit message, as text
        box = plots.first.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 100
        history.locator("svg.plot .marker.regression").first.click()
        assert history.url.endswith("regressions.html#r-" + str(_index_of_planted(site)))
        w.assert_clean()
        page = w.open(out / history_page_name("flash_prefill", NVIDIA.key))
        page.screenshot(path=str(ARTIFACTS / "history.png"), full_page=True)
        page.locator("figure.plotfig:has(.marker.regression)").screenshot(path=str(ARTIFACTS / "history-plot.png"))

        hostile = w.open(out / history_page_name(EVIL, APPLE.key))
        assert EVIL in hostile.locator("h1").inner_text()
        w.assert_clean()
        regressions = w.open(out / "regressions.html")
        assert EVIL in regressions.locator(".correctness-list").inner_text()
        regressions.screenshot(path=str(ARTIFACTS / "regressions.png"), full_page=True)
        chip = w.open(out / chip_page_name(APPLE.key))
        assert chip.locator("table.cmatrix td.cell.failed").count() == 1
        assert "max error 0.5" in chip.locator("table.cmatrix td.cell.failed").get_attribute("title")
        chip.screenshot(path=str(ARTIFACTS / "chip.png"), full_page=True)
        w.assert_clean()
    finally:
        w.context.close()


def _index_of_planted(site: dict) -> int:
    return next(i for i, r in enumerate(site["regressions"]) if r.kind == "performance")


def _seconds(text: str) -> float:
    """A time cell ("512 µs", "1.2 ms") in seconds; inf for an empty one."""
    match = re.match(r"([\d.]+) (s|ms|µs|ns)", text.strip())
    return float(match.group(1)) * {"s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[match.group(2)] if match else math.inf


def test_in_chromium_history_selector_log_axis_and_sortable_tables(site, browser, tmp_path):
    """The every-chip history page's chip selector and the log toggle change what is shown (CSS only), a point's
    hover text names its commit, median and interval, a header click sorts a table (numbers as numbers), the filter
    box hides rows; no console error and no CSP violation on the way."""
    out: Path = site["out"]
    shots = {name: tmp_path / f"{name}.png" for name in ("every-chip", "h200-vs-m4", "log", "commits", "chip")}
    w = Watched(browser)

    def shown(page, selector: str) -> int:
        return page.eval_on_selector_all(selector, "els => els.filter(e => e.getClientRects().length > 0).length")

    try:
        page = w.open(out / kernel_history_page_name("flash_prefill"))
        chips = page.eval_on_selector_all("#chip-selector input", "els => els.map(e => e.value)")
        assert len(chips) == 3 and {APPLE.key, NVIDIA.key} <= set(chips)
        total = page.locator("figure.plotfig").count()
        assert total == shown(page, "svg.plot > g.lin") == 2 + 2 + 1  # M4 Pro, H200: 2 shapes; this machine: 1
        assert shown(page, "svg.plot > g.log") == 0
        page.screenshot(path=str(shots["every-chip"]), full_page=True)
        for i, chip in enumerate(chips):  # the H200 alone
            if chip != NVIDIA.key:
                page.uncheck(f"#show-chip-{i}")
        assert shown(page, "figure.plotfig") == shown(page, f"figure.plotfig[data-chip='{NVIDIA.key}']") == 2
        page.check(f"#show-chip-{chips.index(APPLE.key)}")  # the H200 against the M4 Pro
        assert shown(page, "figure.plotfig") == 4, shots["h200-vs-m4"]
        page.screenshot(path=str(shots["h200-vs-m4"]), full_page=True)
        page.check("#log-scale")
        assert shown(page, "svg.plot > g.log") == 4 and shown(page, "svg.plot > g.lin") == 0, shots["log"]
        assert shown(page, "svg.plot a > circle") == shown(page, "svg.plot a > circle + circle") > 0  # log dots only
        assert "log scale" in page.locator("svg.plot > g.log .axis-title").first.text_content()
        page.screenshot(path=str(shots["log"]), full_page=True)
        w.assert_clean()

        history = w.open(out / history_page_name("flash_prefill", NVIDIA.key))
        title = history.locator("svg.plot .pts a title").first.text_content()
        # the variant and its chip: a plot is the same SVG on the chip's page and on the page of every chip
        assert re.match(rf"{sha_of(0)[:10]} commit 0: tune the flash tiles\n\S+ on {NVIDIA.key}: median [\d.]+ µs, "
                        r"95% interval \[[\d.]+ µs, [\d.]+ µs\], \d+ samples$", title), title

        def commit_rows() -> list[str]:
            return history.eval_on_selector_all("#commits tr[id]", "els => els.filter(e => !e.hidden).map(e => e.id)")

        in_order = [commit_anchor(sha_of(i)) for i in range(N_COMMITS)]
        assert commit_rows() == in_order
        number = history.locator("#commits th").first
        number.click()
        assert commit_rows() == in_order and number.get_attribute("aria-sort") == "ascending"
        number.click()
        assert commit_rows() == in_order[::-1] and number.get_attribute("aria-sort") == "descending"
        history.fill("#filter-commits", "alert(1)")  # the hostile commit message, as text
        assert commit_rows() == [commit_anchor(sha_of(4))], shots["commits"]
        assert "1 of 10 rows" in history.locator("#filter-commits + .table-count").text_content()
        history.screenshot(path=str(shots["commits"]), full_page=True)
        w.assert_clean()

        chip = w.open(out / chip_page_name(NVIDIA.key))
        column = chip.eval_on_selector_all("#benchmarks th",
                                           "els => els.findIndex(e => e.textContent.trim() === 'Median')")
        assert column >= 0

        def cells(index: int) -> list[str]:  # the shown rows' cells of a column ('' for a row spanning columns)
            return chip.eval_on_selector_all("#benchmarks tr:not([hidden])", f"rows => rows.slice(1).map(r => "
                                             f"r.cells.length > {index} ? r.cells[{index}].textContent : '')")

        unsorted = [_seconds(t) for t in cells(column)]
        chip.locator("#benchmarks th").nth(column).click()  # "512 µs" < "1.2 ms": by value, not by text
        ascending = [_seconds(t) for t in cells(column)]
        assert ascending == sorted(unsorted) and ascending != unsorted, shots["chip"]
        chip.locator("#benchmarks th").nth(column).click()
        descending = [t for t in map(_seconds, cells(column)) if t != math.inf]  # the empty stay last
        assert descending == sorted(descending, reverse=True) and len(descending) > 3
        chip.fill("#filter-benchmarks", "flash_bq8")
        variants = cells(1)
        assert variants and len(variants) < len(unsorted) and all("flash_bq8" in v for v in variants), variants
        chip.screenshot(path=str(shots["chip"]), full_page=True)
        w.assert_clean()
    finally:
        w.context.close()
    print("screenshots:", *shots.values())


def test_in_chromium_a_regression_leads_to_its_compare_row_and_its_samples_by_trial(site, browser):
    """The evidence path as a user clicks it: the confirmed slowdown's ratio opens its row on the compare page (the
    same verdict), its samples link opens the strip plot, one dot per stored sample in a column per trial, and that
    page links back to the compare row; no console error, CSP violation or request beyond file:// on the way."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    w = Watched(browser)
    try:
        regressions = w.open(site["out"] / "regressions.html")
        row = regressions.locator(f".performance-list tr#r-{_index_of_planted(site)}")
        ratio = row.locator("td.lose a").inner_text()
        row.locator("td.lose a").click()
        regressions.wait_for_load_state("load")
        compare_page = regressions  # the one page of the context, now on the compare page
        compare_url = compare_page.url
        assert compare_url.split("#")[0].split("/")[-1].startswith("compare-nvidia-h200-sm90--")
        anchor = compare_url.split("#")[1]
        compared = compare_page.locator(f"tr[id='{anchor}']")
        assert "regressed" in compared.inner_text() and "flash_bq16_bk32" in compared.inner_text()
        assert ratio.split(" ")[0] in compared.inner_text()  # x1.308: the same comparison
        compare_page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
        w.assert_clean()

        samples_page = w.open(site["out"] / "regressions.html")
        samples_page.locator(f".performance-list tr#r-{_index_of_planted(site)} a:text('samples')").click()
        samples_page.wait_for_load_state("load")
        strip = samples_page.locator("svg.plot.strip")
        assert strip.count() == 1 and strip.is_visible()
        trials_table = samples_page.locator("#trials tbody tr")
        stored = [int(trials_table.nth(i).locator("td").nth(5).inner_text().split()[0])
                  for i in range(trials_table.count())]
        assert {c.split()[0] for c in samples_page.locator("#trials tr td:first-child").all_inner_texts()} == {
            "base", "head"}
        assert strip.locator("g.samples").count() == len(stored) >= 6  # one column per trial, 3 a side at least
        assert strip.locator("g.samples circle").count() == sum(stored) == 72  # the list's 36 / 36
        first_dot = strip.locator("g.samples circle title").first.text_content()
        assert re.match(r"trial \d+, sample 1: [\d.]+ µs$", first_dot), first_dot
        samples_page.screenshot(path=str(ARTIFACTS / "samples.png"), full_page=True)
        w.assert_clean()
        samples_page.locator("#verdict a:text('its row on the compare page')").click()
        samples_page.wait_for_load_state("load")
        assert samples_page.url == compare_url  # back on the same row of the same compare page
        assert "regressed" in samples_page.locator(f"tr[id='{anchor}']").inner_text()
        w.assert_clean()
    finally:
        w.context.close()
