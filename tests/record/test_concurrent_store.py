"""Concurrent writers on both backends (SQLite WAL + BEGIN IMMEDIATE, PostgreSQL): nothing lost, nothing twice.

A cluster run has many writers at once: the driver's threads (one per chip) and several drivers (one per
submitted commit). Every process and thread below writes the same overlapping set of results and creates runs
for the same new commit and chips at the same moment; every row must land exactly once.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from sqlalchemy import func, select

from harness.core.chip import ChipIdentity
from harness.core.job import JobResult, KernelJob
from harness.record import outbox, store
from harness.record.models import Chip, Commit, JobRecord, Machine, Run, Sample

WRITERS = 4
KEYS = 30  # every writer writes all of them: each key is contended by every writer
SAMPLES = 5


def chip(index: int) -> ChipIdentity:
    return ChipIdentity(key=f"conc-chip-{index}", backend="cpu", device_name="Test", architecture="x86_64")


def job(index: int) -> KernelJob:
    shape = {"N": index}
    if index % 2:
        return KernelJob.of("benchmark", "k", "v", shape, "float32", name="b")
    return KernelJob.of("correctness", "k", "v", shape, "float32", "c", name="c")


def result(j: KernelJob, writer: int) -> JobResult:
    samples = [1e-3 * (i + 1) for i in range(SAMPLES)] if j.kind == "benchmark" else []
    return JobResult(j.key, "passed", f"written by {writer}", samples=samples, inner=1 if samples else None,
                     node=f"writer-{writer}")


def _wait_until(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def create_runs(db_url: str, writer: int, start_at: float) -> str:
    """One new run for a commit and chip every other writer is creating too (get-or-create races)."""
    db = outbox.open_store(db_url)
    try:
        _wait_until(start_at)
        return store.create_run(db, ident=chip(writer % 2), facts={"hostname": "shared-host"},
                                commit={"sha": "c0ffee" * 6 + "abcd", "repo": "conc"}, suite="s", dirty=False,
                                executor="ray", planned_jobs=KEYS)
    finally:
        db.close()


def write_results(db_url: str, run_ids: list[str], writer: int, start_at: float) -> int:
    """Write every key into every run; returns how many writes this writer won."""
    db = outbox.open_store(db_url)
    try:
        _wait_until(start_at)
        order = range(KEYS) if writer % 2 else reversed(range(KEYS))  # meet the others head-on
        return sum(store.record_result(db, run_id, job(i), result(job(i), writer))
                   for i in order for run_id in run_ids)
    finally:
        db.close()


def count(db: store.Store, model, *where) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def check_exactly_once(db: store.Store, run_ids: list[str], wins: int) -> None:
    assert wins == KEYS * len(run_ids)  # every (run, key) was won by exactly one writer
    for run_id in run_ids:
        assert count(db, JobRecord, JobRecord.run_id == run_id) == KEYS
        assert store.stored_keys(db, run_id) == {job(i).key for i in range(KEYS)}
    benchmarks = sum(1 for i in range(KEYS) if job(i).kind == "benchmark") * len(run_ids)
    assert count(db, Sample) == benchmarks * SAMPLES  # no sample row twice either


def test_processes_create_runs_and_write_results_concurrently(db_url):
    db = outbox.open_store(db_url)  # migrated once, before the writers start
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(WRITERS, mp_context=context) as pool:
            start_at = time.time() + 3.0  # leaves the processes time to start and import
            run_ids = list(pool.map(create_runs, [db_url] * WRITERS, range(WRITERS), [start_at] * WRITERS))
            assert len(set(run_ids)) == WRITERS
            assert count(db, Run) == WRITERS
            assert count(db, Commit) == 1 and count(db, Chip) == 2 and count(db, Machine) == 2

            shared = run_ids[:2]
            start_at = time.time() + 1.0
            wins = sum(pool.map(write_results, [db_url] * WRITERS, [shared] * WRITERS, range(WRITERS),
                                [start_at] * WRITERS))
        check_exactly_once(db, shared, wins)
    finally:
        db.close()


def test_threads_sharing_one_store_write_concurrently(db_url):
    """The cluster driver's case: one Store, one thread per chip, results arriving from Ray at once."""
    db = outbox.open_store(db_url)
    try:
        run_ids = [create_runs(db_url, 0, 0.0), create_runs(db_url, 1, 0.0)]
        barrier = threading.Barrier(WRITERS)

        def writer(index: int) -> int:
            barrier.wait(timeout=30)
            order = range(KEYS) if index % 2 else reversed(range(KEYS))
            return sum(store.record_result(db, run_id, job(i), result(job(i), index))
                       for i in order for run_id in run_ids)

        with ThreadPoolExecutor(WRITERS) as pool:
            wins = sum(pool.map(writer, range(WRITERS)))
        check_exactly_once(db, run_ids, wins)
    finally:
        db.close()
