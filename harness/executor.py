"""Execute: run planned jobs, one process per job with a timeout, behind one seam (local pool here, Ray elsewhere)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Protocol

from harness.plan import Job
from harness.result import JobResult

OnResult = Callable[[Job, JobResult], None]
TAIL_CHARS = 4000


class Executor(Protocol):
    """Runs jobs and calls ``on_result`` once per job, from any thread, as results arrive."""

    def execute(self, jobs: list[Job], on_result: OnResult) -> None: ...


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-TAIL_CHARS:].decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def worker_env(tree: str | None = None) -> dict[str, str]:
    """Environment of a job process: the tree under test first on the import path."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH", "")) if p)
    return env


def run_in_subprocess(job: Job, tree: str | None = None, python: str = sys.executable) -> JobResult:
    """Run one job in a fresh process (its own process group); crash and hang become results, not exceptions.

    A job whose variant cannot run here (wrong backend, unsupported dtype) is skipped without a
    process when the code under test is this process's own (``tree`` None): nothing is measured.
    """
    start = time.perf_counter()
    if tree is None:
        from harness.worker import skip_reason

        reason = skip_reason(job)
        if reason:
            return JobResult(job.key, "skipped", reason, duration_s=time.perf_counter() - start)
    with tempfile.TemporaryDirectory(prefix="harness-job-") as scratch:
        job_path, result_path, log_path = (Path(scratch) / n for n in ("job.json", "result.json", "output.log"))
        job_path.write_text(job.to_json())
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([python, "-m", "harness.worker", str(job_path), str(result_path)],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=tree or None, env=worker_env(tree), start_new_session=True)
            try:
                code = proc.wait(timeout=job.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return JobResult(job.key, "timeout", f"no result after {job.timeout_s:g} s; process killed",
                                 duration_s=time.perf_counter() - start, output_tail=_tail(log_path))
        tail = _tail(log_path)
        if result_path.exists():
            result = JobResult.from_dict(json.loads(result_path.read_text()))
            result.output_tail = result.output_tail or tail
            return result
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return JobResult(job.key, "crashed", f"job process died without a result ({why})",
                         duration_s=time.perf_counter() - start, output_tail=tail)


class LocalExecutor:
    """A process per job on this machine. Correctness jobs may run in parallel; timed jobs run alone."""

    def __init__(self, parallel: int = 1, tree: str | None = None):
        self.parallel = max(1, parallel)
        self.tree = tree

    def _run(self, job: Job) -> JobResult:
        return run_in_subprocess(job, self.tree)

    def execute(self, jobs: list[Job], on_result: OnResult) -> None:
        timed = [j for j in jobs if j.kind != "correctness"]
        correctness = [j for j in jobs if j.kind == "correctness"]
        calibration = [j for j in timed if j.kind == "calibration"]
        self._serial(calibration, on_result)
        if self.parallel > 1 and len(correctness) > 1:
            with ThreadPoolExecutor(self.parallel) as pool:
                futures = {pool.submit(self._run, job): job for job in correctness}
                for future in as_completed(futures):
                    on_result(futures[future], future.result())
        else:
            self._serial(correctness, on_result)
        self._serial([j for j in timed if j.kind == "benchmark"], on_result)

    def _serial(self, jobs: Iterable[Job], on_result: OnResult) -> None:
        for job in jobs:
            on_result(job, self._run(job))
