"""Execute: run planned jobs, one process per job with a timeout, behind one seam (local pool here, Ray elsewhere)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Protocol

from harness.core import defaults
from harness.core.config import SOURCE_ROOT
from harness.core.job import PHASES, FunctionJob, InstallJob, Job, JobResult, KernelJob
from harness.core.proc import done_with, file_tail, group, kill_group, kill_started, start_group
from harness.execute import envs
from harness.execute.envs import activated
from harness.execute.worker import skip_reason
from harness.spec.plan import compile_group

OnResult = Callable[[Job, JobResult], None]


class Executor(Protocol):
    """Runs jobs and calls ``on_result`` once per job, from any thread, as results arrive."""

    def execute(self, jobs: list[Job], on_result: OnResult) -> None: ...


HARNESS_ROOT = str(SOURCE_ROOT)


def worker_env(tree: str | None = None, venv: str | None = None) -> dict[str, str]:
    """Environment of a job process: the tree under test first on the import path (then ``tree/src`` if it
    exists, then the inherited PYTHONPATH, then the harness's source root, so ``harness.execute.worker`` and the
    pytest plugin import from another repository's tree too); ``venv``: that environment activated."""
    env = dict(os.environ)
    if tree:
        src = os.path.join(tree, "src")
        paths = (tree, src if os.path.isdir(src) else "", env.get("PYTHONPATH", ""), HARNESS_ROOT)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    if venv:
        env = activated(env, venv)
    return env


def thread_env(job: Job) -> dict[str, str]:
    """The thread variables a job's ``[timing] threads`` sets (none without it: the job inherits the harness's).

    They must be in the environment the job process starts with: a BLAS sizes its thread pool once, when numpy (or
    MLX, or the repository's package) first loads it, which may well be before the module under test sets them.
    """
    threads = job.timing.get("threads") if isinstance(job, KernelJob | FunctionJob) else None
    return {name: str(int(threads)) for name in defaults.THREAD_VARS} if threads else {}


def run_in_subprocess(job: Job, tree: str | None = None, python: str = sys.executable) -> JobResult:
    """Run one job in a fresh process (its own process group); crash and hang become results, not exceptions.

    A job whose variant cannot run here (wrong backend, unsupported dtype) is skipped without a
    process when the code under test is this process's own (``tree`` None): nothing is measured.
    A job of a suite with ``[install]`` runs with the python of the install key's environment, installed
    here first if needed (harness/execute/envs.py); the ``install`` job only does that. A timed job whose protocol
    sets ``threads`` starts with the BLAS/OpenMP thread variables set (:func:`thread_env`).
    """
    start = time.perf_counter()
    if tree is None and isinstance(job, KernelJob):
        reason = skip_reason(job)
        if reason:
            return JobResult(job.key, "skipped", reason, duration_s=time.perf_counter() - start)
    venv = None
    install = {} if isinstance(job, KernelJob) else job.install  # a kernel job runs with the harness's python
    if install:
        try:
            environment = envs.ensure(install, tree or os.getcwd())
        except Exception as exc:  # noqa: BLE001 - an unwritable cache or the like: this job's result, not a crash
            return JobResult(job.key, "crashed", f"cannot prepare the environment: {type(exc).__name__}: {exc}",
                             duration_s=time.perf_counter() - start)
        if isinstance(job, InstallJob) or not environment.ok:
            result = envs.install_result(job.key, environment)
            result.duration_s = time.perf_counter() - start
            return result
        python, venv = str(environment.python), str(environment.path)
    with tempfile.TemporaryDirectory(prefix="harness-job-") as scratch:
        job_path, result_path, log_path = (Path(scratch) / n for n in ("job.json", "result.json", "output.log"))
        job_path.write_text(job.to_json())
        with open(log_path, "wb") as log:
            with group([python, "-m", "harness.execute.worker", str(job_path), str(result_path)],
                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tree or None,
                       env={**worker_env(tree, venv), **thread_env(job)}) as proc:  # a stop kills its group
                try:
                    code = proc.wait(timeout=job.timeout_s)
                except subprocess.TimeoutExpired:
                    kill_group(proc)  # the job process and everything it started (pytest, xdist workers)
                    return JobResult(job.key, "timeout", f"no result after {job.timeout_s:g} s; process killed",
                                     duration_s=time.perf_counter() - start, output_tail=file_tail(log_path))
        tail = file_tail(log_path)
        if result_path.exists():
            result = JobResult.from_dict(json.loads(result_path.read_text()))
            result.output_tail = result.output_tail or tail
            return result
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return JobResult(job.key, "crashed", f"job process died without a result ({why})",
                         duration_s=time.perf_counter() - start, output_tail=tail)


def _batchable(job: Job) -> bool:
    return isinstance(job, KernelJob) and job.kind == "benchmark"


def _runs(jobs: list[Job]) -> Iterator[list[Job]]:
    """Maximal stretches of consecutive batchable jobs of one round, thread setting and ``compile_group``; any
    other job alone."""
    run: list[Job] = []
    for job in jobs:
        if run and not (_batchable(job) and job.trial == run[0].trial and thread_env(job) == thread_env(run[0])
                        and compile_group(job) == compile_group(run[0])):
            yield run
            run = []
        if _batchable(job):
            run.append(job)
        else:
            yield [job]
    if run:
        yield run


def batches(jobs: list[Job], size: int) -> Iterator[list[Job]]:
    """Consecutive benchmark jobs of one trial round and one thread setting, at most ``size`` per batch, never
    splitting the jobs of one ``compile_group`` (a round plans them together) across processes when they fit in
    one; any other job alone (a repository's function runs with its own environment's python)."""
    batch: list[Job] = []
    for run in _runs(jobs):
        if not _batchable(run[0]):
            if batch:
                yield batch
                batch = []
            yield run
            continue
        if batch and (len(batch) + len(run) > size or run[0].trial != batch[0].trial
                      or thread_env(run[0]) != thread_env(batch[0])):
            yield batch
            batch = []
        while len(batch) + len(run) > size:  # a group larger than a batch: whole batches of it
            yield run[:size]
            run = run[size:]
        batch.extend(run)
    if batch:
        yield batch


def _runnable(jobs: list[Job], on_result: OnResult, tree: str | None) -> list[Job]:
    """The jobs that start a process; nothing to start for a variant that cannot run here (reported skipped)."""
    if tree is not None:
        return jobs
    runnable = []
    for job in jobs:
        reason = skip_reason(job)
        if reason:
            on_result(job, JobResult(job.key, "skipped", reason))
        else:
            runnable.append(job)
    return runnable


@dataclass
class _Batch:
    """One batch's job process: its jobs, its folder (jobs.json, a result file per job, ``ready``) and its deadline."""

    jobs: list[Job]
    folder: Path
    proc: subprocess.Popen
    deadline_s: float
    reported: set[int] = field(default_factory=set)


def _start(jobs: list[Job], folder: Path, log: IO[bytes], tree: str | None, gated: bool) -> _Batch:
    (folder / "jobs.json").write_text(json.dumps([job.to_dict() for job in jobs]))
    gate = ["--gate", str(folder / "go")] if gated else []
    proc = start_group([sys.executable, "-m", "harness.execute.worker", "--batch", str(folder / "jobs.json"),
                        str(folder), *gate],
                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tree or None,
                       env={**worker_env(tree), **thread_env(jobs[0])})
    return _Batch(jobs, folder, proc, sum(job.timeout_s for job in jobs))


def _await_ready(batch: _Batch, until: float) -> None:
    """Until the batch's process has compiled and waits at its gate, has ended, or ``until`` passed (then killed:
    its jobs run again alone)."""
    while not (batch.folder / "ready").exists() and batch.proc.poll() is None:
        if time.monotonic() > until:
            kill_group(batch.proc)
            return
        time.sleep(0.05)


def _time(batch: _Batch, on_result: OnResult) -> None:
    """Open the batch's gate (if it has one), report each result as its file appears, kill it past its deadline."""
    (batch.folder / "go").touch()
    deadline = time.monotonic() + batch.deadline_s
    while True:
        ended = batch.proc.poll() is not None
        _report_new(batch.jobs, batch.folder, batch.reported, on_result)
        if ended or len(batch.reported) == len(batch.jobs):
            break
        if time.monotonic() > deadline:
            kill_group(batch.proc)
            break
        time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        batch.proc.wait(timeout=10)


def run_together(group: list[list[Job]], on_result: OnResult, tree: str | None = None) -> None:
    """Batches of benchmark jobs, each in its own process, timed one after another in the given order.

    With more than one, the processes start together and each first compiles its source kernels (the worker's
    ``--gate``: MLX compiles a CUDA or Metal source kernel in every process, 1.3-3.3 s a kernel on the H200) while
    none of them times anything; then their gates open one at a time, so no two ever time at once and the waiting
    ones sit idle. A process that dies, overruns or never gets ready has its unfinished jobs run again alone
    (:func:`run_in_subprocess`), which records a crash or hang against the job that causes it."""
    gated = len(group) > 1
    with contextlib.ExitStack() as stack:
        batches_ = []
        for jobs in group:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="harness-batch-")))
            log = stack.enter_context(open(folder / "output.log", "wb"))
            batch = _start(jobs, folder, log, tree, gated)
            stack.callback(lambda proc=batch.proc: kill_group(proc) if proc.poll() is None else done_with(proc))
            batches_.append(batch)
        if gated:
            until = time.monotonic() + max(batch.deadline_s for batch in batches_)
            for batch in batches_:
                _await_ready(batch, until)
        for batch in batches_:
            _time(batch, on_result)
            for index, job in enumerate(batch.jobs):
                if index not in batch.reported:
                    on_result(job, run_in_subprocess(job, tree))


def run_batch(jobs: list[Job], on_result: OnResult, tree: str | None = None) -> None:
    """Benchmark jobs in one process, each result reported as its file appears (:mod:`harness.execute.worker`
    ``--batch``). If the process dies or overruns the batch's time (the sum of its jobs' limits), it is killed and
    every job it did not finish runs again alone (:func:`run_in_subprocess`), which records a crash or hang against
    the job that causes it."""
    jobs = _runnable(jobs, on_result, tree)
    if len(jobs) < 2:
        for job in jobs:
            on_result(job, run_in_subprocess(job, tree))
        return
    run_together([jobs], on_result, tree)


def _report_new(jobs: list[Job], folder: Path, reported: set[int], on_result: OnResult) -> None:
    for index, job in enumerate(jobs):
        path = folder / f"{index}.json"
        if index not in reported and path.exists():
            reported.add(index)
            on_result(job, JobResult.from_dict(json.loads(path.read_text())))


class LocalExecutor:
    """A process per job on this machine (benchmark jobs: a batch of one round per process; ``ahead`` such
    processes start together and compile, then time one after another: :func:`run_together`). Correctness jobs may
    run in parallel; timed jobs run alone."""

    def __init__(self, parallel: int = 1, tree: str | None = None, batch: int = defaults.ROUND_BATCH,
                 ahead: int = defaults.PREPARE_AHEAD):
        self.parallel = max(1, parallel)
        self.tree = tree
        self.batch = max(1, batch)
        self.ahead = max(1, ahead)
        self.modes: dict[str, str] = {}  # job key -> the timing mode its first trial used (see _settled)

    def _run(self, job: Job) -> JobResult:
        return run_in_subprocess(job, self.tree)

    def execute(self, jobs: list[Job], on_result: OnResult) -> None:
        """The kinds in :data:`harness.core.job.PHASES` order (any other kind last, timed): timed kinds one at a
        time, the others ``parallel`` at once."""
        try:
            self._phases(jobs, on_result)
        except BaseException:  # Ctrl-C or SIGTERM in this thread: no job process (or a pool thread's) runs on
            kill_started()
            raise

    def _phases(self, jobs: list[Job], on_result: OnResult) -> None:
        extra = [(kind, True) for kind in dict.fromkeys(j.kind for j in jobs) if kind not in dict(PHASES)]
        for kind, timed in [*PHASES, *extra]:
            phase = [j for j in jobs if j.kind == kind]
            if not timed and self.parallel > 1 and len(phase) > 1:
                with ThreadPoolExecutor(self.parallel) as pool:
                    futures = {pool.submit(self._run, job): job for job in phase}
                    try:
                        for future in as_completed(futures):
                            on_result(futures[future], future.result())
                    except BaseException:  # before the pool waits for its threads: kill what they wait on
                        pool.shutdown(wait=False, cancel_futures=True)
                        kill_started()
                        raise
            else:
                self._serial(phase, on_result)

    def _serial(self, jobs: list[Job], on_result: OnResult) -> None:
        def settle(job: Job, result: JobResult) -> None:
            if result.mode:
                self.modes.setdefault(job.key, result.mode)
            on_result(job, result)

        group: list[list[Job]] = []  # batches of one round that start together (run_together)

        def start_group() -> None:
            if group:
                run_together(group, settle, self.tree)
                group.clear()

        for batch in batches(jobs, self.batch):
            if group and (len(group) == self.ahead or batch[0].trial != group[0][0].trial):
                start_group()
            # settled as it joins a group: a group holds one round, so earlier rounds have all reported
            runnable = _runnable([self._settled(job) for job in batch], settle, self.tree)
            if len(runnable) > 1:
                group.append(runnable)
            elif runnable:  # a job alone, in its place in the order
                start_group()
                settle(runnable[0], self._run(runnable[0]))
        start_group()

    def _settled(self, job: Job) -> Job:
        """A later trial of a job whose timing mode was "auto" runs in the mode its first trial chose: every trial
        of a series is then timed the same way (a pilot in each process could pick differently when the modes'
        spreads are close, and the two modes' medians differ)."""
        mode = self.modes.get(job.key)
        if mode is None or not isinstance(job, KernelJob | FunctionJob) or job.timing.get("mode") != "auto":
            return job
        return replace(job, timing={**job.timing, "mode": mode})
