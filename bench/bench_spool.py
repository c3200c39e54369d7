"""Time to recover once the database is back: how fast spooled results drain into SQLite and PostgreSQL.

    python bench/bench_spool.py [--jobs 2000] [--samples 10]

Spools N benchmark results (as a run does while its database is unreachable), then drains them with
harness.record.outbox.drain into a fresh SQLite file and a scratch PostgreSQL database, checks every result was stored
exactly once and the spool is empty, and prints the recovery time and results/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select  # noqa: E402

from testkit.pg import scratch_database  # noqa: E402


def recover(url: str, n_jobs: int, per_job: int) -> tuple[float, int]:
    from harness.core.chip import ChipIdentity
    from harness.core.job import JobResult, KernelJob
    from harness.record import outbox, spool, store
    from harness.record.models import JobRecord

    db = outbox.open_store(url)
    run_id = store.create_run(db, ident=ChipIdentity(key="spool-bench", backend="cpu", device_name="b",
                                                     architecture="x86_64"),
                              facts={"hostname": "b"}, commit={"sha": "0" * 40}, suite="b", dirty=False,
                              executor="local", planned_jobs=n_jobs)
    for i in range(n_jobs):  # what a run writes while the database refuses
        shape = {"N": i}
        job = KernelJob.of("benchmark", "k", "v", shape, "float32", name="b")
        spool.put(url, run_id, job, JobResult(job.key, "passed", samples=[1e-3 * (1 + j) for j in range(per_job)]))
    spool.put_finish(url, run_id, "complete")
    start = time.perf_counter()
    outcome = outbox.drain(db)
    elapsed = time.perf_counter() - start
    with db.session() as session:
        stored = session.scalar(select(func.count()).select_from(JobRecord).where(JobRecord.run_id == run_id))
    db.close()
    assert outcome.remaining == 0 and spool.pending(url) == 0, outcome
    return elapsed, stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HARNESS_CACHE"] = str(Path(tmp) / "cache")
        seconds, stored = recover(f"sqlite:///{tmp}/spool.db", args.jobs, args.samples)
        print(f"SQLite:     {stored}/{args.jobs} spooled results written in {seconds:.2f} s "
              f"({args.jobs / seconds:,.0f} results/s)")
        with scratch_database(args.pg, "harness_spool") as url:
            seconds, stored = recover(url, args.jobs, args.samples)
            print(f"PostgreSQL: {stored}/{args.jobs} spooled results written in {seconds:.2f} s "
                  f"({args.jobs / seconds:,.0f} results/s)")


if __name__ == "__main__":
    main()
