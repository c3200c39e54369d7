"""Run a suite end to end for one commit on this chip: plan, execute, record, then hand over to the report."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.core import chip as chip_id
from harness.core.errors import HarnessError
from harness.core.job import Job, JobResult
from harness.execute.local import Executor, LocalExecutor
from harness.record import spool, store
from harness.spec.plan import plan_suite
from harness.spec.target import resolve_run

Progress = Callable[[Job, JobResult, int, int], None]


@dataclass
class RunRequest:
    """What the user asked for (CLI options, with their defaults)."""

    suite: str | None = None
    db_url: str | None = None
    commit: str | None = None
    repo: str = "."
    chip_label: str | None = None
    parallel: int = 1
    executor: str = "local"
    address: str | None = None  # Ray cluster (executor "ray"): HEAD:PORT, or $RAY_ADDRESS
    chips: tuple[str, ...] = ()  # a Ray run's chips; empty: every chip that has a live node
    max_attempts: int = 2  # Ray: a job whose node dies is re-run on another node of its chip up to this many times
    resume: str | None = None  # an interrupted run's id: run only its missing jobs (harness run --resume)


@dataclass
class RunOutcome:
    run_id: str
    chip_key: str
    sha: str
    dirty: bool
    counts: Counter = field(default_factory=Counter)
    tests: Counter = field(default_factory=Counter)  # pytest jobs' per-test outcomes (passed, xfailed, error...)
    planned: int = 0
    peaks: tuple[float | None, float | None] = (None, None)
    status: str = "complete"
    spooled: int = 0  # results left in the spool (the database was unreachable): written by the next command
    spool_dir: str = ""

    @property
    def correctness_failed(self) -> bool:
        return self.counts["failed"] > 0


def execute_run(request: RunRequest, progress: Progress | None = None, executor: Executor | None = None,
                on_planned: Callable[[int], None] | None = None) -> RunOutcome:
    """Plan the suite for the local chip, run every job, record every result; returns the counts."""
    if request.executor == "ray" and executor is None:
        raise HarnessError("a Ray run spans several chips, one run each: use harness.cluster.driver.run_on_cluster")
    if request.resume:
        return _resume(request, progress, executor, on_planned)
    target, suite = resolve_run(request.repo, request.commit, request.suite)  # harness/spec/target.py
    ident = chip_id.detect(request.chip_label)
    db = store.open_store(request.db_url)
    try:
        jobs = plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent))
        if on_planned:
            on_planned(len(jobs))
        executor = executor or LocalExecutor(parallel=request.parallel, tree=target.tree)
        return run_planned(db, jobs, executor, ident=ident, facts=chip_id.machine_facts(), commit=target.commit,
                           dirty=target.dirty, suite=suite.suite.name, executor_name=request.executor,
                           options={"suite": suite.source, **_replay_options(request)}, progress=progress)
    finally:
        db.close()


def _replay_options(request: RunRequest) -> dict:
    """What `harness run --resume` needs to plan the same jobs again (paths made absolute)."""
    def absolute(path: str | None) -> str | None:
        return str(Path(path).resolve()) if path and Path(path).exists() else path

    return {"suite_arg": absolute(request.suite), "repo": absolute(request.repo), "commit_arg": request.commit,
            "chip_label": request.chip_label}


def _resume(request: RunRequest, progress: Progress | None, executor: Executor | None,
            on_planned: Callable[[int], None] | None) -> RunOutcome:
    """`harness run --resume RUN_ID`: plan the run's suite again, run only the jobs it has no result for."""
    from sqlalchemy import select

    from harness.record.models import JobRecord, Run

    db = store.open_store(request.db_url)
    try:
        with db.session() as session:
            run = session.get(Run, request.resume)
            if run is None:
                raise HarnessError(f"no run {request.resume!r} in {store.mask_url(db.url)}")
            opts, sha, chip_key = dict(run.options or {}), run.commit.sha, run.chip.key
            stored = Counter(session.scalars(select(JobRecord.status).where(JobRecord.run_id == run.id,
                                                                            JobRecord.kind != "test")))
            keys = set(session.scalars(select(JobRecord.key).where(JobRecord.run_id == run.id)))
        if "repo" not in opts:
            raise HarnessError(f"run {request.resume} was recorded without its options: it cannot be resumed")
        target, suite = resolve_run(opts["repo"], opts.get("commit_arg"), opts.get("suite_arg"))
        if target.commit["sha"] != sha:
            raise HarnessError(f"run {request.resume} ran commit {sha[:12]}, but {opts['repo']} now resolves to "
                               f"{target.commit['sha'][:12]}: cannot resume it")
        ident = chip_id.detect(opts.get("chip_label") or request.chip_label)
        if ident.key != chip_key:
            raise HarnessError(f"run {request.resume} ran on chip {chip_key}, this machine is {ident.key}")
        jobs = plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent))
        todo = [job for job in jobs if job.key not in keys]
        if on_planned:
            on_planned(len(jobs))
        executor = executor or LocalExecutor(parallel=request.parallel, tree=target.tree)
        return run_planned(db, todo, executor, ident=ident, facts=chip_id.machine_facts(), commit=target.commit,
                           dirty=target.dirty, suite=suite.suite.name, executor_name=request.executor,
                           progress=progress, resume=request.resume, done=stored)
    finally:
        db.close()


def run_planned(db: store.Store, jobs: list[Job], executor: Executor, *, ident: chip_id.ChipIdentity, facts: dict,
                commit: dict, dirty: bool, suite: str, executor_name: str, options: dict | None = None,
                progress: Progress | None = None, resume: str | None = None,
                done: Counter | None = None) -> RunOutcome:
    """One run (one commit on one chip): create it, execute its planned jobs, record each result once, finish it.

    Shared by the local path and the cluster driver (which calls it once per chip, each with its own executor).
    ``resume``: an existing run's id (``jobs`` are then only its missing ones, ``done`` the stored statuses).
    A result the database cannot take (unreachable, locked) is spooled to disk (harness/record/spool.py) and written
    at the end of the run, or by the next harness command that opens the database.
    """
    planned = len(jobs) + sum((done or Counter()).values())
    if resume:
        run_id = resume
        with db.session() as session:
            from harness.record.models import Run

            session.get(Run, run_id).status = "running"
    else:
        run_id = store.create_run(db, ident=ident, facts=facts, commit=commit, suite=suite, dirty=dirty,
                                  executor=executor_name, planned_jobs=len(jobs), options=options or {})
    outcome = RunOutcome(run_id, ident.key, commit["sha"], dirty, planned=planned)
    outcome.counts.update(done or Counter())
    lock = threading.Lock()
    recorder = _Recorder(db, run_id)

    def on_result(job: Job, result: JobResult) -> None:
        recorder.record(job, result)
        with lock:
            outcome.counts[result.status] += 1
            outcome.tests.update(test["outcome"] for test in result.tests)
            finished = sum(outcome.counts.values())
        if progress:
            progress(job, result, finished, planned)

    try:
        executor.execute(jobs, on_result)
    except KeyboardInterrupt:
        recorder.finish("interrupted")
        raise
    except Exception:
        recorder.finish("failed")  # never leave a run "running" forever
        raise
    outcome.peaks = recorder.finish(outcome.status)
    outcome.spooled, outcome.spool_dir = recorder.left, str(spool.folder(db.url))
    return outcome


class _Recorder:
    """record_result, or the spool while the database is unreachable (retried after a growing back-off)."""

    def __init__(self, db: store.Store, run_id: str) -> None:
        self.db, self.run_id = db, run_id
        self.lock = threading.Lock()
        self.spooled = 0  # results that went to the spool during the run
        self.left = 0  # results still in the spool at the end
        self.retry_at = 0.0
        self.backoff = 1.0

    def record(self, job: Job, result: JobResult) -> None:
        if time.monotonic() >= self.retry_at:
            try:
                store.record_result(self.db, self.run_id, job, result)
                with self.lock:
                    self.backoff = 1.0
                return
            except Exception as exc:
                if not spool.is_unreachable(exc):
                    raise
                with self.lock:
                    self.retry_at = time.monotonic() + self.backoff
                    self.backoff = min(self.backoff * 2, 15.0)
        spool.put(self.db.url, self.run_id, job, result)
        with self.lock:
            self.spooled += 1

    def finish(self, status: str) -> tuple[float | None, float | None]:
        """Write what was spooled (bounded retry: $HARNESS_SPOOL_WAIT_S, default 60 s), then close the run."""
        if self.spooled:
            wait = float(os.environ.get("HARNESS_SPOOL_WAIT_S", "60"))
            self.left = spool.drain_with_retry(self.db, wait).remaining
        if not self.left:
            try:
                peaks = store.finalize_roofline(self.db, self.run_id)
                store.finish_run(self.db, self.run_id, status)
                return peaks
            except Exception as exc:
                if not spool.is_unreachable(exc):
                    raise
        spool.put_finish(self.db.url, self.run_id, status)
        self.left = max(self.left, spool.pending(self.db.url))
        return (None, None)
