"""Migration 0010 (``ix_job_run_kind``): a database stored before it gains the (run, kind) index in place of the
run index, keeps every row, and a chip's correctness jobs are then read by it (not every job of its runs)."""

from __future__ import annotations

import numpy as np
from sqlalchemy import func, inspect, select

from harness.record import outbox, store
from harness.record.models import JobRecord
from testkit.analysis import add_run, checks, grid_results
from testkit.migrations import downgraded
from testkit.sql import captured_statements, job_read_plan


def _job_indexes(engine) -> dict[str, list[str]]:  # noqa: ANN001 - an Engine
    return {index["name"]: index["column_names"] for index in inspect(engine).get_indexes("job")}


def test_the_run_index_becomes_the_run_and_kind_index(db_url):
    handle = outbox.open_store(db_url)
    add_run(handle, "chip-a", 1, grid_results(np.random.default_rng(0)) + checks(), minutes=0)
    assert _job_indexes(handle.engine)["ix_job_run_kind"] == ["run_id", "kind"]
    handle.close()
    with downgraded(db_url, "0009") as engine:
        indexes = _job_indexes(engine)
        assert indexes["ix_job_run_id"] == ["run_id"] and "ix_job_run_kind" not in indexes
    handle = store.open_database(db_url)  # migrated to the head again
    try:
        indexes = _job_indexes(handle.engine)
        assert indexes["ix_job_run_kind"] == ["run_id", "kind"] and "ix_job_run_id" not in indexes
        with handle.session() as session:
            assert session.scalar(select(func.count()).select_from(JobRecord)) > 8
    finally:
        handle.close()


def test_a_chips_correctness_jobs_are_read_by_run_and_kind(sqlite_url, monkeypatch):
    """SQLite's plan for ``query.correctness_statuses``: the job index on (run, kind), both columns."""
    from harness.record import query

    handle = outbox.open_store(sqlite_url)
    try:
        add_run(handle, "chip-a", 1, grid_results(np.random.default_rng(0)) + checks(), minutes=0)
        with captured_statements(handle, monkeypatch) as statements:
            assert query.correctness_statuses(handle, "chip-a")
        plan = job_read_plan(handle, statements)
        assert any("ix_job_run_kind (run_id=? AND kind=?)" in step for step in plan), plan
    finally:
        handle.close()
