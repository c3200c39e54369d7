"""Record side of the report's analysis cache (``harness.analysis.cache`` decides what to keep and when to trust it).

The ``analysis_cache`` table holds derived results as opaque payloads, one row per (chip, kind, name), each with the
``key`` (a digest of the inputs it was computed from) under which it may be reused.  This module reads and writes
those rows (``read_entries``, ``write_entries``: an upsert, so concurrent reports never collide), and reads what the
keys are made of without touching samples: the chip's runs with a summary of their job ids (``chip_state``: a run's
fingerprint changes when it is added, deleted, reaped or finished, re-dated, made dirty or clean, or gains or loses
jobs -- a bundle import adds runs like any writer; the summaries are kept in a row of their own and brought up to
date from the jobs added since, ``job_id_summaries``), plus the runs that gained samples since
a sample id (``touched_since``: a later trial of a stored job adds samples without adding a job).  It also loads the
samples of chosen commits only (``commit_history``): the cells of a commit that changed, not the chip's whole history.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, func, select
from sqlalchemy.exc import SQLAlchemyError

from harness.record import query
from harness.record.db import upsert_insert
from harness.record.models import AnalysisCache, AnalysisStamp, Chip, JobRecord, Run, Sample, utcnow
from harness.record.store import Store

__all__ = ["ChipState", "Entry", "arrangement", "chip_jobs", "chip_state", "clean_state", "clear", "commit_history",
           "correctness_rows", "entry_keys", "job_id_summaries", "read_entries", "run_prints", "stamp",
           "touched_since", "write_entries"]


@dataclass(frozen=True)
class Entry:
    """One cached result: the key it is valid under, the sample watermark it was validated at, its bytes."""

    key: str
    payload: bytes
    watermark: int | None = None


def read_entries(store: Store, chip: str, kind: str, names: Collection[str] | None = None) -> dict[str, Entry]:
    """The chip's rows of ``kind`` (only ``names`` when given), by name, each with its watermark as stamped."""
    statement = select(AnalysisCache.name, AnalysisCache.key, AnalysisCache.payload, AnalysisCache.watermark).where(
        AnalysisCache.chip == chip, AnalysisCache.kind == kind)
    if names is not None:
        if not names:
            return {}
        statement = statement.where(AnalysisCache.name.in_(list(names)))
    with store.session() as session:
        rows = query.plain_rows(session, statement)
        stamps = _stamps(session, chip, kind, [row[0] for row in rows])
    return {name: Entry(key, bytes(payload), _stamped(watermark, stamps.get(name), key))
            for name, key, payload, watermark in rows}


def entry_keys(store: Store, chip: str, kind: str, names: Collection[str]) -> dict[str, tuple[str, int | None]]:
    """The key and watermark (as stamped) of the chip's rows of ``kind`` named ``names``, by name (their payloads
    not read)."""
    if not names:
        return {}
    with store.session() as session:
        rows = session.execute(select(AnalysisCache.name, AnalysisCache.key, AnalysisCache.watermark).where(
            AnalysisCache.chip == chip, AnalysisCache.kind == kind, AnalysisCache.name.in_(list(names)))).all()
        stamps = _stamps(session, chip, kind, [row[0] for row in rows])
    return {name: (key, _stamped(watermark, stamps.get(name), key)) for name, key, watermark in rows}


def _stamps(session: Any, chip: str, kind: str, names: list[str]) -> dict[str, tuple[str, int]]:
    """The stamps (``stamp``) of the chip's rows of ``kind`` named ``names``: name -> (key, watermark)."""
    if not names:
        return {}
    return {name: (key, watermark) for name, key, watermark in session.execute(
        select(AnalysisStamp.name, AnalysisStamp.key, AnalysisStamp.watermark).where(
            AnalysisStamp.chip == chip, AnalysisStamp.kind == kind, AnalysisStamp.name.in_(names)))}


def _stamped(watermark: int | None, stamp: tuple[str, int] | None, key: str) -> int | None:
    """A row's watermark, raised by its stamp when that was made under the row's key."""
    if stamp is None or stamp[0] != key:
        return watermark
    return stamp[1] if watermark is None else max(watermark, stamp[1])


def _upsert(dialect: str, table: Any = AnalysisCache):
    statement = upsert_insert(dialect, table)
    if statement is None:
        raise ValueError(f"no upsert for {dialect}")
    return statement


def write_entries(store: Store, chip: str, kind: str, entries: Mapping[str, Entry], *,
                  keep: Collection[str] | None = None) -> None:
    """Insert or replace rows of ``kind`` in one transaction (a concurrent report writing the same rows wins or
    loses whole rows), each with its own watermark (an earlier stamp of it is dropped). ``keep``: the chip's rows of
    ``kind`` named neither there nor in ``entries`` are deleted."""
    now = utcnow()
    rows = [{"chip": chip, "kind": kind, "name": name, "key": entry.key, "payload": entry.payload,
             "watermark": entry.watermark, "updated_at": now} for name, entry in entries.items()]
    with store.writing() as session:
        if keep is not None:
            for table in (AnalysisCache, AnalysisStamp):
                session.execute(delete(table).where(table.chip == chip, table.kind == kind,
                                                    table.name.not_in([*keep, *entries])))
        if rows:
            names = list(entries)
            for start in range(0, len(names), 500):
                session.execute(delete(AnalysisStamp).where(AnalysisStamp.chip == chip, AnalysisStamp.kind == kind,
                                                            AnalysisStamp.name.in_(names[start:start + 500])))
            statement = _upsert(session.get_bind().dialect.name)
            statement = statement.on_conflict_do_update(
                index_elements=["chip", "kind", "name"],
                set_={"key": statement.excluded.key, "payload": statement.excluded.payload,
                      "watermark": statement.excluded.watermark, "updated_at": statement.excluded.updated_at})
            for start in range(0, len(rows), 200):
                session.execute(statement, rows[start:start + 200])


def stamp(store: Store, chip: str, kind: str, name: str, key: str, watermark: int) -> None:
    """Raise the watermark of the row (chip, kind, name) to ``watermark`` while its key is ``key``: the caller found
    none of its runs touched above its watermark (``touched_since``) and nothing above ``watermark`` was read then, so
    the next check reads the samples written since this one only, not every sample since the row was written (a
    chip whose rows are reused, run after run on another chip, would read more at each report). Kept in a row of its
    own (``AnalysisStamp``: an update of the row itself writes its payload again). A failed write only leaves the
    next check reading more."""
    try:
        with store.writing() as session:
            statement = _upsert(session.get_bind().dialect.name, AnalysisStamp).values(
                chip=chip, kind=kind, name=name, key=key, watermark=watermark)
            stamped = AnalysisStamp.__table__.c
            session.execute(statement.on_conflict_do_update(  # raised only, as the row's own watermark was
                index_elements=["chip", "kind", "name"],
                set_={"key": statement.excluded.key, "watermark": statement.excluded.watermark},
                where=(stamped.key != statement.excluded.key) | (stamped.watermark < statement.excluded.watermark)))
    except SQLAlchemyError:
        pass


def clear(store: Store, chip: str | None = None) -> int:
    """Delete the cached analysis (of one chip, or all); returns the rows deleted."""
    with store.writing() as session:
        statement, stamps = delete(AnalysisCache), delete(AnalysisStamp)
        if chip is not None:
            statement, stamps = statement.where(AnalysisCache.chip == chip), stamps.where(AnalysisStamp.chip == chip)
        session.execute(stamps)
        return session.execute(statement).rowcount or 0


# ---------------------------------------------------------------------------------------------------------------
# What the keys are made of
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChipState:
    """The chip's included runs, per commit id: each run's fingerprint -- its id, commit, dirty flag, start and
    finish, status, branch and the count, min, max and sum of its job ids (one index-only aggregate) -- sorted; and
    ``watermark``, the highest sample id, read before anything else (samples with a higher id may be in what is read
    afterwards; they are looked for again next time)."""

    watermark: int
    runs: dict[int, tuple[tuple[Any, ...], ...]]
    run_commit: dict[str, int]
    unfinished: set[int]  # commits with a run not finished (still writing, or abandoned unseen)
    dirty: frozenset[str] = frozenset()  # the dirty runs among them
    open: frozenset[str] = frozenset()  # the runs not finished


_RUN_COLUMNS = (Run.id, Run.commit_id, Run.dirty, Run.started_at, Run.finished_at, Run.status, Run.branch)


JobIds = dict[str, tuple[int, int, int, int]]  # per run: the count, min, max and sum of its job ids

_JOB_IDS_CHIP, _JOB_IDS_KIND, _JOB_IDS_NAME = "", "job-ids", ""  # the row that keeps every run's ``JobIds``
_JOB_IDS_FORMAT = "job-ids-1"  # that row's key: the payload's format


def job_id_summaries(store: Store) -> JobIds:
    """Every run's count, min, max and sum of its job ids: kept in the analysis cache and brought up to date from
    the jobs above the highest id it summed. That is all it needs to read: the harness adds jobs and deletes none
    (a run's jobs go with the run). It is summed anew from every job (an index-only aggregate, ~0.1 s per million
    jobs) where the table does not add up -- not as many jobs as it summed plus those above, or its highest job in
    another run now (a job deleted by other means, and its id taken again) -- or where its row is missing or
    unreadable. Stored again when it changed; a failed write costs only time."""
    kept = _job_id_state(read_entries(store, _JOB_IDS_CHIP, _JOB_IDS_KIND, [_JOB_IDS_NAME]).get(_JOB_IDS_NAME))
    with store.session() as session:
        found = (_job_ids_added(session, kept) if kept is not None else None) or _job_ids_summed(session)
    if found is not kept:
        try:
            write_entries(store, _JOB_IDS_CHIP, _JOB_IDS_KIND,
                          {_JOB_IDS_NAME: Entry(_JOB_IDS_FORMAT, found.to_bytes())})
        except SQLAlchemyError:  # a read-only database, a lock held too long: summed again next time
            pass
    return found.runs


@dataclass(frozen=True)
class _JobIdState:
    runs: JobIds
    count: int  # the jobs summed
    top: int  # the highest id among them (0: none)
    top_run: str  # its run

    def to_bytes(self) -> bytes:
        return json.dumps([self.count, self.top, self.top_run, self.runs], separators=(",", ":")).encode()


def _job_id_state(entry: Entry | None) -> _JobIdState | None:
    if entry is None or entry.key != _JOB_IDS_FORMAT:
        return None
    try:
        count, top, top_run, runs = json.loads(entry.payload)
        return _JobIdState({str(run): (int(n), int(low), int(high), int(total)) for run, (n, low, high, total)
                            in runs.items()}, int(count), int(top), str(top_run))
    except (ValueError, TypeError, AttributeError):
        return None


def _job_ids_added(session: Any, kept: _JobIdState) -> _JobIdState | None:
    """``kept`` with the jobs above its highest id added, or None where the table does not add up."""
    added = query.plain_rows(session, select(JobRecord.run_id, JobRecord.id).where(JobRecord.id > kept.top))
    # counted after the jobs above were read: a job written in between makes it not add up (summed anew), not lost
    count = session.scalar(select(func.count()).select_from(JobRecord)) or 0
    if count != kept.count + len(added):
        return None
    if kept.top and session.scalar(select(JobRecord.run_id).where(JobRecord.id == kept.top)) != kept.top_run:
        return None
    if not added:
        return kept
    runs = dict(kept.runs)
    for run_id, job_id in added:
        n, low, high, total = runs.get(run_id, (0, job_id, job_id, 0))
        runs[run_id] = (n + 1, min(low, job_id), max(high, job_id), total + job_id)
    top_run, top = max(added, key=lambda row: row[1])
    return _JobIdState(runs, count, int(top), str(top_run))


def _job_ids_summed(session: Any) -> _JobIdState:
    runs: JobIds = {run_id: (int(n), int(low), int(high), int(total)) for run_id, n, low, high, total in
                    session.execute(select(JobRecord.run_id, func.count(JobRecord.id), func.min(JobRecord.id),
                                           func.max(JobRecord.id), func.sum(JobRecord.id))
                                    .group_by(JobRecord.run_id))}
    top_run = max(runs, key=lambda run: runs[run][2], default="")
    return _JobIdState(runs, sum(n for n, *_ in runs.values()), runs[top_run][2] if top_run else 0, top_run)


def _fingerprint(row: Any, jobs: Mapping[str, tuple[int, int, int, int]]) -> tuple[Any, ...]:
    """A run's fingerprint from its ``_RUN_COLUMNS`` row and ``job_id_summaries``."""
    run_id, commit_id, dirty, started, finished, status, branch = row
    return (run_id, commit_id, bool(dirty), str(started), str(finished), status, branch,
            *jobs.get(run_id, (0, 0, 0, 0)))


def chip_state(store: Store, chip: str, *, include_dirty: bool = False, jobs: JobIds | None = None) -> ChipState:
    """``jobs``: ``job_id_summaries``, when the caller read them (for several chips; read earlier, they can only
    miss jobs, which changes the fingerprints next time: nothing is reused under them)."""
    with store.session() as session:
        watermark = session.scalar(select(func.max(Sample.id))) or 0
    jobs = jobs if jobs is not None else job_id_summaries(store)
    runs = query.run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
    with store.session() as session:
        per_commit: dict[int, list[tuple[Any, ...]]] = {}
        run_commit: dict[str, int] = {}
        unfinished: set[int] = set()
        dirty, open_runs = set(), set()
        for row in session.execute(runs.with_only_columns(*_RUN_COLUMNS)):
            run_id, commit_id, finished = row[0], row[1], row[4]
            run_commit[run_id] = commit_id
            if finished is None:
                unfinished.add(commit_id)
                open_runs.add(run_id)
            if row[2]:
                dirty.add(run_id)
            per_commit.setdefault(commit_id, []).append(_fingerprint(row, jobs))
    return ChipState(int(watermark), {c: tuple(sorted(rows)) for c, rows in per_commit.items()}, run_commit,
                     unfinished, frozenset(dirty), frozenset(open_runs))


def clean_state(state: ChipState) -> ChipState:
    """``chip_state(include_dirty=False)`` from ``state`` (``chip_state(include_dirty=True)``: read once, the report
    needs both)."""
    run_commit = {run_id: commit for run_id, commit in state.run_commit.items() if run_id not in state.dirty}
    runs = {}
    for commit, prints in state.runs.items():
        kept = tuple(p for p in prints if p[0] not in state.dirty)
        if kept:
            runs[commit] = kept
    return ChipState(state.watermark, runs, run_commit, {run_commit[r] for r in state.open if r in run_commit},
                     frozenset(), state.open & run_commit.keys())


def run_prints(store: Store, run_ids: Collection[str], *, jobs: JobIds | None = None) -> dict[str, tuple[Any, ...]]:
    """Per given run: its fingerprint (``chip_state``'s: id, commit, dirty flag, start, finish, status, branch, the
    count/min/max/sum of its job ids) and the highest id of its samples (a later trial adds samples, not jobs:
    ``newest_samples`` for a finished run, read from its jobs for one still writing). ``jobs``: as
    ``chip_state``'s."""
    if not run_ids:
        return {}
    ids = sorted(set(run_ids))
    jobs = jobs if jobs is not None else job_id_summaries(store)
    with store.session() as session:
        rows = list(session.execute(select(*_RUN_COLUMNS).where(Run.id.in_(ids))))
    finished = {row.id: row.finished_at is not None for row in rows}
    newest = newest_samples(store, [run_id for run_id, done in finished.items() if done])
    newest.update(_newest_by_jobs(store, [run_id for run_id, done in finished.items() if not done]))
    return {row[0]: (*_fingerprint(row, jobs), int(newest.get(row[0]) or 0)) for row in rows}


def _newest_by_jobs(store: Store, run_ids: Collection[str]) -> dict[str, int]:
    """Each run's highest sample id, from its jobs' (one index seek a job, not every sample's entry); runs without
    samples left out."""
    if not run_ids:
        return {}
    per_job = select(func.max(Sample.id)).where(Sample.job_id == JobRecord.id).scalar_subquery()
    with store.session() as session:
        return {run_id: int(newest) for run_id, newest in session.execute(
            select(JobRecord.run_id, func.max(per_job)).where(JobRecord.run_id.in_(sorted(run_ids)))
            .group_by(JobRecord.run_id)) if newest is not None}


_NEWEST_CHIP, _NEWEST_KIND, _NEWEST_NAME = "", "newest-samples", ""  # the row that keeps finished runs' newest ids
_NEWEST_FORMAT = "newest-samples-1"  # that row's key: the payload's format


@dataclass
class _NewestSamples:
    """Finished runs' highest sample ids as of sample ``top`` (whose job is ``top_job``): a sample written since
    has a higher id, and the harness deletes none but with their run. ``changed``: not stored as it is."""

    runs: dict[str, int]
    top: int
    top_job: int
    changed: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps([self.top, self.top_job, self.runs], separators=(",", ":")).encode()


def newest_samples(store: Store, run_ids: Collection[str]) -> dict[str, int]:
    """The highest sample id of each of ``run_ids`` (finished runs: a run still writing may yet get samples with
    lower ids, on PostgreSQL), runs without samples left out -- what ``_newest_by_jobs`` reads, one index seek per
    job, 0.2 s of CPU for the 200-odd runs a report's compare pages name on the 1,000-commit benchmark. Kept in the
    analysis cache and brought up to date from the samples above the highest id it has seen (an id range: a new
    run's), once within ``store.memoised``; a run it has not seen is read from its jobs and added. Read anew where
    its highest sample is gone or in another job now (deleted, and the id maybe taken again) or its row is missing
    or unreadable. Stored again when it changed; a failed write costs only time."""
    if not run_ids:
        return {}
    state = store.memo(("newest samples",), lambda: _newest_state(store))
    missing = [run_id for run_id in run_ids if run_id not in state.runs]
    if missing:
        found = _newest_by_jobs(store, missing)
        state.runs.update({run_id: found.get(run_id, 0) for run_id in missing})
        state.changed = True
    if state.changed:  # once a report, where it moved or learnt runs: the first call does both
        state.changed = False
        try:
            write_entries(store, _NEWEST_CHIP, _NEWEST_KIND, {_NEWEST_NAME: Entry(_NEWEST_FORMAT, state.to_bytes())})
        except SQLAlchemyError:  # a read-only database, a lock held too long: read again next time
            pass
    return {run_id: state.runs[run_id] for run_id in run_ids if state.runs[run_id]}


def _newest_state(store: Store) -> _NewestSamples:
    """The kept state (``newest_samples``) brought up to date, or a new one; ``changed`` where it is not the stored
    one (stored by the caller, after this reading session: one outside a report's ``reading`` holds the write
    lock)."""
    kept = _newest_in(read_entries(store, _NEWEST_CHIP, _NEWEST_KIND, [_NEWEST_NAME]).get(_NEWEST_NAME))
    with store.session() as session:
        if kept is not None and kept.top and session.scalar(
                select(Sample.job_id).where(Sample.id == kept.top)) != kept.top_job:
            kept = None
        if kept is None:  # from the highest sample on: every run is read from its jobs when first asked for
            top, top_job = session.execute(select(Sample.id, Sample.job_id).order_by(Sample.id.desc()).limit(1)
                                           ).first() or (0, 0)
            return _NewestSamples({}, int(top), int(top_job), changed=True)
        per_job = _samples_above(session, kept.top)
        if per_job:  # a run not seen yet is left out: it is read from its jobs when asked for
            for run_id, newest in _per_run(session, per_job, kept.runs).items():
                kept.runs[run_id] = max(kept.runs[run_id], newest)
            kept.top_job, kept.top = max(per_job.items(), key=lambda item: item[1])
            kept.changed = True
    return kept


def _samples_above(session: Any, watermark: int) -> dict[int, int]:
    """Per job with a sample whose id is above ``watermark``: its highest sample id (an id range is read)."""
    per_job: dict[int, int] = {}
    # no GROUP BY: SQLite would scan a whole index for it instead of the id range
    for job_id, sample_id in query.plain_rows(session, select(Sample.job_id, Sample.id).where(
            Sample.id > watermark)):
        if sample_id > per_job.get(job_id, -1):
            per_job[job_id] = sample_id
    return per_job


def _per_run(session: Any, per_job: Mapping[int, int], runs: Container[str] | None) -> dict[str, int]:
    """``per_job``'s highest sample ids per run, for the runs of ``runs`` (None: every run)."""
    found: dict[str, int] = {}
    jobs = sorted(per_job)
    for start in range(0, len(jobs), 5000):
        for job_id, run_id in session.execute(select(JobRecord.id, JobRecord.run_id).where(
                JobRecord.id.in_(jobs[start:start + 5000]))):
            if runs is None or run_id in runs:
                found[run_id] = max(found.get(run_id, 0), int(per_job[job_id]))
    return found


def _newest_in(entry: Entry | None) -> _NewestSamples | None:
    if entry is None or entry.key != _NEWEST_FORMAT:
        return None
    try:
        top, top_job, runs = json.loads(entry.payload)
        return _NewestSamples({str(run): int(newest) for run, newest in runs.items()}, int(top), int(top_job))
    except (ValueError, TypeError, AttributeError):
        return None


def touched_since(store: Store, run_commit: Mapping[str, int], watermark: int) -> dict[str, int]:
    """Per run of ``run_commit`` with a sample whose id is above ``watermark`` (a job written since, or a later
    trial of a stored one): its highest sample id. Reads the samples above the watermark only (an id range), then
    their jobs: once per watermark within ``Store.memoised`` (a report asks it of each chip's cached rows, with the
    watermark they were all stamped with)."""
    def read() -> dict[str, int]:
        with store.session() as session:
            return _per_run(session, _samples_above(session, watermark), None)

    return {run: top for run, top in store.memo(("runs' samples above", watermark), read).items() if run in run_commit}


def chip_jobs(store: Store, chip: str, kinds: Collection[str], *, runs: Collection[str] | None = None
              ) -> list[tuple[str, str, str, str, str, str, bool]]:
    """The distinct (kind, key, kernel, variant, dtype, shape key, measured) of the jobs of ``kinds`` in all the
    chip's runs (dirty ones too; ``runs``: in those runs only), sorted; ``measured``: the job has a median time. What
    ``query.job_units`` and ``query.benchmark_series`` read of the chip (the runs first, then their jobs by index)."""
    if runs is not None:
        if not runs:
            return []
        chosen: Any = sorted(runs)
    else:
        chosen = select(Run.id).join(Chip, Run.chip_id == Chip.id).where(Chip.key == chip)
    with store.session() as session:
        rows = session.execute(
            select(JobRecord.kind, JobRecord.key, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                   JobRecord.shape_key, JobRecord.median_s.is_not(None)).distinct()
            .where(JobRecord.run_id.in_(chosen), JobRecord.kind.in_(sorted(kinds)))).all()
    return sorted((*row[:6], bool(row[6])) for row in rows)


def correctness_rows(store: Store, chip: str, *, include_dirty: bool = False, commits: Collection[int] | None = None
                     ) -> tuple[list[tuple], list[tuple]]:
    """``query.correctness_statuses`` and ``query.failing_correctness_jobs`` of the chip (of ``commits`` only, when
    given), as plain tuples."""
    return ([tuple(row) for row in query.correctness_statuses(store, chip, include_dirty=include_dirty,
                                                               commits=commits)],
            [tuple(row) for row in query.failing_correctness_jobs(store, chip, include_dirty=include_dirty,
                                                                   commits=commits)])


def arrangement(store: Store, chip: str, *, include_dirty: bool = False, last: int | None = None
                ) -> tuple[list[tuple], list[int], list[bool], list[int]]:
    """``query.chip_history``'s commits in history order, previous commits, window and lines, without samples."""
    return query.arranged_in(store, chip, include_dirty, last)


def commit_history(store: Store, chip: str, commits: list[tuple], *, include_dirty: bool = False,
                   samples_below: int | None = None) -> tuple[query.ChipHistory, npt.NDArray[np.bool_]]:
    """The samples of the given commits only (rows of ``arrangement``'s commits) as a ``query.ChipHistory`` of
    those commits (no previous commits, all shown, one line): each cell grouped exactly as ``query.chip_history``
    groups it -- its runs in start order, their trials, each trial's samples sorted -- so everything computed
    from one cell's samples is the same bit for bit; and per (commit, series) whether a benchmark job of it is
    there (with or without a valid sample: ``query.chip_history`` lists the series of every such job).

    ``samples_below``: read the trial summaries instead (``query.load_cell_trials``): every trial's median and
    valid sample count, and the samples of the cells of fewer trials only; the history's ``trials`` then works
    for those cells alone."""
    with store.session() as session:
        if samples_below is None:
            layout = query.load_samples(session, chip, [row[0] for row in commits], include_dirty=include_dirty)
        else:
            layout = query.load_cell_trials(session, chip, [row[0] for row in commits], include_dirty=include_dirty,
                                            samples_below=samples_below)
    n_commits = len(commits)
    return query.ChipHistory(chip, list(commits), [query.SeriesKey(*series, chip) for series in layout.series],
                             layout.counts, layout.offsets, layout.values, np.full(n_commits, -1, dtype=np.int64),
                             np.ones(n_commits, dtype=bool), np.zeros(n_commits, dtype=np.int64),
                             layout.trial_counts, layout.trial_offsets, layout.trial_starts, layout.trial_sizes,
                             layout.trial_runs, _trial_medians=layout.trial_medians), layout.has_jobs
