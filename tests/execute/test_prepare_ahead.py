"""Job processes that compile together, then time in turn (harness/execute/local.py ``run_together``, the worker's
``--gate``): MLX compiles a source kernel in every process (1.3-3.3 s a kernel on the H200), so a round's processes
start together and make their first calls while none of them times; then each times alone, in plan order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict

from harness.core.job import KernelJob
from harness.execute.local import LocalExecutor
from testkit.paths import PLUGINS

TIMING = {"warmup_s": 0.0, "warmup_calls": 1, "min_sample_s": 0.001, "samples": 3}


def gate_job(variant: str, n: int) -> KernelJob:
    return KernelJob.of("benchmark", "gatelog", variant, {"N": n}, "float32", "", timeout_s=60.0, timing=TIMING,
                        plugins=("gate_kernels",), plugin_dir=str(PLUGINS))


def calls(log) -> dict[int, list[tuple[float, str]]]:
    by_pid: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        pid, at, name = line.split()
        by_pid[int(pid)].append((float(at), name))
    return by_pid


def test_processes_of_a_group_all_compile_before_any_times_and_then_time_one_after_another(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("GATE_LOG", str(log))
    jobs = [gate_job("src", n) for n in (8, 16, 24, 32, 40, 48)]
    seen = {}
    LocalExecutor(batch=2, ahead=3).execute(jobs, lambda job, result: seen.__setitem__(job.key, result))
    assert [seen[job.key].status for job in jobs] == ["passed"] * 6
    by_pid = calls(log)
    assert len(by_pid) == 3  # three processes of two jobs each
    prepared = [entries[:2] for entries in by_pid.values()]  # one call of each of its two jobs before its gate
    timed = [entries[2:] for entries in by_pid.values()]
    assert all(len(entries) > 2 for entries in by_pid.values())
    last_prepare = max(at for entries in prepared for at, _ in entries)
    first_timed = min(at for entries in timed for at, _ in entries)
    assert last_prepare < first_timed
    spans = sorted((entries[0][0], entries[-1][0]) for entries in timed)
    assert all(end < next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))


def test_mlx_op_variants_are_not_called_before_the_gate_and_nothing_is_timed_until_it_opens(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("GATE_LOG", str(log))
    folder = tmp_path / "batch"
    folder.mkdir()
    jobs = [gate_job("ops", 8), gate_job("src", 8), gate_job("src", 16)]
    (folder / "jobs.json").write_text(json.dumps([job.to_dict() for job in jobs]))
    proc = subprocess.Popen([sys.executable, "-m", "harness.execute.worker", "--batch", str(folder / "jobs.json"),
                             str(folder), "--gate", str(folder / "go")], env={**os.environ, "GATE_LOG": str(log)})
    try:
        deadline = time.monotonic() + 60
        while not (folder / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        assert (folder / "ready").read_text().strip() == "2"  # the two source-kernel jobs, one call each
        assert [name for entries in calls(log).values() for _, name in entries] == ["src", "src"]
        assert not list(folder.glob("[0-9]*.json"))  # nothing timed yet
        (folder / "go").touch()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    results = [json.loads((folder / f"{i}.json").read_text()) for i in range(3)]
    assert [r["status"] for r in results] == ["passed"] * 3 and all(len(r["samples"]) == 3 for r in results)


def test_a_process_that_dies_before_its_gate_has_its_jobs_run_alone_and_the_others_go_on(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("GATE_LOG", str(log))
    jobs = [gate_job("src_dies", 8), gate_job("src_dies", 16), gate_job("src", 8), gate_job("src", 16),
            gate_job("src", 24), gate_job("src", 32)]
    seen = {}
    LocalExecutor(batch=2, ahead=3).execute(jobs, lambda job, result: seen.__setitem__(job.key, result.status))
    assert [seen[job.key] for job in jobs] == ["passed", "crashed", "passed", "passed", "passed", "passed"]
    by_pid = calls(log)
    # the group's first process died compiling (before its gate); its two jobs then ran one per process
    died = [pid for pid, entries in by_pid.items() if [name for _, name in entries] == ["src_dies", "src_dies"]]
    alone = [pid for pid, entries in by_pid.items() if pid not in died and entries[0][1] == "src_dies"]
    assert len(died) == 1 and len(alone) == 2 and len(by_pid) == 5
