"""Load: N short jobs (2,000 by default) through a local 3-node Ray cluster into PostgreSQL, each recorded once.

    python bench/bench_load.py [--jobs 2000] [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

Runs one harness run (runner.run_planned with the RayExecutor: the production path) of N no-op correctness
jobs (tests/plugins/ray_sched_plugin.py) on three loopback nodes labelled chip=load, writing into a scratch
PostgreSQL database (created and dropped), then checks that every job key is stored exactly once. Prints the
wall time, jobs/s, per-job cost, and the driver's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from sqlalchemy import func, select  # noqa: E402

from bench.bench_ray_overhead import make_jobs  # noqa: E402
from testkit.pg import scratch_database  # noqa: E402
from testkit.ray import restore_env, set_env, start_cluster  # noqa: E402

CHIP = "load"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with scratch_database(args.pg, "harness_load") as url:
        measure(args.jobs, url)


def measure(n_jobs: int, db_url: str) -> None:
    """Run n_jobs no-op jobs through a fresh 3-node cluster into db_url and print the figures."""
    import ray

    from harness.core.chip import ChipIdentity
    from harness.core.job import RunContext
    from harness.execute.ray_executor import RayExecutor
    from harness.pipeline.run import run_planned
    from harness.record import outbox
    from harness.record.models import JobRecord

    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    previous = set_env(tmp)
    cluster = start_cluster([CHIP] * 3)
    db = outbox.open_store(db_url)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        jobs = make_jobs(n_jobs)
        ident = ChipIdentity(key=CHIP, backend="cpu", device_name="load", architecture="x86_64")
        start = time.perf_counter()
        context = RunContext(ident=ident, facts={"hostname": "load-bench"}, commit={"sha": "0" * 40}, dirty=False,
                             suite="load", executor="ray")
        outcome = run_planned(db, jobs, RayExecutor(CHIP), context)
        elapsed = time.perf_counter() - start
        with db.session() as session:
            mine = JobRecord.run_id == outcome.run_id
            stored = session.scalar(select(func.count()).select_from(JobRecord).where(mine))
            distinct = session.scalar(select(func.count(func.distinct(JobRecord.key))).where(mine))
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{n_jobs} jobs on 3 nodes into PostgreSQL: {elapsed:.1f} s, {n_jobs / elapsed:.1f} jobs/s, "
              f"{elapsed / n_jobs * 1e3:.0f} ms/job wall")
        print(f"stored rows {stored}, distinct keys {distinct}, statuses {dict(outcome.counts)}: "
              f"{'every job recorded exactly once' if stored == distinct == n_jobs else 'MISMATCH'}")
        print(f"driver peak RSS {peak_mib:.0f} MiB")
    finally:
        db.close()
        ray.shutdown()
        cluster.shutdown()
        restore_env(previous)


if __name__ == "__main__":
    main()
