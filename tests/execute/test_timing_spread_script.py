"""bench/timing_spread.py as a user runs it: fresh processes per setting, pinned where asked (on MLX's CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testkit.paths import BENCH


def test_each_affinity_is_a_setting_and_its_processes_run_pinned(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "spread.json"
    done = subprocess.run([sys.executable, str(BENCH / "timing_spread.py"), "--cpu", "--processes", "2",
                           "--samples", "5", "--kernels", "sdpa1024", "--modes", "pipelined",
                           "--affinities", f"all;{cpu}", "--groups", "1,4", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    everything = json.loads(out.read_text())["results"]
    assert {(r["cpus"], r["group"]) for r in everything} == {(c, g) for c in ("all", str(cpu)) for g in (1, 4)}
    assert all(p["group"] == r["group"] for r in everything for p in r["processes"])
    results = {r["cpus"]: r for r in everything if r["group"] == 1}
    assert all(p["affinity"] == [cpu] for p in results[str(cpu)]["processes"])
    assert all(p["affinity"] == sorted(os.sched_getaffinity(0)) for p in results["all"]["processes"])
    assert all(len(r["processes"]) == 2 and r["median_ms"] > 0 for r in results.values())


def test_a_bad_cpu_set_fails_before_any_process_starts(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / "timing_spread.py"), "--cpu", "--affinities",
                           "all;x"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "bad CPU set 'x'" in done.stderr and "Traceback" not in done.stderr


def test_bad_groups_fail_before_any_process_starts(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / "timing_spread.py"), "--cpu", "--groups", "1,0"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "bad --groups '1,0'" in done.stderr and "Traceback" not in done.stderr
