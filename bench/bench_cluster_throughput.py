"""Wall time of a suite submitted to a local two-node Ray cluster against `harness run` of the same suite here.

    python bench/bench_cluster_throughput.py [--suite jobs/builtin.toml] [--nodes 2] [--benchmarks-only]

Both paths run the same commit: this checkout's files copied into a fresh git repository (so that the cluster's
nodes can check it out, as they would a CI commit). The local run is `harness run --repo COPY --commit SHA`; the
cluster is a loopback head (`harness cluster up`, no jobs of its own) and ``--nodes`` nodes of one chip label
(`harness node join --detach`), submitted to with `harness submit --wait` and stopped with the harness's own
commands (`node leave`, `cluster down`). Run one after the other on this machine, local first; each wall time
includes planning and storing, the cluster's also the checkout on the nodes. Prints both times and the ratio
(cluster / local; the goal is at most 1.2). Nodes of one machine share its cores: the ratio says what the Ray path
costs, not what more machines would gain.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.e2e import commit, copy_checkout  # noqa: E402
from testkit.ray import free_port  # noqa: E402
from testkit.suites import benchmark_sections  # noqa: E402

CHIP = "bench-throughput"


def harness(cwd: Path, env: dict[str, str], *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def timed(what: str, call) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = call()
    elapsed = time.perf_counter() - start
    print(f"{what}: exit {done.returncode}, {elapsed:.1f} s", flush=True)
    if done.returncode not in (0, 1):
        print(done.stderr[-2000:], flush=True)
    return elapsed, done


def stored_jobs(db: Path) -> int:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from job where kind != 'test'").fetchone()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="jobs/builtin.toml", help="suite file, relative to the repository")
    parser.add_argument("--nodes", type=int, default=2, help="nodes joined to the loopback head")
    parser.add_argument("--benchmarks-only", action="store_true", help="only the suite's [[benchmark]] sections")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="throughput-") as scratch:
        work = Path(scratch)
        repo = work / "repo"
        repo.mkdir()
        suite = args.suite
        if not (ROOT / args.suite).is_file():
            parser.error(f"no suite {args.suite} in {ROOT}")
        sha = copy_checkout(repo, "throughput")
        if args.benchmarks_only:
            suite = "bench-only.toml"
            sha = commit(repo, {suite: benchmark_sections((repo / args.suite).read_text())}, "benchmarks only")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(work / "cache"),
               "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        local_db = work / "local.db"
        local_s, local = timed("local harness run", lambda: harness(
            work, env, "run", "--repo", str(repo), "--commit", sha, "--suite", str(repo / suite), "--db",
            f"sqlite:///{local_db}", "--no-report"))
        port, dashboard = free_port(), free_port()
        up = harness(work, env, "cluster", "up", "--port", str(port), "--dashboard-port", str(dashboard),
                     "--auth-mode", "disabled", f"--ray-arg=--dashboard-agent-listen-port={free_port()}", timeout=300)
        if up.returncode != 0:
            print(f"cluster up failed: {up.stderr[-2000:]}")
            return 2
        try:
            for _ in range(args.nodes):
                join = harness(work, env, "node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", CHIP,
                               "--auth-mode", "disabled", "--detach", timeout=300)
                if join.returncode != 0:
                    print(f"node join failed: {join.stderr[-2000:]}")
                    return 2
            cluster_db = work / "cluster.db"
            cluster_s, cluster = timed(f"cluster submit --wait ({args.nodes} nodes)", lambda: harness(
                work, env, "submit", "--address", f"http://127.0.0.1:{dashboard}", "--repo", str(repo), "--commit",
                sha, "--suite", suite, "--python", sys.executable, "--chips", CHIP, "--db", f"sqlite:///{cluster_db}",
                "--wait"))
        finally:
            harness(work, env, "node", "leave", timeout=300)
            harness(work, env, "cluster", "down", "--port", str(port), timeout=300)
        print(f"suite {suite} at {sha[:12]}: local {local_s:.1f} s ({stored_jobs(local_db)} jobs stored), "
              f"cluster {cluster_s:.1f} s ({stored_jobs(cluster_db) if cluster_db.exists() else 0} jobs stored); "
              f"ratio cluster / local = {cluster_s / local_s:.2f} (goal <= 1.2)")
        return 0 if local.returncode in (0, 1) and cluster.returncode in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
