"""Which run has which job, without samples: the chip pages' newest job rows and the variant matrix's series."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Literal, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.record.models import Chip, Commit, JobRecord, Run
from harness.record.query.common import SeriesKey
from harness.record.store import Store


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


def unit_of(kind: str, key: str, kernel: str) -> tuple[str, str]:
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
                key = (unit_of(row.kind, row.key, row.kernel) if newest_per == "unit"
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
        units.setdefault(chip_key, set()).add(unit_of(kind, key, kernel))
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
