"""Read side of the store: every database read of the analysis and the report, returned as plain data.

It owns the run views (``RunView``, ``runs``, ``latest_run``, ``get_run``, ``chips``), the resolution of commit and
run references (``resolve_ref``), the samples and correctness failures of given runs (``series_trials``,
``correctness_failures``, ``latest_runs``) and one chip's whole history as arrays (``chip_history``, cached per
database state, and its correctness jobs); ``harness.analysis`` turns these rows and arrays into verdicts without
touching SQLAlchemy or the models.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from harness.core import defaults
from harness.core.errors import HarnessError
from harness.core.status import CODE_FAILURES, CORRECTNESS_KINDS, drop_explained_selections
from harness.record import ancestry
from harness.record.models import Chip, Commit, JobRecord, Run, Sample, TrialSummary
from harness.record.store import TRIAL_RECORD, Store
from harness.stats import pacing
from harness.stats.summary import sorted_medians


@dataclass
class RunView:
    id: str
    chip_key: str
    sha: str
    message: str
    branch: str
    dirty: bool
    suite: str
    status: str
    started_at: Any
    finished_at: Any
    peak_flops: float | None
    peak_bytes_per_s: float | None
    planned_jobs: int
    hostname: str
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in self.jobs:
            out[job["status"]] = out.get(job["status"], 0) + 1
        return out


JOB_FIELDS = ("key", "kind", "name", "kernel", "variant", "dtype", "shape", "shape_key", "check_name", "status",
              "detail", "output_tail", "max_error", "tolerance", "duration_s", "node", "attempts", "n_samples",
              "inner", "warmup_s", "median_s", "ci_low_s", "ci_high_s", "iqr_rel", "flops", "bytes_moved",
              "achieved_flops", "achieved_bytes_per_s", "pct_peak", "bound", "trials", "timing_mode", "round_trip_s",
              "backlog_calls")


def _job_dict(record: JobRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in JOB_FIELDS}


def _run_view(session: Session, run: Run, with_jobs: bool) -> RunView:
    view = RunView(run.id, run.chip.key, run.commit.sha, run.commit.message, run.branch or run.commit.branch,
                   run.dirty, run.suite, run.status, run.started_at, run.finished_at, run.peak_flops,
                   run.peak_bytes_per_s, run.planned_jobs, run.machine.hostname if run.machine else "")
    if with_jobs:
        records = session.scalars(select(JobRecord).where(JobRecord.run_id == run.id).order_by(JobRecord.id))
        view.jobs = [_job_dict(r) for r in records]
    return view


def previous_run_id(store: Store, run_id: str) -> str | None:
    """The run ``run_id`` is compared with (:func:`previous_run`)."""
    return previous_run(store, run_id)[0]


def previous_run(store: Store, run_id: str) -> tuple[str | None, bool]:
    """The run ``run_id`` is compared with, and whether ancestry proves it is of an earlier commit: the latest run,
    on the same chip, of the previous commit, the nearest ancestor of the run's commit with runs on that chip (first
    parents, then the other parents: ``harness.record.ancestry.nearest``); (None, True) if no ancestor has one.
    When the commit's parents are unknown, or the walk meets unknown ones or a parent not stored (its ancestry did
    not travel with a bundle) first: the chip's latest run of the same repository's commit with the latest commit
    time before this one's (else the run started just before it), not proven."""
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None, True
        repo, sha = run.commit.repo, run.commit.sha
        with_runs = {(repo, other) for other in session.scalars(
            select(Commit.sha).join(Run, Run.commit_id == Commit.id)
            .where(Run.chip_id == run.chip_id, Commit.repo == repo, Run.settling.is_(False)).distinct())}
        found = ancestry.nearest(ancestry.load_graph(session, [repo]), (repo, sha), with_runs)
        if found is None:
            return None, True
        same = (select(Run.id).join(Commit, Run.commit_id == Commit.id)
                .where(Run.chip_id == run.chip_id, Commit.repo == repo, Run.id != run.id, Run.settling.is_(False)))
        newest = (Run.started_at.desc(), Run.id.desc())
        if isinstance(found, tuple):
            return session.scalars(same.where(Commit.sha == found[1]).order_by(*newest).limit(1)).first(), True
        when = run.commit.committed_at
        if when is not None:
            earlier = session.scalars(same.where(Commit.committed_at < when, Commit.sha != sha)
                                      .order_by(Commit.committed_at.desc(), *newest).limit(1)).first()
            if earlier is not None:
                return earlier, False
        earlier = session.scalars(same.where(Run.started_at < run.started_at).order_by(*newest).limit(1)).first()
        return earlier, earlier is None  # nothing before it: nothing guessed


NOT_PROVEN = "order not proven by ancestry"  # said wherever commits are ordered by commit time, not ancestry


def ancestry_proves(store: Store, base_sha: str, head_sha: str) -> bool:
    """Whether the stored ancestry shows commit ``base_sha`` before ``head_sha`` (an ancestor of it, or it)."""
    with store.session() as session:
        heads = session.scalars(select(Commit.repo).where(Commit.sha == head_sha)).all()
        for repo in heads:
            if base_sha == head_sha:
                return True
            graph = ancestry.load_graph(session, [repo])
            if (repo, base_sha) in graph and isinstance(
                    ancestry.nearest(graph, (repo, head_sha), {(repo, base_sha)}), tuple):
                return True
    return False


def chips(store: Store) -> list[dict[str, Any]]:
    with store.session() as session:
        return [{"key": c.key, "backend": c.backend, "device_name": c.device_name, "architecture": c.architecture,
                 "memory_bytes": c.memory_bytes, "gpu_cores": c.gpu_cores, "record": c.record}
                for c in session.scalars(select(Chip).order_by(Chip.key))]


def runs(store: Store, chip_key: str | None = None, with_jobs: bool = False) -> list[RunView]:
    """Runs, newest first (optionally of one chip)."""
    with store.session() as session:
        query = select(Run).join(Chip).order_by(Run.started_at.desc())
        if chip_key:
            query = query.where(Chip.key == chip_key)
        return [_run_view(session, run, with_jobs) for run in session.scalars(query)]


def latest_run(store: Store, chip_key: str) -> RunView | None:
    with store.session() as session:
        run = session.scalars(select(Run).join(Chip).where(Chip.key == chip_key)
                              .order_by(Run.started_at.desc()).limit(1)).first()
        return _run_view(session, run, True) if run else None


class SuiteTip(NamedTuple):
    """One (repository, suite) of a chip at its tip (``chip_tips``): the run shown, and that pair's runs (newest
    first)."""

    repo: str
    suite: str
    run_id: str
    same: list[str]


def chip_tip(store: Store, chip_key: str) -> tuple[str | None, list[str]]:
    """The run a chip's page shows, and the runs it may take missing jobs from (newest first): one suite of one
    repository -- the repository of the chip's newest run made for a branch (a bisect probe, made for a sha, does
    not choose it), and of its suites the one with the most planned jobs (a partial suite, one kernel re-run, does
    not take the page over; ties: the newest) -- at its tip: the newest commit of the branch's first-parent line by
    ancestry (``harness.record.ancestry.arrange``), not the most recently started run, so bisect probes and
    re-measurements of older commits never replace it; of the tip commit's runs, the newest made for a branch.
    (None, []) for a chip without runs."""
    tips = chip_tips(store, chip_key)
    return (tips[0].run_id, tips[0].same) if tips else (None, [])


def chip_tips(store: Store, chip_key: str) -> list[SuiteTip]:
    """Every (repository, suite) a chip has runs of, each at its tip (as ``chip_tip`` finds it): the one its page
    shows first (``chip_tip``'s), then the others, newest run first. [] for a chip without runs."""
    with store.session() as session:
        rows = session.execute(
            select(Run.id, Run.suite, Run.branch, Run.planned_jobs, Commit.repo, Commit.sha, Commit.committed_at)
            .join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
            .where(Chip.key == chip_key).order_by(Run.started_at.desc(), Run.id.desc())).all()
        if not rows:
            return []
        repo = next((row for row in rows if row.branch), rows[0]).repo
        size: dict[str, int] = {}
        for row in rows:
            if row.repo == repo:
                size[row.suite] = max(size.get(row.suite, 0), row.planned_jobs or 0)
        suite = max(size, key=lambda name: size[name])  # dicts keep the order met: newest first among ties
        pairs = [(repo, suite)] + list(dict.fromkeys((row.repo, row.suite) for row in rows
                                                     if (row.repo, row.suite) != (repo, suite)))
        return [_suite_tip(session, [row for row in rows if (row.repo, row.suite) == pair]) for pair in pairs]


def _suite_tip(session: Session, mine: list[Any]) -> SuiteTip:
    """The tip of one (repository, suite)'s runs ``mine`` (newest first), by ancestry (``chip_tip``)."""
    lead = mine[0]
    first: dict[str, Any] = {}
    branches: dict[str, set[str]] = {}
    for row in reversed(mine):  # oldest first: the commits in time order of their first runs
        first.setdefault(row.sha, row)
        branches.setdefault(row.sha, set()).add(row.branch)
    shas = list(first)
    arranged = ancestry.arrange([(lead.repo, sha) for sha in shas], ancestry.load_graph(session, [lead.repo]),
                                [branches[sha] for sha in shas], [_utc(first[sha].committed_at) for sha in shas])
    main = [i for i, line in zip(arranged.order, arranged.line, strict=True) if line == 0]
    tip = shas[main[-1]]
    of_tip = [row for row in mine if row.sha == tip]
    run_id = next((row for row in of_tip if row.branch), of_tip[0]).id
    return SuiteTip(lead.repo, lead.suite, run_id, [row.id for row in mine])


def get_run(store: Store, run_id: str) -> RunView | None:
    with store.session() as session:
        run = session.get(Run, run_id)
        return _run_view(session, run, True) if run else None


# ---------------------------------------------------------------------------------------------------------------
# Series samples and correctness failures of given runs (compare, variants)
# ---------------------------------------------------------------------------------------------------------------


MIN_PREFIX = 4  # shortest commit / run id prefix accepted (as git)


class SeriesKey(NamedTuple):
    """One benchmark series: a kernel variant at one dtype and shape, on one chip."""

    kernel: str
    variant: str
    dtype: str
    shape_key: str
    chip: str


class FailureRow(NamedTuple):
    """A failing correctness job of a run: a kernel check, or a repository test (kind "test"; ``name`` its node id),
    or a pytest selection that failed without a failing test to show for it (collection error, crash, timeout)."""

    chip: str
    kernel: str
    variant: str
    check: str
    dtype: str
    shape_key: str
    status: str
    detail: str
    run_id: str
    sha: str
    kind: str
    key: str
    name: str


def _positive(values: Iterable[float]) -> npt.NDArray[np.float64]:
    array = np.fromiter(values, dtype=np.float64)
    return array[np.isfinite(array) & (array > 0)]


class SeriesTrials(NamedTuple):
    """One series' raw samples on one side of a comparison, grouped by trial: one array per (run, trial)."""

    trials: list[npt.NDArray[np.float64]]
    runs: int  # the distinct runs they came from


def series_trials(store: Store, run_ids: Sequence[str]) -> dict[SeriesKey, SeriesTrials]:
    """Raw benchmark samples of the given runs per series (chip included), one array per trial (a run's job
    process; rows stored before trials were recorded are one trial each); only finite positive samples. Read once
    per ``run_ids`` within ``Store.memoised`` (the arrays are shared: not to be changed)."""
    if not run_ids:
        return {}
    return dict(store.memo(("series trials", *run_ids), lambda: _series_trials(store, run_ids)))


def _series_trials(store: Store, run_ids: Sequence[str]) -> dict[SeriesKey, SeriesTrials]:
    with store.session() as session:
        rows = _plain_rows(session,  # tuples: SQLAlchemy's Row objects cost more than the query on 10^5 samples
            select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, Chip.key,
                   JobRecord.run_id, Sample.trial, Sample.seconds)
            .select_from(Sample)
            .join(JobRecord, Sample.job_id == JobRecord.id)
            .join(Run, JobRecord.run_id == Run.id)
            .join(Chip, Run.chip_id == Chip.id)
            .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark")
            .order_by(JobRecord.id, Sample.idx)
        )
        grouped: dict[SeriesKey, dict[tuple[str, int], list[float]]] = {}
        for kernel, variant, dtype, shape_key, chip, run_id, trial, seconds in rows:
            series = grouped.setdefault(SeriesKey(kernel, variant, dtype, shape_key, chip), {})
            series.setdefault((run_id, trial), []).append(seconds)
    result = {}
    for key, trials in grouped.items():
        arrays = [array for array in map(_positive, trials.values()) if array.size]
        if arrays:
            result[key] = SeriesTrials(arrays, len({run_id for run_id, _ in trials}))
    return result


def _first_parents(graph: ancestry.Graph, start: ancestry.Key, limit: int) -> list[str] | None:
    """``start``'s sha and those of its first-parent ancestors, newest first; None when a commit's parents are
    unknown on the way (stored before parents were recorded, or not seen in git)."""
    shas, key = [], start
    while key in graph and len(shas) < limit:
        shas.append(key[1])
        parents = graph[key]
        if parents is None:
            return None
        if not parents:
            break
        key = (key[0], parents[0])
    return shas


def _history_runs(session: Session, graph: ancestry.Graph, runs: Sequence[Run], limit: int) -> list[str]:
    """The newest ``limit`` finished clean runs on the runs' chip at their commits or first-parent ancestors; where
    the ancestry is unknown, the chip's runs of the repository started up to the newest given run (time order, as
    :func:`previous_run_id` falls back to)."""
    repo, chip_id = runs[0].commit.repo, runs[0].chip_id
    walks = [_first_parents(graph, (repo, run.commit.sha), 10 * limit) for run in runs]
    finished = (select(Run.id, Commit.sha, Run.started_at).join(Commit, Run.commit_id == Commit.id)
                .where(Run.chip_id == chip_id, Commit.repo == repo, Run.finished_at.is_not(None),
                       Run.dirty.is_(False), Run.settling.is_(False)))
    if any(walk is None for walk in walks):
        newest = max(run.started_at for run in runs)
        rows = session.execute(finished.where(Run.started_at <= newest).order_by(Run.started_at.desc())
                               .limit(limit)).all()
        return [run_id for run_id, _, _ in rows]
    order = {sha: rank for walk in walks for rank, sha in enumerate(walk or [])}
    rows = session.execute(finished.where(Commit.sha.in_(list(order))).order_by(Run.started_at.desc())).all()
    return [run_id for run_id, _, _ in sorted(rows, key=lambda row: order[row[1]])][:limit]


def _history_groups(store: Store, session: Session, run_ids: Sequence[str], limit: int
                    ) -> Iterator[tuple[str, list[str]]]:
    """Per (repository, chip) of the given runs: the chip's key and its history runs (:func:`_history_runs`)."""
    given = session.scalars(select(Run).where(Run.id.in_(list(run_ids)))).all()
    repos = sorted({run.commit.repo for run in given})
    graph = store.memo(("commit graph", *repos), lambda: ancestry.load_graph(session, repos))
    for (_, _, chip_key), runs in groupby(sorted(given, key=lambda r: (r.commit.repo, r.chip_id)),
                                          key=lambda r: (r.commit.repo, r.chip_id, r.chip.key)):
        yield chip_key, _history_runs(session, graph, list(runs), limit)


def history_run_ids(store: Store, run_ids: Sequence[str], limit: int = defaults.HISTORY_RUNS) -> list[str]:
    """The runs :func:`history_medians` reads for the given runs (what their series' history floors come from)."""
    if not run_ids:
        return []
    with store.session() as session:
        return [run_id for _, chosen in _history_groups(store, session, run_ids, limit) for run_id in chosen]


def history_medians(store: Store, run_ids: Sequence[str], limit: int = defaults.HISTORY_RUNS
                    ) -> dict[SeriesKey, list[float]]:
    """Each series' medians over the newest ``limit`` finished, clean runs on the given runs' chips at their commits
    or the commits' first-parent ancestors (the base branch; :func:`_history_runs`): the between-run noise of a
    series (``harness.stats.trials.history_floor``). The given runs themselves count; runs of other branches do
    not."""
    if not run_ids:
        return {}
    medians: dict[SeriesKey, list[float]] = {}
    with store.session() as session:
        for chip_key, chosen in _history_groups(store, session, run_ids, limit):
            rows = session.execute(
                select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, JobRecord.median_s)
                .where(JobRecord.run_id.in_(chosen), JobRecord.kind == "benchmark", JobRecord.median_s.is_not(None)))
            for kernel, variant, dtype, shape_key, median in rows:
                medians.setdefault(SeriesKey(kernel, variant, dtype, shape_key, chip_key), []).append(median)
    return medians


def _series_select(run_ids: Sequence[str], column):
    """Each benchmark job of the given runs: its series key's fields (kernel, variant, dtype, shape key, chip) and
    ``column``."""
    return (select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, Chip.key, column)
            .join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
            .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark"))


def timing_modes(store: Store, run_ids: Sequence[str]) -> dict[SeriesKey, str]:
    """How each benchmark series of the given runs was timed ("pipelined", "per-call"; "" if not recorded), joined
    with "+" where its runs differ."""
    modes: dict[SeriesKey, set[str]] = {}
    with store.session() as session:
        for kernel, variant, dtype, shape_key, chip, mode in session.execute(
                _series_select(run_ids, JobRecord.timing_mode)):
            modes.setdefault(SeriesKey(kernel, variant, dtype, shape_key, chip), set()).add(mode or "")
    return _joined_modes(modes)


def host_paced_series(store: Store, run_ids: Sequence[str]) -> set[SeriesKey]:
    """The benchmark series of the given runs that were host-paced in any of their jobs (``harness.stats.pacing``:
    the device waited for the host's calls, so the time per call is the host's pace, not the kernel's)."""
    with store.session() as session:
        rows = session.execute(_series_select(run_ids, JobRecord.backlog_calls)
                               .where(JobRecord.backlog_calls.is_not(None)))
        return {SeriesKey(*row[:5]) for row in rows if pacing.host_paced(row[5])}


def _joined_modes(modes: dict[Any, set[str]]) -> dict[Any, str]:
    """Each key's recorded timing modes as one string, "+"-joined where its runs differ ("" if none recorded)."""
    return {key: "+".join(sorted(m for m in found if m)) for key, found in modes.items()}


def commit_timing_modes(store: Store, chip: str, commit_ids: Sequence[int], *, include_dirty: bool = False
                        ) -> dict[tuple[int, str, str, str, str], str]:
    """How each benchmark series was timed in the chip's runs (those ``chip_history`` includes) of the given
    commits: (commit id, kernel, variant, dtype, shape key) -> the mode, "+"-joined where its runs differ."""
    modes: dict[tuple[int, str, str, str, str], set[str]] = {}
    # The runs first, then their jobs by index: joined the other way, SQLite scans the whole job table.
    runs = _run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty).where(
        Run.commit_id.in_(list(commit_ids)))
    with store.session() as session:
        for commit_id, kernel, variant, dtype, shape_key, mode in session.execute(
                select(Run.commit_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key,
                       JobRecord.timing_mode)
                .join(Run, JobRecord.run_id == Run.id)
                .where(JobRecord.run_id.in_(runs), JobRecord.kind == "benchmark")):
            modes.setdefault((commit_id, kernel, variant, dtype, shape_key), set()).add(mode or "")
    return _joined_modes(modes)


def correctness_failures(store: Store, run_ids: Sequence[str]) -> list[FailureRow]:
    """Failing correctness jobs (``CODE_FAILURES``, kinds ``CORRECTNESS_KINDS``) of the given runs, by chip, kernel,
    variant, check, test.

    A pytest selection's own row fails whenever one of its tests does; it is listed only when none of its tests is
    (a collection error, a crash, a timeout), so each failure is named once, by the test that failed.
    """
    if not run_ids:
        return []
    with store.session() as session:
        rows = [FailureRow(*row) for row in session.execute(
            select(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.check_name, JobRecord.dtype,
                   JobRecord.shape_key, JobRecord.status, JobRecord.detail, JobRecord.run_id, Commit.sha,
                   JobRecord.kind, JobRecord.key, JobRecord.name)
            .select_from(JobRecord)
            .join(Run, JobRecord.run_id == Run.id)
            .join(Chip, Run.chip_id == Chip.id)
            .join(Commit, Run.commit_id == Commit.id)
            .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind.in_(CORRECTNESS_KINDS),
                   JobRecord.status.in_(CODE_FAILURES))
            .order_by(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.check_name, JobRecord.dtype,
                      JobRecord.shape_key, JobRecord.name, JobRecord.run_id)
        )]
    return drop_explained_selections(rows, attrgetter("kind"), attrgetter("run_id", "kernel"))


def latest_runs(store: Store) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Per chip (by key): its latest run (as a one-run tuple) and that run's commit sha; chips without runs left out."""
    runs: dict[str, tuple[str, ...]] = {}
    shas: dict[str, str] = {}
    with store.session() as session:
        for chip_key in list(session.scalars(select(Chip.key).order_by(Chip.key))):
            latest = session.execute(
                select(Run.id, Commit.sha).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
                .where(Chip.key == chip_key, Run.settling.is_(False))
                .order_by(Run.started_at.desc(), Run.id.desc()).limit(1)
            ).first()
            if latest is not None:
                runs[chip_key], shas[chip_key] = (latest[0],), latest[1]
    return runs, shas


class JobPresence(NamedTuple):
    """One job row of a run, in brief: which run has which job. The chip pages show each job from the newest run
    that has it, the variant matrix compares a variant with its default in the newest run that measured both."""

    run_id: str
    chip: str
    sha: str
    started_at: datetime | None
    kind: str
    key: str
    kernel: str
    variant: str
    dtype: str
    shape_key: str
    status: str
    detail: str
    measured: bool  # a job with a median time (a benchmark that stored samples)


SELECTION_KINDS = ("pytest", "test")  # job kinds shown whole, per selection (their kernel), by ``newest_per="unit"``


def _presence_filter(statement, chip: str | None, run_ids: Sequence[str] | None, kinds: Sequence[str] | None):
    if chip is not None:
        statement = statement.where(Chip.key == chip)
    if run_ids is not None:
        statement = statement.where(JobRecord.run_id.in_(list(run_ids)))
    if kinds is not None:
        statement = statement.where(JobRecord.kind.in_(list(kinds)))
    return statement


def _newest_first(statement):
    return statement.order_by(Run.started_at.desc(), Run.id.desc(), JobRecord.id)


def _presence_rows(session: Session, chip: str | None, run_ids: Sequence[str] | None,
                   kinds: Sequence[str] | None) -> list[JobPresence]:
    statement = _newest_first(_presence_filter(
        select(JobRecord.run_id, Chip.key, Commit.sha, Run.started_at, JobRecord.kind, JobRecord.key,
               JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, JobRecord.status,
               JobRecord.detail, JobRecord.median_s.is_not(None))
        .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
        .join(Commit, Run.commit_id == Commit.id), chip, run_ids, kinds))
    return [JobPresence(*row[:11], row[11] or "", bool(row[12])) for row in session.execute(statement)]


def _unit_of(kind: str, key: str, kernel: str) -> tuple[str, str]:
    return ("selection", kernel) if kind in SELECTION_KINDS else ("job", key)


def _batches(items: Sequence[str]) -> Iterable[Sequence[str]]:
    """``items`` in consecutive batches of 1, 2, 4, ... (at most 256): a scan that usually stops after the first."""
    start, size = 0, 1
    while start < len(items):
        yield items[start:start + size]
        start, size = start + size, min(size * 2, 256)


def job_presence(store: Store, *, chip: str | None = None, run_ids: Sequence[str] | None = None,
                 kinds: Sequence[str] | None = None,
                 newest_per: Literal["unit", "series"] | None = None,
                 among: Iterable[tuple[str, ...]] | None = None) -> list[JobPresence]:
    """The job rows (of ``kinds``) of every run, or of ``chip``'s runs, or of ``run_ids`` only: newest run first
    (start time, then run id), in job order within a run. No samples are read.

    ``newest_per``: only the first of those rows (in that order) of each ``"unit"`` (a job by its key, a pytest
    selection, kinds ``SELECTION_KINDS``, by its kernel) or each ``"series"`` (kernel, variant, dtype, shape key,
    chip). The database names the units (or series) there are; the runs are then read newest first, a few at a
    time, until each has been met, so a long history is not read row by row when the newest runs have them all.
    ``among``: the units (``job_units``) or series (``benchmark_series``) to look for, when the caller has them: those
    there are (no other is met), without reading them again."""
    if run_ids is not None and not run_ids:
        return []
    with store.session() as session:
        if newest_per is None:
            return _presence_rows(session, chip, run_ids, kinds)
        if among is not None:
            wanted = set(among)
        elif newest_per == "unit":
            wanted = _job_units(session, kinds, chip, run_ids).get(chip, set()) if chip is not None else {
                unit for units in _job_units(session, kinds, chip, run_ids).values() for unit in units}
        else:
            wanted = set(_benchmark_series(session, run_ids, kinds, chip))
        runs = [row[0] for row in _runs_with(session, kinds, chip, run_ids)]
        found: list[JobPresence] = []
        for batch in _batches(runs):
            if not wanted:
                break
            for row in _presence_rows(session, None, batch, kinds):
                key = (_unit_of(row.kind, row.key, row.kernel) if newest_per == "unit"
                       else (row.kernel, row.variant, row.dtype, row.shape_key, row.chip))
                if key in wanted:
                    wanted.discard(key)
                    found.append(row)
        return found


def measured_series(store: Store, *, run_ids: Sequence[str] | None = None) -> list[tuple[SeriesKey, str]]:
    """Each measured benchmark job (one with a median time) of every run, or of ``run_ids`` only, as (series,
    run id), in ``job_presence``'s order (newest run first)."""
    if run_ids is not None and not run_ids:
        return []
    with store.session() as session:
        statement = _newest_first(_presence_filter(
            select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, Chip.key,
                   JobRecord.run_id)
            .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
            .where(JobRecord.median_s.is_not(None)),
            None, run_ids, ("benchmark",)))
        return [(SeriesKey(*row[:5]), row[5]) for row in session.execute(statement)]


def _job_units(session: Session, kinds: Sequence[str] | None, chip: str | None, run_ids: Sequence[str] | None
               ) -> dict[str, set[tuple[str, str]]]:
    # the chip first: so SQLite reads the table once rather than through an index of the job table
    units: dict[str, set[tuple[str, str]]] = {}
    for chip_key, kind, key, kernel in session.execute(_presence_filter(
            select(Chip.key, JobRecord.kind, JobRecord.key, JobRecord.kernel).distinct().select_from(Run)
            .join(JobRecord, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id), chip, run_ids, kinds)):
        units.setdefault(chip_key, set()).add(_unit_of(kind, key, kernel))
    return units


def job_units(store: Store, kinds: Sequence[str] | None = None) -> dict[str, set[tuple[str, str]]]:
    """Per chip: the units (``job_presence``'s ``newest_per="unit"``) of its job rows of ``kinds``, in one read."""
    with store.session() as session:
        return _job_units(session, kinds, None, None)


def _benchmark_series(session: Session, run_ids: Sequence[str] | None,
                      kinds: Sequence[str] | None = ("benchmark",), chip: str | None = None) -> dict[SeriesKey, bool]:
    found: dict[SeriesKey, bool] = {}
    for chip_key, kernel, variant, dtype, shape_key, measured in session.execute(_presence_filter(
            select(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key,
                   JobRecord.median_s.is_not(None)).distinct().select_from(Run)
            .join(JobRecord, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id),
            chip, run_ids, kinds)):
        key = SeriesKey(kernel, variant, dtype, shape_key, chip_key)
        found[key] = found.get(key, False) or bool(measured)
    return found


def benchmark_series(store: Store, *, run_ids: Sequence[str] | None = None) -> dict[SeriesKey, bool]:
    """Every benchmark series of every run (or of ``run_ids``), and whether any of its jobs was measured (has a
    median time), in one read."""
    if run_ids is not None and not run_ids:
        return {}
    with store.session() as session:
        return _benchmark_series(session, run_ids)


def _runs_with(session: Session, kinds: Sequence[str] | None, chip: str | None, run_ids: Sequence[str] | None):
    statement = (select(Run.id, Chip.key, Commit.sha).select_from(Run).join(Chip, Run.chip_id == Chip.id)
                 .join(Commit, Run.commit_id == Commit.id).order_by(Run.started_at.desc(), Run.id.desc()))
    has = select(JobRecord.id).where(JobRecord.run_id == Run.id)
    if kinds is not None:
        has = has.where(JobRecord.kind.in_(list(kinds)))
    statement = statement.where(has.exists())
    if chip is not None:
        statement = statement.where(Chip.key == chip)
    if run_ids is not None:
        statement = statement.where(Run.id.in_(list(run_ids)))
    return session.execute(statement)


def runs_with_jobs(store: Store, kinds: Sequence[str], *, run_ids: Sequence[str] | None = None
                   ) -> list[tuple[str, str, str]]:
    """(run id, chip key, commit sha) of every run (or of ``run_ids``) with a job of ``kinds``, newest first
    (start time, then run id): the runs ``job_presence`` names, in its order."""
    if run_ids is not None and not run_ids:
        return []
    with store.session() as session:
        return [tuple(row) for row in _runs_with(session, kinds, None, run_ids)]


# ---------------------------------------------------------------------------------------------------------------
# Chips and commit / run references
# ---------------------------------------------------------------------------------------------------------------


def chip_keys(store: Store) -> list[str]:
    """Every chip key, sorted."""
    with store.session() as session:
        return list(session.scalars(select(Chip.key).order_by(Chip.key)))


def _check_chip(session: Session, chip: str | None) -> None:
    if chip is not None and session.scalar(select(Chip.id).where(Chip.key == chip)) is None:
        known = ", ".join(session.scalars(select(Chip.key).order_by(Chip.key))) or "none"
        raise HarnessError(f"unknown chip {chip!r} (known: {known})")


def check_chip(store: Store, chip: str | None) -> None:
    """Raise HarnessError, naming the known chips, unless ``chip`` is None or a stored chip key."""
    with store.session() as session:
        _check_chip(session, chip)


class ResolvedRef(NamedTuple):
    """What a commit or run reference denotes: a commit (all its runs) or one run, and its commit."""

    kind: Literal["commit", "run"]
    sha: str
    message: str
    branch: str
    runs: dict[str, tuple[str, ...]]  # chip key -> run ids, in start order
    dirty_runs: int


def _resolved(kind: Literal["commit", "run"], commit: Commit, runs: Sequence[Run]) -> ResolvedRef:
    per_chip: dict[str, list[str]] = {}
    for run in sorted(runs, key=lambda r: (r.started_at, r.id)):
        per_chip.setdefault(run.chip.key, []).append(run.id)
    return ResolvedRef(kind, commit.sha, commit.message, commit.branch,
                       {chip: tuple(ids) for chip, ids in sorted(per_chip.items())}, sum(bool(r.dirty) for r in runs))


def _commit_runs(session: Session, commits: Sequence[Commit]) -> list[Run]:
    ids = [c.id for c in commits]
    # a commit's settling runs (harness compare --settle) hold some series only: reached by run id alone
    return list(session.scalars(select(Run).where(Run.commit_id.in_(ids), Run.settling.is_(False))))


def resolve_ref(store: Store, ref: str, chip: str | None = None) -> ResolvedRef:
    """A commit sha (full or unique prefix: all its runs, per chip) or a run id (full or unique prefix).

    ``chip`` keeps that chip's runs only.  HarnessError on an empty, unknown, too short or ambiguous reference, an
    unknown chip, a run of another chip, or a commit without runs (on ``chip``).
    """
    ref = ref.strip()
    if not ref:
        raise HarnessError("empty commit or run id")
    with store.session() as session:
        _check_chip(session, chip)
        exact_run = session.get(Run, ref)
        exact_commits = session.scalars(select(Commit).where(Commit.sha == ref)).all()
        if exact_run is not None and not exact_commits:
            runs, kind, commits = [exact_run], "run", [exact_run.commit]
        elif exact_commits:
            runs, kind, commits = _commit_runs(session, exact_commits), "commit", exact_commits
        else:
            if len(ref) < MIN_PREFIX:
                raise HarnessError(f"no commit or run {ref!r} (prefixes need at least {MIN_PREFIX} characters)")
            # Commits are also stored without runs (ancestry between run commits): a prefix names one that has runs.
            commits = session.scalars(select(Commit).where(Commit.sha.startswith(ref, autoescape=True),
                                                           Commit.id.in_(select(Run.commit_id)))).all()
            prefix_runs = session.scalars(select(Run).where(Run.id.startswith(ref, autoescape=True))).all()
            shas = sorted({c.sha for c in commits})
            if len(shas) + len(prefix_runs) > 1:
                listed = [f"commit {s[:12]}" for s in shas] + [f"run {r.id[:12]}" for r in prefix_runs]
                more = f", ... ({len(listed)} in all)" if len(listed) > 3 else ""
                raise HarnessError(f"{ref!r} is ambiguous: {', '.join(listed[:3])}{more}")
            if not shas and not prefix_runs:
                unrun = session.scalars(select(Commit.sha).where(Commit.sha.startswith(ref, autoescape=True))).first()
                if unrun:
                    raise HarnessError(f"commit {unrun[:12]} has no runs")
                raise HarnessError(f"no commit or run {ref!r} in the database")
            if prefix_runs:
                runs, kind, commits = list(prefix_runs), "run", [prefix_runs[0].commit]
            else:
                runs, kind = _commit_runs(session, commits), "commit"
        if chip is not None:
            if kind == "run" and runs[0].chip.key != chip:
                raise HarnessError(f"run {runs[0].id} ran on chip {runs[0].chip.key!r}, not {chip!r}")
            runs = [r for r in runs if r.chip.key == chip]
        if not runs:
            where = f" on chip {chip!r}" if chip else ""
            raise HarnessError(f"commit {commits[0].sha[:12]} has no runs{where}")
        return _resolved(kind, commits[0], runs)


# ---------------------------------------------------------------------------------------------------------------
# One chip's whole history, as arrays (history and regressions), with a small cache
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ChipHistory:
    """All clean runs of one chip, pooled per (commit, series) cell and grouped per trial within each cell.

    ``commits`` are in history order (``harness.record.ancestry.arrange``): the branch's first-parent line, oldest
    first (``line`` 0), then the commits off it as lines of their own (1, 2, ...); without parents, time order.
    ``previous``: per commit, the index of its previous commit (its nearest ancestor with runs on the chip), -1
    when it has none here. ``shown``: the commits of the window (all without ``last``); the others are only loaded
    behind shown ones: their previous commits (the bases they are judged against) and the history before those.

    Samples: each cell's are contiguous in ``values`` (``offsets``, ``counts``) and grouped there by trial, one
    trial per (run, trial) -- a job process -- with the runs in start order; each trial's samples are sorted.
    A cell's trials are ``trial_counts`` entries of the per-trial arrays from ``trial_offsets``: where the trial's
    samples start in ``values`` (``trial_starts``), how many (``trial_sizes``) and its run (``trial_runs``: an index
    in the chip's runs in start order, so a cell's runs are ascending and its newest run last).
    """

    chip: str
    commits: list[tuple[int, str, str, str, datetime | None]]  # (commit id, sha, message, branch, first start)
    series: list[SeriesKey]
    counts: npt.NDArray[np.int64]  # (n_commits, n_series): valid samples per cell
    offsets: npt.NDArray[np.int64]  # (n_commits, n_series): start of each cell in ``values``
    values: npt.NDArray[np.float64]  # samples sorted by (cell, run, trial, seconds)
    previous: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    shown: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    line: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trial_counts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    trial_offsets: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    trial_starts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trial_sizes: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trial_runs: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _trial_medians: npt.NDArray[np.float64] | None = field(default=None, repr=False, compare=False)

    def nearest_with(self, present: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
        """Per commit and column of ``present`` (n_commits, k): the nearest commit up the commit's ``previous``
        chain (its ancestors with runs, nearest first) where ``present`` holds; -1 where none does."""
        n = len(self.commits)
        depth = np.zeros(n, dtype=np.int64)
        for start in range(n):
            path = []
            i = start
            while i >= 0 and depth[i] == 0:
                path.append(i)
                i = int(self.previous[i])
            level = int(depth[i]) if i >= 0 else 0
            for j in reversed(path):
                level += 1
                depth[j] = level
        out = np.full(present.shape, -1, dtype=np.int64)
        for commit in np.argsort(depth, kind="stable").tolist():  # ancestors before their descendants
            before = int(self.previous[commit])
            if before >= 0:
                out[commit] = np.where(present[before], before, out[before])
        return out

    def cell_rows(self, cells: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.float64]:
        """Pooled samples (every trial's) of flat cell indices that all have n samples, each row sorted:
        shape (len(cells), n)."""
        return np.sort(self.values[self.offsets.ravel()[cells][:, None] + np.arange(n)], axis=1)

    def samples(self, cell: int) -> npt.NDArray[np.float64]:
        """Pooled samples (every trial's) of one flat cell index, sorted."""
        start = self.offsets.flat[cell]
        return np.sort(self.values[start:start + self.counts.flat[cell]])

    def trials(self, cell: int) -> list[npt.NDArray[np.float64]]:
        """The samples of one flat cell index per trial (runs in start order), each sorted."""
        first = int(self.trial_offsets.flat[cell])
        span = slice(first, first + int(self.trial_counts.flat[cell]))
        if span.stop > span.start and int(self.trial_starts[span].min()) < 0:
            raise ValueError(f"cell {cell}: its trials' samples were not loaded (load_cell_trials)")
        return [self.values[start:start + size]
                for start, size in zip(self.trial_starts[span].tolist(), self.trial_sizes[span].tolist(), strict=True)]

    def trial_medians(self) -> npt.NDArray[np.float64]:
        """The median of every trial (as ``np.median`` computes it), in the order of the per-trial arrays."""
        if self._trial_medians is None:
            if self.trial_starts.size and int(self.trial_starts.min()) < 0:
                raise ValueError("trials without their samples need their medians given (load_cell_trials)")
            self._trial_medians = sorted_medians(self.values, self.trial_starts, self.trial_sizes)
        return self._trial_medians

    def trial_cells(self) -> npt.NDArray[np.int64]:
        """The flat cell index of every trial."""
        return np.repeat(np.arange(self.trial_counts.size), self.trial_counts.ravel())


def _run_filter(query, chip: str, include_dirty: bool):
    query = query.where(Chip.key == chip, Run.settling.is_(False))  # settling runs: never history points
    return query if include_dirty else query.where(Run.dirty.is_(False))


@contextlib.contextmanager
def _executed(session: Session, statement) -> Iterator[Any]:
    """A DBAPI cursor that has executed the compiled SELECT (SQLAlchemy's Row objects skipped)."""
    connection = session.connection()
    compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup)
    cursor = connection.connection.cursor()
    try:
        cursor.execute(str(compiled), params)
        yield cursor
    finally:
        cursor.close()


def _plain_rows(session: Session, statement) -> list[tuple]:
    """DBAPI tuples of a SELECT, skipping SQLAlchemy's Row objects (seconds on millions of samples)."""
    with _executed(session, statement) as cursor:
        return cursor.fetchall()


def _plain_array(session: Session, statement, dtype: np.dtype) -> npt.NDArray[Any]:
    """``_plain_rows`` as a structured array, filled from the cursor row by row: no list of millions of tuples
    (their allocation and the garbage collector's passes over them cost a quarter of a chip's sample read)."""
    with _executed(session, statement) as cursor:
        return np.fromiter(cursor, dtype=dtype)


_CACHE: OrderedDict[tuple, ChipHistory] = OrderedDict()
_CACHE_SIZE = 8  # chip histories; ~20 MB each at 1000 commits x 200 series x 10 samples


def _fingerprint(session: Session) -> tuple:
    """Changes whenever a run or job is added or removed, a trial is appended to a stored job (new samples), a
    run's start time moves, or commits or parents are recorded."""
    runs = session.execute(select(func.count(Run.id), func.max(Run.started_at))).one()
    jobs = session.execute(select(func.count(JobRecord.id), func.max(JobRecord.id))).one()
    samples = session.execute(select(func.max(Sample.id))).one()
    commits = session.execute(select(func.count(Commit.id), func.count(Commit.parents))).one()
    return (*runs, *jobs, *samples, *commits)


def chip_history(store: Store, chip: str, kernel: str | None = None, *, include_dirty: bool = False,
                 last: int | None = None) -> ChipHistory:
    """The chip's benchmark history, its commits in history order (see ``ChipHistory``), from a small cache keyed
    on the database's state (history then regressions of the same chip, as the report does, load it once).

    ``last``: the window is the last N commits of the main line, and the commits off it whose first run is not
    older than the oldest first run among those N; the previous commits of the window come along as bases.
    """
    with store.session() as session:
        key = (store.url, chip, kernel, include_dirty, last, _fingerprint(session))
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        data = _query_chip(session, chip, kernel, include_dirty, last)
    _CACHE[key] = data
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return data


def _arrangement_of(session: Session, chip: str, include_dirty: bool
                    ) -> tuple[list[Any], dict[int, list[str]], ancestry.Arrangement]:
    """The chip's commits (in time order of first runs), the branches of their runs, and their arrangement."""
    first_start = func.min(Run.started_at)
    rows = session.execute(_run_filter(
        select(Commit.id, Commit.sha, Commit.message, Commit.branch, first_start, Commit.repo, Commit.committed_at)
        .select_from(Run).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id),
        chip, include_dirty).group_by(Commit.id, Commit.sha, Commit.message, Commit.branch, Commit.repo,
                                      Commit.committed_at)
        .order_by(first_start, Commit.id)).all()
    run_branches: dict[int, list[str]] = {}
    for commit_id, branch in session.execute(_run_filter(
            select(Run.commit_id, Run.branch).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
            .order_by(Run.started_at, Run.id)):
        if branch:
            run_branches.setdefault(commit_id, []).append(branch)
    graph = ancestry.load_graph(session, {row[5] for row in rows})
    arranged = ancestry.arrange([(row[5], row[1]) for row in rows], graph,
                                [{*run_branches.get(row[0], ()), row[3]} for row in rows],
                                [_utc(row[6]) for row in rows])
    return rows, run_branches, arranged


def _arranged(session: Session, chip: str, include_dirty: bool,
              last: int | None) -> tuple[list[tuple], list[int], list[bool], list[int]]:
    """The chip's commits in history order, and per commit: previous commit index, shown, line."""
    rows, run_branches, arranged = _arrangement_of(session, chip, include_dirty)
    shown = set(range(len(rows)))
    if last is not None:
        window = [i for i, line in zip(arranged.order, arranged.line, strict=True) if line == 0]
        window = window[-last:] if last > 0 else []
        since = min(window, default=len(rows))  # rows are in time order
        shown = {*window, *(i for i, line in zip(arranged.order, arranged.line, strict=True)
                            if line > 0 and i >= since)}
    # The previous commits of the window (its bases) and the history behind them (the bases' history floors)
    kept, frontier = set(shown), set(shown)
    for _ in range(1 + defaults.HISTORY_RUNS):
        frontier = {arranged.previous[i] for i in frontier if arranged.previous[i] >= 0} - kept
        kept |= frontier
    positions = [i for i in arranged.order if i in kept]
    position = {i: k for k, i in enumerate(positions)}
    line_of = dict(zip(arranged.order, arranged.line, strict=True))
    commits = [(rows[i][0], rows[i][1], rows[i][2], (run_branches.get(rows[i][0]) or [rows[i][3]])[-1], rows[i][4])
               for i in positions]
    previous = [position.get(arranged.previous[i], -1) for i in positions]
    return commits, previous, [i in shown for i in positions], [line_of[i] for i in positions]


def _utc(when: datetime | None) -> datetime | None:
    """A stored time, comparable with the others (SQLite gives them without offset: UTC)."""
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


def chip_order_proven(store: Store, chip: str, include_dirty: bool = False) -> bool:
    """Whether ancestry proves the order of every commit of the chip's history (else some are placed by commit
    time: pages say "order not proven by ancestry")."""
    with store.session() as session:
        return _arrangement_of(session, chip, include_dirty)[2].all_proven


_SAMPLE_ROW = np.dtype([("job", np.int64), ("seconds", np.float64), ("trial", np.int64)])


def _query_chip(session: Session, chip: str, kernel: str | None, include_dirty: bool,
                last: int | None) -> ChipHistory:
    commits, previous, shown, line = _arranged(session, chip, include_dirty, last)
    layout = load_samples(session, chip, [row[0] for row in commits], include_dirty=include_dirty,
                          all_runs=last is None, kernel=kernel)
    return ChipHistory(chip, commits, [SeriesKey(*series, chip) for series in layout.series], layout.counts,
                       layout.offsets, layout.values, np.array(previous, dtype=np.int64),
                       np.array(shown, dtype=bool), np.array(line, dtype=np.int64), layout.trial_counts,
                       layout.trial_offsets, layout.trial_starts, layout.trial_sizes, layout.trial_runs)


class _ChipJobs(NamedTuple):
    """The selection of a chip's benchmark jobs that ``load_samples`` and ``load_cell_trials`` read."""

    runs: Any  # the runs' SELECT
    run_commit: dict[str, int]  # run id -> commit index
    run_index: dict[str, int]  # run id -> index in start order
    kernel: str | None

    def jobs(self, statement):
        # Runs first, then their jobs by index: SQLite would otherwise scan the whole job table.
        statement = statement.where(JobRecord.run_id.in_(self.runs), JobRecord.kind == "benchmark")
        return statement.where(JobRecord.kernel == self.kernel) if self.kernel is not None else statement


def _chip_jobs(session: Session, chip: str, commit_ids: Sequence[int], *, include_dirty: bool, all_runs: bool,
               kernel: str | None) -> _ChipJobs:
    commit_index = {commit_id: i for i, commit_id in enumerate(commit_ids)}
    runs = _run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
    if not all_runs:
        runs = runs.where(Run.commit_id.in_(list(commit_index)))
    run_rows = session.execute(runs.with_only_columns(Run.id, Run.commit_id)
                               .order_by(Run.started_at, Run.id)).all()
    return _ChipJobs(runs, {run_id: commit_index[commit_id] for run_id, commit_id in run_rows},
                     {run_id: i for i, (run_id, _) in enumerate(run_rows)}, kernel)


_JOB_SERIES = (JobRecord.id, JobRecord.run_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
               JobRecord.shape_key)


def load_samples(session: Session, chip: str, commit_ids: Sequence[int], *, include_dirty: bool,
                 all_runs: bool = False, kernel: str | None = None) -> SampleLayout:
    """The benchmark samples of the chip's runs of ``commit_ids`` (index i: ``commit_ids[i]``), arranged by
    ``arrange_samples``; ``all_runs``: every run of the chip (its commits are all in ``commit_ids``), without the
    commit filter; ``kernel``: that kernel's series only."""
    chip_jobs = _chip_jobs(session, chip, commit_ids, include_dirty=include_dirty, all_runs=all_runs, kernel=kernel)
    job_rows = _plain_rows(session, chip_jobs.jobs(select(*_JOB_SERIES)))
    sample_rows = _plain_array(session, chip_jobs.jobs(
        select(Sample.job_id, Sample.seconds, Sample.trial).join(JobRecord, Sample.job_id == JobRecord.id)),
        _SAMPLE_ROW)
    return arrange_samples(job_rows, sample_rows, chip_jobs.run_commit, chip_jobs.run_index, len(commit_ids))


_IDS_PER_READ = 500


def _job_samples(session: Session, job_ids: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """The samples of the given jobs as ``_SAMPLE_ROW`` rows."""
    ids = job_ids.tolist()
    parts = [_plain_array(session, select(Sample.job_id, Sample.seconds, Sample.trial)
                          .where(Sample.job_id.in_(ids[start:start + _IDS_PER_READ])), _SAMPLE_ROW)
             for start in range(0, len(ids), _IDS_PER_READ)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=_SAMPLE_ROW)


def load_cell_trials(session: Session, chip: str, commit_ids: Sequence[int], *, include_dirty: bool,
                     samples_below: int) -> SampleLayout:
    """What ``load_samples`` gives of the chip's runs of ``commit_ids`` for their cells' levels and summaries, read
    from the trial summaries (``models.TrialSummary``) instead of every sample: ``trial_medians`` holds each
    trial's median and ``trial_sizes`` its valid sample count, equal to those ``load_samples`` gives, in the same
    order.  Samples are read (into ``values``, ``offsets`` valid for their cells) only for the cells of fewer
    than ``samples_below`` trials (their interval is their pooled samples') and for the jobs whose summaries do not
    account for their ``n_samples`` (written before the summaries existed, or by other means); the other trials
    have ``trial_starts`` -1.  With samples to read for most jobs, this is ``load_samples``."""
    chip_jobs = _chip_jobs(session, chip, commit_ids, include_dirty=include_dirty, all_runs=False, kernel=None)
    job_rows = _plain_rows(session, chip_jobs.jobs(
        select(*_JOB_SERIES, func.coalesce(JobRecord.n_samples, 0), func.coalesce(TrialSummary.n, -1),
               TrialSummary.trials).outerjoin(TrialSummary, TrialSummary.job_id == JobRecord.id)))
    index = _job_index(job_rows, chip_jobs.run_commit, chip_jobs.run_index, len(commit_ids))
    job_ids, job_cell = index.job_ids, index.job_cells
    unread = np.fromiter((row[6] != row[7] for row in job_rows), dtype=bool, count=len(job_rows))
    if unread.sum() * 2 > job_ids.size:
        return load_samples(session, chip, commit_ids, include_dirty=include_dirty)
    payloads, sizes, width = [], [], TRIAL_RECORD.itemsize
    for i in np.flatnonzero(~unread).tolist():
        payload = job_rows[i][8]
        if len(payload) % width:  # not a summary this harness wrote: read the samples
            unread[i] = True
        else:
            payloads.append(payload)
            sizes.append(len(payload) // width)
    summary = np.frombuffer(b"".join(payloads), dtype=TRIAL_RECORD)
    job_of = np.repeat(np.flatnonzero(~unread), sizes).astype(np.int64)
    read = _job_samples(session, job_ids[unread])
    # Trials per cell: the summaries' (valid ones) and those of the jobs read
    layout = _arranged_samples(index, read)
    keep = ~unread[job_of] & (summary["valid"] > 0)
    summary, job_of = summary[keep], job_of[keep]
    trial_counts = layout.trial_counts.ravel() + np.bincount(job_cell[job_of], minlength=layout.trial_counts.size)
    few = (trial_counts > 0) & (trial_counts < samples_below)
    more = np.flatnonzero(~unread & few[job_cell])  # their pooled samples give the interval: read them too
    if (unread.sum() + more.size) * 2 > job_ids.size:  # mostly single runs of few trials: one query reads them
        return load_samples(session, chip, commit_ids, include_dirty=include_dirty)
    if more.size:
        unread[more] = True
        read = np.concatenate([read, _job_samples(session, job_ids[more])])
        layout = _arranged_samples(index, read)
        keep = ~unread[job_of]
        summary, job_of = summary[keep], job_of[keep]
    return _merged(layout, summary, job_cell[job_of], index.job_runs[job_of])


def _rank_in_groups(cells: npt.NDArray[np.int64], runs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each entry's position within its run of equal (cell, run) pairs (the arrays sorted by them)."""
    if cells.size == 0:
        return np.zeros(0, dtype=np.int64)
    index = np.arange(cells.size)
    first = np.concatenate([[True], (cells[1:] != cells[:-1]) | (runs[1:] != runs[:-1])])
    return index - np.maximum.accumulate(np.where(first, index, 0))


def _merged(layout: SampleLayout, summary: npt.NDArray[Any], cells: npt.NDArray[np.int64],
            runs: npt.NDArray[np.int64]) -> SampleLayout:
    """``layout`` (of the samples read) with the summarised trials (``summary`` rows, their flat cells and runs)
    merged in: every cell's trials ordered by (run, trial), as ``arrange_samples`` orders them."""
    read_cells = np.repeat(np.arange(layout.trial_counts.size), layout.trial_counts.ravel())
    read_runs = layout.trial_runs
    # a (cell, run) is one job: its trials, read or summarised, come in trial order
    read_rank = _rank_in_groups(read_cells, read_runs)
    order = np.lexsort((summary["trial"], runs, cells))
    summary, cells, runs = summary[order], cells[order], runs[order]
    summary_rank = _rank_in_groups(cells, runs)
    all_cells = np.concatenate([read_cells, cells])
    all_runs = np.concatenate([read_runs, runs])
    order = np.lexsort((np.concatenate([read_rank, summary_rank]), all_runs, all_cells))
    read_medians = sorted_medians(layout.values, layout.trial_starts, layout.trial_sizes)
    medians = np.concatenate([read_medians, summary["median"]])[order]
    starts = np.concatenate([layout.trial_starts, np.full(cells.size, -1, dtype=np.int64)])[order]
    sizes = np.concatenate([layout.trial_sizes, summary["valid"]])[order]
    shape = layout.counts.shape
    trial_counts = np.bincount(all_cells, minlength=layout.counts.size).astype(np.int64)
    trial_offsets = (np.concatenate([[0], np.cumsum(trial_counts)[:-1]]).astype(np.int64) if trial_counts.size
                     else trial_counts)
    counts = layout.counts.ravel() + np.bincount(cells, summary["valid"], minlength=layout.counts.size).astype(
        np.int64)
    return layout._replace(counts=counts.reshape(shape), trial_counts=trial_counts.reshape(shape),
                           trial_offsets=trial_offsets.reshape(shape), trial_starts=starts.astype(np.int64),
                           trial_sizes=sizes.astype(np.int64), trial_runs=all_runs[order].astype(np.int64),
                           trial_medians=medians)


class SampleLayout(NamedTuple):
    """A chip's samples arranged per (commit, series) cell and per trial: the arrays of ``ChipHistory``."""

    series: list[tuple[str, str, str, str]]  # (kernel, variant, dtype, shape key) per series index
    counts: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    trial_counts: npt.NDArray[np.int64]
    trial_offsets: npt.NDArray[np.int64]
    trial_starts: npt.NDArray[np.int64]
    trial_sizes: npt.NDArray[np.int64]
    trial_runs: npt.NDArray[np.int64]
    has_jobs: npt.NDArray[np.bool_]  # (n_commits, n_series): a benchmark job of the cell exists (samples or not)
    trial_medians: npt.NDArray[np.float64] | None = None  # given where not every trial's samples were read


def arrange_samples(job_rows: Sequence[tuple], sample_rows: Sequence[tuple] | npt.NDArray[Any],
                    run_commit: dict[str, int], run_index: dict[str, int], n_commits: int) -> SampleLayout:
    """Group benchmark samples as ``ChipHistory`` holds them. ``job_rows``: (job id, run id, kernel, variant, dtype,
    shape key); ``sample_rows``: (job id, seconds, trial), tuples or a ``_SAMPLE_ROW`` array; ``run_commit``: run id
    -> commit index; ``run_index``: run id -> its index in start order. Each cell's samples are contiguous, grouped
    by (run, trial), each trial's samples sorted: everything computed from one cell depends on that cell's samples
    only."""
    return _arranged_samples(_job_index(job_rows, run_commit, run_index, n_commits), sample_rows)


class _JobIndex(NamedTuple):
    """Benchmark job rows numbered: the series (first seen first) and per job its id, flat cell and run index."""

    series: list[tuple[str, str, str, str]]
    job_ids: npt.NDArray[np.int64]
    job_cells: npt.NDArray[np.int64]  # commit index * n_series + series index
    job_runs: npt.NDArray[np.int64]
    n_runs: int
    has_jobs: npt.NDArray[np.bool_]


def _job_index(job_rows: Sequence[tuple], run_commit: dict[str, int], run_index: dict[str, int],
               n_commits: int) -> _JobIndex:
    """``job_rows``: (job id, run id, kernel, variant, dtype, shape key, ...)."""
    series_index: dict[tuple[str, str, str, str], int] = {}
    job_ids = np.empty(len(job_rows), dtype=np.int64)
    job_cells = np.empty(len(job_rows), dtype=np.int64)
    job_commit = np.empty(len(job_rows), dtype=np.int64)
    job_run = np.empty(len(job_rows), dtype=np.int64)
    for i, row in enumerate(job_rows):
        job_ids[i] = row[0]
        job_commit[i] = run_commit[row[1]]
        job_run[i] = run_index[row[1]]
        job_cells[i] = series_index.setdefault(tuple(row[2:6]), len(series_index))
    n_series = len(series_index)
    has_jobs = np.zeros((n_commits, n_series), dtype=bool)
    has_jobs[job_commit, job_cells] = True
    job_cells += job_commit * n_series
    return _JobIndex(list(series_index), job_ids, job_cells, job_run, len(run_index), has_jobs)


def _arranged_samples(index: _JobIndex, sample_rows: Sequence[tuple] | npt.NDArray[Any]) -> SampleLayout:
    job_ids, job_cells, job_run, has_jobs = index.job_ids, index.job_cells, index.job_runs, index.has_jobs
    n_commits, n_series = has_jobs.shape
    samples = (sample_rows if isinstance(sample_rows, np.ndarray)
               else np.fromiter(sample_rows, dtype=_SAMPLE_ROW, count=len(sample_rows)))
    del sample_rows
    valid = np.isfinite(samples["seconds"]) & (samples["seconds"] > 0)
    sample_jobs, seconds, trial = samples["job"][valid], samples["seconds"][valid], samples["trial"][valid]
    del samples
    order = np.argsort(job_ids)
    job_of = order[np.searchsorted(job_ids[order], sample_jobs)] if job_ids.size else sample_jobs[:0]
    cells = job_cells[job_of]
    # One key per trial, (cell, run, trial) in this order: a cell's samples stay contiguous, grouped by trial.
    if trial.size and trial.min() < 0:
        trial = np.unique(trial, return_inverse=True)[1].reshape(-1)
    per_run = int(trial.max()) + 1 if trial.size else 1
    per_cell = per_run * max(index.n_runs, 1)
    keys = cells * per_cell + job_run[job_of] * per_run + trial
    by_trial = np.argsort(keys, kind="stable")  # the rows come nearly in this order: much faster than a lexsort
    keys, values = keys[by_trial], seconds[by_trial]
    del by_trial
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if keys.size else keys
    sizes = np.diff(np.append(starts, keys.size))
    for size in np.unique(sizes).tolist():  # each trial's samples sorted, trials of one size at a time
        rows = starts[sizes == size][:, None] + np.arange(size)
        values[rows] = np.sort(values[rows], axis=1)
    trial_cell = keys[starts] // per_cell
    counts = np.bincount(cells, minlength=n_commits * n_series).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts.size else counts
    trial_counts = np.bincount(trial_cell, minlength=n_commits * n_series).astype(np.int64)
    trial_offsets = (np.concatenate([[0], np.cumsum(trial_counts)[:-1]]).astype(np.int64) if trial_counts.size
                     else trial_counts)
    shape = (n_commits, n_series)
    return SampleLayout(list(index.series), counts.reshape(shape), offsets.reshape(shape), values,
                        trial_counts.reshape(shape), trial_offsets.reshape(shape), starts.astype(np.int64),
                        sizes.astype(np.int64), (keys[starts] // per_run % max(index.n_runs, 1)).astype(np.int64),
                        has_jobs)


# The correctness evidence of a commit's history: kernel checks and repository tests (a pytest selection's own row
# fails with any of its tests, so its tests speak for it).
EVENT_KINDS = ("correctness", "test")


def correctness_statuses(store: Store, chip: str, *, include_dirty: bool = False,
                         commits: Collection[int] | None = None) -> list[tuple[int, str, str]]:
    """``(commit id, job key, status)`` of every correctness job of the chip's clean runs (all with
    ``include_dirty``; of ``commits`` only, when given), unordered."""
    with store.session() as session:
        return _plain_rows(session, select(Run.commit_id, JobRecord.key, JobRecord.status).select_from(JobRecord)
                           .join(Run, JobRecord.run_id == Run.id)
                           .where(JobRecord.run_id.in_(_chip_runs(chip, include_dirty, commits)),
                                  JobRecord.kind.in_(EVENT_KINDS)))


def _chip_runs(chip: str, include_dirty: bool, commits: Collection[int] | None = None):
    """The chip's (clean) run ids (of ``commits``, when given) as a subquery: SQLite then reads their jobs by index
    instead of the job table."""
    runs = _run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
    return runs if commits is None else runs.where(Run.commit_id.in_(sorted(commits)))


def failing_correctness_jobs(store: Store, chip: str, *, include_dirty: bool = False,
                             commits: Collection[int] | None = None) -> list[tuple]:
    """``(commit id, job key, kernel, variant, dtype, shape_key, check, status, detail)`` of every failing
    correctness job and repository test (``CODE_FAILURES``) of the chip's clean runs (all with ``include_dirty``;
    of ``commits`` only, when given), in run start order, then job order. A test's ``kernel`` is its selection and
    its ``check`` its node id."""
    with store.session() as session:
        rows = session.execute(
            select(Run.commit_id, JobRecord.key, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                   JobRecord.shape_key, JobRecord.check_name, JobRecord.status, JobRecord.detail, JobRecord.kind,
                   JobRecord.name)
            .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id)
            .where(JobRecord.run_id.in_(_chip_runs(chip, include_dirty, commits)), JobRecord.kind.in_(EVENT_KINDS),
                   JobRecord.status.in_(CODE_FAILURES))
            .order_by(Run.started_at, JobRecord.id))
        return [(*row[:6], row.name if row.kind == "test" else row.check_name, *row[7:9]) for row in rows]


# ---------------------------------------------------------------------------------------------------------------
# The report's evidence path: every run in brief (commit links, run ids per commit) and raw samples per job
# ---------------------------------------------------------------------------------------------------------------


class RunBrief(NamedTuple):
    """A run without its jobs: what the report needs to name it, link its commit and place it in time."""

    id: str
    chip: str
    sha: str
    repo: str  # the commit's repository as recorded (its origin URL, else its folder name)
    started_at: datetime | None
    dirty: bool


def run_briefs(store: Store) -> list[RunBrief]:
    """Every run, in start order, in one query."""
    with store.session() as session:
        rows = session.execute(
            select(Run.id, Chip.key, Commit.sha, Commit.repo, Run.started_at, Run.dirty)
            .select_from(Run).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
            .order_by(Run.started_at, Run.id))
        return [RunBrief(run_id, chip, sha, repo or "", started, bool(dirty))
                for run_id, chip, sha, repo, started, dirty in rows]


class JobSamples(NamedTuple):
    """One benchmark job's stored samples, each ``(trial, idx, seconds)`` in trial then index order (every stored
    value, non-finite ones included: the caller decides what it can draw)."""

    run_id: str
    key: str
    series: SeriesKey
    samples: list[tuple[int, int, float]]


def job_samples(store: Store, run_ids: Sequence[str], kernels: Iterable[str] | None = None) -> list[JobSamples]:
    """The raw samples of every benchmark job (of ``kernels`` only, when given) of the given runs that stored any,
    in job order."""
    if not run_ids:
        return []
    statement = (
        select(JobRecord.id, JobRecord.run_id, JobRecord.key, JobRecord.kernel, JobRecord.variant,
               JobRecord.dtype, JobRecord.shape_key, Chip.key, Sample.trial, Sample.idx, Sample.seconds)
        .select_from(Sample).join(JobRecord, Sample.job_id == JobRecord.id)
        .join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
        .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark")
        .order_by(JobRecord.id, Sample.trial, Sample.idx))
    if kernels is not None:  # ``|| ''``: SQLite then reads the runs' jobs, not every job of the kernels (an index)
        statement = statement.where((JobRecord.kernel + "").in_(sorted(kernels)))
    with store.session() as session:
        rows = _plain_rows(session, statement)
        jobs = []
        for _, group in groupby(rows, key=itemgetter(0)):
            group = list(group)
            first = group[0]
            jobs.append(JobSamples(first[1], first[2], SeriesKey(*first[3:8]),
                                   [(int(trial), int(idx), float(seconds)) for *_, trial, idx, seconds in group]))
        return jobs
