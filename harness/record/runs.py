"""Stored runs of a commit on a chip, their job rows and samples, for reuse by `harness bisect`. It owns the read
queries a bisect needs: which clean runs of a commit exist on a chip (:func:`clean_runs`), every job row of some
runs (:func:`job_rows`, as :class:`StoredJob` tuples) and the timing samples of some jobs, pooled
(:func:`job_samples`) or per trial (:func:`job_trials`: one list per independent process, which is what a bisect
compares; see :mod:`harness.stats.trials`). Everything returned is plain data (strings, tuples, lists of floats):
no ORM object or session leaves this module, so the caller needs neither sqlalchemy nor the models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import select

from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.store import Store


class StoredJob(NamedTuple):
    """One stored job row, as a bisect classifies it (no ORM object: plain values)."""

    job_id: int
    run_id: str
    kind: str
    key: str
    kernel: str
    name: str
    variant: str
    dtype: str
    shape_key: str
    check: str
    status: str
    detail: str

    @property
    def first_line(self) -> str:
        return (self.detail.splitlines() or [""])[0][:300]


def clean_runs(store: Store, sha: str, chip: str) -> list[str]:
    """Ids of the clean (not dirty) runs of commit ``sha`` on chip ``chip``, oldest first."""
    with store.session() as session:
        return list(session.scalars(
            select(Run.id).join(Commit, Run.commit_id == Commit.id).join(Chip, Run.chip_id == Chip.id)
            .where(Commit.sha == sha, Chip.key == chip, Run.dirty.is_(False))
            .order_by(Run.started_at, Run.id)))


def job_rows(store: Store, run_ids: Sequence[str]) -> dict[str, list[StoredJob]]:
    """Every job row of the given runs, per run (in the order stored; a run without jobs maps to [])."""
    out: dict[str, list[StoredJob]] = {run_id: [] for run_id in run_ids}
    if not run_ids:
        return out
    with store.session() as session:
        rows = session.execute(
            select(JobRecord.id, JobRecord.run_id, JobRecord.kind, JobRecord.key, JobRecord.kernel, JobRecord.name,
                   JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, JobRecord.check_name, JobRecord.status,
                   JobRecord.detail)
            .where(JobRecord.run_id.in_(list(run_ids))).order_by(JobRecord.id))
        for row in rows:
            out[row[1]].append(StoredJob(*row))
    return out


def job_samples(store: Store, job_ids: Sequence[int]) -> dict[int, list[float]]:
    """The timing samples (seconds) of the given jobs, per job, in sample order."""
    out: dict[int, list[float]] = {job_id: [] for job_id in job_ids}
    if not job_ids:
        return out
    with store.session() as session:
        for job_id, seconds in session.execute(select(Sample.job_id, Sample.seconds)
                                               .where(Sample.job_id.in_(list(job_ids)))
                                               .order_by(Sample.job_id, Sample.idx)):
            out[job_id].append(seconds)
    return out


def job_trials(store: Store, job_ids: Sequence[int]) -> dict[int, dict[int, list[float]]]:
    """The timing samples (seconds) of the given jobs per job and trial (the process they came from), trials in
    ascending order and samples in sample order; a job without samples maps to {} (rows stored before trials were
    recorded are one trial, 0)."""
    out: dict[int, dict[int, list[float]]] = {job_id: {} for job_id in job_ids}
    if not job_ids:
        return out
    with store.session() as session:
        for job_id, trial, seconds in session.execute(select(Sample.job_id, Sample.trial, Sample.seconds)
                                                      .where(Sample.job_id.in_(list(job_ids)))
                                                      .order_by(Sample.job_id, Sample.trial, Sample.idx)):
            out[job_id].setdefault(trial, []).append(seconds)
    return out
