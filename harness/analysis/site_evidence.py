"""The evidence behind the site: commit links, run ids, compare reports per chip and regression, their samples."""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from harness.analysis.cache import ComparePages
from harness.analysis.compare import HOURS_APART_S, for_order, single_run_gap
from harness.analysis.records import CompareReport, CompareRow, RegressionEvidence
from harness.core.errors import HarnessError
from harness.record import analysis_cache, query
from harness.record.store import Store
from harness.spec import git, weburl

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
    content: str = ""  # ``ComparePages.content``: stands for ``report.rows`` in the page's fingerprint ("" : none)

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
                  commit_url: str | None = None, cache: bool = True,
                  links: tuple[list[query.RunBrief], dict[str, str]] | None = None,
                  shown: Callable[[Evidence], None] | None = None) -> Evidence:
    """Commit links and run ids for every run, a compare page per chip (the shown run against its previous run) and
    per regression pair (at most ``MAX_REGRESSION_COMPARES``), and the samples behind them: every series of a chip's
    shown run (and its previous run), and the changed series of a regression pair. ``cache``: compare reports whose
    inputs did not change are reused from the analysis cache (``ComparePages``), and so is what a pair's compare
    rows and samples pages take from its samples (``_SampleSummaries``); the samples themselves are read per pair
    when a samples page is drawn (``SeriesSamples.jobs``), so the pages a build keeps read none. ``links``: the runs'
    briefs and commit links (``query.run_briefs``, ``commit_urls``), when the caller has them already (else the
    links are ``commit_url``'s, or the runs' recorded remotes').
    ``regressions``: the list, or a function that gives it, called once the chip pages' pairs are loaded; ``shown``
    is called with the evidence of those pairs first (their compare and samples pages do not depend on the list:
    ``build_report`` renders them while the analysis goes on). The evidence grows afterwards: the same object."""
    pages = ComparePages(store, use_cache=cache)
    briefs, urls = links if links is not None else (None, None)
    if briefs is None or urls is None:
        briefs = query.run_briefs(store)
        urls = commit_urls(briefs, template=commit_url)
    by_id = {b.id: b for b in briefs}
    runs_of: dict[tuple[str, str], list[str]] = {}
    for b in briefs:
        runs_of.setdefault((b.chip, b.sha), []).append(b.id)
    evidence = Evidence(urls, {key: tuple(ids) for key, ids in runs_of.items()})
    wanted: list[_Wanted] = []
    seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    chip_pairs = [(chip, run, *query.previous_run(store, run.id))  # the run `harness run` compares its run with
                  for chip, run in latest.items() if run is not None]
    pages.prefetch([(previous, run.id, chip) for chip, run, previous, _ in chip_pairs if previous])
    for chip, run, previous, proven in chip_pairs:
        view = None
        if previous:
            report = pages.compare(previous, run.id, chip)
            view = _compare_view(for_order(report, proven), chip, True, by_id, pages.content(report, proven))
            evidence.compares.append(view)
        wanted.append((chip, (previous,) if previous else (), (run.id,), view))
        seen.add(((previous,) if previous else (), (run.id,)))
    summaries = _SampleSummaries(store) if cache else None
    # the chip pages' pairs are read whole: their samples do not depend on the pairs still to come
    _add_samples(evidence, store, wanted, wanted, pages, summaries, by_id)
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
    pages.prefetch([(base_sha, head_sha, chip) for chip, base_sha, head_sha, *_ in pairs[:MAX_REGRESSION_COMPARES]])
    added: list[_Wanted] = []
    for chip, base_sha, head_sha, base, head, proven in pairs[:MAX_REGRESSION_COMPARES]:
        report = pages.compare(base_sha, head_sha, chip)
        view = _compare_view(for_order(report, proven), chip, False, by_id, pages.content(report, proven))
        evidence.compares.append(view)
        added.append((chip, base, head, view))
    pages.flush()
    _add_samples(evidence, store, added, wanted + added, pages, summaries, by_id)
    if summaries is not None:
        summaries.flush()
    return evidence


_Wanted = tuple[str, tuple[str, ...], tuple[str, ...], "CompareView | None"]  # chip, base runs, head runs, compare


def _add_samples(evidence: Evidence, store: Store, wanted: list[_Wanted], every: list[_Wanted], pages: ComparePages,
                 summaries: _SampleSummaries | None, by_id: dict[str, query.RunBrief]) -> None:
    """The samples behind the pairs of ``wanted`` (``every``: all the pairs of the evidence, these included): every
    series of a chip page's pair; of a regression pair, the kernels of its changed series only (the runs behind
    each row of a side with one run are that run), unless a side pools several runs -- or a run is a chip page's,
    read whole anyway."""
    full = {i for chip, base, head, view in every if view is None or view.shown or len(base) > 1 or len(head) > 1
            for i in (*base, *head)}
    kernels = {row.key.kernel for _, _, _, view in every if view is not None for row in view.report.changed}
    prints = pages.run_prints([i for _, base, head, _ in wanted for i in (*base, *head)]) \
        if summaries is not None else {}  # with the cache (``summaries``) only
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


def _compare_view(report: CompareReport, chip: str, shown: bool, by_id: dict[str, query.RunBrief], content: str
                  ) -> CompareView:
    base = tuple(by_id[i] for i in report.base.runs.get(chip, ()))
    head = tuple(by_id[i] for i in report.head.runs.get(chip, ()))
    return CompareView(chip, report, shown, base, head, _apart(base, head), {}, content)
