"""`harness compare --settle` on the built-in benchmark sections, two runs of identical code (not a test).

A copy of this checkout (base) and an empty commit on top of it (head): one `harness run` of the benchmark sections
of jobs/builtin.toml each, then `harness compare BASE HEAD` (stored runs alone) and `harness compare BASE HEAD
--settle`; prints the verdict counts of both and the time --settle spent against one full run.

Run: ``python bench/settle_builtin.py [--budget 300s] [--timeout 3600] [--burners 2]`` (two full runs of the
sections: many minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.e2e import copy_checkout, git  # noqa: E402
from testkit.load import random_load  # noqa: E402
from testkit.suites import benchmark_sections  # noqa: E402


def harness(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in ``cwd`` (testkit.e2e.harness with a longer limit: one full run of the sections
    took 598 s on 2 cores at load 22)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def stored_run_s(db_file: Path, sha: str) -> float | None:
    """Seconds of the complete, non-settling run of ``sha`` stored in ``db_file`` (None: none there)."""
    if not db_file.is_file():
        return None
    with sqlite3.connect(db_file) as conn:
        row = conn.execute('select r.started_at, r.finished_at from run r join "commit" c on c.id = r.commit_id '
                           "where c.sha = ? and r.status = 'complete' and not r.settling", (sha,)).fetchone()
    if row is None:
        return None
    return (datetime.fromisoformat(row[1]) - datetime.fromisoformat(row[0])).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="300s")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one harness command may take")
    parser.add_argument("--folder", help="work here, not in a temporary folder, and keep it: a commit that already "
                                         "has a complete run there is not run again (its stored duration counts)")
    parser.add_argument("--burners", type=int, default=0, help="background processes loading the CPU at random "
                                                                   "(testkit.load) throughout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="settle-builtin-") as scratch, random_load(args.burners):
        folder = Path(args.folder) if args.folder else Path(scratch)
        repo = folder / "repo"
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True)
            copy_checkout(repo, "base")
            git(repo, "commit", "-q", "--allow-empty", "-m", "head: nothing changed")
        base, head = git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")
        suite = folder / "benchmarks.toml"
        if not suite.is_file():
            suite.write_text(benchmark_sections((ROOT / "jobs" / "builtin.toml").read_text()))
        db = f"sqlite:///{folder / 'builtin.db'}"
        run_s = []
        for sha in (base, head):
            if (stored := stored_run_s(folder / "builtin.db", sha)) is not None:
                run_s.append(stored)
                print(f"harness run at {sha[:12]}: stored, complete, {stored:.0f} s", flush=True)
                continue
            started = time.perf_counter()
            done = harness("run", "--repo", str(repo), "--commit", sha, "--suite", str(suite), "--db", db,
                           "--no-report", cwd=folder, timeout=args.timeout)
            run_s.append(time.perf_counter() - started)
            print(f"harness run at {sha[:12]}: exit {done.returncode}, {run_s[-1]:.0f} s", flush=True)
            if done.returncode != 0:  # every job of identical code should pass: show why not
                print("\n".join(line for line in (done.stdout + done.stderr).splitlines()
                                if not line.startswith("progress"))[-3000:], flush=True)
            if done.returncode not in (0, 1):
                raise SystemExit(done.stderr[-1500:])
        plain = json.loads(harness("compare", base, head, "--db", db, "--format", "json", cwd=folder,
                                   timeout=args.timeout).stdout)
        print(f"stored runs alone: {plain['counts']}", flush=True)
        started = time.perf_counter()
        done = harness("compare", base, head, "--settle", "--repo", str(repo), "--suite", str(suite), "--db", db,
                       "--budget", args.budget, "--format", "json", cwd=folder, timeout=args.timeout)
        settle_s = time.perf_counter() - started
        print("\n".join(line for line in done.stderr.splitlines() if line.startswith("settle")))
        settled = json.loads(done.stdout)
        counts, total = settled["counts"], len(settled["rows"])
        for row in settled["rows"]:  # what is left undecided, and on what evidence
            if row["verdict"] in ("inconclusive", "regressed", "improved"):
                key = row["key"]
                print(f"  {row['verdict']}: {key['kernel']}/{key['variant']} {key['dtype']} {key['shape_key']}: "
                      f"x{row['ratio']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}], trials "
                      f"{row['trials_base']}/{row['trials_head']}, basis {row['basis']}, "
                      f"more trials {row['more_trials_needed']}, more runs {row['more_runs_needed']}", flush=True)
        flagged = counts["regressed"] + counts["improved"]
        print(f"compare --settle: exit {done.returncode}, {counts}; {flagged / total:.1%} flagged, "
              f"{counts['inconclusive'] / total:.1%} inconclusive of {total} series; --settle took {settle_s:.0f} s "
              f"against {sum(run_s) / 2:.0f} s for one full run ({settle_s / (sum(run_s) / 2):.2f}x)")


if __name__ == "__main__":
    main()
