"""Per-job overhead of the harness on Ray vs bare Ray tasks, for the same no-op job, on a local 3-node cluster.

    python bench/bench_ray_overhead.py [--jobs 30] [--rounds 3]

Every mode runs the same N no-op correctness jobs (tests/plugins/ray_sched_plugin.py, variant "ok") on three
loopback nodes labelled chip=bench, one job per node at a time (each task takes the node's whole
``harness_node`` resource), and the per-job cost is wall time / N. Modes:

- ``bare-inproc``:   a bare Ray task that does nothing (no job process at all);
- ``bare-subproc``:  a bare Ray task that spawns the same job process the harness spawns
                     (``python -m harness.execute.worker job.json result.json``) and reads its result;
- ``harness``:       RayExecutor.execute (label check, dispatch loop, run_in_subprocess with its timeout);
- ``harness+git``:   the same, each job from a verified clean worktree of a commit (the production path:
                     per-node clone cache, ``git rev-parse`` + ``git status`` before every job).

The harness runs every job in its own process (its isolation guarantee), so the honest comparison is against
``bare-subproc``; the ratio against ``bare-inproc`` is printed too and is dominated by the process start.
Rounds are interleaved (mode order rotates) and the median round of each mode is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Before Ray is imported (it reads these once): nothing leaves the machine, the cluster stays on 127.0.0.1.
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from testkit.ray import make_remote_repo, restore_env, set_env, start_cluster  # noqa: E402

CHIP = "bench"


def make_jobs(count: int):
    from harness.core.job import KernelJob

    jobs = []
    for i in range(count):
        shape = {"N": i + 1}
        jobs.append(KernelJob.of("correctness", "ray_sched", "ok", shape, "float32", "noop", name="noop",
                                 timeout_s=120, plugins=("ray_sched_plugin",),
                                 plugin_dir=str(ROOT / "tests" / "plugins")))
    return jobs


def bare_tasks():
    import ray

    from harness.execute.ray_executor import CHIP_LABEL, NODE_RESOURCE

    options = {"num_cpus": 0, "max_retries": 0, "label_selector": {CHIP_LABEL: CHIP},
               "resources": {NODE_RESOURCE: 1.0}}

    @ray.remote(**options)
    def inproc(job_json: str) -> dict:
        return {"key": json.loads(job_json)["key"], "status": "passed"}

    @ray.remote(**options)
    def subproc(job_json: str) -> dict:
        with tempfile.TemporaryDirectory(prefix="bare-job-") as scratch:
            job_path, result_path = Path(scratch, "job.json"), Path(scratch, "result.json")
            job_path.write_text(job_json)
            subprocess.run([sys.executable, "-m", "harness.execute.worker", str(job_path), str(result_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=120, check=False)
            return json.loads(result_path.read_text())

    return inproc, subproc


def run_bare(task, jobs) -> float:
    import ray

    start = time.perf_counter()
    refs = [task.remote(job.to_json()) for job in jobs]
    results = ray.get(refs, timeout=600)
    elapsed = time.perf_counter() - start
    assert all(r["status"] == "passed" for r in results), results[:2]
    return elapsed


def run_harness(jobs, repo: str | None = None, sha: str | None = None) -> float:
    from harness.execute.ray_executor import RayExecutor

    statuses = []
    start = time.perf_counter()
    RayExecutor(CHIP, repo=repo, sha=sha).execute(jobs, lambda job, result: statuses.append(result.status))
    elapsed = time.perf_counter() - start
    assert statuses == ["passed"] * len(jobs), statuses[:3]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="no-op jobs per round and mode")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per mode (median reported)")
    args = parser.parse_args()

    import ray

    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    previous = set_env(tmp)
    repo, sha = make_remote_repo(tmp / "remote")
    cluster = start_cluster([CHIP] * 3)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        inproc, subproc = bare_tasks()
        jobs = make_jobs(args.jobs)
        modes = {
            "bare-inproc": lambda: run_bare(inproc, jobs),
            "bare-subproc": lambda: run_bare(subproc, jobs),
            "harness": lambda: run_harness(jobs),
            "harness+git": lambda: run_harness(jobs, str(repo), sha),
        }
        for run in modes.values():  # warm-up: worker processes, imports, the clone and worktree on each node
            run()
        times: dict[str, list[float]] = {name: [] for name in modes}
        names = list(modes)
        for round_index in range(args.rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for name in order:
                times[name].append(modes[name]())
        per_job = {name: statistics.median(values) / args.jobs for name, values in times.items()}
        print(f"{args.jobs} no-op jobs x {args.rounds} rounds on 3 nodes (chip={CHIP}), {os.cpu_count()} cores; "
              "per-job = median round wall time / jobs")
        for name, seconds in per_job.items():
            spread = ", ".join(f"{v / args.jobs * 1e3:.1f}" for v in times[name])
            print(f"  {name:13s} {seconds * 1e3:8.1f} ms/job   (rounds: {spread} ms/job)")
        base = per_job["bare-subproc"]
        print(f"harness     / bare Ray task + same job subprocess: {per_job['harness'] / base:.2f}x (target <= 1.2x)")
        print(f"harness+git / bare Ray task + same job subprocess: {per_job['harness+git'] / base:.2f}x")
        print(f"harness     / bare in-process Ray task:            {per_job['harness'] / per_job['bare-inproc']:.1f}x "
              "(the job process start is the product's isolation cost)")
    finally:
        ray.shutdown()
        cluster.shutdown()
        restore_env(previous)


if __name__ == "__main__":
    main()
