"""Benchmark the report on a large synthetic history (not a test).

Default: 1,000 commits × 4 chips × 200 benchmark series (3 trials of 10 samples each: 24 M sample rows) plus a few
correctness jobs per run, bulk-inserted straight into a temporary SQLite DB (the per-job write path would take hours).
Each trial (job process) sits at a level of its own (lognormal, ``--between`` log sd). Planted: a handful of step
changes, one of them a confirmed regression at the last commit, and a divergent variant.

Prints the time of each phase of ``harness report`` (queries + analysis, then rendering the HTML), the page count
and sizes. Targets: rendering ≤ 5 s, index.html ≤ 1 MB.

    python scripts/bench_report.py                      # the full size, change points on (slow analysis)
    python scripts/bench_report.py --no-change-points   # analysis without stats.detect_change_points
    python scripts/bench_report.py --commits 100 --series 40
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import insert

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.core.job import job_key, shape_label  # noqa: E402
from harness.record.models import Chip, Commit, Machine, Run  # noqa: E402
from harness.record.outbox import open_store  # noqa: E402
from harness.render.site import load_site, render  # noqa: E402

CHIPS = [("apple-m4-pro-20c", "metal", "Apple M4 Pro", "applegpu_g16s", 20, 1.0),
         ("apple-m2-max-38c", "metal", "Apple M2 Max", "applegpu_g14s", 38, 1.3),
         ("nvidia-h200-sm90", "cuda", "NVIDIA H200", "sm_90", None, 0.12),
         ("cpu-x86_64-amd-epyc", "cpu", "AMD EPYC", "x86_64", None, 9.0)]
KERNELS = {  # kernel -> (variants, default first), shapes per dtype
    "flash_prefill": (["sdpa", "flash_bq8_bk16", "flash_bq8_bk32", "flash_bq16_bk16", "flash_bq16_bk32",
                       "flash_bq16_bk64", "flash_bq32_bk32", "flash_bq32_bk64"],
                      [{"B": 1, "H": 8, "S_q": s, "S_kv": s, "D": 64} for s in (128, 256, 512, 1024, 2048, 4096)]),
    "quant_decode": (["dequant_sdpa", "fused_split1", "fused_split4", "fused_split16"],
                     [{"B": 1, "H": 8, "S": s, "D": 128} for s in (256, 512, 1024, 2048, 4096, 8192)]),
    "swiglu": (["unfused", "fused_gateup", "chunked_f64", "chunked_f256"],
               [{"T": t, "D": 1024, "F": 4096} for t in (1, 8, 32, 64, 128, 256, 512)]),
}
DTYPES = ("float16", "float32")


def series_list(limit: int) -> list[tuple[str, str, str, dict[str, int]]]:
    out = []
    for kernel, (variants, shapes) in KERNELS.items():
        for variant in variants:
            for dtype in DTYPES:
                for shape in shapes:
                    out.append((kernel, variant, dtype, shape))
    return out[:limit]


def fill(url: str, n_commits: int, n_chips: int, n_series: int, n_samples: int, n_trials: int = 3,
         between: float = 0.01, seed: int = 0) -> dict[str, int]:
    store = open_store(url)
    rng = np.random.default_rng(seed)
    series = series_list(n_series)
    chips = CHIPS[:n_chips]
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    # Planted truth: a base time per series and chip; steps at some commits; one variant divergent across chips.
    base = np.exp(rng.normal(np.log(1e-3), 0.8, size=(len(chips), len(series))))
    for c, chip in enumerate(chips):
        base[c] *= chip[5]
    level = np.ones((n_commits, len(chips), len(series)))
    for _ in range(12):  # sustained steps somewhere in the history
        c, s, at = rng.integers(len(chips)), rng.integers(len(series)), rng.integers(5, n_commits - 5)
        level[at:, c, s] *= rng.choice([0.8, 1.15, 1.25])
    level[-1, 0, 0] *= 1.3  # a regression at the newest commit
    divergent = [i for i, s in enumerate(series) if s[1] == "flash_bq8_bk16"]
    base[0, divergent] = base[0, [series.index((s[0], "sdpa", s[2], s[3])) for s in
                                  (series[i] for i in divergent)]] * 0.7
    if len(chips) > 2:
        base[2, divergent] = base[2, [series.index((s[0], "sdpa", s[2], s[3])) for s in
                                      (series[i] for i in divergent)]] * 1.4
    counts = {}
    with store.engine.begin() as conn:
        conn.execute(insert(Chip), [{"id": i + 1, "key": key, "backend": backend, "device_name": name,
                                     "architecture": arch, "memory_bytes": 64 * 2**30, "gpu_cores": cores,
                                     "record": {"os": "synthetic", "mlx_version": "0.32.4"}}
                                    for i, (key, backend, name, arch, cores, _) in enumerate(chips)])
        conn.execute(insert(Machine), [{"id": i + 1, "hostname": f"host-{i}", "chip_id": i + 1, "facts": {}}
                                       for i in range(len(chips))])
        conn.execute(insert(Commit), [{"id": i + 1, "repo": "", "sha": f"{i:08x}" + "c0ffee" * 5 + "00",
                                       "message": f"commit {i}: synthetic change to the kernels\n\nbody",
                                       "author": "bench", "branch": "main"} for i in range(n_commits)])
        runs = []
        for i in range(n_commits):
            for c in range(len(chips)):
                start = t0 + timedelta(hours=i, minutes=c)
                runs.append({"id": f"r{i:05d}c{c}", "commit_id": i + 1, "chip_id": c + 1, "machine_id": c + 1,
                             "suite": "bench", "dirty": False, "executor": "local", "status": "complete",
                             "started_at": start, "finished_at": start + timedelta(minutes=30),
                             "peak_flops": 50e12 / chips[c][5], "peak_bytes_per_s": 400e9 / chips[c][5],
                             "planned_jobs": len(series) + 4, "options": {}})
        conn.execute(insert(Run), runs)
        counts["runs"] = len(runs)
        keys = [job_key("benchmark", k, v, s, d) for k, v, d, s in series]
        labels = [shape_label(s) for _, _, _, s in series]
        shapes = [json.dumps(s) for _, _, _, s in series]
        checks = [(k, v, d, s) for k, v, d, s in series if s == KERNELS[k][1][0] and d == "float16"][:4]
        created = t0.strftime("%Y-%m-%d %H:%M:%S.%f")
        job_id, n_jobs, n_rows = 0, 0, 0
        columns = ("id", "run_id", "key", "kind", "name", "kernel", "variant", "dtype", "shape", "shape_key",
                   "check_name", "status", "detail", "output_tail", "max_error", "tolerance", "duration_s", "node",
                   "attempts", "n_samples", "inner", "median_s", "ci_low_s", "ci_high_s", "iqr_rel", "flops",
                   "bytes_moved", "achieved_flops", "achieved_bytes_per_s", "pct_peak", "bound", "trials", "created_at")
        quoted = ", ".join('"' + c + '"' for c in columns)
        job_sql = f"INSERT INTO job ({quoted}) VALUES ({', '.join('?' * len(columns))})"
        sample_sql = "INSERT INTO sample (job_id, idx, seconds, trial) VALUES (?, ?, ?, ?)"
        for i in range(n_commits):
            jobs, samples = [], []
            for c in range(len(chips)):
                run_id = f"r{i:05d}c{c}"
                levels = (base[c] * level[i, c])[:, None, None] * np.exp(
                    rng.normal(0.0, between, (len(series), n_trials, 1)))
                per_job = n_trials * n_samples
                times = (levels * np.exp(rng.normal(0.0, 0.01, (len(series), n_trials, n_samples)))).reshape(
                    len(series), per_job)
                medians = np.median(times, axis=1).tolist()
                lows, highs = times.min(axis=1).tolist(), times.max(axis=1).tolist()
                ids = np.arange(job_id + 1, job_id + 1 + len(series))
                for s, (kernel, variant, dtype, _) in enumerate(series):
                    m = medians[s]
                    jobs.append((job_id + 1 + s, run_id, keys[s], "benchmark", kernel, kernel, variant, dtype,
                                 shapes[s], labels[s], "", "passed", "", "", None, None, 1.0, "", 1, per_job, 10,
                                 m, lows[s], highs[s], 0.01, 1e9, 1e8, 1e9 / m, 1e8 / m, 10.0, "compute", n_trials,
                                 created))
                samples.extend(zip(np.repeat(ids, per_job).tolist(), np.tile(np.arange(per_job), len(series))
                                   .tolist(), times.ravel().tolist(),
                                   np.tile(np.repeat(np.arange(n_trials), n_samples), len(series)).tolist(),
                                   strict=True))
                job_id += len(series)
                for kernel, variant, dtype, shape in checks:
                    job_id += 1
                    jobs.append((job_id, run_id, job_key("correctness", kernel, variant, shape, dtype, "reference"),
                                 "correctness", kernel, kernel, variant, dtype, json.dumps(shape), shape_label(shape),
                                 "reference", "passed", "", "", 1e-4, 2e-3, 0.1, "", 1, None, None, None, None, None,
                                 None, None, None, None, None, None, "", 1, created))
            conn.exec_driver_sql(job_sql, jobs)
            conn.exec_driver_sql(sample_sql, samples)
            n_jobs += len(jobs)
            n_rows += len(samples)
        counts.update(jobs=n_jobs, samples=n_rows)
    store.close()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--chips", type=int, default=4, choices=range(1, len(CHIPS) + 1))
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--samples", type=int, default=10, help="samples per trial")
    parser.add_argument("--trials", type=int, default=3, help="trials (job processes) per benchmark job and run")
    parser.add_argument("--between", type=float, default=0.01, help="log sd of a trial's level between processes")
    parser.add_argument("--change-points", action=argparse.BooleanOptionalAction, default=True,
                        help="run stats.detect_change_points on every history (O(n^2) per series)")
    parser.add_argument("--last", type=int, help="histories and regressions of each chip's last N commits only")
    parser.add_argument("--db", help="reuse (or keep) this SQLite file; filled only if it does not exist")
    parser.add_argument("--out", help="output folder (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=3, help="render this many times, report the best")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "bench.db"
        url = f"sqlite:///{db}"
        if not db.exists():
            start = time.perf_counter()
            counts = fill(url, args.commits, args.chips, args.series, args.samples, args.trials, args.between)
            print(f"filled {db} in {time.perf_counter() - start:.1f} s: {counts['runs']} runs, {counts['jobs']} jobs, "
                  f"{counts['samples']} samples ({db.stat().st_size / 2**20:.0f} MiB)")
        store = open_store(url)
        try:
            start = time.perf_counter()
            data = load_site(store, change_points=args.change_points, last=args.last)
            load_s = time.perf_counter() - start
        finally:
            store.close()
        out = Path(args.out) if args.out else Path(tmp) / "site"
        walls, cpus = [], []
        for _ in range(args.repeat):  # best of N: the wall clock of a shared machine is noisy, CPU time less so
            cpu = time.process_time()
            index = render(data, out)
            cpus.append(time.process_time() - cpu)
            walls.append(data.timings["render"])
        pages = sorted(out.glob("*.html"))
        sizes = {p.name: p.stat().st_size for p in pages}
        n_series = sum(len(h) for h in data.histories.values())
        n_changes = sum(len(s.change_points) for h in data.histories.values() for s in h)
        print(f"history: {n_series} series on {len(data.histories)} chips, {n_changes} change points, "
              f"{len(data.regressions)} regressions, {len(data.matrix.cells)} variant cells, "
              f"{len(data.matrix.divergent)} divergent")
        for phase, seconds in data.timings.items():
            if phase != "render":
                print(f"  {phase:<16} {seconds:7.2f} s")
        print(f"load + analysis  {load_s:7.2f} s (change points {'on' if args.change_points else 'off'}, "
              f"{f'last {args.last}' if args.last else 'all'} commits)")
        print(f"render           {min(walls):7.2f} s wall, {min(cpus):.2f} s CPU, best of {args.repeat} "
              f"(all walls: {', '.join(f'{w:.2f}' for w in walls)}; target ≤ 5 s)")
        print(f"total            {load_s + min(walls):7.2f} s")
        print(f"index.html       {sizes[index.name] / 1024:7.1f} KiB (target ≤ 1 MB)")
        largest = max(sizes, key=sizes.get)
        print(f"pages            {len(pages)}, {sum(sizes.values()) / 2**20:.1f} MiB in all; largest {largest} "
              f"{sizes[largest] / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
