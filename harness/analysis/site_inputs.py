"""The site's inputs loaded from the store: each chip's shown run, its suites, noise and earlier failures."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.analysis.cache import NoiseRows, VariantCells, analyse, job_catalogue, job_ids
from harness.analysis.noise import noise_report
from harness.analysis.records import NoiseRow, RegressionEvidence, SeriesHistory, VariantMatrix
from harness.analysis.site_evidence import Evidence
from harness.analysis.variants import default_variants, variant_matrix
from harness.core.errors import HarnessError
from harness.core.status import PASSES, run_failures
from harness.record import analysis_cache, query
from harness.record.query import JobSamples, RunBrief, RunView, SeriesKey
from harness.record.store import Store, mask_url

__all__ = ["JobSamples", "OtherSuite", "RunBrief", "RunView", "SHOWN_KINDS", "SeriesKey", "SiteData", "load_site"]
# RunView, RunBrief, SeriesKey and JobSamples are re-exported for the render stage, which imports no harness.record


@dataclass
class SiteData:
    """Everything the site shows, loaded and analysed; ``timings`` says where the time went (seconds). The one input
    of the render stage (``harness.render.pages.write_site``): plain records only, nothing read from the store."""

    chips: list[dict[str, Any]]
    latest: dict[str, query.RunView | None]  # per chip: its tip run (query.chip_tip), filled from its suite's runs
    failing_before: dict[str, set[str]] = field(default_factory=dict)  # per chip: shown job keys failing in the run
    # before the one they come from
    baselines: dict[str, str] = field(default_factory=dict)
    matrix: VariantMatrix | None = None
    histories: dict[str, list[SeriesHistory]] = field(default_factory=dict)
    regressions: list[RegressionEvidence] = field(default_factory=list)
    db_label: str = ""
    noise: dict[str, dict[tuple[str, str, str, str], NoiseRow]] = field(default_factory=dict)
    last: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    evidence: Evidence | None = None  # commit links, run ids, compare and samples pages (``load_evidence``)
    acks: dict[str, Any] = field(default_factory=dict)  # acknowledged regressions by id (``harness ack``)
    pages: Any = None  # what ``render`` rendered, kept and deleted (``harness.render.pageset.WriteStats``)
    unproven: list[str] = field(default_factory=list)  # chips whose commits ancestry does not all order
    repos: dict[str, str] = field(default_factory=dict)  # per chip: the repository of the run its page shows
    others: dict[str, list[OtherSuite]] = field(default_factory=dict)  # per chip: its other (repository, suite)s
    checks: dict[str, str] = field(default_factory=dict)  # correctness check name -> what it verifies


class SiteAnalysis(Protocol):
    """What ``load_site`` starts once it knows the chips (``harness.pipeline.report.SiteAnalysis``: the histories,
    the regression list and the history pages, maybe in a process of their own)."""

    def start(self, store: Store, chips: list[str], states: dict[str, analysis_cache.ChipState] | None) -> None: ...


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
    the regression list, which the caller takes from it when needed, nor the chips whose order is unproven, which
    only the history pages read (it finds them itself).
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chips = query.chips(store)
    # each chip's runs (and the highest sample id, before anything else), for the analysis cache's keys: read once
    jobs = job_ids(store) if cache else None
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
    unproven: list[str] = []  # what the history pages say of a chip; the analysis draws them (``SiteAnalysis``)
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
