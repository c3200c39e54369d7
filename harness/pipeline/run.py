"""Run a suite end to end for one commit on this chip: plan, execute, record, then hand over to the report."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.core import chip as chip_id
from harness.core.errors import HarnessError
from harness.core.job import Job, JobResult, RunContext
from harness.core.status import is_run_failure
from harness.execute.local import Executor, LocalExecutor
from harness.record import outbox, spool, store
from harness.spec.plan import plan_suite
from harness.spec.target import resolve_run

Progress = Callable[[Job, JobResult, int, int], None]


@dataclass(frozen=True)
class RunRequest:
    """What to run, common to a local and a cluster run (CLI options, with their defaults)."""

    suite: str | None = None
    db_url: str | None = None
    commit: str | None = None
    repo: str = "."
    parallel: int = 1


@dataclass(frozen=True)
class LocalRunRequest(RunRequest):
    """A run on this machine's chip (``harness run``)."""

    chip_label: str | None = None  # override the detected chip key
    resume: str | None = None  # an interrupted run's id: run only its missing jobs (harness run --resume)


@dataclass(frozen=True)
class ClusterRunRequest(RunRequest):
    """A run on every chip of a Ray cluster, one stored run per chip (``harness submit``, ``--executor ray``)."""

    address: str | None = None  # HEAD:PORT, or $RAY_ADDRESS
    chips: tuple[str, ...] = ()  # empty: every chip that has a live node
    max_attempts: int = 2  # a job whose node dies is re-run on another node of its chip up to this many times


@dataclass(frozen=True)
class Resume:
    """Continue a stored run: its id and the statuses of the jobs it already has."""

    run_id: str
    done: Counter


@dataclass
class RunOutcome:
    run_id: str
    chip_key: str
    sha: str
    dirty: bool
    counts: Counter = field(default_factory=Counter)
    test_outcomes: dict[str, str] = field(default_factory=dict)  # node id -> outcome: each test once
    selections: dict[str, Counter] = field(default_factory=dict)  # pytest selection -> its tests' outcomes
    planned: int = 0
    peaks: tuple[float | None, float | None] = (None, None)
    status: str = "complete"
    spooled: int = 0  # results left in the spool (the database was unreachable): written by the next command
    spool_dir: str = ""

    @property
    def tests(self) -> Counter:
        """The distinct tests' outcomes (passed, xfailed, error...) over every pytest selection of the run."""
        return Counter(self.test_outcomes.values())


def execute_run(request: LocalRunRequest, progress: Progress | None = None,
                on_planned: Callable[[int], None] | None = None) -> RunOutcome:
    """Plan the suite for the local chip, run every job, record every result; returns the counts."""
    if request.resume:
        return _resume(request, progress, on_planned)
    target, suite = resolve_run(request.repo, request.commit, request.suite)  # harness/spec/target.py
    ident = chip_id.detect(request.chip_label)
    db = outbox.open_store(request.db_url)
    try:
        jobs = plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent))
        if on_planned:
            on_planned(len(jobs))
        context = RunContext(ident=ident, facts=chip_id.machine_facts(), commit=target.commit, dirty=target.dirty,
                             suite=suite.suite.name, executor="local",
                             options={"suite": suite.source, **_replay_options(request)})
        return run_planned(db, jobs, LocalExecutor(parallel=request.parallel, tree=target.tree), context,
                           progress=progress)
    finally:
        db.close()


def _replay_options(request: LocalRunRequest) -> dict:
    """What `harness run --resume` needs to plan the same jobs again (paths made absolute)."""
    def absolute(path: str | None) -> str | None:
        return str(Path(path).resolve()) if path and Path(path).exists() else path

    return {"suite_arg": absolute(request.suite), "repo": absolute(request.repo), "commit_arg": request.commit,
            "chip_label": request.chip_label}


def _resume(request: LocalRunRequest, progress: Progress | None,
            on_planned: Callable[[int], None] | None) -> RunOutcome:
    """`harness run --resume RUN_ID`: plan the run's suite again, run only the jobs it has no result for."""
    db = outbox.open_store(request.db_url)
    try:
        stored = store.stored_run(db, request.resume)
        if stored is None:
            raise HarnessError(f"no run {request.resume!r} in {store.mask_url(db.url)}")
        opts = stored.options
        if "repo" not in opts:
            raise HarnessError(f"run {request.resume} was recorded without its options: it cannot be resumed")
        target, suite = resolve_run(opts["repo"], opts.get("commit_arg"), opts.get("suite_arg"))
        if target.commit["sha"] != stored.sha:
            raise HarnessError(f"run {request.resume} ran commit {stored.sha[:12]}, but {opts['repo']} now resolves "
                               f"to {target.commit['sha'][:12]}: cannot resume it")
        ident = chip_id.detect(opts.get("chip_label") or request.chip_label)
        if ident.key != stored.chip_key:
            raise HarnessError(f"run {request.resume} ran on chip {stored.chip_key}, this machine is {ident.key}")
        jobs = plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent))
        todo = [job for job in jobs if job.key not in stored.keys]
        if on_planned:
            on_planned(len(jobs))
        context = RunContext(ident=ident, facts=chip_id.machine_facts(), commit=target.commit, dirty=target.dirty,
                             suite=suite.suite.name, executor="local")
        return run_planned(db, todo, LocalExecutor(parallel=request.parallel, tree=target.tree), context,
                           progress=progress, resume=Resume(request.resume, stored.statuses))
    finally:
        db.close()


def run_planned(db: store.Store, jobs: list[Job], executor: Executor, context: RunContext, *,
                progress: Progress | None = None, resume: Resume | None = None) -> RunOutcome:
    """One run (one commit on one chip): create it, execute its planned jobs, record each result once, finish it.

    Shared by the local path and the cluster driver (which calls it once per chip, each with its own executor).
    ``resume``: an existing run (``jobs`` are then only its missing ones).
    A result the database cannot take (unreachable, locked) is spooled to disk (harness/record/spool.py) and written
    at the end of the run, or by the next harness command that opens the database.
    """
    done = resume.done if resume else Counter()
    planned = len(jobs) + sum(done.values())
    if resume:
        run_id = resume.run_id
        store.reopen_run(db, run_id)
    else:
        run_id = store.create_run(db, ident=context.ident, facts=context.facts, commit=context.commit,
                                  suite=context.suite, dirty=context.dirty, executor=context.executor,
                                  planned_jobs=len(jobs), options=context.options)
    outcome = RunOutcome(run_id, context.ident.key, context.commit["sha"], context.dirty, planned=planned)
    outcome.counts.update(done)
    lock = threading.Lock()
    recorder = outbox.Recorder(db, run_id)

    def on_result(job: Job, result: JobResult) -> None:
        recorder.record(job, result)
        with lock:
            outcome.counts[result.status] += 1
            if result.tests:
                outcome.selections[job.name] = Counter(test["outcome"] for test in result.tests)
            for test in result.tests:  # a test in two selections counts once, failing if it failed in either
                if not is_run_failure(outcome.test_outcomes.get(test["nodeid"], "")):
                    outcome.test_outcomes[test["nodeid"]] = test["outcome"]
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
