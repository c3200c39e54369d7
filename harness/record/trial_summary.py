"""What a job's samples come to, computed as they are written: each trial's count and median (``TrialSummary``
rows, packed), the job's median, CI and roofline, and the bulk sample writer that stores samples with them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from harness.record.models import JobRecord, Sample, TrialSummary
from harness.stats.summary import sorted_medians, summarize


def trial_summaries(rows: Sequence[Sequence[Any]]) -> list[tuple[int, int, int, int, float]]:
    """``(job_id, trial, n, valid, median)`` per (job, trial) of sample rows ``(job_id, idx, seconds, trial)``, in
    (job, trial) order: how many samples, how many valid (finite, > 0; the analysis drops the others) and the median
    of the valid ones as ``np.median`` computes it (the mean of the two middle values; nan with none valid)."""
    if not rows:
        return []
    count = len(rows)
    job = np.fromiter((row[0] for row in rows), dtype=np.int64, count=count)
    seconds = np.fromiter((row[2] for row in rows), dtype=np.float64, count=count)
    trial = np.fromiter((row[3] for row in rows), dtype=np.int64, count=count)
    valid = np.isfinite(seconds) & (seconds > 0)
    order = np.lexsort((np.where(valid, seconds, np.inf), trial, job))  # per (job, trial): valid ones first, sorted
    job, seconds, trial, valid = job[order], seconds[order], trial[order], valid[order]
    starts = np.flatnonzero(np.concatenate([[True], (job[1:] != job[:-1]) | (trial[1:] != trial[:-1])]))
    sizes = np.diff(np.append(starts, count))
    n_valid = np.add.reduceat(valid.astype(np.int64), starts)
    has = n_valid > 0
    medians = np.where(has, sorted_medians(seconds, starts, np.maximum(n_valid, 1)), np.nan)
    return list(zip(job[starts].tolist(), trial[starts].tolist(), sizes.tolist(), n_valid.tolist(),
                    medians.tolist(), strict=True))


# One trial in ``TrialSummary.trials``: the bytes of these records, one per trial in trial order.
TRIAL_RECORD = np.dtype([("trial", "<i8"), ("valid", "<i8"), ("median", "<f8")])


def packed_summaries(summaries: Sequence[tuple[int, int, int, int, float]]
                     ) -> dict[int, tuple[int, npt.NDArray[Any]]]:
    """``trial_summaries`` rows per job: its sample count and its ``TRIAL_RECORD`` array."""
    out: dict[int, tuple[int, npt.NDArray[Any]]] = {}
    for job_id, group in groupby(summaries, key=itemgetter(0)):
        trials = list(group)
        records = np.array([(t, v, m) for _, t, _, v, m in trials], dtype=TRIAL_RECORD)
        out[job_id] = (sum(n for _, _, n, _, _ in trials), records)
    return out


def unpacked_trials(payload: bytes) -> npt.NDArray[Any] | None:
    """The ``TRIAL_RECORD`` array of a ``TrialSummary.trials`` value; None if it is not one."""
    if len(payload) % TRIAL_RECORD.itemsize:
        return None
    return np.frombuffer(payload, dtype=TRIAL_RECORD)


def sample_writer(session: Session, *, append: bool = False) -> Callable[[list[tuple[int, int, float, int]]], None]:
    """The fastest bulk insert of (job_id, idx, seconds, trial) rows the database offers, in the session's
    transaction, with their jobs' ``TrialSummary`` rows: each call must hold all the samples of the trials it writes
    (a trial is written once). ``append``: the jobs may have trials stored already (a later trial), kept and merged
    with the new ones; else they are new jobs.

    PostgreSQL (psycopg 3): COPY FROM STDIN in text format, the rows formatted at once (float repr is exact and
    PostgreSQL reads inf/nan). SQLite: executemany of plain tuples (no per-row parameter processing).
    Anything else: a Core executemany insert.
    """
    write = _raw_sample_writer(session)
    table = TrialSummary.__table__

    def write_with_summaries(rows: list[tuple[int, int, float, int]]) -> None:
        if clean := _without_nan(rows):  # none at all (a bundle of test-only runs): SQLite's executemany of an
            write(clean)  # empty list runs the statement once, without its parameters
        new = packed_summaries(trial_summaries(rows))
        if not new:
            return
        connection = session.connection()
        jobs = sorted(new) if append else []
        for start in range(0, len(jobs), 500):
            part = jobs[start:start + 500]
            for job_id, n, payload in connection.execute(select(table.c.job_id, table.c.n, table.c.trials)
                                                         .where(table.c.job_id.in_(part))).all():
                old = unpacked_trials(payload)
                added, records = new[job_id]
                merged = records if old is None else np.concatenate([old, records])
                new[job_id] = (added + (n if old is not None else 0), np.sort(merged, order="trial", kind="stable"))
            connection.execute(delete(table).where(table.c.job_id.in_(part)))
        connection.execute(insert(table), [{"job_id": job_id, "n": n, "trials": records.tobytes()}
                                           for job_id, (n, records) in new.items()])

    return write_with_summaries


def _without_nan(rows: list[tuple[int, int, float, int]]) -> list[tuple[int, int, float, int]]:
    """The rows with a sample that is not a number as +inf. SQLite reads a NaN as NULL, which the sample column
    refuses (the job's whole write failed); to the analysis both are an invalid sample (valid: finite and > 0), so
    every backend stores +inf and reads the same."""
    if not any(seconds != seconds for _, _, seconds, _ in rows):  # noqa: PLR0124 -- NaN is the value unequal to itself
        return rows
    return [(job, idx, seconds if seconds == seconds else math.inf, trial)  # noqa: PLR0124
            for job, idx, seconds, trial in rows]


def _raw_sample_writer(session: Session) -> Callable[[list[tuple[int, int, float, int]]], None]:
    connection = session.connection()
    dialect = connection.dialect
    table = dialect.identifier_preparer.format_table(Sample.__table__)
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        driver_connection = connection.connection.driver_connection

        def copy(rows: list[tuple[int, int, float, int]]) -> None:
            with driver_connection.cursor() as cursor, \
                    cursor.copy(f"COPY {table} (job_id, idx, seconds, trial) FROM STDIN") as stream:
                stream.write("".join([f"{job}\t{idx}\t{seconds!r}\t{trial}\n" for job, idx, seconds, trial in rows]))

        return copy
    if dialect.name == "sqlite":
        return lambda rows: connection.exec_driver_sql(
            f"INSERT INTO {table} (job_id, idx, seconds, trial) VALUES (?, ?, ?, ?)", rows)
    return lambda rows: connection.execute(insert(Sample.__table__),
                                           [{"job_id": j, "idx": i, "seconds": s, "trial": t} for j, i, s, t in rows])


def summarize_samples(record: JobRecord, samples: list[float], peaks: tuple[float | None, float | None]) -> None:
    """The stored median / CI / IQR and roofline of a job over all its samples (every trial's)."""
    summary = summarize(samples)
    record.n_samples = summary.n
    record.median_s, record.ci_low_s, record.ci_high_s, record.iqr_rel = (
        summary.median, summary.ci_low, summary.ci_high, summary.iqr_rel)
    apply_roofline(record, *peaks)


def apply_roofline(record: JobRecord, peak_flops: float | None, peak_bytes_per_s: float | None) -> None:
    """Achieved FLOP/s and B/s, and % of the chip's calibrated peak for whichever bound is higher."""
    if not record.median_s:
        return
    record.achieved_flops = (record.flops or 0.0) / record.median_s
    record.achieved_bytes_per_s = (record.bytes_moved or 0.0) / record.median_s
    fractions = {}
    if peak_flops and record.flops:
        fractions["compute"] = record.achieved_flops / peak_flops
    if peak_bytes_per_s and record.bytes_moved:
        fractions["memory"] = record.achieved_bytes_per_s / peak_bytes_per_s
    if fractions:
        record.bound = max(fractions, key=fractions.get)
        record.pct_peak = 100.0 * fractions[record.bound]
