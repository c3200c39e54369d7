"""The report's evidence path: every run in brief (commit links, run ids per commit) and raw samples per job."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from sqlalchemy import select

from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.query.common import SeriesKey, plain_rows
from harness.record.store import Store


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
    in job order. Two reads: the jobs, then their samples as numbers alone (a job's names once, not per sample)."""
    if not run_ids:
        return []
    jobs_of_runs = (JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark")
    if kernels is not None:  # ``|| ''``: SQLite then reads the runs' jobs, not every job of the kernels (an index)
        jobs_of_runs += ((JobRecord.kernel + "").in_(sorted(kernels)),)
    with store.session() as session:
        named = {row[0]: row[1:] for row in plain_rows(session, (
            select(JobRecord.id, JobRecord.run_id, JobRecord.key, JobRecord.kernel, JobRecord.variant,
                   JobRecord.dtype, JobRecord.shape_key, Chip.key)
            .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
            .where(*jobs_of_runs)))}
        rows = plain_rows(session, (
            select(Sample.job_id, Sample.trial, Sample.idx, Sample.seconds)
            .select_from(Sample).join(JobRecord, Sample.job_id == JobRecord.id)
            .where(*jobs_of_runs).order_by(Sample.job_id, Sample.trial, Sample.idx)))
        jobs = []
        for job_id, group in groupby(rows, key=itemgetter(0)):
            run_id, key, *series = named[job_id]
            jobs.append(JobSamples(run_id, key, SeriesKey(*series),
                                   [(int(trial), int(idx), float(seconds)) for _, trial, idx, seconds in group]))
        return jobs
