"""Measure bundle export and import rates (rows/s) for N raw samples on SQLite and PostgreSQL.

    PYTHONPATH=. python bench/bench_bundle.py [--samples 1000000] [--pg-admin postgresql://postgres@127.0.0.1/postgres]

Fills a scratch SQLite database with realistic runs (benchmark jobs with samples, plus correctness jobs), then
times: export from SQLite, import into a fresh SQLite, import into a scratch PostgreSQL database (created on the
admin URL's server and dropped afterwards), export from PostgreSQL. Both bundles must carry the same payload.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from harness.core.chip import ChipIdentity  # noqa: E402
from harness.core.job import JobResult, KernelJob  # noqa: E402
from harness.record import outbox, store  # noqa: E402
from harness.record.bundle import export_bundle, import_bundle, read_header  # noqa: E402
from testkit.pg import scratch_database  # noqa: E402

CHIP = ChipIdentity(key="bench-chip", backend="cuda", device_name="NVIDIA H200", architecture="sm90",
                    memory_bytes=141 << 30, os="Linux", mlx_version="0.32.0", device_info={"name": "H200"})


def fill(db: store.Store, samples: int, runs: int, per_job: int) -> int:
    """``samples`` raw samples spread over ``runs`` runs of benchmark jobs (``per_job`` each) + 20 correctness."""
    rng = random.Random(0)
    jobs_per_run = max(1, samples // (runs * per_job))
    rows = 0
    for r in range(runs):
        run_id = store.create_run(db, ident=CHIP, facts={"hostname": f"host-{r % 2}"},
                                  commit={"sha": f"{r:040x}", "message": f"commit {r}"}, suite="bench",
                                  dirty=False, executor="local", planned_jobs=jobs_per_run + 20)
        for j in range(jobs_per_run):
            shape = {"N": 64 + j}
            job = KernelJob.of("benchmark", "k", f"v{j % 7}", shape, "float16", name="b")
            base = rng.uniform(1e-5, 1e-3)
            result = JobResult(job.key, "passed", samples=[base * rng.lognormvariate(0, 0.05) for _ in range(per_job)],
                               inner=8, warmup_s=0.1, warmup_calls=3, flops=1e9, bytes_moved=1e6, duration_s=1.5)
            store.record_result(db, run_id, job, result)
            rows += 1 + per_job
        for c in range(20):
            shape = {"N": c}
            job = KernelJob.of("correctness", "k", "ref", shape, "float32", "reference", name="c")
            store.record_result(db, run_id, job, JobResult(job.key, "passed" if c % 5 else "failed",
                                                           max_error=rng.random() * 1e-3, tolerance=1e-3,
                                                           output_tail="x" * 200))
            rows += 1
        store.finish_run(db, run_id, "passed")
    return rows


def timed(label: str, rows: int, samples: int, fn):
    start = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - start
    print(f"{label:<28} {elapsed:7.2f} s  {rows / elapsed:>11,.0f} rows/s  {samples / elapsed:>11,.0f} samples/s",
          flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--per-job", type=int, default=1000, help="samples per benchmark job")
    parser.add_argument("--pg-admin", default=os.environ.get("HARNESS_TEST_PG",
                                                             "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, scratch_database(args.pg_admin, "harness_bench") as pg_url:
        src = outbox.open_store(f"sqlite:///{tmp}/src.db")
        start = time.perf_counter()
        rows = fill(src, args.samples, args.runs, args.per_job)
        print(f"filled SQLite source: {rows:,} job+sample rows in {time.perf_counter() - start:.1f} s")
        bundle = Path(tmp) / "sqlite.bundle"
        summary = timed("export  SQLite -> bundle", rows, args.samples, lambda: export_bundle(src, bundle))
        n, read_samples = summary.jobs + summary.samples, summary.samples
        print(f"  bundle: {summary.bytes / 2**20:.1f} MiB, {summary.runs} runs, {summary.jobs:,} jobs, "
              f"{summary.samples:,} samples")
        dst = outbox.open_store(f"sqlite:///{tmp}/dst.db")
        timed("import  bundle -> SQLite", n, read_samples, lambda: import_bundle(dst, bundle))
        pg = outbox.open_store(pg_url)
        result = timed("import  bundle -> PostgreSQL", n, read_samples, lambda: import_bundle(pg, bundle))
        assert result.samples_added == read_samples, result
        again = Path(tmp) / "pg.bundle"
        timed("export  PostgreSQL -> bundle", n, read_samples, lambda: export_bundle(pg, again))
        same = read_header(bundle)["sha256"] == read_header(again)["sha256"]
        print(f"payloads identical after SQLite -> PostgreSQL -> bundle: {same}")
        timed("re-import (all skipped), PG", n, read_samples, lambda: import_bundle(pg, bundle))
        for handle in (src, dst, pg):
            handle.close()
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
