"""Glue between the store and the renderer: load plain data and verdicts, render the static site."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from harness.analysis.cache import (
    ComparePages,
    NoiseRows,
    VariantCells,
    analyse,
    cache_log,
    job_catalogue,
    replay_log,
)
from harness.analysis.compare import HOURS_APART_S, order_not_proven, single_run_gap
from harness.analysis.noise import noise_report
from harness.analysis.records import (
    CompareReport,
    CompareRow,
    NoiseRow,
    RegressionEvidence,
    SeriesHistory,
    VariantMatrix,
)
from harness.analysis.variants import default_variants, variant_matrix
from harness.core.errors import HarnessError
from harness.core.status import PASSES, run_failures
from harness.record import acks, analysis_cache, query
from harness.record.store import Store, mask_url
from harness.render import pages as render_pages
from harness.render.pages import (
    DeliveredHistoryPages,
    EvidencePages,
    ForkedWork,
    HistoryPages,
    SiteManifests,
    WriteStats,
    write_site,
)
from harness.spec import git, weburl

DEFAULT_REPORT_DIR = Path("harness-out") / "report"

log = logging.getLogger(__name__)


@dataclass
class SiteData:
    """Everything the site shows, loaded and analysed; ``timings`` says where the time went (seconds)."""

    chips: list[dict[str, Any]]
    latest: dict[str, query.RunView | None]  # per chip: its tip run (query.chip_tip), filled from its suite's runs
    failing_before: dict[str, set[str]]  # per chip: shown job keys failing in the run before the one they come from
    baselines: dict[str, str]
    matrix: VariantMatrix
    histories: dict[str, list[SeriesHistory]]
    regressions: list[RegressionEvidence]
    db_label: str
    noise: dict[str, dict[tuple[str, str, str, str], NoiseRow]] = field(default_factory=dict)
    last: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    evidence: Evidence | None = None  # commit links, run ids, compare and samples pages (``load_evidence``)
    acks: dict[str, Any] = field(default_factory=dict)  # acknowledged regressions by id (``harness ack``)
    pages: WriteStats | None = None  # what ``render`` rendered, kept and deleted
    unproven: list[str] = field(default_factory=list)  # chips whose commits ancestry does not all order
    repos: dict[str, str] = field(default_factory=dict)  # per chip: the repository of the run its page shows
    others: dict[str, list[OtherSuite]] = field(default_factory=dict)  # per chip: its other (repository, suite)s


@dataclass
class OtherSuite:
    """A (repository, suite) a chip has runs of besides the one its page shows, at its tip (``query.chip_tips``)."""

    repo: str
    suite: str
    run: query.RunView

    def passed(self) -> int:
        return sum(n for status, n in self.run.counts().items() if status in PASSES)

    def failed(self) -> int:
        return run_failures(self.run.counts())


SHOWN_KINDS = ("correctness", "benchmark", "pytest")  # what a chip page takes from an older run; a selection's tests
# come with it (calibration and install belong to their own run)


def _unit(job: Any) -> tuple[str, str]:
    """What one run shows as a whole: a job by its key, a pytest selection (and every test of it) by its name."""
    return ("selection", job["kernel"]) if job["kind"] in ("pytest", "test") else ("job", job["key"])


def _shown_runs(store: Store, chips: list[dict[str, Any]], commit: str | None,
                units: dict[str, set[tuple[str, str]]] | None = None,
                tips: dict[str, list[query.SuiteTip]] | None = None) -> dict[str, query.RunView | None]:
    """Per chip: its tip run (``query.chip_tip``: one suite of one repository, the newest commit of its branch by
    ancestry; with ``commit``: that commit's newest run there; None where there is none) with its jobs completed by
    each job it lacks, taken from the newest other run of that suite and repository that has it (with ``commit``: of
    that commit), so a partial run (one kernel re-run) hides nothing; a pytest selection comes whole, with its tests,
    from the newest run that ran it. Every job carries ``run_id``; one from an older run also ``from_run`` (its
    ``id``, ``sha``, ``message``, ``started_at``), None for the newest run's own. ``units``: ``query.job_units(store,
    SHOWN_KINDS)`` when the caller has it; ``tips``: ``query.chip_tips`` of each chip, when the caller has them."""
    resolved = None
    if commit is not None:
        resolved = query.resolve_ref(store, commit)
        if resolved.kind != "commit":
            raise HarnessError(f"--commit {commit}: that is a run id; give its commit ({resolved.sha[:12]})")
    shown: dict[str, query.RunView | None] = {}
    if resolved is not None:
        units = {}
    elif units is None:
        units = query.job_units(store, SHOWN_KINDS)  # every chip's, in one read
    for chip in chips:
        key = chip["key"]
        if resolved is None:  # the tip of the chip's suite and repository, filled from their runs only
            of_chip = tips[key] if tips is not None else query.chip_tips(store, key)
            tip, same = (of_chip[0].run_id, of_chip[0].same) if of_chip else (None, [])
            newest = None if tip is None else query.get_run(store, tip)
            presence = query.job_presence(store, run_ids=same, kinds=SHOWN_KINDS, newest_per="unit",
                                          among=units.get(key, set()))
        elif key in resolved.runs:
            newest = query.get_run(store, resolved.runs[key][-1])
            presence = query.job_presence(store, run_ids=resolved.runs[key], kinds=SHOWN_KINDS, newest_per="unit")
        else:
            newest, presence = None, []
        shown[key] = None if newest is None else _completed(store, newest, presence)
    return shown


def _completed(store: Store, newest: query.RunView, presence: list[query.JobPresence]) -> query.RunView:
    """``newest`` with the units it lacks from the older runs of ``presence`` (newest first; the first row of each
    unit is all that counts, so ``job_presence(newest_per="unit")`` is enough)."""
    have = {_unit(job) for job in newest.jobs}
    wanted: dict[str, set[tuple[str, str]]] = {}
    for row in presence:
        unit = _unit({"kind": row.kind, "kernel": row.kernel, "key": row.key})
        if row.run_id != newest.id and unit not in have:
            have.add(unit)
            wanted.setdefault(row.run_id, set()).add(unit)
    jobs = [{**job, "run_id": newest.id, "from_run": None} for job in newest.jobs]
    for run_id, units in wanted.items():
        older = query.get_run(store, run_id)
        if older is None:
            continue
        source = {"id": older.id, "sha": older.sha, "message": older.message, "started_at": older.started_at}
        jobs += [{**job, "run_id": older.id, "from_run": source} for job in older.jobs if _unit(job) in units]
    return dataclasses.replace(newest, jobs=jobs)


def load_site(store: Store, *, change_points: bool = True, last: int | None = None,
              commit: str | None = None, cache: bool = True, analysis: SiteAnalysis | None = None) -> SiteData:
    """Query and analyse: latest run per chip, the variant matrix, every chip's history and the regression list.

    ``last``: histories and regressions cover each chip's last N commits only (all when None). ``commit``: the chip
    pages, the variant matrix and the noise show that commit's runs instead of each chip's latest run. ``cache``:
    histories and regressions reuse (and store) the analysis of what did not change (``harness.analysis.cache``);
    False computes them from the samples alone. ``analysis``: it analyses (``SiteAnalysis``, maybe in a process of
    its own while the rest is loaded) and holds the history pages; the histories are then not in the result, nor
    the regression list, which the caller takes from it when needed.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chips = query.chips(store)
    # each chip's runs (and the highest sample id, before anything else), for the analysis cache's keys: read once
    jobs = analysis_cache.job_id_summaries(store) if cache else None
    states = {chip["key"]: analysis_cache.chip_state(store, chip["key"], include_dirty=True, jobs=jobs)
              for chip in chips} if cache else None
    if analysis is not None:
        analysis.start(store, [chip["key"] for chip in chips], states)
    catalogue = None
    if commit is None:  # every chip's jobs: what the chip pages and the variant matrix look for
        catalogue = job_catalogue(store, [chip["key"] for chip in chips], SHOWN_KINDS, use_cache=cache,
                                  states=states)
    timings["jobs"] = time.perf_counter() - start
    start = time.perf_counter()
    tips = {chip["key"]: query.chip_tips(store, chip["key"]) for chip in chips} if commit is None else None
    latest = _shown_runs(store, chips, commit, catalogue.units if catalogue is not None else None, tips)
    repos, others = _suites(store, tips or {})
    failing_before = {key: _failing_before(store, run) for key, run in latest.items()}
    timings["latest runs"] = time.perf_counter() - start
    start = time.perf_counter()
    cells = VariantCells(store, use_cache=cache, jobs=jobs)
    matrix = variant_matrix(store, commit, series=catalogue.series if catalogue is not None else None, measure=cells)
    cells.flush()
    timings["variant matrix"] = time.perf_counter() - start
    start = time.perf_counter()
    noise = _shown_noise(store, latest, commit, NoiseRows(store, use_cache=cache, jobs=jobs))
    timings["noise"] = time.perf_counter() - start
    if analysis is not None:  # its regression list is taken when needed (``SiteAnalysis.regressions``)
        histories, regressions = {}, []
    else:
        histories, regressions, _ = analyse(store, [chip["key"] for chip in chips], change_points=change_points,
                                            last=last, use_cache=cache, timings=timings, states=states)
    unproven = [chip["key"] for chip in chips if not query.chip_order_proven(store, chip["key"])]
    return SiteData(chips, latest, failing_before, default_variants(), matrix, histories, regressions,
                    mask_url(store.url), noise, last, timings, unproven=unproven, repos=repos, others=others)


def _suites(store: Store, tips: dict[str, list[query.SuiteTip]]) -> tuple[dict[str, str], dict[str, list[OtherSuite]]]:
    """Per chip: the repository its page shows, and its other (repository, suite)s at their tips."""
    repos = {key: of_chip[0].repo for key, of_chip in tips.items() if of_chip}
    others: dict[str, list[OtherSuite]] = {}
    for key, of_chip in tips.items():
        for tip in of_chip[1:]:
            run = query.get_run(store, tip.run_id)
            if run is not None:
                others.setdefault(key, []).append(OtherSuite(tip.repo, tip.suite, run))
    return repos, others


NoiseKey = tuple[str, str, str, str]  # (kernel, variant, dtype, shape_key)


def _shown_noise(store: Store, latest: dict[str, query.RunView | None], commit: str | None,
                 rows_of: NoiseRows | None = None) -> dict[str, dict[NoiseKey, NoiseRow]]:
    """Per chip: the noise meter of each benchmark series the chip page shows, from the run it is shown from (the
    newest runs, or ``commit``'s, pooled; a series an older run supplies, from that run). ``rows_of``: each
    chip's rows reused from the analysis cache where nothing they read changed (``NoiseRows``, flushed here)."""
    def key_of(row: NoiseRow) -> NoiseKey:
        return (row.key.kernel, row.key.variant, row.key.dtype, row.key.shape_key)

    noise: dict[str, dict[NoiseKey, NoiseRow]] = {}
    for row in noise_report(store, commit, rows_of=rows_of).rows:
        noise.setdefault(row.key.chip, {})[key_of(row)] = row
    for chip, view in latest.items():
        older: dict[str, set[NoiseKey]] = {}
        for job in view.jobs if view is not None else []:
            if job["kind"] == "benchmark" and job.get("from_run"):
                older.setdefault(job["run_id"], set()).add(
                    (job["kernel"], job["variant"], job["dtype"], job["shape_key"]))
        for run_id, keys in older.items():
            for row in noise_report(store, run_id, chip, rows_of=rows_of).rows:
                if key_of(row) in keys:
                    noise.setdefault(chip, {})[key_of(row)] = row
    if rows_of is not None:
        rows_of.flush()
    return noise


def _failing_before(store: Store, run: query.RunView | None) -> set[str]:
    """The shown jobs' keys that failed correctness in the run before the one each job comes from."""
    if run is None:
        return set()
    keys_of: dict[str, set[str]] = {}
    for job in run.jobs:
        keys_of.setdefault(job.get("run_id") or run.id, set()).add(job["key"])
    failing: set[str] = set()
    for run_id, keys in keys_of.items():
        previous = query.previous_run_id(store, run_id)
        if previous:
            failing |= {row.key for row in query.correctness_failures(store, [previous])} & keys
    return failing


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
    index = write_site(out_dir, data.chips, data.latest, data.baselines, data.db_label, matrix=data.matrix,
                       checks=check_descriptions(), failing_before=data.failing_before,
                       histories=data.histories, regressions=data.regressions, last=data.last, noise=data.noise,
                       generated_at=generated_at or _stamp(), evidence=data.evidence,
                       manifests=SiteManifests(store) if store is not None else None, incremental=incremental,
                       stats=data.pages, history=history, early=early, acks=data.acks, unproven=data.unproven,
                       repos=data.repos, others=data.others)
    data.timings["render"] = time.perf_counter() - start
    if history is not None and history.seconds is not None:
        data.timings["history pages"] = history.seconds
    return index


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


class SiteAnalysis:
    """The histories and the regression list (``analyse``) and then the history pages, in a forked process
    (``pages.ForkedWork``, where ``pages.can_fork``) while the report loads what the chip pages show: the regression
    list and the pages' frame come back first (``regressions``), the pages when written (``history.finish``); then
    it stores the analysis cache's rows, and the report waits for it to end once the site is written (``collect``).
    What the process did not deliver is done in the report's own; the site is the same either way."""

    def __init__(self, out_dir: str | Path, *, change_points: bool, last: int | None, cache: bool,
                 commit_urls: dict[str, str], generated_at: str) -> None:
        self.out_dir, self.change_points, self.last, self.cache = out_dir, change_points, last, cache
        self.commit_urls, self.generated_at = commit_urls, generated_at
        self.history: HistoryPages | DeliveredHistoryPages | None = None
        self._work: ForkedWork | None = None

    def start(self, store: Store, chips: list[str], states: dict[str, analysis_cache.ChipState] | None) -> None:
        self.store, self.chips, self.states = store, chips, states
        if render_pages.can_fork() and store.shared_by_processes:
            self._work = ForkedWork(self._in_child)

    def _analyse(self, timings: dict[str, float], deferred_writes: list[Callable[[], None]] | None = None
                 ) -> tuple[dict[str, list[SeriesHistory]], list[RegressionEvidence]]:
        histories, regressions, _ = analyse(self.store, self.chips, change_points=self.change_points, last=self.last,
                                            use_cache=self.cache, timings=timings, states=self.states,
                                            deferred_writes=deferred_writes)
        return histories, regressions

    def _pages(self, histories: dict[str, list[SeriesHistory]], regressions: list[RegressionEvidence]
               ) -> HistoryPages:
        unproven = [chip for chip in histories if not query.chip_order_proven(self.store, chip)]
        return HistoryPages(self.out_dir, histories, regressions, default_variants(), mask_url(self.store.url),
                            last=self.last, generated_at=self.generated_at, commit_urls=self.commit_urls,
                            manifests=SiteManifests(self.store), incremental=self.cache, unproven=unproven)

    def _in_child(self, send: Callable[[Any], None]) -> None:
        self.store.forked()
        timings: dict[str, float] = {}
        deferred: list[Callable[[], None]] = []
        with cache_log() as notes:
            histories, regressions = self._analyse(timings, deferred)
        pages = self._pages(histories, regressions)
        send((regressions, timings, notes, pages.frame))
        send(pages.render())
        for store_rows in deferred:  # the analysis cache's rows, once the report has what it waits for
            store_rows()

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
        histories, regressions = self._analyse(timings)
        self.history = self._pages(histories, regressions)
        self.history.start()  # the pages alone, in a process of their own where it can
        return regressions

    def _pages_sent(self) -> tuple[bool, Any]:
        assert self._work is not None
        found = self._work.receive()
        if not found[0]:  # it ended: reaped
            self._work = None
        return found

    def collect(self) -> None:
        """Wait for the analysis' process to end, once the site is written: it stores the analysis cache's rows
        after it sent the history pages."""
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


def build_report(store: Store, out_dir: str | Path = DEFAULT_REPORT_DIR, *, change_points: bool = True,
                 last: int | None = None, commit: str | None = None, commit_url: str | None = None,
                 repo: str | None = None, cache: bool = True, timings: dict[str, float] | None = None) -> Path:
    """Load, analyse and render the whole site into ``out_dir``; returns the index path (``timings``, when given,
    gets the seconds of each phase).

    ``commit_url`` (a template with ``{sha}``) and ``repo`` (a git repository whose remote names the web pages)
    say where commits link to (``commit_urls``); ``cache``: as ``load_site``'s, and the pages whose inputs did not
    change since the last build into ``out_dir`` are kept (``harness.render.pages``; False renders every page and
    keeps no manifest)."""
    if commit_url:
        weburl.check_template(commit_url)  # a bad template or repository fails before the slow part
    elif repo is not None and not git.is_repo(repo):
        raise HarnessError(f"--repo {repo}: not a git repository")
    briefs = query.run_briefs(store)
    urls = commit_urls(briefs, template=commit_url, repo=repo)
    generated_at = _stamp()
    analysis = SiteAnalysis(out_dir, change_points=change_points, last=last, cache=cache, commit_urls=urls,
                            generated_at=generated_at)
    try:
        with store.memoised():  # the pages read the newest runs again and again
            data = load_site(store, change_points=change_points, last=last, commit=commit, cache=cache,
                             analysis=analysis)
            start = time.perf_counter()

            def regressions() -> list[RegressionEvidence]:  # after the chip pages' compares (the analysis goes on)
                data.regressions = analysis.regressions(data.timings)
                return data.regressions

            # the chip pages' compare and samples pages while the analysis goes on: they do not depend on it
            early = EvidencePages(out_dir, store, data.db_label, last=last, generated_at=generated_at,
                                  incremental=cache)
            data.acks = acks.acks(store)
            data.evidence = load_evidence(store, data.latest, regressions, cache=cache, links=(briefs, urls),
                                          shown=early.render)
            data.timings["evidence"] = time.perf_counter() - start
            data.timings["evidence pages"] = early.seconds
            index = render(data, out_dir, store=store, incremental=cache, history=analysis.history,
                           generated_at=generated_at, early=early)
            analysis.collect()
    finally:
        analysis.abandon()
    if timings is not None:
        timings.update(data.timings)
    return index


# --- the evidence path: commit links, run ids, compare pages, samples ----------------------------------------------
# (kept apart from the loading above: ``load_evidence`` runs after it and only reads what it chose to show)

MAX_REGRESSION_COMPARES = 40
"""Compare pages made for the regression list's (base, head) pairs, newest first, besides each chip's own: each is a
full ``harness compare`` (the rest of the list links to its history page only)."""


@dataclass(frozen=True)
class CompareView:
    """One compare page: ``report`` (``harness compare`` of one chip's two sides, as the CLI prints it) with the
    runs of each side; ``shown``: the chip page's run against the run ``harness run`` compares it with
    (``query.previous_run_id``), else a regression's two commits; ``apart_s``: when a side is a single run, the
    shortest time between it and the other side's runs (None otherwise); ``runs``: per series, the runs with samples
    of it on each side."""

    chip: str
    report: CompareReport
    shown: bool
    base_runs: tuple[query.RunBrief, ...]
    head_runs: tuple[query.RunBrief, ...]
    apart_s: float | None
    runs: dict[query.SeriesKey, tuple[int, int]]

    @property
    def single_apart(self) -> bool:
        return self.apart_s is not None and self.apart_s >= HOURS_APART_S


@dataclass(frozen=True)
class SeriesSamples:
    """The raw samples of one series on one chip behind a comparison (or of the chip page's run alone, when it has
    no previous run): each job's samples (``jobs``, read on first use), base side first, runs in start order;
    ``row``: its compare row; ``runs``: the briefs of both sides' runs and ``prints`` their fingerprints
    (``analysis_cache.run_prints``, empty when not read): what the samples are a function of."""

    key: query.SeriesKey
    base_runs: tuple[str, ...]
    head_runs: tuple[str, ...]
    source: _PairSamples = field(compare=False, repr=False)
    row: CompareRow | None
    runs: tuple[query.RunBrief, ...] = ()
    prints: tuple[Any, ...] = ()

    @property
    def jobs(self) -> tuple[tuple[str, query.RunBrief, query.JobSamples], ...]:  # (side, run, samples)
        return self.source.jobs_of(self.key)


class _PairSamples:
    """The samples of one (base, head) pair's runs, read in one query when first asked for (a samples page kept
    from the last build never asks): runs of ``full`` with every kernel, the others with ``kernels`` only."""

    def __init__(self, store: Store, base: tuple[str, ...], head: tuple[str, ...], full: set[str],
                 kernels: set[str], by_id: dict[str, query.RunBrief]) -> None:
        self.store, self.base, self.head, self.by_id = store, base, head, by_id
        self.full = sorted({*base, *head} & full)
        self.partial = sorted({*base, *head} - full)
        self.kernels = kernels
        self._by_run_series: dict[tuple[str, query.SeriesKey], list[query.JobSamples]] | None = None

    def by_run_series(self) -> dict[tuple[str, query.SeriesKey], list[query.JobSamples]]:
        if self._by_run_series is None:
            samples = query.job_samples(self.store, self.full) + query.job_samples(self.store, self.partial,
                                                                                    kernels=self.kernels)
            self._by_run_series = {}
            for job in samples:
                self._by_run_series.setdefault((job.run_id, job.series), []).append(job)
        return self._by_run_series

    def jobs_of(self, key: query.SeriesKey) -> tuple[tuple[str, query.RunBrief, query.JobSamples], ...]:
        found = self.by_run_series()
        return tuple((side, self.by_id[run_id], job) for side, ids in (("base", self.base), ("head", self.head))
                     for run_id in ids for job in found.get((run_id, key), []))


@dataclass
class Evidence:
    commit_urls: dict[str, str] = field(default_factory=dict)  # sha -> its web page
    runs_of: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # (chip, sha) -> run ids
    compares: list[CompareView] = field(default_factory=list)
    samples: list[SeriesSamples] = field(default_factory=list)
    skipped_compares: int = 0  # regression pairs beyond MAX_REGRESSION_COMPARES


def commit_urls(briefs: list[query.RunBrief], *, template: str | None = None, repo: str | None = None
                ) -> dict[str, str]:
    """Each run's commit -> its web page. ``template`` (``{sha}`` in it) wins; else the remote of ``repo`` when
    given (an error if it is not a git repository); else each commit's recorded repository when that is a remote
    URL, and the current folder's remote (when it is a git repository) for those recorded without one."""
    if template:
        weburl.check_template(template)
        return {b.sha: template.format(sha=b.sha) for b in briefs}
    if repo is not None:
        remote = weburl.remote_url(repo)
        if remote is None and not git.is_repo(repo):
            raise HarnessError(f"--repo {repo}: not a git repository")
        fixed = weburl.commit_url_template(remote)
        return {b.sha: fixed.format(sha=b.sha) for b in briefs} if fixed else {}
    local = weburl.commit_url_template(weburl.remote_url("."))
    urls = {}
    for b in briefs:
        remote = f"https://{b.repo}" if git.is_identity(b.repo) and not b.repo.startswith(git.ROOT_PREFIX) \
            else b.repo  # a repository identity (host/owner/name) is its https remote
        found = weburl.commit_url_template(remote) if weburl.is_remote(remote) else local
        if found:
            urls[b.sha] = found.format(sha=b.sha)
    return urls


def _apart(base: tuple[query.RunBrief, ...], head: tuple[query.RunBrief, ...]) -> float | None:
    return single_run_gap([b.started_at for b in base], [h.started_at for h in head])


def _positive_runs(jobs: list[query.JobSamples]) -> set[str]:
    return {job.run_id for job in jobs if any(math.isfinite(s) and s > 0 for _, _, s in job.samples)}


def load_evidence(store: Store, latest: dict[str, query.RunView | None],
                  regressions: Sequence[RegressionEvidence] | Callable[[], Sequence[RegressionEvidence]], *,
                  commit_url: str | None = None, repo: str | None = None, cache: bool = True,
                  links: tuple[list[query.RunBrief], dict[str, str]] | None = None,
                  shown: Callable[[Evidence], None] | None = None) -> Evidence:
    """Commit links and run ids for every run, a compare page per chip (the shown run against its previous run) and
    per regression pair (at most ``MAX_REGRESSION_COMPARES``), and the samples behind them: every series of a chip's
    shown run (and its previous run), and the changed series of a regression pair. ``cache``: compare reports whose
    inputs did not change are reused from the analysis cache (``ComparePages``), and so is what a pair's compare
    rows and samples pages take from its samples (``_SampleSummaries``); the samples themselves are read per pair
    when a samples page is drawn (``SeriesSamples.jobs``), so the pages a build keeps read none. ``links``: the runs'
    briefs and commit links (``query.run_briefs``, ``commit_urls``), when the caller has them already.
    ``regressions``: the list, or a function that gives it, called once the chip pages' pairs are loaded; ``shown``
    is called with the evidence of those pairs first (their compare and samples pages do not depend on the list:
    ``build_report`` renders them while the analysis goes on). The evidence grows afterwards: the same object."""
    pages = ComparePages(store, use_cache=cache)
    briefs, urls = links if links is not None else (None, None)
    if briefs is None or urls is None:
        briefs = query.run_briefs(store)
        urls = commit_urls(briefs, template=commit_url, repo=repo)
    by_id = {b.id: b for b in briefs}
    runs_of: dict[tuple[str, str], list[str]] = {}
    for b in briefs:
        runs_of.setdefault((b.chip, b.sha), []).append(b.id)
    evidence = Evidence(urls, {key: tuple(ids) for key, ids in runs_of.items()})
    wanted: list[_Wanted] = []
    seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    for chip, run in latest.items():
        if run is None:
            continue
        previous, proven = query.previous_run(store, run.id)  # the run `harness run` compares its run with
        view = None
        if previous:
            report = pages.compare(previous, run.id, chip)
            view = _compare_view(report if proven else order_not_proven(report), chip, True, by_id)
            evidence.compares.append(view)
        wanted.append((chip, (previous,) if previous else (), (run.id,), view))
        seen.add(((previous,) if previous else (), (run.id,)))
    summaries = _SampleSummaries(store) if cache else None
    # the chip pages' pairs are read whole: their samples do not depend on the pairs still to come
    _add_samples(evidence, store, wanted, wanted, pages, summaries, by_id, cache)
    if shown is not None:
        shown(evidence)
    pairs = []
    for reg in regressions() if callable(regressions) else regressions:
        if reg.kind in ("performance", "unproven") and reg.base_sha:
            base, head = evidence.runs_of.get((reg.chip, reg.base_sha)), evidence.runs_of.get((reg.chip, reg.head_sha))
            if base and head and (base, head) not in seen:
                seen.add((base, head))
                pairs.append((reg.chip, reg.base_sha, reg.head_sha, base, head, reg.kind == "performance"))
    pairs.sort(key=lambda pair: max(_when(by_id[i]) for i in pair[4]), reverse=True)
    evidence.skipped_compares = max(0, len(pairs) - MAX_REGRESSION_COMPARES)
    added: list[_Wanted] = []
    for chip, base_sha, head_sha, base, head, proven in pairs[:MAX_REGRESSION_COMPARES]:
        report = pages.compare(base_sha, head_sha, chip)
        view = _compare_view(report if proven else order_not_proven(report), chip, False, by_id)
        evidence.compares.append(view)
        added.append((chip, base, head, view))
    pages.flush()
    _add_samples(evidence, store, added, wanted + added, pages, summaries, by_id, cache)
    if summaries is not None:
        summaries.flush()
    return evidence


_Wanted = tuple[str, tuple[str, ...], tuple[str, ...], "CompareView | None"]  # chip, base runs, head runs, compare


def _add_samples(evidence: Evidence, store: Store, wanted: list[_Wanted], every: list[_Wanted], pages: ComparePages,
                 summaries: _SampleSummaries | None, by_id: dict[str, query.RunBrief], cache: bool) -> None:
    """The samples behind the pairs of ``wanted`` (``every``: all the pairs of the evidence, these included): every
    series of a chip page's pair; of a regression pair, the kernels of its changed series only (the runs behind
    each row of a side with one run are that run), unless a side pools several runs -- or a run is a chip page's,
    read whole anyway."""
    full = {i for chip, base, head, view in every if view is None or view.shown or len(base) > 1 or len(head) > 1
            for i in (*base, *head)}
    kernels = {row.key.kernel for _, _, _, view in every if view is not None for row in view.report.changed}
    prints = pages.run_prints([i for _, base, head, _ in wanted for i in (*base, *head)]) if cache else {}
    if summaries is not None:
        summaries.prints.update(prints)
    for chip, base, head, view in wanted:
        source = _PairSamples(store, base, head, full, kernels, by_id)
        rows = {row.key: row for row in view.report.rows} if view else {}
        every_series = view is None or view.shown
        found = summaries.get(chip, source, rows, every_series) if summaries is not None else None
        if found is None:
            found = _sample_summary(source, rows, every_series, chip)
            if summaries is not None:
                summaries.put(chip, source, rows, every_series, found)
        counts, keys = found
        if view is not None:
            view.runs.update(counts)
        run_prints = tuple(prints.get(i) for i in (*base, *head)) if prints else ()
        briefs = tuple(by_id[i] for i in (*base, *head))
        evidence.samples += [SeriesSamples(key, base, head, source, rows.get(key), briefs, run_prints)
                             for key in keys]


def _sample_summary(source: _PairSamples, rows: dict[query.SeriesKey, CompareRow], every: bool, chip: str
                    ) -> tuple[dict[query.SeriesKey, tuple[int, int]], list[query.SeriesKey]]:
    """From a pair's samples: per compare row, the runs with samples of its series per side (the sides' run counts
    where the series' kernel was not read); the series that get a samples page (every series with samples when
    ``every``, else the changed rows'), in key order."""
    by_run_series = source.by_run_series()
    base, head = source.base, source.head
    counts = {}
    for key in rows:
        if (base[0] in source.full) or key.kernel in source.kernels:
            jobs = source.jobs_of(key)
            counts[key] = (len(_positive_runs([j for s, _, j in jobs if s == "base"])),
                           len(_positive_runs([j for s, _, j in jobs if s == "head"])))
        else:
            counts[key] = (len(base), len(head))
    candidates = ({key for run_id, key in by_run_series if run_id in head or run_id in base} if every
                  else {key for key, row in rows.items() if row.verdict != "unchanged"})
    keys = [key for key in sorted(k for k in candidates if k.chip == chip) if source.jobs_of(key)]
    return counts, keys


class _SampleSummaries:
    """``_sample_summary`` of each pair kept in the analysis cache (chip, kind ``samples``), keyed by everything it
    reads: the pair's runs with their fingerprints (``analysis_cache.run_prints``: a run's jobs and its highest
    sample id), which of them were read whole, the kernels read of the others, its compare rows' series and
    whether every series counts. Rows of pairs not shown are dropped by ``flush``."""

    KIND = "samples"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.prints: dict[str, tuple[Any, ...]] = {}  # of the runs of the pairs so far (``_add_samples``)
        self.shown: dict[str, set[str]] = {}
        self.computed: dict[str, dict[str, analysis_cache.Entry]] = {}

    def _key(self, source: _PairSamples, rows: dict[query.SeriesKey, CompareRow], every: bool) -> tuple[str, str]:
        name = hashlib.sha256(repr((source.base, source.head)).encode()).hexdigest()[:32]
        key = hashlib.sha256(repr((_SUMMARY_FORMAT, source.base, source.head, source.full,
                                   [self.prints.get(i) for i in (*source.base, *source.head)],
                                   sorted(source.kernels) if source.partial else None,
                                   sorted(rows), every)).encode()).hexdigest()
        return name, key

    def get(self, chip: str, source: _PairSamples, rows: dict[query.SeriesKey, CompareRow], every: bool
            ) -> tuple[dict[query.SeriesKey, tuple[int, int]], list[query.SeriesKey]] | None:
        name, key = self._key(source, rows, every)
        self.shown.setdefault(chip, set()).add(name)
        try:
            entry = analysis_cache.read_entries(self.store, chip, self.KIND, [name]).get(name)
        except SQLAlchemyError:
            return None
        if entry is None or entry.key != key:
            return None
        try:
            data = json.loads(zlib.decompress(entry.payload))
            return ({query.SeriesKey(*k): (int(b), int(h)) for *k, b, h in data["counts"]},
                    [query.SeriesKey(*k) for k in data["keys"]])
        except (ValueError, TypeError, KeyError, zlib.error):
            return None

    def put(self, chip: str, source: _PairSamples, rows: dict[query.SeriesKey, CompareRow], every: bool,
            found: tuple[dict[query.SeriesKey, tuple[int, int]], list[query.SeriesKey]]) -> None:
        name, key = self._key(source, rows, every)
        counts, keys = found
        payload = json.dumps({"counts": [[*k, b, h] for k, (b, h) in counts.items()], "keys": [list(k) for k in keys]},
                             separators=(",", ":"))
        self.computed.setdefault(chip, {})[name] = analysis_cache.Entry(key, zlib.compress(payload.encode()))

    def flush(self) -> None:
        for chip, names in self.shown.items():
            try:
                analysis_cache.write_entries(self.store, chip, self.KIND, self.computed.get(chip, {}), keep=names)
            except SQLAlchemyError:  # the next report reads the samples again
                pass


_SUMMARY_FORMAT = 1


def _when(run: query.RunBrief) -> float:
    return run.started_at.timestamp() if run.started_at is not None else 0.0


def _compare_view(report: CompareReport, chip: str, shown: bool, by_id: dict[str, query.RunBrief]) -> CompareView:
    base = tuple(by_id[i] for i in report.base.runs.get(chip, ()))
    head = tuple(by_id[i] for i in report.head.runs.get(chip, ()))
    return CompareView(chip, report, shown, base, head, _apart(base, head), {})
