"""The incremental site (``harness.render.pages``): a build into a folder renders only the pages whose inputs
changed since the last build there, and the folder then equals a full build of the same database byte for byte.

A small store (two chips, two commits with a planted slowdown on one chip, ``test_compare_page``'s) is built, a
third commit is run on one chip, and the site is built again into the same folder and, fresh, into another: every
file must be equal, the other chip's history, compare and samples pages must not have been written again, the
changed ones must have been, and the pages of the chip's older shown run must be gone. The generated-at stamp is
held still (a page kept from an earlier build keeps its own stamp, see the module's docstring).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from harness.analysis import site_evidence, site_inputs
from harness.analysis.records import CompareRow, HistoryPoints
from harness.analysis.site_manifests import Manifest, SiteManifests
from harness.core import fork
from harness.pipeline import report
from harness.pipeline.report import ReportOptions, build_report
from harness.record import analysis_cache, query
from harness.record.outbox import open_store
from harness.render import evidence as render_evidence
from harness.render import fingerprint, pageset
from harness.render import history as render_history
from reports.evidence import compare_page_name
from reports.history import kernel_history_page_name
from reports.render import chip_page_name, history_page_name
from tests.render.test_compare_page import APPLE, NVIDIA, SHAS, add_run, build_store


def _forks(monkeypatch: pytest.MonkeyPatch, can_fork: object) -> None:
    """Whether the report may fork: the analysis' process (``harness.pipeline.report``), the history pages', the
    evidence pages' and the chip pages'."""
    monkeypatch.setattr(report, "can_fork", can_fork)
    monkeypatch.setattr(render_history, "can_fork", can_fork)
    monkeypatch.setattr(pageset, "can_fork", can_fork)


URL_TEMPLATE = "https://git.example.com/kernels/commit/{sha}"
NEW_SHA = "c" * 40


class _Frozen(datetime):
    @classmethod
    def now(cls, tz=None):  # noqa: ANN001, ANN206 - datetime.now's signature
        return datetime(2026, 1, 2, 3, 4, tzinfo=tz or UTC)


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """Every build stamps the same time, so that builds at different minutes are comparable byte for byte."""
    monkeypatch.setattr(report, "datetime", _Frozen)


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def build(store, out: Path, **kwargs) -> None:
    build_report(store, out, ReportOptions(change_points=False, commit_url=URL_TEMPLATE, **kwargs))


@pytest.fixture
def store(tmp_path):
    handle = build_store(f"sqlite:///{tmp_path / 'results.db'}")
    yield handle
    handle.close()


def test_one_new_run_renders_only_what_changed_and_equals_a_full_build(store, tmp_path):
    out = tmp_path / "site"
    build(store, out)
    before, written = files(out), mtimes(out)
    old_shown = {chip: query.latest_run(store, chip).id for chip in (APPLE.key, NVIDIA.key)}
    old_base = query.previous_run_id(store, old_shown[NVIDIA.key])
    new_run = add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))

    build(store, out)
    after = files(out)
    build(store, tmp_path / "fresh")  # a folder never built into: every page rendered
    assert after == files(tmp_path / "fresh")

    rewritten = {name for name, ns in mtimes(out).items() if written.get(name) != ns}
    apple_pages = {history_page_name("flash_prefill", APPLE.key), chip_page_name(APPLE.key),
                   compare_page_name(APPLE.key, [query.previous_run_id(store, old_shown[APPLE.key])],
                                     [old_shown[APPLE.key]])}
    assert apple_pages <= set(after) and not apple_pages & rewritten  # the other chip's pages: kept
    assert chip_page_name(NVIDIA.key) in rewritten
    kept_samples = {name for name in after if name.startswith("samples-") and name not in rewritten}
    assert len(kept_samples) >= 4  # the other chip's shown run: 2 variants x 2 shapes
    assert {history_page_name("flash_prefill", NVIDIA.key), kernel_history_page_name("flash_prefill"),
            compare_page_name(NVIDIA.key, [old_shown[NVIDIA.key]], [new_run]), "index.html"} <= rewritten
    # the chip's previous shown comparison stays as its regression pair's page, with samples pages of the changed
    # series only: those of its unchanged series are no longer made, and deleted (the fresh build has none either)
    assert compare_page_name(NVIDIA.key, [old_base], [old_shown[NVIDIA.key]]) in after
    stale = set(before) - set(after)
    assert len(stale) == 3 and all(name.startswith("samples-") for name in stale)


@pytest.mark.parametrize("forks", [False, True])
def test_the_chip_pages_evidence_is_rendered_before_the_regression_list_is_taken(store, tmp_path, monkeypatch,
                                                                                 forks):
    """``build_report`` renders the chip pages' compare and samples pages while the analysis goes on (they do not
    depend on it; here, or handed to a process of their own), the rest after: the same files as a build that
    renders every page at the end."""
    events: list[str] = []
    render_early, regressions = render_evidence.EvidencePages.render, report.SiteAnalysis.regressions
    monkeypatch.setattr(pageset, "can_fork", lambda: forks)

    def early(self, evidence):  # noqa: ANN001, ANN202 - the method's own
        events.append(f"early: {len(evidence.compares)} compares, {len(evidence.samples)} samples")
        render_early(self, evidence)
        handed = len(self._handed)  # the pages its process renders
        events.append(f"handed {handed}" if forks else f"rendered {sorted(self.site.stats.rendered.items())}")

    def taken(self, timings):  # noqa: ANN001, ANN202
        events.append("regressions")
        return regressions(self, timings)

    monkeypatch.setattr(render_evidence.EvidencePages, "render", early)
    monkeypatch.setattr(report.SiteAnalysis, "regressions", taken)
    add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))
    build(store, tmp_path / "site")
    assert events[:2] == ["early: 2 compares, 8 samples",
                          "handed 10" if forks else "rendered [('compare', 2), ('samples', 8)]"]
    assert events[2] == "regressions"
    data = site_inputs.load_site(store, change_points=False)  # analysed here, every page rendered at the end
    data.evidence = site_evidence.load_evidence(store, data.latest, data.regressions, commit_url=URL_TEMPLATE)
    report.render(data, tmp_path / "at-the-end", store=store)
    assert files(tmp_path / "site") == files(tmp_path / "at-the-end")
    assert data.pages.rendered["compare"] > 2  # the regression pairs' pages besides the chip pages'


def test_the_samples_of_kept_pages_are_not_read(store, tmp_path, monkeypatch):
    out = tmp_path / "site"
    build(store, out)
    apple_runs = {b.id for b in query.run_briefs(store) if b.chip == APPLE.key}
    add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))
    read: list[str] = []
    job_samples = query.job_samples

    def counted(store, run_ids, kernels=None):  # noqa: ANN001, ANN202 - query.job_samples's
        read.extend(run_ids)
        return job_samples(store, run_ids, kernels)

    monkeypatch.setattr(query, "job_samples", counted)
    build(store, out)
    assert read and not set(read) & apple_runs  # the new run's pages only: the Apple chip's samples stay unread
    monkeypatch.setattr(query, "job_samples", job_samples)
    build(store, tmp_path / "fresh")
    assert files(out) == files(tmp_path / "fresh")


def test_a_changed_input_is_rendered_again(store, tmp_path):
    out = tmp_path / "site"
    build(store, out)
    written = mtimes(out)
    history = out / history_page_name("flash_prefill", APPLE.key)
    history.write_text("edited by hand", encoding="utf-8")  # a page changed since: rendered again
    other = ReportOptions(change_points=False, commit_url="https://other.example.com/{sha}")
    build_report(store, out, other)  # every link
    build_report(store, tmp_path / "fresh", other)
    assert files(out) == files(tmp_path / "fresh")
    kept = {name for name, ns in mtimes(out).items() if written.get(name) == ns}
    assert not {name for name in kept if not name.startswith("samples-")}  # each names a commit with its link
    assert "edited by hand" not in history.read_text(encoding="utf-8")


def test_a_regression_list_change_reaches_the_history_page(store, tmp_path):
    """A history page links each of its regressions by its place in the list: a new regression ahead of it moves
    it, and the page is rendered again though its series did not change."""
    out = tmp_path / "site"
    data = site_inputs.load_site(store, change_points=False)
    data.evidence = site_evidence.load_evidence(store, data.latest, data.regressions)
    report.render(data, out, store=store)
    assert data.pages.rendered["history"] == 2
    regression = next(r for r in data.regressions if r.kind == "performance")
    moved = dataclasses.replace(regression, chip="other-chip", kernel="other_kernel")
    data.regressions = [moved, *data.regressions]
    report.render(data, out, store=store)
    assert data.pages.rendered["history"] == 1 and data.pages.kept["history"] == 1  # the chip with the regression
    report.render(data, tmp_path / "fresh")
    assert files(out) == files(tmp_path / "fresh")


def test_nothing_new_renders_only_the_summary_pages(store, tmp_path):
    out = tmp_path / "site"
    build(store, out)
    written = mtimes(out)
    build(store, out)
    again = {name for name, ns in mtimes(out).items() if written[name] != ns}
    assert again == {"index.html", "variants.html", "regressions.html", "regressions.atom"}


def test_no_cache_renders_every_page_and_stores_no_manifest(store, tmp_path):
    out = tmp_path / "site"
    build(store, out)
    assert analysis_cache.read_entries(store, SiteManifests.CHIP, SiteManifests.KIND)
    written = mtimes(out)
    build(store, out, cache=False)
    assert all(ns != written[name] for name, ns in mtimes(out).items())
    assert not analysis_cache.read_entries(store, SiteManifests.CHIP, SiteManifests.KIND)
    build(store, out)  # the next build knows nothing of the folder: every page again
    assert all(ns != written[name] for name, ns in mtimes(out).items())


def test_a_page_the_manifest_never_listed_is_left_alone(store, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    (out / "notes.html").write_text("mine", encoding="utf-8")
    build(store, out)
    add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))
    build(store, out)
    assert (out / "notes.html").read_text(encoding="utf-8") == "mine"


# --- fingerprints ------------------------------------------------------------------------------------------------


def test_fingerprint_is_exact_and_independent_of_set_order():
    digest = fingerprint.Fingerprint
    assert digest({"b", "a", "c"}).hexdigest() == digest({"c", "a", "b"}).hexdigest()
    assert digest(0.0).hexdigest() != digest(-0.0).hexdigest()
    assert digest([1, 2]).hexdigest() != digest((1, 2)).hexdigest()
    assert digest({"a": 1, "b": 2}).hexdigest() != digest({"b": 2, "a": 1}).hexdigest()  # order is shown
    assert digest(np.array([1.0, 2.0])).hexdigest() != digest(np.array([1.0, 2.0], dtype=np.float32)).hexdigest()
    with pytest.raises(TypeError):
        digest(object())


def test_records_fingerprinted_by_their_text_are_exact():
    key = query.SeriesKey("flash_prefill", "sdpa", "float16", "B=1", "chip")
    row = CompareRow(key, "unchanged", 1.0, 0.99, 1.01, 0.5, 0.6, 24, 24, 0, 1e-4, 1e-4)
    digest = fingerprint.Fingerprint
    assert digest(row).hexdigest() == digest(dataclasses.replace(row)).hexdigest()
    assert digest(row).hexdigest() != digest(dataclasses.replace(row, ratio=1.0000000000000002)).hexdigest()
    assert digest(row).hexdigest() != digest(dataclasses.replace(row, key=key._replace(chip="other"))).hexdigest()
    assert digest([row]).hexdigest() != digest([dataclasses.replace(row, noise=0.01)]).hexdigest()


def test_history_points_fingerprint_reads_the_commits_not_the_table_layout():
    when = datetime(2026, 1, 1, tzinfo=UTC)
    table = [("a" * 40, "one", "main", when), ("b" * 40, "two", "main", when), ("c" * 40, "three", "main", when)]
    points = HistoryPoints(table, [0, 2], [1.0, 2.0], [0.9, 1.9], [1.1, 2.1], [3, 3])
    shuffled = HistoryPoints([table[2], ("d" * 40, "four", "main", when), table[0]], [2, 0], [1.0, 2.0], [0.9, 1.9],
                             [1.1, 2.1], [3, 3])
    assert fingerprint.Fingerprint(points).hexdigest() == fingerprint.Fingerprint(shuffled).hexdigest()
    renamed = HistoryPoints([table[0], table[1], ("c" * 40, "3", "main", when)], [0, 2], [1.0, 2.0], [0.9, 1.9],
                            [1.1, 2.1], [3, 3])
    assert fingerprint.Fingerprint(points).hexdigest() != fingerprint.Fingerprint(renamed).hexdigest()
    moved = HistoryPoints(table, [0, 2], [1.0, 2.5], [0.9, 1.9], [1.1, 2.1], [3, 3])
    assert fingerprint.Fingerprint(points).hexdigest() != fingerprint.Fingerprint(moved).hexdigest()


def test_an_unreadable_manifest_renders_every_page(tmp_path):
    assert Manifest.from_bytes(b"not zlib").pages == {}
    manifest = Manifest({"x.html": ("f" * 64, 3, 1)})
    assert Manifest.from_bytes(manifest.to_bytes()) == manifest
    (tmp_path / "x.html").write_text("abc", encoding="utf-8")
    assert not manifest.fresh(tmp_path, "x.html", "f" * 64)  # the file's time is not the one recorded
    stat = (tmp_path / "x.html").stat()
    manifest.pages["x.html"] = ("f" * 64, stat.st_size, stat.st_mtime_ns)
    assert manifest.fresh(tmp_path, "x.html", "f" * 64) and not manifest.fresh(tmp_path, "x.html", "0" * 64)


def test_store_manifest_is_per_folder(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        manifests = report.site_manifests(store)
        manifests.write(tmp_path / "a", Manifest({"p.html": ("x", 1, 2)}))
        manifests.write(tmp_path / "b", Manifest({"q.html": ("y", 1, 2)}))
        assert manifests.read(tmp_path / "a").pages == {"p.html": ("x", 1, 2)}
        manifests.forget(tmp_path / "a")
        assert manifests.read(tmp_path / "a").pages == {}
        assert manifests.read(tmp_path / "b").pages == {"q.html": ("y", 1, 2)}
    finally:
        store.close()


def test_the_page_of_every_chip_takes_a_kept_chip_pages_plots_from_its_file(store, tmp_path, monkeypatch):
    """After a run on one chip, only that chip's plots are drawn: the page of every chip reads the other chip's
    from its kept page (and still equals a full build, above)."""
    from reports import svg

    _forks(monkeypatch, lambda: False)  # drawn in this process, where the calls are counted
    out = tmp_path / "site"
    build(store, out)
    add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))
    drawn: list[str] = []
    original = svg.overlay_plot
    monkeypatch.setattr(svg, "overlay_plot", lambda series, opts: drawn.append(opts.plot_id) or original(series, opts))
    build(store, out)
    every = (out / kernel_history_page_name("flash_prefill")).read_text(encoding="utf-8")
    def plots(chip: str) -> dict:
        return {key: bytes(plot).decode() for key, plot in render_history.page_plots(
            (out / history_page_name("flash_prefill", chip)).read_bytes()).items()}

    apple, nvidia = plots(APPLE.key), plots(NVIDIA.key)
    assert apple and nvidia and all(plot in every for plot in (*apple.values(), *nvidia.values()))
    assert sorted(drawn) == sorted(nvidia)  # each of the chip's plots once (its page), none of the other chip's


def test_a_history_is_digested_once_per_build_and_exactly():
    """With a build's ``FingerprintMemo`` a history on two pages is digested once; the digest still tells every
    point apart (a changed median is a changed fingerprint), and equal inputs give equal fingerprints."""
    from harness.analysis.records import SeriesHistory

    points = HistoryPoints([("a" * 40, "m", "main", None), ("b" * 40, "m", "main", None)], np.array([0, 1]),
                           np.array([1e-3, 2e-3]), np.array([0.9e-3, 1.9e-3]), np.array([1.1e-3, 2.1e-3]),
                           np.array([10, 10]))
    history = SeriesHistory(query.SeriesKey("k", "v", "float16", "S=1", "chip"), points, ())
    memo = fingerprint.FingerprintMemo()
    first = fingerprint.Fingerprint({"chip": [history]}, memo=memo).hexdigest()
    assert list(memo.records) == [id(history)]
    assert fingerprint.Fingerprint({"chip": [history]}, memo=memo).hexdigest() == first
    assert fingerprint.Fingerprint({"chip": [history]}, memo=fingerprint.FingerprintMemo()).hexdigest() == first
    moved = dataclasses.replace(history, points=HistoryPoints(
        points._commits, points.rows, np.array([1e-3, np.nextafter(2e-3, 1.0)]), points.ci_low, points.ci_high,
        points.n))
    assert fingerprint.Fingerprint({"chip": [moved]}, memo=memo).hexdigest() != first


def test_the_samples_pages_of_a_pair_share_one_digest_and_stay_exact():
    """A pair's samples pages digest what they share once; each page's fingerprint still tells apart its series and
    row, and any change to what the pair shares (a run's fingerprint, the compare page's labels, a commit link)."""
    from types import SimpleNamespace

    from harness.analysis.site_inputs import RunBrief
    from reports import evidence as evidence_pages

    runs = (RunBrief("r1", "chip", "a" * 40, "repo", None, False),
            RunBrief("r2", "chip", "b" * 40, "repo", None, False))
    prints = (("r1", 3, 10), ("r2", 3, 20))
    compare = SimpleNamespace(name="compare-x.html", base_label="a", head_label="b")

    def page(key: str, row: str, pair_prints: tuple = prints) -> SimpleNamespace:
        return SimpleNamespace(key=key, base_runs=("r1",), head_runs=("r2",), runs=runs, prints=pair_prints, row=row)

    def prints_of(pages: list, links: dict[str, str] | None = None, linked: object = compare) -> list[str]:
        found = evidence_pages.Links(links or {})
        digest = render_evidence._SamplesPrints(found, "shared")
        return [digest(f"samples-{i}.html", data, linked).hexdigest() for i, data in enumerate(pages)]

    one, two = page("k1", "row1"), page("k2", "row2")
    first = prints_of([one, two])
    assert len(set(first)) == 2
    digest = render_evidence._SamplesPrints(evidence_pages.Links(), "shared")
    digest("samples-0.html", one, compare), digest("samples-1.html", two, compare)
    assert len(digest._pairs) == 1  # the pair digested once
    assert prints_of([one, two]) == first  # a fresh build: the same
    assert prints_of([page("k1", "row1 changed"), two])[0] != first[0]
    assert prints_of([page("k1", "row1", (("r1", 3, 10), ("r2", 3, 21))), two])[0] != first[0]  # a later trial
    relabelled = SimpleNamespace(name="compare-x.html", base_label="a", head_label="b'")
    assert prints_of([one, two], linked=relabelled)[0] != first[0]
    assert prints_of([one, two], links={"a" * 40: "https://example.com/a"})[0] != first[0]


def _record_renderer_pid(monkeypatch, where: Path) -> None:
    """Each time the history pages are rendered, the rendering process's pid is appended to ``where``."""
    original = render_history.HistoryPages.render

    def recorded(self):  # noqa: ANN001, ANN202 - the method's own
        with where.open("a") as out:
            out.write(f"{os.getpid()}\n")
        return original(self)

    monkeypatch.setattr(render_history.HistoryPages, "render", recorded)


def _forked_after_a_new_run_keeps_its_pages(store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            prefixes: tuple[str, ...]) -> None:
    """After a new run, an incremental build with forks (the manifests merged) equals a fresh one, and a build with
    nothing new keeps the pages named ``prefixes``... that the forked processes wrote."""
    add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))
    _forks(monkeypatch, lambda: True)
    build(store, tmp_path / "forked")
    build(store, tmp_path / "fresh")
    assert files(tmp_path / "forked") == files(tmp_path / "fresh")
    before = mtimes(tmp_path / "forked")
    build(store, tmp_path / "forked")  # nothing new
    after = mtimes(tmp_path / "forked")
    kept = [name for name in before if name.startswith(prefixes)]
    assert kept and all(before[name] == after[name] for name in kept)


def test_history_pages_drawn_in_a_process_of_their_own_equal_those_drawn_inline(store, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    _record_renderer_pid(monkeypatch, pids)
    _forks(monkeypatch, lambda: True)
    build(store, tmp_path / "forked")
    _forks(monkeypatch, lambda: False)
    build(store, tmp_path / "inline")
    forked, inline = pids.read_text().split()
    assert int(forked) != os.getpid() and int(inline) == os.getpid()
    assert files(tmp_path / "forked") == files(tmp_path / "inline")
    _forked_after_a_new_run_keeps_its_pages(store, tmp_path, monkeypatch, ("history",))


@pytest.mark.parametrize("forks", [True, False])
def test_the_other_pages_are_written_before_the_report_waits_for_the_history_pages(store, tmp_path, monkeypatch,
                                                                                   forks):
    """The index and chip pages read only the history pages' summaries, known before the pages are written: they
    are rendered while the history pages' process (or, without one, this one later) writes them."""
    out = tmp_path / "site"
    seen: list[tuple[str, bool]] = []
    for kind in (render_history.HistoryPages, render_history.DeliveredHistoryPages):
        def finish(self, into, original=kind.finish):  # noqa: ANN001, ANN202 - the method's own
            seen.append(((out / "index.html").exists(), (out / chip_page_name(APPLE.key)).exists()))
            return original(self, into)
        monkeypatch.setattr(kind, "finish", finish)
    _forks(monkeypatch, lambda: forks)
    build(store, out)
    assert seen == [(True, True)]  # one wait, after both were written


def _made_good_here(store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                    message: str) -> None:
    """A build whose forked process fails says so (``message``) and writes the site a build without forks does."""
    _forks(monkeypatch, lambda: True)
    build(store, tmp_path / "site")
    assert message in caplog.text
    _forks(monkeypatch, lambda: False)
    build(store, tmp_path / "inline")
    assert files(tmp_path / "site") == files(tmp_path / "inline")


def test_a_failed_history_process_is_made_good_here(store, tmp_path, monkeypatch, caplog):
    parent = os.getpid()
    original = render_history.HistoryPages.render

    def fails_in_the_child(self):  # noqa: ANN001, ANN202 - the method's own
        if os.getpid() != parent:
            (self.frame.out / history_page_name("flash_prefill", APPLE.key)).write_text("half written")
            raise RuntimeError("the child dies")
        return original(self)

    monkeypatch.setattr(render_history.HistoryPages, "render", fails_in_the_child)
    _made_good_here(store, tmp_path, monkeypatch, caplog,
                    "history pages: their process failed (RuntimeError: the child dies); rendered here")


def test_evidence_pages_drawn_in_a_process_of_their_own_equal_those_drawn_inline(store, tmp_path, monkeypatch):
    """The chip pages' compare and samples pages are written by a forked process while the report goes on (it
    reads the samples of the pages it draws on a connection of its own); the site is the same as one written
    here, after a new run too, and a build with nothing new keeps what that process wrote."""
    pids = tmp_path / "pids"
    original = render_evidence.write_evidence

    def recorded(site, found, samples, shared, skip):  # noqa: ANN001, ANN202 - the function's own
        if [name for name, _, _ in samples if name not in skip]:
            with pids.open("a") as out:
                out.write(f"{os.getpid()}\n")
        return original(site, found, samples, shared, skip)

    monkeypatch.setattr(render_evidence, "write_evidence", recorded)
    _forks(monkeypatch, lambda: True)
    build(store, tmp_path / "forked")
    writers = {int(pid) for pid in pids.read_text().split()}
    assert writers and os.getpid() not in writers  # every samples page drawn elsewhere
    _forks(monkeypatch, lambda: False)
    build(store, tmp_path / "inline")
    assert files(tmp_path / "forked") == files(tmp_path / "inline")
    assert any(name.startswith("samples") for name in files(tmp_path / "forked"))
    _forked_after_a_new_run_keeps_its_pages(store, tmp_path, monkeypatch, ("samples", "compare"))


def test_a_failed_evidence_process_is_made_good_here(store, tmp_path, monkeypatch, caplog):
    parent = os.getpid()
    original = render_evidence.write_evidence

    def fails_in_the_child(site, found, samples, shared, skip):  # noqa: ANN001, ANN202 - the function's own
        if os.getpid() != parent:
            (site.out / samples[0][0]).write_text("half written")
            raise RuntimeError("the child dies")
        return original(site, found, samples, shared, skip)

    monkeypatch.setattr(render_evidence, "write_evidence", fails_in_the_child)
    _made_good_here(store, tmp_path, monkeypatch, caplog,
                    "evidence pages: their process failed (RuntimeError: the child dies); rendered here")


def test_chip_pages_drawn_in_a_process_of_their_own_equal_those_drawn_inline(store, tmp_path, monkeypatch):
    original = pageset.ForkedPages._in_child

    def in_child(self, send):  # noqa: ANN001, ANN202 - the method's own
        (tmp_path / "chip-pid").write_text(str(os.getpid()))
        return original(self, send)

    monkeypatch.setattr(pageset.ForkedPages, "_in_child", in_child)
    _forks(monkeypatch, lambda: True)
    build(store, tmp_path / "forked")
    assert int((tmp_path / "chip-pid").read_text()) != os.getpid()
    _forks(monkeypatch, lambda: False)
    build(store, tmp_path / "inline")
    assert files(tmp_path / "forked") == files(tmp_path / "inline")
    assert chip_page_name(APPLE.key) in files(tmp_path / "forked")


def test_a_failed_chip_pages_process_is_made_good_here(store, tmp_path, monkeypatch, caplog):
    parent = os.getpid()
    original = pageset.ForkedPages._render

    def fails_in_the_child(self, into):  # noqa: ANN001, ANN202 - the method's own
        if os.getpid() != parent:
            (into.out / chip_page_name(APPLE.key)).write_text("half written")
            raise RuntimeError("the child dies")
        return original(self, into)

    monkeypatch.setattr(pageset.ForkedPages, "_render", fails_in_the_child)
    _made_good_here(store, tmp_path, monkeypatch, caplog,
                    "chip pages: their process failed (RuntimeError: the child dies); rendered here")


@pytest.mark.parametrize(("where", "started_before"), [
    ("load_evidence", 1),  # the analysis' process
    ("render", 2),  # and the evidence pages'
    ("index_groups", 3),  # and the chip pages'
])
def test_a_build_that_fails_leaves_no_process_behind(store, tmp_path, monkeypatch, where, started_before):
    from harness.render import pages as render_pages

    started: list[int] = []
    original = fork.ForkedWork.__init__

    def init(self, work):  # noqa: ANN001, ANN202 - the method's own
        original(self, work)
        started.append(self.pid)

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError(f"{where} failed")

    monkeypatch.setattr(fork.ForkedWork, "__init__", init)
    _forks(monkeypatch, lambda: True)
    monkeypatch.setattr(render_pages if where == "index_groups" else report, where, broken)
    with pytest.raises(RuntimeError, match=f"{where} failed"):
        build(store, tmp_path / "site")
    assert len(started) == started_before
    for pid in started:
        with pytest.raises(ChildProcessError):  # reaped: neither running nor a zombie
            os.waitpid(pid, os.WNOHANG)


def test_a_failed_analysis_process_is_made_good_here(store, tmp_path, monkeypatch, caplog):
    """The analysis and the history pages run in a forked process; where it dies before sending the regression
    list, the report analyses and draws here (its history pages alone in a process of their own)."""
    parent = os.getpid()
    original = report.analyse

    def fails_in_the_child(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if os.getpid() != parent:
            raise RuntimeError("no analysis there")
        return original(*args, **kwargs)

    monkeypatch.setattr(report, "analyse", fails_in_the_child)
    _forks(monkeypatch, lambda: True)
    pids = tmp_path / "pids"
    _record_renderer_pid(monkeypatch, pids)
    build(store, tmp_path / "site")
    assert "analysis: its process failed (RuntimeError: no analysis there); analysed here instead" in caplog.text
    assert int(pids.read_text()) != parent  # the history pages still drawn in a process of their own
    _forks(monkeypatch, lambda: False)
    build(store, tmp_path / "inline")
    assert files(tmp_path / "site") == files(tmp_path / "inline")


def test_no_fork_while_another_thread_runs(monkeypatch):
    import threading

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(sys, "platform", "linux")
    assert fork.can_fork() == hasattr(os, "fork")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not fork.can_fork()  # the child would inherit whatever lock that thread holds
    finally:
        stop.set()
        other.join()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not fork.can_fork()  # Metal (MLX) does not survive a fork


def test_an_in_memory_database_is_analysed_here(tmp_path):
    from harness.record.store import open_database

    memory = open_database("sqlite://")
    on_disk = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        assert not memory.shared_by_processes and on_disk.shared_by_processes
    finally:
        memory.close()
        on_disk.close()


def test_the_forked_analysis_writes_its_cache_on_both_backends(db_url, tmp_path, monkeypatch, caplog):
    """The child opens its own connections (``Store.forked``): what it stores is read by the next build, on SQLite
    and on PostgreSQL, and the site equals one built in a single process."""
    handle = build_store(db_url)
    try:
        _forks(monkeypatch, lambda: True)
        build(handle, tmp_path / "forked")
        caplog.clear()
        with caplog.at_level("INFO", logger="harness.analysis.cache"):
            build(handle, tmp_path / "forked")  # the cache the child stored, reused (its note logged here)
        assert "chips reused whole 2" in caplog.text
        _forks(monkeypatch, lambda: False)
        build(handle, tmp_path / "inline")
        assert files(tmp_path / "forked") == files(tmp_path / "inline")
    finally:
        handle.close()


def test_history_pages_are_fingerprinted_by_the_whole_analysis_the_cache_holds(store, tmp_path, monkeypatch):
    """A chip whose whole analysis the cache holds (reused, or computed and stored: ``CacheStats.whole``) has its
    history pages fingerprinted by a digest of that analysis, not point by point -- the same digest either way, so
    the build after a new run keeps the pages of the chip it computed; the folder equals a full build without the
    cache."""
    _forks(monkeypatch, lambda: False)  # counted in this process
    digested: list[int] = []
    points = fingerprint.Fingerprint._points
    monkeypatch.setattr(fingerprint.Fingerprint, "_points",
                        lambda self, value: digested.append(1) or points(self, value))
    out = tmp_path / "site"
    build(store, out)
    add_run(store, NVIDIA, 2, NEW_SHA, SHAS[-1], np.random.default_rng(9))
    build(store, out)  # the NVIDIA chip computed and stored, the Apple chip reused
    assert not digested
    written = mtimes(out)
    build(store, out)
    history = {name for name in written if name.startswith("histor")}
    assert history and not {name for name, ns in mtimes(out).items() if written[name] != ns} & history
    build(store, tmp_path / "fresh", cache=False)
    assert files(out) == files(tmp_path / "fresh")


def test_a_chips_stored_analysis_digest_covers_every_value_and_place():
    """The digest a chip's analysis row holds changes with any value of it, and each history of a chip is
    fingerprinted by that digest and its place (two histories of one chip never share a fingerprint)."""
    from harness.analysis.cache import chips
    from harness.analysis.records import SeriesHistory

    commits = [("a" * 40, "one", "main", None), ("b" * 40, "two", "main", None)]
    key = query.SeriesKey("k", "v", "float32", "S=1", "chip")

    def history(median: float, variant: str = "v") -> SeriesHistory:
        points = HistoryPoints(commits, [0, 1], [1.0, median], [0.9, 0.9], [1.1, 1.1], [3, 3])
        return SeriesHistory(key._replace(variant=variant), points, ())

    base = chips._chip_out([history(1.0)], [])[1]
    assert len({base, chips._chip_out([history(1.0 + 1e-12)], [])[1], chips._chip_out([history(1.0, "w")], [])[1],
                chips._chip_out([history(1.0), history(1.0)], [])[1]}) == 4
    assert chips._chip_out([history(1.0)], [])[1] == base
    memo = fingerprint.FingerprintMemo()
    pair = [history(1.0), history(1.0)]
    memo.known(pair, base)
    assert fingerprint.Fingerprint(pair[0], memo=memo).hexdigest() != fingerprint.Fingerprint(pair[1], memo=memo
                                                                                              ).hexdigest()


def test_a_report_is_built_without_the_cyclic_collector_and_gives_it_back(store, tmp_path, monkeypatch):
    """The collector is off while a report is built (its collections were a tenth of a report's own CPU time) and
    on again after it, also when the build fails; the site is the same."""
    import gc

    seen: list[bool] = []
    load = report.load_site
    monkeypatch.setattr(report, "load_site", lambda *a, **k: seen.append(gc.isenabled()) or load(*a, **k))
    assert gc.isenabled()
    build(store, tmp_path / "site")
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(report, "load_site", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        build(store, tmp_path / "other")
    assert gc.isenabled()
    gc.disable()
    try:  # a caller that had it off keeps it off
        monkeypatch.setattr(report, "load_site", load)
        build(store, tmp_path / "again")
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert files(tmp_path / "again") == files(tmp_path / "site")


def test_a_pages_plots_are_found_by_their_ids_and_nothing_else():
    page = ('<p>x</p><svg class="plot" width="1" id="svg-0123456789"><text>a &lt;/svg&gt; → µs</text></svg>'
            '<svg class="plot" width="1">no id</svg><svg class="other" id="svg-aaaaaaaaaa"></svg>'
            '<svg class="plot" role="img" id="svg-bbbbbbbbbb"><g/></svg><svg class="plot" id="svg-cccccccccc">')
    found = render_history.page_plots(page.encode())
    assert {key: bytes(plot).decode() for key, plot in found.items()} == {
        "svg-0123456789": '<svg class="plot" width="1" id="svg-0123456789"><text>a &lt;/svg&gt; → µs</text></svg>',
        "svg-bbbbbbbbbb": '<svg class="plot" role="img" id="svg-bbbbbbbbbb"><g/></svg>'}  # the last: cut short


def test_a_kept_pages_plots_go_into_the_page_of_every_chip_as_their_bytes(tmp_path):
    """The page of every chip gets a kept chip page's plot as a token, not as text: ``splice`` writes the plot's
    bytes from the file in its place (never decoded nor encoded again), and the rest of the page as UTF-8."""
    from reports.history import plot_key

    key = plot_key("chip-a", "float32", "S=64")
    svg = f'<svg class="plot" role="img" id="{key}"><text>1 µs → 2 µs</text></svg>'.encode()
    (tmp_path / "kept.html").write_bytes(b"<h1>kept</h1>" + svg + b"<p>rest</p>")
    plots = render_history._ChipPlots(tmp_path)
    plots.start("flash_prefill")
    plots.add("chip-a", None, "kept.html")
    token = plots("chip-a", "float32", "S=64")
    assert token is not None and "svg" not in token and plots("chip-a", "float32", "S=32") is None
    written = b"".join(plots.splice(f"<p>×</p>{token}<p>…</p>"))
    assert written == "<p>×</p>".encode() + svg + "<p>…</p>".encode()
