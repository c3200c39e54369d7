"""The evidence path of the report site: compare pages, samples pages and the links between them.

A small store (two chips, two commits, one run each, three trials of eight samples per benchmark) with a planted
30 % slowdown of one series on one chip, the base run of the other chip measured five hours before its head; the
site is built once with ``build_report`` and read as text: the compare page's rows are ``analysis.compare``'s, the
samples page has one point per stored sample grouped by trial, every link resolves to a file and an anchor.
"""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
from sqlalchemy import func, select, update

from harness.analysis.compare import compare
from harness.analysis.site_evidence import MAX_REGRESSION_COMPARES
from harness.core.chip import ChipIdentity
from harness.core.job import JobResult, KernelJob, shape_label
from harness.pipeline.report import ReportOptions, build_report
from harness.record import query
from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.outbox import open_store
from harness.record.store import Store, create_run, finish_run, record_result
from reports.evidence import compare_page_name, samples_page_name, series_anchor
from reports.render import chip_page_name

APPLE = ChipIdentity("apple-m4-pro-20c", "metal", "Apple M4 Pro", "applegpu_g16s", 48 * 2**30, 20, "macOS 15.3",
                     "0.32.4")
NVIDIA = ChipIdentity("nvidia-h200-sm90", "cuda", "NVIDIA H200", "sm_90", 141 * 2**30, None, "Linux", "0.32.4")
REMOTE = "git@github.com:octo/kernels.git"
SHAS = ["a" * 40, "b" * 40]
SHAPES = [{"B": 1, "H": 8, "S_q": 128, "S_kv": 128, "D": 64}, {"B": 1, "H": 8, "S_q": 256, "S_kv": 256, "D": 64}]
VARIANTS = ("sdpa", "flash_bq16_bk32")
TRIALS, SAMPLES = 3, 8
SLOWER = (NVIDIA.key, "flash_bq16_bk32", 1)  # chip, variant, shape index: 30 % slower at the head commit
APART_H = 5  # the Apple chip's base run started this many hours before its head run


def add_run(store: Store, ident: ChipIdentity, index: int, sha: str, parent: str | None, rng: np.random.Generator,
            remote: str = REMOTE) -> str:
    """One run of commit ``sha`` (its ``index``: the slowdown is planted at 1 and stays) on chip ``ident``."""
    commit = {"sha": sha, "repo": remote, "message": f"commit {index}", "branch": "main",
              "parents": [parent] if parent else []}
    run_id = create_run(store, ident=ident, facts={"hostname": "host"}, commit=commit, suite="small", dirty=False,
                        executor="local", planned_jobs=0)
    for variant in VARIANTS:
        for s, shape in enumerate(SHAPES):
            job = KernelJob.of("benchmark", "flash_prefill", variant, shape, "float16", name="bench")
            level = 1e-4 * (s + 1) * (1.3 if index >= 1 and (ident.key, variant, s) == SLOWER else 1.0)
            for trial in range(TRIALS):
                trial_level = level * np.exp(rng.normal(0.0, 0.003))
                samples = (trial_level * np.exp(rng.normal(0.0, 0.01, SAMPLES))).tolist()
                record_result(store, run_id, job, JobResult(job.key, "passed", samples=samples, inner=4,
                                                            trial=trial))
    finish_run(store, run_id, "complete")
    return run_id


def build_store(url: str, remote: str = REMOTE) -> Store:
    """Two commits (the second a child of the first, of repository ``remote``) run once on each chip."""
    store = open_store(url)
    rng = np.random.default_rng(3)
    for i, sha in enumerate(SHAS):
        for ident in (APPLE, NVIDIA):
            add_run(store, ident, i, sha, SHAS[i - 1] if i else None, rng, remote)
    with store.session() as session:  # the Apple base run: measured hours before its head run
        apple_base = session.scalars(select(Run.id).join(Chip, Run.chip_id == Chip.id)
                                     .join(Commit, Run.commit_id == Commit.id)
                                     .where(Chip.key == APPLE.key, Commit.sha == SHAS[0])).one()
        started = session.get(Run, apple_base).started_at
        session.execute(update(Run).where(Run.id == apple_base).values(started_at=started - timedelta(hours=APART_H)))
    return store


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("evidence")
    url = f"sqlite:///{folder / 'results.db'}"
    store = build_store(url)
    try:
        out = folder / "site"
        build_report(store, out, ReportOptions(change_points=False, commit_url="https://git.example.com/kernels/commit/{sha}"))
        heads = {chip: query.latest_run(store, chip) for chip in (APPLE.key, NVIDIA.key)}
        bases = {chip: query.previous_run_id(store, run.id) for chip, run in heads.items()}
        reports = {chip: compare(store, bases[chip], heads[chip].id) for chip in heads}
        with store.session() as session:
            stored = {(run_id, kernel, variant, dtype, shape_key, trial): n for run_id, kernel, variant, dtype,
                      shape_key, trial, n in session.execute(
                          select(JobRecord.run_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                                 JobRecord.shape_key, Sample.trial, func.count(Sample.id))
                          .join(Sample, Sample.job_id == JobRecord.id)
                          .group_by(JobRecord.run_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                                    JobRecord.shape_key, Sample.trial))}
    finally:
        store.close()
    return {"out": out, "heads": heads, "bases": bases, "reports": reports, "stored": stored}


def read(site: dict, name: str) -> str:
    return (site["out"] / name).read_text(encoding="utf-8")


def compare_name(site: dict, chip: str) -> str:
    return compare_page_name(chip, [site["bases"][chip]], [site["heads"][chip].id])


def _cells(row_html: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row_html, re.S)]


def test_each_chip_has_a_compare_page_of_its_run_against_the_previous_run(site):
    names = {p.name for p in site["out"].glob("compare-*.html")}
    assert names == {compare_name(site, chip) for chip in (APPLE.key, NVIDIA.key)}
    for chip in (APPLE.key, NVIDIA.key):
        chip_html = read(site, chip_page_name(chip))
        assert f'href="{compare_name(site, chip)}"' in chip_html
        assert site["heads"][chip].id in chip_html and site["bases"][chip][:12] in chip_html  # run ids shown
        assert f'href="{compare_name(site, chip)}"' in read(site, "index.html")


def test_compare_rows_are_harness_compares_rows_in_its_order(site):
    for chip, report in site["reports"].items():
        html = read(site, compare_name(site, chip))
        rows = re.findall(r'<tr id="(s-[0-9a-f]+)" class="(\w+)">(.*?)</tr>', html, re.S)
        assert [anchor for anchor, _, _ in rows] == [series_anchor(row.key) for row in report.changed] + [
            series_anchor(row.key) for row in report.rows if row.verdict == "unchanged"]
        by_anchor = {anchor: _cells(body) for anchor, _, body in rows}
        for row in report.rows:
            cells = by_anchor[series_anchor(row.key)]
            assert cells[0].startswith(row.verdict)
            assert cells[1:5] == [row.key.kernel, row.key.variant, row.key.dtype, row.key.shape_key]
            assert cells[6] == f"×{row.ratio:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
            assert cells[8] == f"{row.trials_base} / {row.trials_head} (1 / 1)" == f"{TRIALS} / {TRIALS} (1 / 1)"
        counts = {v: n for v, n in report.counts.items() if n}
        for verdict, n in counts.items():
            assert f"{n} {verdict}</span>" in html
    nvidia = site["reports"][NVIDIA.key]
    (regressed,) = [row for row in nvidia.rows if row.verdict == "regressed"]
    assert (regressed.key.variant, regressed.key.shape_key) == (SLOWER[1], shape_label(SHAPES[SLOWER[2]]))
    html = read(site, compare_name(site, NVIDIA.key))
    assert html.index(series_anchor(regressed.key)) < html.index('id="unchanged"')  # regressed first


def test_a_single_run_measured_hours_apart_is_marked(site):
    apple = read(site, compare_name(site, APPLE.key))
    assert 'id="apart"' in apple and "one run against one run, measured 5.0 h apart" in apple
    marked = re.findall(r'<tr id="s-[0-9a-f]+" class="\w+"><td[^>]*>.*?1 run vs 1 run, 5.0 h apart', apple)
    trial_based = [row for row in site["reports"][APPLE.key].rows if row.basis == "trials"]
    assert trial_based and len(marked) == len(trial_based)
    assert "5.0 h apart" in read(site, chip_page_name(APPLE.key))
    nvidia = read(site, compare_name(site, NVIDIA.key))  # measured minutes apart: no marker
    assert 'id="apart"' not in nvidia and "1 run vs 1 run" not in nvidia


def test_samples_page_has_one_point_per_stored_sample_grouped_by_trial(site):
    chip, variant, shape_index = SLOWER
    base, head = site["bases"][chip], site["heads"][chip].id
    key = query.SeriesKey("flash_prefill", variant, "float16", shape_label(SHAPES[shape_index]), chip)
    name = samples_page_name(key, [base], [head])
    compare_html = read(site, compare_name(site, chip))
    row = re.search(rf'<tr id="{series_anchor(key)}".*?</tr>', compare_html, re.S).group(0)
    assert f'href="{name}"' in row  # the compare row links to its samples
    html = read(site, name)
    groups = re.findall(r'<g class="samples"[^>]*data-trial="(\d+)">(.*?)</g>', html, re.S)
    expected = [site["stored"][(run_id, *key[:4], trial)] for run_id in (base, head) for trial in range(TRIALS)]
    assert [int(trial) for trial, _ in groups] == [t for _ in (base, head) for t in range(TRIALS)]
    assert [body.count("<circle") for _, body in groups] == expected == [SAMPLES] * (2 * TRIALS)
    assert html.count('<line class="median"') == 2 * TRIALS
    assert "time per call (µs)" in html and "trial (one job process each)" in html
    assert f'href="{compare_name(site, chip)}#{series_anchor(key)}"' in html
    chip_html = read(site, chip_page_name(chip))  # the chip page's benchmark row links to it too
    assert f'href="{name}"' in chip_html[chip_html.index('id="benchmarks"'):]


def test_pages_are_bounded_by_the_series_of_the_shown_runs(site):
    series = len(VARIANTS) * len(SHAPES)
    assert len(list(site["out"].glob("samples-*.html"))) == 2 * series  # two chips, one compare each
    assert MAX_REGRESSION_COMPARES >= 1


def test_regression_row_links_its_compare_row_and_samples(site):
    html = read(site, "regressions.html")
    perf = html[html.index('id="performance"'):]
    chip = NVIDIA.key
    regressed = next(row for row in site["reports"][chip].rows if row.verdict == "regressed")
    assert f'href="{compare_name(site, chip)}#{series_anchor(regressed.key)}"' in perf
    assert f'href="{samples_page_name(regressed.key, [site["bases"][chip]], [site["heads"][chip].id])}"' in perf
    assert site["heads"][chip].id[:8] in perf and site["bases"][chip][:8] in perf  # run ids


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("href") is not None:
            self.hrefs.append(values["href"])


def check_links(out: Path, external: str | tuple[str, ...] = "") -> int:
    """Every href of every page points to an existing page (or the site's feed) and, with a fragment, to an element
    with that id; external links must start with ``external`` (one of them). The number of links checked."""
    pages = {}
    for path in out.glob("*.html"):
        parser = _Page()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path.name] = parser
    checked = 0
    for name, page in pages.items():
        for href in page.hrefs:
            parts = urlsplit(href)
            if parts.scheme:
                assert external and href.startswith(external), (name, href)  # str.startswith takes a tuple
                continue
            target = unquote(parts.path) or name
            if target == "regressions.atom" and (out / target).is_file():  # the feed: not a page
                continue
            assert target in pages, (name, href)
            if parts.fragment:
                assert unquote(parts.fragment) in pages[target].ids, (name, href)
            checked += 1
    return checked


def test_every_link_of_the_site_resolves(site):
    assert check_links(site["out"], external="https://git.example.com/kernels/commit/") > 100


def test_a_regression_before_the_shown_run_gets_its_own_compare_page(tmp_path, monkeypatch):
    """A third commit on the H200 (nothing changed): the chip page compares it with the second, the regression (first
    -> second commit) gets a compare page of its own, with samples for its changed series only."""
    store = build_store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        third = add_run(store, NVIDIA, 2, "c" * 40, SHAS[1], np.random.default_rng(5))
        runs = {sha: query.resolve_ref(store, sha, NVIDIA.key).runs[NVIDIA.key] for sha in SHAS}
        report = compare(store, SHAS[0], SHAS[1], chip=NVIDIA.key)
        out = tmp_path / "site"
        build_report(store, out, ReportOptions(change_points=False))
        monkeypatch.setattr("harness.analysis.site_evidence.MAX_REGRESSION_COMPARES", 0)  # the cap: no page, said
        capped = tmp_path / "capped"
        build_report(store, capped, ReportOptions(change_points=False))
    finally:
        store.close()
    own = compare_page_name(NVIDIA.key, runs[SHAS[0]], runs[SHAS[1]])
    assert not (capped / own).exists() and (capped / compare_page_name(NVIDIA.key, runs[SHAS[1]], [third])).is_file()
    assert "1 older pair link to their history only" in (capped / "regressions.html").read_text(encoding="utf-8")
    shown = compare_page_name(NVIDIA.key, runs[SHAS[1]], [third])
    assert {p.name for p in out.glob("compare-*.html")} >= {own, shown}
    (regressed,) = [row for row in report.rows if row.verdict == "regressed"]
    perf = (out / "regressions.html").read_text(encoding="utf-8")
    perf = perf[perf.index('id="performance"'):]
    assert f'href="{own}#{series_anchor(regressed.key)}"' in perf
    html = (out / own).read_text(encoding="utf-8")
    rows = re.findall(r'<tr id="(s-[0-9a-f]+)" class="(\w+)">(.*?)</tr>', html, re.S)
    assert [(a, v) for a, v, _ in rows] == [(series_anchor(r.key), r.verdict) for r in report.changed] + [
        (series_anchor(r.key), r.verdict) for r in report.rows if r.verdict == "unchanged"]
    assert all(_cells(body)[8].endswith("(1 / 1)") for _, _, body in rows)  # runs per side
    changed = {samples_page_name(r.key, runs[SHAS[0]], runs[SHAS[1]]) for r in report.changed}
    assert changed and all(f'href="{name}"' in html and (out / name).is_file() for name in changed)
    series = len(VARIANTS) * len(SHAPES)
    assert len(list(out.glob("samples-*.html"))) == 2 * series + len(changed)  # shown runs, then changed rows only
    assert check_links(out, external=("https://github.com/octo/kernels/commit/",
                                      "https://github.com/octo/kernels/compare/")) > 100


def test_changes_held_against_a_shifted_run_are_marked_held(db, tmp_path):
    """One run a side, no history, the head run's every series x1.19 (a load that lasted the run): the compare
    page says the changes are held and what settles them, as `harness compare` does."""
    from testkit.analysis import add_run, grid_results, sha_of

    rng = np.random.default_rng(4)
    add_run(db, "chip-a", 1, grid_results(rng, trials=4), minutes=0)
    shifted = grid_results(rng, trials=4)
    for _, result in shifted:
        result.samples = [seconds * 1.19 for seconds in result.samples]
    head = add_run(db, "chip-a", 2, shifted, minutes=10)
    base = query.previous_run_id(db, head)
    report = compare(db, base, head)
    held = [row for row in report.rows if row.more_runs_needed]
    assert held and all(row.verdict == "inconclusive" for row in held)
    assert report.counts["regressed"] == report.counts["improved"] == 0
    build_report(db, tmp_path / "site", ReportOptions(change_points=False))
    html = (tmp_path / "site" / compare_page_name("chip-a", [base], [head])).read_text()
    assert f'{len(held)} change{"s" if len(held) != 1 else ""} held</span>' in html
    assert html.count(">held</span> 2 more base runs") == len(held)
    assert sha_of(2)[:7] in html
