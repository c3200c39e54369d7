"""Run a suite end to end for one commit on this chip: plan, execute, record, then hand over to the report."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import chip as chip_id
from harness import git, store
from harness.errors import HarnessError
from harness.executor import Executor, LocalExecutor
from harness.plan import Job, plan_suite
from harness.result import JobResult
from harness.suite import load_suite

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


@dataclass
class RunOutcome:
    run_id: str
    chip_key: str
    sha: str
    dirty: bool
    counts: Counter = field(default_factory=Counter)
    planned: int = 0
    peaks: tuple[float | None, float | None] = (None, None)
    status: str = "complete"

    @property
    def correctness_failed(self) -> bool:
        return self.counts["failed"] > 0


@dataclass(frozen=True)
class Target:
    """The commit to run and the tree its code is imported from (None: the current install)."""

    commit: dict
    dirty: bool
    tree: str | None


def resolve_target(repo: str, rev: str | None) -> Target:
    """HEAD of ``repo`` (dirty flag recorded) by default; any other commit runs from a clean worktree."""
    unversioned = Target({"sha": "unversioned", "repo": Path(repo).resolve().name}, True, None)
    if not git.is_repo(repo):
        if rev:
            raise HarnessError(f"--commit {rev} needs a git repository, and {Path(repo).resolve()} is not one")
        return unversioned
    top = git.toplevel(repo)
    if rev is None and not git.has_commits(top):
        return unversioned
    head = git.resolve(top, "HEAD")
    wanted = git.resolve(top, rev) if rev else head
    dirty = git.is_dirty(top)
    if wanted.sha == head.sha and (rev is None or not dirty):
        return Target(head.as_row(), dirty, None)
    return Target(wanted.as_row(), False, str(git.worktree(top, wanted.sha)))


def execute_run(request: RunRequest, progress: Progress | None = None, executor: Executor | None = None,
                on_planned: Callable[[int], None] | None = None) -> RunOutcome:
    """Plan the suite for the local chip, run every job, record every result; returns the counts."""
    suite = load_suite(request.suite)
    ident = chip_id.detect(request.chip_label)
    target = resolve_target(request.repo, request.commit)
    db = store.open_store(request.db_url)
    try:
        jobs = plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent))
        if on_planned:
            on_planned(len(jobs))
        run_id = store.create_run(db, ident=ident, facts=chip_id.machine_facts(), commit=target.commit,
                                  suite=suite.suite.name, dirty=target.dirty, executor=request.executor,
                                  planned_jobs=len(jobs), options={"suite": suite.source})
        outcome = RunOutcome(run_id, ident.key, target.commit["sha"], target.dirty, planned=len(jobs))
        executor = executor or LocalExecutor(parallel=request.parallel, tree=target.tree)
        lock = threading.Lock()

        def on_result(job: Job, result: JobResult) -> None:
            store.record_result(db, run_id, job, result)
            with lock:
                outcome.counts[result.status] += 1
                done = sum(outcome.counts.values())
            if progress:
                progress(job, result, done, len(jobs))

        try:
            executor.execute(jobs, on_result)
        except KeyboardInterrupt:
            store.finish_run(db, run_id, "interrupted")
            raise
        outcome.peaks = store.finalize_roofline(db, run_id)
        store.finish_run(db, run_id, outcome.status)
        return outcome
    finally:
        db.close()
