"""Glue between the store and the renderer: load plain data and verdicts, render the static site."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.analysis.cache import ComparePages, analyse
from harness.analysis.compare import HOURS_APART_S, single_run_gap
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
from harness.record import query
from harness.record.store import Store, mask_url
from harness.spec import git, weburl
from reports.render import render_site

DEFAULT_REPORT_DIR = Path("harness-out") / "report"


@dataclass
class SiteData:
    """Everything the site shows, loaded and analysed; ``timings`` says where the time went (seconds)."""

    chips: list[dict[str, Any]]
    latest: dict[str, query.RunView | None]  # per chip: its newest run, jobs it lacks taken from older runs
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


SHOWN_KINDS = ("correctness", "benchmark", "pytest")  # what a chip page takes from an older run; a selection's tests
# come with it (calibration and install belong to their own run)


def _unit(job: Any) -> tuple[str, str]:
    """What one run shows as a whole: a job by its key, a pytest selection (and every test of it) by its name."""
    return ("selection", job["kernel"]) if job["kind"] in ("pytest", "test") else ("job", job["key"])


def _shown_runs(store: Store, chips: list[dict[str, Any]], commit: str | None) -> dict[str, query.RunView | None]:
    """Per chip: its newest run (with ``commit``: that commit's newest run there; None where there is none) with its
    jobs completed by each job it lacks, taken from the newest older run that has it (with ``commit``: of that
    commit), so a partial run (one kernel re-run) hides nothing; a pytest selection comes whole, with its tests,
    from the newest run that ran it. Every job carries ``run_id``; one from an older run also ``from_run`` (its
    ``id``, ``sha``, ``message``, ``started_at``), None for the newest run's own."""
    resolved = None
    if commit is not None:
        resolved = query.resolve_ref(store, commit)
        if resolved.kind != "commit":
            raise HarnessError(f"--commit {commit}: that is a run id; give its commit ({resolved.sha[:12]})")
    shown: dict[str, query.RunView | None] = {}
    units = query.job_units(store, SHOWN_KINDS) if resolved is None else {}  # every chip's, in one read
    for chip in chips:
        key = chip["key"]
        if resolved is None:
            newest = query.latest_run(store, key)
            presence = query.job_presence(store, chip=key, kinds=SHOWN_KINDS, newest_per="unit",
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
              commit: str | None = None, cache: bool = True) -> SiteData:
    """Query and analyse: latest run per chip, the variant matrix, every chip's history and the regression list.

    ``last``: histories and regressions cover each chip's last N commits only (all when None). ``commit``: the chip
    pages, the variant matrix and the noise show that commit's runs instead of each chip's latest run. ``cache``:
    histories and regressions reuse (and store) the analysis of what did not change (``harness.analysis.cache``);
    False computes them from the samples alone.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chips = query.chips(store)
    latest = _shown_runs(store, chips, commit)
    failing_before = {key: _failing_before(store, run) for key, run in latest.items()}
    timings["latest runs"] = time.perf_counter() - start
    start = time.perf_counter()
    matrix = variant_matrix(store, commit)
    timings["variant matrix"] = time.perf_counter() - start
    histories, regressions, _ = analyse(store, [chip["key"] for chip in chips], change_points=change_points,
                                        last=last, use_cache=cache, timings=timings)
    start = time.perf_counter()
    noise = _shown_noise(store, latest, commit)
    timings["noise"] = time.perf_counter() - start
    return SiteData(chips, latest, failing_before, default_variants(), matrix, histories, regressions,
                    mask_url(store.url), noise, last, timings)


NoiseKey = tuple[str, str, str, str]  # (kernel, variant, dtype, shape_key)


def _shown_noise(store: Store, latest: dict[str, query.RunView | None], commit: str | None
                 ) -> dict[str, dict[NoiseKey, NoiseRow]]:
    """Per chip: the noise meter of each benchmark series the chip page shows, from the run it is shown from (the
    newest runs, or ``commit``'s, pooled; a series an older run supplies, from that run)."""
    def key_of(row: NoiseRow) -> NoiseKey:
        return (row.key.kernel, row.key.variant, row.key.dtype, row.key.shape_key)

    noise: dict[str, dict[NoiseKey, NoiseRow]] = {}
    for row in noise_report(store, commit).rows:
        noise.setdefault(row.key.chip, {})[key_of(row)] = row
    for chip, view in latest.items():
        older: dict[str, set[NoiseKey]] = {}
        for job in view.jobs if view is not None else []:
            if job["kind"] == "benchmark" and job.get("from_run"):
                older.setdefault(job["run_id"], set()).add(
                    (job["kernel"], job["variant"], job["dtype"], job["shape_key"]))
        for run_id, keys in older.items():
            for row in noise_report(store, run_id, chip).rows:
                if key_of(row) in keys:
                    noise.setdefault(chip, {})[key_of(row)] = row
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


def render(data: SiteData, out_dir: str | Path = DEFAULT_REPORT_DIR) -> Path:
    start = time.perf_counter()
    index = render_site(out_dir, data.chips, data.latest, data.baselines, data.db_label, matrix=data.matrix,
                        checks=check_descriptions(),
                        failing_before=data.failing_before,
                        histories=data.histories, regressions=data.regressions, last=data.last, noise=data.noise,
                        generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                        evidence=data.evidence)
    data.timings["render"] = time.perf_counter() - start
    return index


def build_report(store: Store, out_dir: str | Path = DEFAULT_REPORT_DIR, *, change_points: bool = True,
                 last: int | None = None, commit: str | None = None, commit_url: str | None = None,
                 repo: str | None = None, cache: bool = True) -> Path:
    """Load, analyse and render the whole site into ``out_dir``; returns the index path.

    ``commit_url`` (a template with ``{sha}``) and ``repo`` (a git repository whose remote names the web pages)
    say where commits link to (``commit_urls``); ``cache``: as ``load_site``'s."""
    if commit_url:
        weburl.check_template(commit_url)  # a bad template or repository fails before the slow part
    elif repo is not None and not git.is_repo(repo):
        raise HarnessError(f"--repo {repo}: not a git repository")
    data = load_site(store, change_points=change_points, last=last, commit=commit, cache=cache)
    start = time.perf_counter()
    data.evidence = load_evidence(store, data.latest, data.regressions, commit_url=commit_url, repo=repo, cache=cache)
    data.timings["evidence"] = time.perf_counter() - start
    return render(data, out_dir)


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
    no previous run): each job's samples, base side first, runs in start order; ``row``: its compare row."""

    key: query.SeriesKey
    base_runs: tuple[str, ...]
    head_runs: tuple[str, ...]
    jobs: tuple[tuple[str, query.RunBrief, query.JobSamples], ...]  # (side, run, samples)
    row: CompareRow | None


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
        found = weburl.commit_url_template(b.repo) if weburl.is_remote(b.repo) else local
        if found:
            urls[b.sha] = found.format(sha=b.sha)
    return urls


def _apart(base: tuple[query.RunBrief, ...], head: tuple[query.RunBrief, ...]) -> float | None:
    return single_run_gap([b.started_at for b in base], [h.started_at for h in head])


def _positive_runs(jobs: list[query.JobSamples]) -> set[str]:
    return {job.run_id for job in jobs if any(math.isfinite(s) and s > 0 for _, _, s in job.samples)}


def load_evidence(store: Store, latest: dict[str, query.RunView | None], regressions: list[RegressionEvidence], *,
                  commit_url: str | None = None, repo: str | None = None, cache: bool = True) -> Evidence:
    """Commit links and run ids for every run, a compare page per chip (the shown run against its previous run) and
    per regression pair (at most ``MAX_REGRESSION_COMPARES``), and the samples behind them: every series of a chip's
    shown run (and its previous run), and the changed series of a regression pair. ``cache``: compare reports whose
    inputs did not change are reused from the analysis cache (``ComparePages``)."""
    pages = ComparePages(store, use_cache=cache)
    briefs = query.run_briefs(store)
    by_id = {b.id: b for b in briefs}
    runs_of: dict[tuple[str, str], list[str]] = {}
    for b in briefs:
        runs_of.setdefault((b.chip, b.sha), []).append(b.id)
    evidence = Evidence(commit_urls(briefs, template=commit_url, repo=repo),
                        {key: tuple(ids) for key, ids in runs_of.items()})
    wanted: list[tuple[str, tuple[str, ...], tuple[str, ...], CompareView | None]] = []
    seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    for chip, run in latest.items():
        if run is None:
            continue
        previous = query.previous_run_id(store, run.id)  # the run `harness run` compares its run with
        view = None
        if previous:
            view = _compare_view(pages.compare(previous, run.id, chip), chip, True, by_id)
            evidence.compares.append(view)
        wanted.append((chip, (previous,) if previous else (), (run.id,), view))
        seen.add(((previous,) if previous else (), (run.id,)))
    pairs = []
    for reg in regressions:
        if reg.kind == "performance" and reg.base_sha:
            base, head = evidence.runs_of.get((reg.chip, reg.base_sha)), evidence.runs_of.get((reg.chip, reg.head_sha))
            if base and head and (base, head) not in seen:
                seen.add((base, head))
                pairs.append((reg.chip, reg.base_sha, reg.head_sha, base, head))
    pairs.sort(key=lambda pair: max(_when(by_id[i]) for i in pair[4]), reverse=True)
    evidence.skipped_compares = max(0, len(pairs) - MAX_REGRESSION_COMPARES)
    for chip, base_sha, head_sha, base, head in pairs[:MAX_REGRESSION_COMPARES]:
        view = _compare_view(pages.compare(base_sha, head_sha, chip), chip, False, by_id)
        evidence.compares.append(view)
        wanted.append((chip, base, head, view))
    pages.flush()
    # Samples: every series of the shown runs; of a regression pair, the kernels of its changed series only (the
    # runs behind each row of a side with one run are that run), unless a side pools several runs.
    full = {i for chip, base, head, view in wanted if view is None or view.shown or len(base) > 1 or len(head) > 1
            for i in (*base, *head)}
    kernels = {row.key.kernel for _, _, _, view in wanted if view is not None for row in view.report.changed}
    partial = {i for _, base, head, _ in wanted for i in (*base, *head)} - full
    samples = query.job_samples(store, sorted(full)) + query.job_samples(store, sorted(partial), kernels=kernels)
    by_run_series: dict[tuple[str, query.SeriesKey], list[query.JobSamples]] = {}
    for job in samples:
        by_run_series.setdefault((job.run_id, job.series), []).append(job)
    for chip, base, head, view in wanted:
        rows = {row.key: row for row in view.report.rows} if view else {}

        def jobs_of(key: query.SeriesKey, base=base, head=head) -> list[tuple[str, query.RunBrief, query.JobSamples]]:
            return [(side, by_id[run_id], job) for side, ids in (("base", base), ("head", head)) for run_id in ids
                    for job in by_run_series.get((run_id, key), [])]

        for key in rows:
            jobs = jobs_of(key)
            view.runs[key] = ((len(_positive_runs([j for s, _, j in jobs if s == "base"])),
                               len(_positive_runs([j for s, _, j in jobs if s == "head"])))
                              if base[0] in full or key.kernel in kernels else (len(base), len(head)))
        keys = ({key for run_id, key in by_run_series if run_id in head or run_id in base} if view is None or view.shown
                else {key for key, row in rows.items() if row.verdict != "unchanged"})
        for key in sorted(k for k in keys if k.chip == chip):
            jobs = jobs_of(key)
            if jobs:
                evidence.samples.append(SeriesSamples(key, base, head, tuple(jobs), rows.get(key)))
    return evidence


def _when(run: query.RunBrief) -> float:
    return run.started_at.timestamp() if run.started_at is not None else 0.0


def _compare_view(report: CompareReport, chip: str, shown: bool, by_id: dict[str, query.RunBrief]) -> CompareView:
    base = tuple(by_id[i] for i in report.base.runs.get(chip, ()))
    head = tuple(by_id[i] for i in report.head.runs.get(chip, ()))
    return CompareView(chip, report, shown, base, head, _apart(base, head), {})
