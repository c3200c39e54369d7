"""Migration 0009 (``run.settling``): runs stored before it keep their jobs and samples, and read as
ordinary runs."""

from __future__ import annotations

import numpy as np
from sqlalchemy import func, inspect, select

from harness.record import outbox, store
from harness.record.models import JobRecord, Run, Sample
from testkit.analysis import add_run, grid_results
from testkit.migrations import downgraded


def test_runs_stored_before_settling_keep_their_jobs_and_samples(db_url):
    handle = outbox.open_store(db_url)
    add_run(handle, "chip-a", 1, grid_results(np.random.default_rng(0)), minutes=0)
    handle.close()
    with downgraded(db_url, "0008") as engine:
        assert "settling" not in {c["name"] for c in inspect(engine).get_columns("run")}
    handle = store.open_database(db_url)  # migrated to the head again
    try:
        with handle.session() as session:
            # a batch copy of the run table on SQLite drops it, and ON DELETE CASCADE took every job with it
            assert session.scalar(select(func.count()).select_from(JobRecord)) == 8
            assert session.scalar(select(func.count()).select_from(Sample)) == 240
            assert session.scalars(select(Run.settling)).all() == [False]
    finally:
        handle.close()
