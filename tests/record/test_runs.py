"""The bisect read side of the store (harness.record.runs): clean runs of a commit on a chip, their job rows and
samples, as plain data."""

from __future__ import annotations

import pytest

from harness.core.chip import ChipIdentity
from harness.core.job import JobResult, KernelJob
from harness.record import runs, store

CHIP = ChipIdentity(key="test-chip", backend="cpu", device_name="Test", architecture="x86_64", memory_bytes=1 << 30)
OTHER = ChipIdentity(key="other-chip", backend="cpu", device_name="Other", architecture="x86_64", memory_bytes=1 << 30)


def new_run(db: store.Store, sha: str, *, chip: ChipIdentity = CHIP, dirty: bool = False) -> str:
    return store.create_run(db, ident=chip, facts={"hostname": "host-a"}, commit={"sha": sha, "message": "m"},
                            suite="s", dirty=dirty, executor="local", planned_jobs=1)


@pytest.fixture
def db(db_url):
    handle = store.open_database(db_url)
    yield handle
    handle.close()


def test_clean_runs_job_rows_and_samples(db):
    first, second = new_run(db, "a" * 40), new_run(db, "a" * 40)
    new_run(db, "a" * 40, dirty=True)
    new_run(db, "a" * 40, chip=OTHER)
    new_run(db, "b" * 40)
    assert runs.clean_runs(db, "a" * 40, "test-chip") == [first, second]
    assert runs.clean_runs(db, "c" * 40, "test-chip") == []

    shape = {"N": 8}
    bench = KernelJob.of("benchmark", "k", "v", shape, "float32", name="b")
    check = KernelJob.of("correctness", "k", "v", shape, "float32", "reference", name="c")
    store.record_result(db, first, bench, JobResult(bench.key, "passed", samples=[3.0, 1.0, 2.0]))
    store.record_result(db, first, check, JobResult(check.key, "failed", detail="max error 3\nmore"))
    rows = runs.job_rows(db, [first, second])
    assert list(rows) == [first, second] and rows[second] == []
    got = {row.kind: row for row in rows[first]}
    assert got["benchmark"]._replace(job_id=0) == runs.StoredJob(0, first, "benchmark", bench.key, "k", "b", "v",
                                                                  "float32", "N=8", "", "passed", "")
    assert got["correctness"].check == "reference" and got["correctness"].detail == "max error 3\nmore"
    samples = runs.job_samples(db, [got["benchmark"].job_id, got["correctness"].job_id])
    assert samples == {got["benchmark"].job_id: [3.0, 1.0, 2.0], got["correctness"].job_id: []}
    assert runs.job_rows(db, []) == {} and runs.job_samples(db, []) == {}
