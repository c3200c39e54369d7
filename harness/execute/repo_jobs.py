"""The worker side of a repository suite's jobs: a pytest selection and a benchmark function.

Both run inside the job process that ``python -m harness.execute.worker`` starts (with the install key's python and
the commit's tree first on PYTHONPATH: harness/execute/envs.py), so they stay free of the database and of pydantic.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import unittest
from collections import Counter
from pathlib import Path
from typing import Any

from harness import bench
from harness.core.job import FunctionJob, JobResult, PytestJob
from harness.core.proc import file_tail, kill_tree
from harness.core.status import WRONG, count_label
from harness.execute.timing import TimingProtocol, measure, measure_mlx

OUT_ENV = "HARNESS_PYTEST_OUT"  # harness/execute/pytest_plugin.py's output file (not imported here: it imports pytest)
# pytest's exit codes (pytest.ExitCode) that say more than the per-test outcomes do.
PYTEST_EXIT = {2: "interrupted (collection errors or Ctrl-C)", 3: "internal error", 4: "usage error",
               5: "no tests collected"}


def pytest_command(spec: dict[str, Any]) -> list[str]:
    """``python -m pytest`` for one selection, with the recording plugin (and no cache written into the tree)."""
    command = [sys.executable, "-m", "pytest", "-p", "harness.execute.pytest_plugin", "-p", "no:cacheprovider"]
    if spec.get("k"):
        command += ["-k", spec["k"]]
    if spec.get("m"):
        command += ["-m", spec["m"]]
    if spec.get("workers"):
        command += ["-n", str(spec["workers"])]
    return command + list(spec.get("args") or []) + list(spec.get("paths") or [])


def read_outcomes(path: Path) -> list[dict[str, Any]]:
    """The plugin's JSON lines (a torn last line, from a killed run, is ignored); one entry per node id."""
    tests: dict[str, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        tests[entry["nodeid"]] = entry
    return list(tests.values())


def run_pytest(job: PytestJob) -> JobResult:
    """Run the selection in the current folder (the commit's tree); status from the per-test outcomes."""
    spec = job.selection
    timeout_s = float(spec.get("timeout_s", 900))
    with tempfile.TemporaryDirectory(prefix="harness-pytest-") as scratch:
        out, log_path = Path(scratch) / "outcomes.jsonl", Path(scratch) / "pytest.log"
        env = {**os.environ, OUT_ENV: str(out)}
        timed_out = False
        with open(log_path, "wb") as log:
            # In the job process's group: a stop or the job's timeout kills the job's group, pytest and its xdist
            # workers with it (harness/core/proc.py); pytest's own timeout kills only pytest's tree.
            proc = subprocess.Popen(pytest_command(spec), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_tree(proc.pid)  # pytest, its xdist workers and what they started
                code = proc.wait()
        tests = read_outcomes(out)
        tail = file_tail(log_path)
    counts = Counter(t["outcome"] for t in tests)
    detail = count_label(counts)
    if timed_out:
        status, detail = "timeout", f"pytest did not finish within {timeout_s:g} s (killed); {detail}"
    elif any(counts[s] for s in WRONG):
        status = "failed"
    elif code == 5 or (not tests and code == 0):
        status, detail = "skipped", "no tests collected"
    elif code != 0:
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "no output")
        status = "failed"
        detail = f"pytest exit status {code} ({PYTEST_EXIT.get(code, 'failed')}): {last.strip()[:300]}; {detail}"
    else:
        status = "passed"
    return JobResult(job.key, status, detail, output_tail=tail, tests=tests)


def _skip_reason(exc: BaseException) -> str | None:
    """The reason when ``exc`` says "skip this here" (harness.bench.skip, unittest.SkipTest, pytest.skip)."""
    if isinstance(exc, unittest.SkipTest):
        return str(exc) or "skipped"
    if type(exc).__name__ == "Skipped" and type(exc).__module__.startswith("_pytest"):
        return str(getattr(exc, "msg", "") or exc) or "skipped"
    return None


def _is_mlx(value: Any) -> bool:
    """An mx.array, or a list / tuple / dict holding one (what mx.eval takes)."""
    mx = sys.modules.get("mlx.core")
    if mx is None:
        return False
    if isinstance(value, mx.array):
        return True
    if isinstance(value, list | tuple):
        return any(_is_mlx(v) for v in value)
    if isinstance(value, dict):
        return any(_is_mlx(v) for v in value.values())
    return False


def run_function(job: FunctionJob) -> JobResult:
    """Build the benchmark at this grid point, time what it returns with the job's protocol, count its work."""
    module_name, _, name = job.target.partition(":")
    module = importlib.import_module(module_name)
    function = getattr(module, name, None)
    if not callable(function):
        return JobResult(job.key, "failed", f"{module_name} has no function {name!r}")
    kwargs: dict[str, Any] = dict(job.shape)
    if job.dtype:
        kwargs["dtype"] = job.dtype
    try:
        call = function(**kwargs)
        if not callable(call):
            return JobResult(job.key, "failed", f"{job.target} must return the callable to time, "
                                                f"not {type(call).__name__}")
        first = call()
    except BaseException as exc:
        reason = _skip_reason(exc)
        if reason is None:
            raise
        return JobResult(job.key, "skipped", reason)
    protocol = TimingProtocol(**{k: v for k, v in job.timing.items() if k in TimingProtocol.__dataclass_fields__})
    if _is_mlx(first):
        measurement = measure_mlx(call, protocol)
        sync = f"{measurement.mode}: mx.async_eval + mx.synchronize"
    else:
        measurement, sync = measure(call, lambda: None, protocol), "no sync"
    flops, bytes_moved = bench.counts(function, kwargs)
    return JobResult(job.key, "passed", f"{len(measurement.samples)} samples x {measurement.inner} calls ({sync})",
                     samples=measurement.samples, inner=measurement.inner, warmup_s=measurement.warmup_s,
                     warmup_calls=measurement.warmup_calls, flops=flops, bytes_moved=bytes_moved,
                     mode=measurement.mode if _is_mlx(first) else "",
                     round_trip_s=measurement.round_trip_s if _is_mlx(first) else None,
                     backlog_calls=measurement.backlog_calls if _is_mlx(first) else None)
