"""The report build: load and analyse the site's inputs (``harness.analysis``), then write it (``harness.render``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.analysis.cache import analyse, cache_log, replay_log
from harness.analysis.cache.chips import ChipRows
from harness.analysis.records import RegressionEvidence, SeriesHistory
from harness.analysis.site_evidence import commit_urls, load_evidence
from harness.analysis.site_inputs import SiteData, load_site
from harness.analysis.site_manifests import SiteManifests
from harness.analysis.variants import default_variants
from harness.core.collector import without_the_collector
from harness.core.errors import HarnessError
from harness.core.fork import ForkedWork, can_fork
from harness.record import acks, analysis_cache, query
from harness.record.store import Store, mask_url
from harness.render.evidence import EvidencePages
from harness.render.fingerprint import render_version
from harness.render.history import DeliveredHistoryPages, HistoryPages
from harness.render.pages import write_site
from harness.render.pageset import Build, WriteStats
from harness.spec import git, weburl

DEFAULT_REPORT_DIR = Path("harness-out") / "report"

log = logging.getLogger(__name__)


def check_descriptions() -> dict[str, str]:
    """Each registered correctness check's name -> the first sentence of its docstring (what it verifies)."""
    from kernels import REGISTRY  # loads mlx: only when a report is rendered

    found: dict[str, str] = {}
    for kernel in REGISTRY.values():
        for name, check in kernel.checks.items():
            doc = " ".join((check.__doc__ or "").strip().split("\n\n")[0].split())
            found.setdefault(name, doc)
    return found


def render(data: SiteData, out_dir: str | Path = DEFAULT_REPORT_DIR, *, store: Store | None = None,
           incremental: bool = True, history: HistoryPages | DeliveredHistoryPages | None = None,
           generated_at: str | None = None, early: EvidencePages | None = None) -> Path:
    """Write the site into ``out_dir`` (``harness.render.pages.write_site``); returns the index path. With ``store``,
    its analysis cache holds the folder's manifest: ``incremental``, only the pages whose inputs changed since the
    last build there are rendered; else every page, and the manifest is removed. Without, every page, nothing
    stored. ``history``: the history pages, started by the caller (``build_report``) from the same data;
    ``generated_at``: the build's time stamp (now, by default); ``early``: the evidence pages rendered already
    (``build_report``)."""
    start = time.perf_counter()
    data.pages = WriteStats()
    data.checks = check_descriptions()
    build = Build(generated_at or _stamp(), site_manifests(store) if store is not None else None, incremental,
                  data.pages)
    index = write_site(out_dir, data, build, history=history, early=early)
    data.timings["render"] = time.perf_counter() - start
    if history is not None and history.seconds is not None:
        data.timings["history pages"] = history.seconds
    return index


def site_manifests(store: Store) -> SiteManifests:
    """The manifests of the sites built from ``store``, keyed by this renderer's version."""
    return SiteManifests(store, render_version())


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


class SiteAnalysis:
    """The histories and the regression list (``analyse``) and then the history pages, in a forked process
    (``pages.ForkedWork``, where ``pages.can_fork``) while the report loads what the chip pages show: the regression
    list and the pages' frame come back first (``regressions``), then the pages (``history.finish``). It stores the
    analysis cache's rows itself, in a thread while it draws the pages (a 1,000-commit chip's whole analysis is one
    16 MB row: sent to the report's process, pickled and stored there, it cost that process, whose own work is as
    long, the writing and more), and ends once they are stored, which the report waits for (``collect``). What the
    process did not deliver is done in the report's own; the site is the same either way."""

    def __init__(self, out_dir: str | Path, *, change_points: bool, last: int | None, cache: bool,
                 commit_urls: dict[str, str], generated_at: str) -> None:
        self.out_dir, self.change_points, self.last, self.cache = out_dir, change_points, last, cache
        self.commit_urls, self.generated_at = commit_urls, generated_at
        self.history: HistoryPages | DeliveredHistoryPages | None = None
        self._work: ForkedWork | None = None

    def start(self, store: Store, chips: list[str], states: dict[str, analysis_cache.ChipState] | None) -> None:
        self.store, self.chips, self.states = store, chips, states
        if can_fork() and store.shared_by_processes:
            self._work = ForkedWork(self._in_child)

    def _analyse(self, timings: dict[str, float], deferred_writes: list[ChipRows] | None = None
                 ) -> tuple[dict[str, list[SeriesHistory]], list[RegressionEvidence], dict[str, str]]:
        """The histories, the regression list and the digests of the chips' whole analyses (``CacheStats.whole``)."""
        histories, regressions, stats = analyse(self.store, self.chips, change_points=self.change_points,
                                                last=self.last, use_cache=self.cache, timings=timings,
                                                states=self.states, deferred_writes=deferred_writes)
        return histories, regressions, stats.whole

    def _pages(self, histories: dict[str, list[SeriesHistory]], regressions: list[RegressionEvidence],
               whole_analyses: dict[str, str]) -> HistoryPages:
        unproven = [chip for chip in histories if not query.chip_order_proven(self.store, chip)]
        data = SiteData([], {}, baselines=default_variants(), histories=histories, regressions=regressions,
                        db_label=mask_url(self.store.url), last=self.last, unproven=unproven)
        return HistoryPages(self.out_dir, data, Build(self.generated_at, site_manifests(self.store), self.cache),
                            self.commit_urls, whole_analyses=whole_analyses)

    def _in_child(self, send: Callable[[Any], None]) -> None:
        self.store.forked()
        timings: dict[str, float] = {}
        deferred: list[ChipRows] = []
        with cache_log() as notes:
            histories, regressions, whole = self._analyse(timings, deferred)
        pages = self._pages(histories, regressions, whole)
        send((regressions, timings, notes, pages.frame))
        storing = threading.Thread(target=_store_rows, args=(self.store, deferred), name="analysis-cache-rows")
        storing.start()  # while the pages are drawn: the writing is mostly SQLite's, outside the GIL
        send(pages.render())
        storing.join()

    def regressions(self, timings: dict[str, float]) -> list[RegressionEvidence]:
        """The regression list (``timings`` gets the analysis' phases, and how long this process waited for them);
        ``history`` is then set."""
        if self._work is not None:
            began = time.perf_counter()
            ok, value = self._work.receive()
            timings["waiting for the analysis"] = time.perf_counter() - began
            if ok:
                regressions, analysed, notes, frame = value
                timings.update(analysed)
                replay_log(notes)  # what the analysis cache reused, as if logged here
                self.history = DeliveredHistoryPages(frame, self._pages_sent, self._redo, self.abandon)
                return regressions
            log.warning("analysis: its process failed (%s); analysed here instead", value)
            self._work = None
        histories, regressions, whole = self._analyse(timings)
        self.history = self._pages(histories, regressions, whole)
        self.history.start()  # the pages alone, in a process of their own where it can
        return regressions

    def _pages_sent(self) -> tuple[bool, Any]:
        """The pages, as the analysis' process sent them."""
        assert self._work is not None
        found = self._work.receive()
        if not found[0]:  # it ended: reaped
            self._work = None
        return found

    def collect(self) -> None:
        """Wait for the analysis' process to end, once the site is written (it has sent everything and stores the
        analysis cache's rows)."""
        if self._work is not None:
            self._work.close()
            self._work = None

    def _redo(self) -> HistoryPages:
        return self._pages(*self._analyse({}))

    def abandon(self) -> None:
        if self._work is not None:
            self._work.abandon()
            self._work = None
        if isinstance(self.history, HistoryPages):
            self.history.abandon()


def _store_rows(store: Store, deferred: list[ChipRows]) -> None:
    """Store the analysis cache's rows and copy them into a SQLite database's file (the report's own commits leave
    that to this thread: ``harness.record.db``); a failure costs the next report the work again, nothing else."""
    try:
        for chip_rows in deferred:
            chip_rows.store(store)
        store.checkpoint()
    except Exception as exc:  # noqa: BLE001 - in a thread of its own: said here, or lost
        log.warning("analysis cache: rows not stored (%s: %s); the next report computes them again",
                    type(exc).__name__, exc)


@dataclass(frozen=True)
class ReportOptions:
    """What a report shows (``harness report``'s options): change points searched, the last N commits only, one
    commit's runs instead of each chip's latest, where commits link to, and whether the caches are used."""

    change_points: bool = True
    last: int | None = None
    commit: str | None = None
    commit_url: str | None = None
    repo: str | None = None
    cache: bool = True


def build_report(store: Store, out_dir: str | Path = DEFAULT_REPORT_DIR, options: ReportOptions = ReportOptions(),
                 timings: dict[str, float] | None = None) -> Path:
    """Load, analyse and render the whole site into ``out_dir``; returns the index path (``timings``, when given,
    gets the seconds of each phase).

    ``options.change_points``, ``last`` and ``commit``: as ``load_site``'s. ``commit_url`` (a template with
    ``{sha}``) and ``repo`` (a git repository whose remote names the web pages) say where commits link to
    (``commit_urls``); ``cache``: as ``load_site``'s, and the pages whose inputs did not change since the last build
    into ``out_dir`` are kept (``harness.render.pages``; False renders every page and keeps no manifest)."""
    with store.reading(), without_the_collector():  # only the analysis cache is written (``writing``)
        return _build_report(store, out_dir, options, timings)


def _build_report(store: Store, out_dir: str | Path, options: ReportOptions, timings: dict[str, float] | None
                  ) -> Path:
    change_points, last, commit, commit_url, repo, cache = (options.change_points, options.last, options.commit,
                                                            options.commit_url, options.repo, options.cache)
    if commit_url:
        weburl.check_template(commit_url)  # a bad template or repository fails before the slow part
    elif repo is not None and not git.is_repo(repo):
        raise HarnessError(f"--repo {repo}: not a git repository")
    briefs = query.run_briefs(store)
    urls = commit_urls(briefs, template=commit_url, repo=repo)
    generated_at = _stamp()
    analysis = SiteAnalysis(out_dir, change_points=change_points, last=last, cache=cache, commit_urls=urls,
                            generated_at=generated_at)
    early: EvidencePages | None = None
    try:
        with store.memoised():  # the pages read the newest runs again and again
            data = load_site(store, change_points=change_points, last=last, commit=commit, cache=cache,
                             analysis=analysis)
            start = time.perf_counter()

            def regressions() -> list[RegressionEvidence]:  # after the chip pages' compares (the analysis goes on)
                data.regressions = analysis.regressions(data.timings)
                return data.regressions

            # the chip pages' compare and samples pages while the analysis goes on: they do not depend on it
            early = EvidencePages(out_dir, site_manifests(store), data.db_label, last=last, generated_at=generated_at,
                                  incremental=cache, forked=store.forked if store.shared_by_processes else None)
            data.acks = acks.acks(store)
            data.evidence = load_evidence(store, data.latest, regressions, cache=cache, links=(briefs, urls),
                                          shown=early.render)
            data.timings["evidence"] = time.perf_counter() - start
            index = render(data, out_dir, store=store, incremental=cache, history=analysis.history,
                           generated_at=generated_at, early=early)
            data.timings["evidence pages"] = early.seconds  # in its own process, where it forked
            analysis.collect()
    finally:
        analysis.abandon()
        if early is not None:
            early.abandon()
    if timings is not None:
        timings.update(data.timings)
    return index
