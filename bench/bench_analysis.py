"""Time harness.analysis on a large synthetic SQLite history (commits x chips x series x samples).

    python bench/bench_analysis.py --commits 1000 --chips 4 --series 200 --samples 10 --trials 3 --db /tmp/big.db

Rows are bulk-inserted with sqlite3 (the store's record_result would take hours at this size); each job is measured
in ``--trials`` trials (job processes) of ``--samples`` samples, each trial at a level of its own (lognormal,
``--between`` log sd: real processes differ); every 50th commit carries a 15 % step in one series, so the regression
list is not empty.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.analysis.compare import compare  # noqa: E402
from harness.analysis.history import history  # noqa: E402
from harness.analysis.regressions import regressions  # noqa: E402
from harness.analysis.variants import variant_matrix  # noqa: E402
from harness.record import outbox  # noqa: E402


def build(path: Path, commits: int, chips: int, series: int, samples: int, trials: int = 3, between: float = 0.01,
          seed: int = 0) -> None:
    outbox.open_store(f"sqlite:///{path}").close()
    rng = np.random.default_rng(seed)
    variants = [f"flash_bq{bq}_bk{bk}" for bq in (8, 16, 32) for bk in (16, 32, 64)] + ["sdpa"]
    keys = [(variants[i % len(variants)], f"B=1,D=64,H=8,S={128 * (1 + i // len(variants))}") for i in range(series)]
    base = rng.uniform(1e-4, 1e-2, size=(chips, series))
    steps = np.ones((commits, chips, series))
    for c in range(50, commits, 50):
        steps[c:, rng.integers(chips), rng.integers(series)] *= 1.15
    level = steps  # a step persists from its commit on
    t0 = datetime(2025, 1, 1)
    conn = sqlite3.connect(path)
    conn.executemany("insert into chip (id, key, backend, device_name, architecture, record) values (?,?,?,?,?,?)",
                     [(k + 1, f"chip-{k}", "cpu", f"C{k}", "x86_64", "{}") for k in range(chips)])
    conn.executemany("insert into machine (id, hostname, chip_id, facts) values (?,?,?,?)",
                     [(k + 1, f"host-{k}", k + 1, "{}") for k in range(chips)])
    conn.executemany("insert into `commit` (id, repo, sha, message, author, branch) values (?,?,?,?,?,?)",
                     [(c + 1, "", f"{c:08x}" + "0" * 32, f"commit {c}", "a", "main") for c in range(commits)])
    job_id = 0
    for c in range(commits):
        runs, jobs, rows = [], [], []
        for k in range(chips):
            run_id = f"r{c:06d}{k:02d}"
            started = (t0 + timedelta(minutes=10 * c + k)).strftime("%Y-%m-%d %H:%M:%S.%f")
            runs.append((run_id, c + 1, k + 1, k + 1, "big", 0, "local", "complete", started, 0, "{}"))
            levels = (base[k] * level[c, k])[:, None, None] * np.exp(rng.normal(0, between, (series, trials, 1)))
            values = (levels * np.exp(rng.normal(0, 0.02, (series, trials, samples)))).reshape(series, -1)
            trial_of = np.repeat(np.arange(trials), samples).tolist()
            for s, (variant, shape_key) in enumerate(keys):
                job_id += 1
                jobs.append((job_id, run_id, f"benchmark/flash_prefill/{variant}/float32/{shape_key}", "benchmark",
                             "big", "flash_prefill", variant, "float32", "{}", shape_key, "", "passed", "", "",
                             0.0, "", 1, samples * trials, trials, "", started))
                rows.extend(zip([job_id] * values.shape[1], range(values.shape[1]), values[s].tolist(), trial_of,
                                strict=True))
        conn.executemany("insert into run (id, commit_id, chip_id, machine_id, suite, dirty, executor, status, "
                         "started_at, planned_jobs, options) values (?,?,?,?,?,?,?,?,?,?,?)", runs)
        conn.executemany("insert into job (id, run_id, key, kind, name, kernel, variant, dtype, shape, shape_key, "
                         "check_name, status, detail, output_tail, duration_s, node, attempts, n_samples, trials, "
                         "bound, created_at) values (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", jobs)
        conn.executemany("insert into sample (job_id, idx, seconds, trial) values (?,?,?,?)", rows)
    conn.commit()
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--chips", type=int, default=4)
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--samples", type=int, default=10, help="samples per trial")
    parser.add_argument("--trials", type=int, default=3, help="trials (job processes) per job")
    parser.add_argument("--between", type=float, default=0.01, help="log sd of a trial's level between processes")
    parser.add_argument("--db", type=Path, default=Path("/tmp/harness-bench-analysis.db"))
    parser.add_argument("--reuse", action="store_true", help="Time an existing --db instead of building it.")
    args = parser.parse_args()
    if not args.reuse:
        args.db.unlink(missing_ok=True)
        start = time.perf_counter()
        build(args.db, args.commits, args.chips, args.series, args.samples, args.trials, args.between)
        print(f"build: {time.perf_counter() - start:.1f} s")
    handle = outbox.open_store(f"sqlite:///{args.db}")
    chip = "chip-0"
    for name, call in (
        ("history, no change points", lambda: history(handle, chip, change_points=False)),
        ("history", lambda: history(handle, chip)),
        ("regressions (one chip)", lambda: regressions(handle, chip)),
        ("regressions (all chips)", lambda: regressions(handle)),
        ("compare last two commits", lambda: compare(handle, f"{args.commits - 2:08x}", f"{args.commits - 1:08x}")),
        ("variant_matrix", lambda: variant_matrix(handle)),
    ):
        start = time.perf_counter()
        result = call()
        size = len(result.rows) if hasattr(result, "rows") else len(getattr(result, "cells", result))
        print(f"{name}: {time.perf_counter() - start:.2f} s ({size} items)")
    handle.close()


if __name__ == "__main__":
    main()
