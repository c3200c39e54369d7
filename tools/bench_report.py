"""Benchmark `harness report` on a large synthetic history, cold and warm, against `asv publish` (not a test).

Default: 1,000 commits x 4 chips x 400 benchmark series (3 trials of 10 samples each: 48 M sample rows) plus a few
correctness jobs per run, bulk-inserted straight into a SQLite DB (the per-job write path would take hours). Each
trial (job process) sits at a level of its own (lognormal, ``--between`` log sd). Planted: a handful of step
changes, one of them a confirmed regression at the last commit, and a divergent variant.

Measured in one go, each report in a fresh process, as a user runs it (``python -m harness report --db URL --out DIR
--timings``: start-up, imports, queries, analysis, render), printed side by side with the time of each phase:

1. full rebuild: the analysis cache emptied first (``harness.record.analysis_cache.clear``), so every commit's cells,
   every change point and every regression family is computed and stored (and no site manifest: every page);
2. ``--uncached``: the report without the cache (``load_site(cache=False)``: the analysis from the samples alone,
   every page rendered, into a folder of its own);
3. the report again, nothing new (warm cache; into the same folder, so only the pages whose inputs changed are
   rendered, ``harness.render.pages``);
4. the report after one new run (one more commit on one chip: its 400 series; warm cache, same folder),
   ``--new-runs`` times (default 3), each after one more run: the target line takes their median, each shown;
5. ``asv publish`` on the same data, when asv can run (``--asv PATH`` to its executable, default
   ``/tmp/asvenv/bin/asv`` if present; install it with ``python -m venv /tmp/asvenv && /tmp/asvenv/bin/pip install
   asv``): one asv benchmark per series, one machine per chip, one result file per (machine, commit) in asv's
   results format (api version 2: each benchmark's median, its 99 % interval, quartiles, number and repeat; no raw
   samples, asv's default), the commits a real git repository's linear history; then the ratios.

``--check`` also compares the cached histories and regression list with ``load_site(cache=False)`` (identical).

``--baseline TREE`` (another checkout of the project, e.g. ``git archive <commit> | tar -x -C TREE``) also times
that tree's report, by its own copy of this script, next to rows 3 and 4: on a copy of the database taken before
this tree opens it (opening a database migrates it to the opener's schema, which an older tree refuses: across a
schema change, ``--db`` must be a database the baseline can open), the same new run added to both by each tree's
own code, into a folder of its own, warmed by a first report that is not shown (the analysis cache's keys hold the
code version: that report analyses everything and writes every page). For side-by-side figures on a noisy machine,
``bench/ab_report.py`` alternates the two trees over several rounds.

    python tools/bench_report.py                                   # the full size (slow to fill: minutes)
    python tools/bench_report.py --commits 200 --series 100 --check
    python tools/bench_report.py --db /tmp/big.db --keep-db        # reuse a filled DB (filled if missing)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import func, insert, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.analysis import site_evidence, site_inputs  # noqa: E402
from harness.core.job import job_key, shape_label  # noqa: E402
from harness.pipeline import report  # noqa: E402
from harness.record import analysis_cache  # noqa: E402
from harness.record import store as store_module  # noqa: E402
from harness.record.models import Chip, Commit, JobRecord, Machine, Run  # noqa: E402
from harness.record.outbox import open_store  # noqa: E402

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
MORE_SHAPES = {  # beyond the first 200 series: bfloat16 of all the above, then flash_prefill at D=128
    "flash_prefill": [{"B": 1, "H": 8, "S_q": s, "S_kv": s, "D": 128} for s in (128, 256, 512, 1024, 2048, 4096)]}
T0 = datetime(2025, 1, 1, tzinfo=UTC)
TARGET_FULL_RATIO = 0.1  # issue 40: a full rebuild in at most 0.1x asv publish's wall time
TARGET_AFTER_RUN_S = 2.0  # issue 40: the report after one new run in at most 2 s
ISSUE_ASV_S = 147.7  # asv publish's wall time on the machine the issue measured (its 2 s is 0.0135x of it)
AFTER_ONE_RUN = "harness report after one new run"  # the rows of the second target (``--new-runs``)


def target_lines(full_s: float, afters: list[float], asv_s: float) -> list[str]:
    """Issue 40's two targets from one run's wall seconds: the full rebuild against ``asv publish``, and the report
    after one new run -- the median of ``afters`` (each after one more run), each shown -- absolute and on this
    machine's scale (against asv publish here, as the issue's 2 s was against its 147.7 s)."""
    ratio = full_s / asv_s
    after = statistics.median(afters)
    each = f" (median of {', '.join(f'{s:.2f}' for s in afters)})" if len(afters) > 1 else ""
    scaled, goal = after / asv_s, TARGET_AFTER_RUN_S / ISSUE_ASV_S
    return [f"targets (wall): full rebuild / asv publish = {full_s:.2f} / {asv_s:.2f} s = {ratio:.3f} (target <= "
            f"{TARGET_FULL_RATIO}: {'met' if ratio <= TARGET_FULL_RATIO else 'NOT met'}); after one new run "
            f"{after:.2f} s{each} (target <= {TARGET_AFTER_RUN_S} s: "
            f"{'met' if after <= TARGET_AFTER_RUN_S else 'NOT met'})",
            f"after one new run / asv publish = {scaled:.4f} (the issue's {TARGET_AFTER_RUN_S} s against its "
            f"{ISSUE_ASV_S} s asv publish: {goal:.4f}; {'met' if scaled <= goal else 'NOT met'} on this machine's "
            "scale)"]
RUN_COLUMNS = ("id", "run_id", "key", "kind", "name", "kernel", "variant", "dtype", "shape", "shape_key",
               "check_name", "status", "detail", "output_tail", "max_error", "tolerance", "duration_s", "node",
               "attempts", "n_samples", "inner", "median_s", "ci_low_s", "ci_high_s", "iqr_rel", "flops",
               "bytes_moved", "achieved_flops", "achieved_bytes_per_s", "pct_peak", "bound", "trials", "created_at")


def series_list(limit: int) -> list[tuple[str, str, str, dict[str, int]]]:
    """The first ``limit`` series: the grid of KERNELS x DTYPES (200), then bfloat16 of it (100), then
    flash_prefill at D=128 in all three dtypes (144)."""
    out = []
    for dtypes, grid in ((DTYPES, {k: v[1] for k, v in KERNELS.items()}),
                         (("bfloat16",), {k: v[1] for k, v in KERNELS.items()}),
                         ((*DTYPES, "bfloat16"), MORE_SHAPES)):
        for kernel, shapes in grid.items():
            for variant in KERNELS[kernel][0]:
                for dtype in dtypes:
                    out.extend((kernel, variant, dtype, shape) for shape in shapes)
    if limit > len(out):
        raise SystemExit(f"--series {limit}: at most {len(out)} series are defined")
    return out[:limit]


def _truth(n_commits: int, n_chips: int, series: list, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The planted truth: a base time per chip and series, a level factor per commit (steps; one regression at the
    newest commit) and a variant that wins on one chip and loses on another."""
    rng = np.random.default_rng(seed)
    chips = CHIPS[:n_chips]
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
    return base, level


def _run_rows(run_id: str, levels: np.ndarray, series: list, job_id: int, rng: np.random.Generator, *,
              n_trials: int, n_samples: int, between: float) -> tuple[list[tuple], list[tuple], int]:
    """The job rows (benchmarks, then a few correctness checks) and sample rows of one run; the last job id."""
    keys = [job_key("benchmark", k, v, s, d) for k, v, d, s in series]
    checks = [(k, v, d, s) for k, v, d, s in series if s == KERNELS[k][1][0] and d == "float16"][:4]
    created = T0.strftime("%Y-%m-%d %H:%M:%S.%f")
    per_job = n_trials * n_samples
    trial_levels = levels[:, None, None] * np.exp(rng.normal(0.0, between, (len(series), n_trials, 1)))
    times = (trial_levels * np.exp(rng.normal(0.0, 0.01, (len(series), n_trials, n_samples)))).reshape(
        len(series), per_job)
    medians = np.median(times, axis=1).tolist()
    lows, highs = times.min(axis=1).tolist(), times.max(axis=1).tolist()
    jobs = []
    for s, (kernel, variant, dtype, shape) in enumerate(series):
        m = medians[s]
        jobs.append((job_id + 1 + s, run_id, keys[s], "benchmark", kernel, kernel, variant, dtype, json.dumps(shape),
                     shape_label(shape), "", "passed", "", "", None, None, 1.0, "", 1, per_job, 10, m, lows[s],
                     highs[s], 0.01, 1e9, 1e8, 1e9 / m, 1e8 / m, 10.0, "compute", n_trials, created))
    ids = np.arange(job_id + 1, job_id + 1 + len(series))
    samples = list(zip(np.repeat(ids, per_job).tolist(), np.tile(np.arange(per_job), len(series)).tolist(),
                       times.ravel().tolist(), np.tile(np.repeat(np.arange(n_trials), n_samples), len(series))
                       .tolist(), strict=True))
    job_id += len(series)
    for kernel, variant, dtype, shape in checks:
        job_id += 1
        jobs.append((job_id, run_id, job_key("correctness", kernel, variant, shape, dtype, "reference"),
                     "correctness", kernel, kernel, variant, dtype, json.dumps(shape), shape_label(shape),
                     "reference", "passed", "", "", 1e-4, 2e-3, 0.1, "", 1, None, None, None, None, None,
                     None, None, None, None, None, None, "", 1, created))
    return jobs, samples, job_id


def _insert_sql() -> tuple[str, str]:
    quoted = ", ".join('"' + c + '"' for c in RUN_COLUMNS)
    return (f"INSERT INTO job ({quoted}) VALUES ({', '.join('?' * len(RUN_COLUMNS))})",
            "INSERT INTO sample (job_id, idx, seconds, trial) VALUES (?, ?, ?, ?)")


def _insert_samples(conn, sample_sql: str, samples: list[tuple]) -> None:
    """The samples and, as the store writes them with every sample (``store.sample_writer``), their trials'
    summaries."""
    conn.exec_driver_sql(sample_sql, samples)
    conn.exec_driver_sql("INSERT INTO trial_summary (job_id, n, trials) VALUES (?, ?, ?)", [
        (job_id, n, records.tobytes())
        for job_id, (n, records) in store_module.packed_summaries(store_module.trial_summaries(samples)).items()])


def _run_row(i: int, c: int, n_series: int, *, minutes: float = 0.0) -> dict:
    start = T0 + timedelta(hours=i, minutes=c + minutes)
    return {"id": f"r{i:05d}c{c}", "commit_id": i + 1, "chip_id": c + 1, "machine_id": c + 1, "suite": "bench",
            "dirty": False, "executor": "local", "status": "complete", "started_at": start,
            "finished_at": start + timedelta(minutes=30), "peak_flops": 50e12 / CHIPS[c][5],
            "peak_bytes_per_s": 400e9 / CHIPS[c][5], "planned_jobs": n_series + 4, "options": {}}


def _commit_row(i: int) -> dict:
    return {"id": i + 1, "repo": "", "sha": f"{i:08x}" + "c0ffee" * 5 + "00",
            "message": f"commit {i}: synthetic change to the kernels\n\nbody", "author": "bench", "branch": "main"}


def fill(url: str, n_commits: int, n_chips: int, n_series: int, n_samples: int, n_trials: int = 3,
         between: float = 0.01, seed: int = 0) -> dict[str, int]:
    store = open_store(url)
    series = series_list(n_series)
    chips = CHIPS[:n_chips]
    base, level = _truth(n_commits, n_chips, series, seed)
    rng = np.random.default_rng(seed + 1)
    counts = {}
    job_sql, sample_sql = _insert_sql()
    with store.engine.begin() as conn:
        conn.execute(insert(Chip), [{"id": i + 1, "key": key, "backend": backend, "device_name": name,
                                     "architecture": arch, "memory_bytes": 64 * 2**30, "gpu_cores": cores,
                                     "record": {"os": "synthetic", "mlx_version": "0.32.4"}}
                                    for i, (key, backend, name, arch, cores, _) in enumerate(chips)])
        conn.execute(insert(Machine), [{"id": i + 1, "hostname": f"host-{i}", "chip_id": i + 1, "facts": {}}
                                       for i in range(len(chips))])
        conn.execute(insert(Commit), [_commit_row(i) for i in range(n_commits)])
        runs = [_run_row(i, c, len(series)) for i in range(n_commits) for c in range(len(chips))]
        conn.execute(insert(Run), runs)
        counts["runs"] = len(runs)
        job_id, n_jobs, n_rows = 0, 0, 0
        for i in range(n_commits):
            jobs, samples = [], []
            for c in range(len(chips)):
                more_jobs, more_samples, job_id = _run_rows(f"r{i:05d}c{c}", base[c] * level[i, c], series, job_id,
                                                            rng, n_trials=n_trials, n_samples=n_samples,
                                                            between=between)
                jobs += more_jobs
                samples += more_samples
            conn.exec_driver_sql(job_sql, jobs)
            _insert_samples(conn, sample_sql, samples)
            n_jobs += len(jobs)
            n_rows += len(samples)
        counts.update(jobs=n_jobs, samples=n_rows)
    store.close()
    return counts


def add_run(url: str, *, chip: int = 0, n_samples: int = 10, n_trials: int = 3, between: float = 0.01,
            seed: int = 0) -> str:
    """One new run: the next commit, on one chip, every series the chip ran before (and the checks)."""
    store = open_store(url)
    try:
        with store.session() as session:
            n_commits = session.scalar(select(Commit.id).order_by(Commit.id.desc()).limit(1)) or 0
            n_chips = len(session.scalars(select(Chip.id)).all())
            job_id = session.scalar(select(JobRecord.id).order_by(JobRecord.id.desc()).limit(1)) or 0
            n_series = len(set(session.scalars(select(JobRecord.key).where(
                JobRecord.kind == "benchmark", JobRecord.run_id == f"r{n_commits - 1:05d}c{chip}"))))
        series = series_list(n_series)
        base, level = _truth(n_commits, n_chips, series, seed)
        run_id = f"r{n_commits:05d}c{chip}"
        jobs, samples, _ = _run_rows(run_id, base[chip] * level[-1, chip], series, job_id,
                                     np.random.default_rng(seed + 7 + n_commits), n_trials=n_trials,
                                     n_samples=n_samples, between=between)
        job_sql, sample_sql = _insert_sql()
        with store.engine.begin() as conn:
            conn.execute(insert(Commit), [_commit_row(n_commits)])
            conn.execute(insert(Run), [_run_row(n_commits, chip, len(series))])
            conn.exec_driver_sql(job_sql, jobs)
            _insert_samples(conn, sample_sql, samples)
        return run_id
    finally:
        store.close()


def add_run_by(tree: Path, url: str, *, n_samples: int = 10, n_trials: int = 3, between: float = 0.01) -> None:
    """``add_run`` by ``tree``'s own code, in a process of its own: the same run (``add_run`` is deterministic in the
    database's state), and the database stays at that tree's schema (opening one migrates it to the opener's, which
    an older tree refuses)."""
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'tools'); import bench_report; "
                    "bench_report.add_run(sys.argv[1], n_samples=int(sys.argv[2]), n_trials=int(sys.argv[3]), "
                    "between=float(sys.argv[4]))", url, str(n_samples), str(n_trials), str(between)],
                   cwd=tree, check=True, capture_output=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


# ---------------------------------------------------------------------------------------------------------------
# One report, in this process (run in a fresh process per scenario by main)
# ---------------------------------------------------------------------------------------------------------------


def one_report(url: str, out: Path, *, cache: bool, change_points: bool, last: int | None) -> dict:
    """``harness report`` as build_report runs it (load, analyse, evidence, render), timed per phase; with what the
    analysis cache reused and computed."""
    notes: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: notes.append(record.getMessage())  # type: ignore[method-assign]
    for name in ("harness.analysis.cache", "harness.render.pages"):  # what the caches reused, pages kept
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    start = time.perf_counter()
    store = open_store(url, must_exist=True)
    try:
        data = site_inputs.load_site(store, change_points=change_points, last=last, cache=cache)
        began = time.perf_counter()  # the compare / samples pages
        data.evidence = site_evidence.load_evidence(store, data.latest, data.regressions)
        data.timings["evidence"] = time.perf_counter() - began
        report.render(data, out, store=store, incremental=cache)  # as build_report: pages unchanged are kept
    finally:
        store.close()
    return {"timings": data.timings, "in_process_s": time.perf_counter() - start,
            "histories": sum(len(h) for h in data.histories.values()),
            "change_points": sum(len(s.change_points) for h in data.histories.values() for s in h),
            "regressions": len(data.regressions), "cache": "; ".join(notes)}


def timed(command: list[str], **kwargs) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds (user + system, children included) of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def compile_tree(tree: Path) -> None:
    """Compile ``tree``'s sources to bytecode, as a user's install has them (pip compiles on install; an editable
    checkout writes them on its first run): with PYTHONDONTWRITEBYTECODE set, as on the machines these figures
    come from, every report would otherwise compile the harness again (0.4-0.7 s of CPU each)."""
    folders = [str(tree / name) for name in ("harness", "reports", "kernels") if (tree / name).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True, capture_output=True)


def reference_loop_s() -> float:
    """Seconds of a fixed pure-Python loop (best of three): how fast this machine is, to set figures measured on
    different machines side by side (the machines lent here differ by 3x and more from day to day)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        sum(i * i for i in range(2_000_000))
        best = min(best, time.perf_counter() - start)
    return best


def report_process(url: str, out: Path, *, cache: bool, args: argparse.Namespace, tree: Path | None = None) -> dict:
    """One report in a fresh process: this tree's ``harness report`` as a user runs it (``python -m harness report
    ... --timings``: the CLI's start-up, imports, queries, analysis and render), or ``tree``'s by its own copy of
    this script (``--report-once``: a baseline checkout may predate ``--timings``)."""
    if tree is None:
        command = [sys.executable, "-m", "harness", "report", "--db", url, "--out", str(out), "--timings"]
        command += [] if cache else ["--no-cache"]
    else:
        own = tree / "tools" / "bench_report.py"  # scripts/ in a checkout from before tools/
        own = own if own.exists() else tree / "scripts" / "bench_report.py"
        command = [sys.executable, str(own), "--report-once", url, "--out", str(out)]
        command += [] if cache else ["--uncached"]
    command += [] if args.change_points else ["--no-change-points"]
    command += ["--last", str(args.last)] if args.last else []
    wall, cpu, done = timed(command, env={**os.environ, "PYTHONHASHSEED": "0"}, cwd=tree or ROOT)
    if done.returncode != 0:
        raise SystemExit(f"report failed:\n{done.stdout}\n{done.stderr}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall, "cpu_s": cpu}


# ---------------------------------------------------------------------------------------------------------------
# asv: the same data as asv results, then `asv publish`
# ---------------------------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str, **kwargs) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, **kwargs).stdout


def write_asv(url: str, root: Path) -> tuple[Path, int]:
    """asv's project for the database's data under ``root``: a git repository with one commit per stored commit
    (linear, in id order), asv.conf.json, results/<machine>/machine.json, benchmarks.json and one results file per
    (machine, commit); returns the config path and the number of result values."""
    store = open_store(url, must_exist=True)
    try:
        with store.session() as session:
            commit_ids = list(session.scalars(select(Commit.id).order_by(Commit.id)))
            rows = session.execute(
                select(Chip.key, Run.commit_id, Run.started_at, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                       JobRecord.shape_key, JobRecord.median_s, JobRecord.ci_low_s, JobRecord.ci_high_s,
                       JobRecord.iqr_rel, JobRecord.inner, JobRecord.n_samples)
                .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
                .where(JobRecord.kind == "benchmark", JobRecord.median_s.is_not(None))).all()
    finally:
        store.close()
    repo = root / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    stream = []
    for n, _ in enumerate(commit_ids):
        when = int((T0 + timedelta(hours=n)).timestamp())
        message = f"commit {n}\n".encode()
        stream.append(b"commit refs/heads/main\n" + f"mark :{n + 1}\n".encode()
                      + f"committer bench <bench@example.com> {when} +0000\n".encode()
                      + f"data {len(message)}\n".encode() + message
                      + (f"from :{n}\n".encode() if n else b"") + b"\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=b"".join(stream), check=True)
    shas = _git(repo, "rev-list", "--reverse", "main").split()
    sha_of = dict(zip(commit_ids, shas, strict=True))
    results = root / "results"
    benchmarks: dict[str, dict] = {}
    files: dict[tuple[str, int], dict] = {}
    for chip, commit_id, started, kernel, variant, dtype, shape_key, median, low, high, iqr, inner, n in rows:
        name = f"{kernel}.time_{variant}_{dtype}_" + "".join(c if c.isalnum() else "_" for c in shape_key)
        benchmarks.setdefault(name, {"name": name, "type": "time", "unit": "seconds", "params": [],
                                     "param_names": [], "version": "1", "timeout": 60.0, "number": 0,
                                     "repeat": 0, "min_run_count": 2, "rounds": 2, "sample_time": 0.01,
                                     "warmup_time": -1, "code": "", "pretty_name": name})
        started_ms = int(started.replace(tzinfo=started.tzinfo or UTC).timestamp() * 1000)
        entry = files.setdefault((chip, commit_id), {"date": started_ms, "results": {}})
        spread = (iqr or 0.0) * median / 2
        entry["results"][name] = [[median], [], "1", started_ms, 1.0, [low], [high], [median - spread],
                                  [median + spread], [inner or 1], [n or 1]]
    for chip in sorted({chip for chip, _ in files}):
        (results / chip).mkdir(parents=True)
        (results / chip / "machine.json").write_text(json.dumps({
            "machine": chip, "arch": "x86_64", "cpu": chip, "num_cpu": "8", "os": "Linux", "ram": "64GB",
            "version": 1}))
    columns = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
               "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
    for (chip, commit_id), entry in files.items():
        sha = sha_of[commit_id]
        (results / chip / f"{sha[:8]}-existing-py.json").write_text(json.dumps({
            "commit_hash": sha, "env_name": "existing-py", "date": entry["date"],
            "params": {"machine": chip, "arch": "x86_64", "cpu": chip, "num_cpu": "8", "os": "Linux",
                       "ram": "64GB", "python": "3.11"},
            "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": columns,
            "results": entry["results"], "durations": {}, "version": 2}, separators=(",", ":")))
    (results / "benchmarks.json").write_text(json.dumps({**benchmarks, "version": 2}))
    conf = root / "asv.conf.json"
    conf.write_text(json.dumps({"version": 1, "project": "bench", "project_url": "https://example.com/",
                                "repo": str(repo), "dvcs": "git", "branches": ["main"],
                                "environment_type": "existing", "results_dir": str(results),
                                "html_dir": str(root / "html")}))
    return conf, sum(len(entry["results"]) for entry in files.values())


def asv_publish(asv: str, conf: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    return timed([asv, "--config", str(conf), "publish", "--no-pull"], cwd=conf.parent)


# ---------------------------------------------------------------------------------------------------------------


def _phases(result: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in result["timings"].items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--chips", type=int, default=4, choices=range(1, len(CHIPS) + 1))
    parser.add_argument("--series", type=int, default=400)
    parser.add_argument("--samples", type=int, default=10, help="samples per trial")
    parser.add_argument("--trials", type=int, default=3, help="trials (job processes) per benchmark job and run")
    parser.add_argument("--between", type=float, default=0.01, help="log sd of a trial's level between processes")
    parser.add_argument("--change-points", action=argparse.BooleanOptionalAction, default=True,
                        help="run stats.detect_change_points on every history (O(n^2) per series)")
    parser.add_argument("--last", type=int, help="histories and regressions of each chip's last N commits only")
    parser.add_argument("--db", help="this SQLite file (filled if it does not exist; a new run is added to it)")
    parser.add_argument("--keep-db", action="store_true", help="keep --db's new run (default: --db is copied)")
    parser.add_argument("--uncached", action="store_true", help="also time the report without the cache")
    parser.add_argument("--check", action="store_true", help="check cached results == uncached results")
    parser.add_argument("--asv", default="/tmp/asvenv/bin/asv", help="asv's executable ('' to skip asv)")
    parser.add_argument("--out", help="output folder (default: a temporary one)")
    parser.add_argument("--baseline", metavar="TREE", help="also time this checkout's report (rows 3 and 4)")
    parser.add_argument("--new-runs", type=int, default=3, metavar="N",
                        help="time the report after each of N new runs, one after another (each one new run; the "
                             "target line takes their median: one report on a noisy machine is one draw)")
    parser.add_argument("--report-once", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report_once:
        result = one_report(args.report_once, Path(args.out), cache=not args.uncached,
                            change_points=args.change_points, last=args.last)
        print(json.dumps(result))
        return
    compile_tree(ROOT)
    if args.baseline:
        compile_tree(Path(args.baseline).resolve())
    print(f"reference loop (machine speed): {reference_loop_s():.3f} s; bytecode compiled first")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db = work / "bench.db"
        if args.db and Path(args.db).exists():
            if args.keep_db:
                db = Path(args.db)
            else:
                shutil.copyfile(args.db, db)
                print(f"copied {args.db}")
        else:
            db = Path(args.db) if args.db else db
            start = time.perf_counter()
            counts = fill(f"sqlite:///{db}", args.commits, args.chips, args.series, args.samples, args.trials,
                          args.between)
            print(f"filled {db} in {time.perf_counter() - start:.0f} s: {counts['runs']} runs, {counts['jobs']} "
                  f"jobs, {counts['samples']} samples ({db.stat().st_size / 2**20:.0f} MiB)")
        url = f"sqlite:///{db}"
        out = Path(args.out) if args.out else work / "site"
        base_db = work / "baseline.db"
        if args.baseline:  # copied before this tree opens it: opening migrates it to this tree's schema
            shutil.copyfile(db, base_db)
        store = open_store(url)
        cleared = analysis_cache.clear(store)
        with store.session() as session:
            n_runs = session.scalar(select(func.count(Run.id)))
            n_commits = session.scalar(select(func.count(Commit.id)))
            n_series = session.scalar(select(func.count(func.distinct(JobRecord.key))).where(
                JobRecord.kind == "benchmark", JobRecord.run_id == session.scalar(select(Run.id).limit(1))))
        store.close()
        print(f"{n_runs} runs; analysis cache emptied ({cleared} rows)")
        rows: list[tuple[str, dict]] = []
        rows.append(("harness report, full rebuild (empty cache)", report_process(url, out, cache=True, args=args)))
        if args.uncached:
            rows.append(("harness report without the cache", report_process(url, out.with_name(out.name + "-uncached"),
                                                                            cache=False, args=args)))
        rows.append(("harness report again, nothing new", report_process(url, out, cache=True, args=args)))
        base_url = None
        if args.baseline:
            tree = Path(args.baseline).resolve()
            base_url = f"sqlite:///{base_db}"
            # its first report analyses everything (the cache's rows are keyed by the code, this tree's here) and
            # writes every page: not shown, as the head tree's full rebuild is not one of its later rows
            report_process(base_url, work / "site-baseline", cache=True, args=args, tree=tree)
            rows.append(("baseline tree, nothing new", report_process(base_url, work / "site-baseline", cache=True,
                                                                      args=args, tree=tree)))
        for i in range(max(1, args.new_runs)):
            run_id = add_run(url, n_samples=args.samples, n_trials=args.trials, between=args.between)
            rows.append((f"{AFTER_ONE_RUN} ({run_id})", report_process(url, out, cache=True, args=args)))
            if base_url and i == 0:
                add_run_by(tree, base_url, n_samples=args.samples, n_trials=args.trials, between=args.between)
                rows.append((f"baseline tree, after one new run ({run_id})",
                             report_process(base_url, work / "site-baseline", cache=True, args=args, tree=tree)))
        if args.check:
            store = open_store(url)
            try:
                cached = site_inputs.load_site(store, change_points=args.change_points, last=args.last)
                plain = site_inputs.load_site(store, change_points=args.change_points, last=args.last, cache=False)
            finally:
                store.close()
            same = cached.histories == plain.histories and cached.regressions == plain.regressions
            print(f"check: cached histories and regressions {'==' if same else '!='} uncached "
                  f"({sum(len(h) for h in plain.histories.values())} series, {len(plain.regressions)} regressions)")
        asv_row = None
        if args.asv and Path(args.asv).exists():
            start = time.perf_counter()
            conf, values = write_asv(url, work / "asv")
            print(f"asv data written in {time.perf_counter() - start:.0f} s: {values} results "
                  f"({sum(f.stat().st_size for f in (work / 'asv' / 'results').rglob('*.json')) / 2**20:.0f} MiB)")
            wall, cpu, done = asv_publish(args.asv, conf)
            if done.returncode == 0:
                asv_row = {"wall_s": wall, "cpu_s": cpu}
                html = work / "asv" / "html"
                print(f"asv publish: {sum(1 for _ in html.rglob('*.json'))} JSON files written")
            else:
                print(f"asv publish FAILED (exit {done.returncode}), no asv numbers:\n{done.stderr[-2000:]}")
        else:
            print(f"asv not run: no executable at {args.asv!r} (python -m venv /tmp/asvenv && "
                  "/tmp/asvenv/bin/pip install asv)")
        size = (f"{n_commits} commits x {args.chips} chips x {n_series} series, {args.trials} trials x "
                f"{args.samples} samples, change points {'on' if args.change_points else 'off'}"
                f"{f', last {args.last}' if args.last else ''}")
        print(f"\n{size}; wall and CPU seconds (CPU: user + system, children included)")
        print(f"{'':48} {'wall s':>8} {'CPU s':>8}   phases (in-process wall s)")
        for label, result in rows:
            print(f"{label:48} {result['wall_s']:8.2f} {result['cpu_s']:8.2f}   {_phases(result)}")
            if result["cache"]:
                print(f"{'':48} {'':17}   {result['cache']}")
        if asv_row:
            print(f"{'asv publish (same data)':48} {asv_row['wall_s']:8.2f} {asv_row['cpu_s']:8.2f}")
            print("\nratios to asv publish (wall, CPU):")
            for label, result in rows:
                print(f"  {label:46} {result['wall_s'] / asv_row['wall_s']:6.3f} "
                      f"{result['cpu_s'] / asv_row['cpu_s']:6.3f}")
        full = rows[0][1]
        afters = [result["wall_s"] for label, result in rows if label.startswith(AFTER_ONE_RUN)]
        if asv_row:  # issue 40's two targets, from this run's figures
            print("\n" + "\n".join(target_lines(full["wall_s"], afters, asv_row["wall_s"])))
        if "histories" in full:  # a --report-once row (the CLI's --timings does not count them)
            print(f"\nreported: {full['histories']} series histories, {full['change_points']} change points, "
                  f"{full['regressions']} regressions")


if __name__ == "__main__":
    main()
