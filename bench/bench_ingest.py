"""Ingest rate of raw samples through the store's real write path (store.record_result), SQLite and PostgreSQL.

Writes N_JOBS benchmark results of SAMPLES_PER_JOB raw samples each (1,000,000 samples by default) into a
fresh SQLite file and a scratch PostgreSQL database (created and dropped), and prints rows/s for each.
Targets (issue "Reliability"): >= 50,000 samples/s SQLite, >= 20,000 samples/s PostgreSQL.

Usage: python bench/bench_ingest.py [--jobs 1000] [--samples 1000] [--pg postgresql+psycopg://postgres@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from harness.core.chip import ChipIdentity  # noqa: E402
from harness.core.job import JobResult, KernelJob  # noqa: E402
from harness.record import outbox, store  # noqa: E402
from testkit.pg import scratch_database  # noqa: E402

CHIP = ChipIdentity(key="bench-chip", backend="cpu", device_name="bench", architecture="x86_64")


def ingest(url: str, n_jobs: int, per_job: int) -> float:
    db = outbox.open_store(url)
    try:
        run_id = store.create_run(db, ident=CHIP, facts={"hostname": "bench"}, commit={"sha": "0" * 40},
                                  suite="bench", dirty=False, executor="local", planned_jobs=n_jobs)
        rng = random.Random(0)
        results = []
        for i in range(n_jobs):
            shape = {"N": i}
            job = KernelJob.of("benchmark", "k", "v", shape, "float32", name="b")
            results.append((job, JobResult(job.key, "passed", samples=[rng.random() for _ in range(per_job)])))
        start = time.perf_counter()
        for job, result in results:
            store.record_result(db, run_id, job, result)
        return time.perf_counter() - start
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    total = args.jobs * args.samples
    with tempfile.TemporaryDirectory() as tmp:
        seconds = ingest(f"sqlite:///{tmp}/ingest.db", args.jobs, args.samples)
        print(f"SQLite:     {total:,} samples in {seconds:.2f} s = {total / seconds:,.0f} samples/s (target 50,000)")
    with scratch_database(args.pg, "harness_bench") as url:
        seconds = ingest(url, args.jobs, args.samples)
        print(f"PostgreSQL: {total:,} samples in {seconds:.2f} s = {total / seconds:,.0f} samples/s (target 20,000)")


if __name__ == "__main__":
    main()
