"""scripts/timing_spread.py as a user runs it: fresh processes per setting, pinned where asked (on MLX's CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testkit.paths import ROOT


def test_each_affinity_is_a_setting_and_its_processes_run_pinned(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "spread.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "timing_spread.py"), "--cpu", "--processes", "2",
                           "--samples", "5", "--kernels", "sdpa1024", "--modes", "pipelined",
                           "--affinities", f"all;{cpu}", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["cpus"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"all", str(cpu)}
    assert all(p["affinity"] == [cpu] for p in results[str(cpu)]["processes"])
    assert all(p["affinity"] == sorted(os.sched_getaffinity(0)) for p in results["all"]["processes"])
    assert all(len(r["processes"]) == 2 and r["median_ms"] > 0 for r in results.values())


def test_a_bad_cpu_set_fails_before_any_process_starts(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "timing_spread.py"), "--cpu", "--affinities",
                           "all;x"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "bad CPU set 'x'" in done.stderr and "Traceback" not in done.stderr
