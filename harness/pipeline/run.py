"""Run a suite end to end for one commit on this chip: plan, execute, record, then hand over to the report."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.core import chip as chip_id
from harness.core import defaults
from harness.core.errors import HarnessError
from harness.core.job import Job, JobResult, RunContext
from harness.core.status import is_run_failure
from harness.execute.local import Executor, LocalExecutor
from harness.record import outbox, spool, store
from harness.spec.plan import plan_suite, plan_trials, trial_seed
from harness.spec.target import resolve_run

Progress = Callable[[Job, JobResult, int, int], None]
STOP_SPOOL_WAIT_S = 1.0  # a stopped process has seconds left (Ray SIGKILLs a stopped job's driver 3 s after SIGTERM)


@dataclass(frozen=True)
class RunRequest:
    """What to run, common to a local and a cluster run (CLI options, with their defaults)."""

    suite: str | None = None
    db_url: str | None = None
    commit: str | None = None
    repo: str = "."
    parallel: int = 1
    keep: Callable[[Job], bool] | None = None  # plan only the jobs this keeps (a bisect probe's); None: the suite
    repo_name: str | None = None  # the repository's identity, instead of its remote's or root commit's (--repo-name)


def kept(jobs: list[Job], keep: Callable[[Job], bool] | None) -> tuple[list[Job], dict]:
    """The planned jobs ``keep`` keeps, and the run options that say so (``harness run --resume`` plans only those
    again): a run of part of its suite is stored with the keys it planned."""
    if keep is None:
        return jobs, {}
    chosen = [job for job in jobs if keep(job)]
    return chosen, {"only_keys": sorted({job.key for job in chosen})}


@dataclass(frozen=True)
class LocalRunRequest(RunRequest):
    """A run on this machine's chip (``harness run``)."""

    chip_label: str | None = None  # override the detected chip key
    resume: str | None = None  # an interrupted run's id: run only its missing jobs (harness run --resume)
    ahead: int = defaults.PREPARE_AHEAD  # job processes that compile together, then time in turn (LocalExecutor)


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


class RunStopped(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM: `harness submit --timeout` or `ray job stop` stopping the driver, a
    service manager): its runs are finished as "stopped", as Ctrl-C finishes them as "interrupted"."""



def _local_executor(request: LocalRunRequest, tree: str | None) -> LocalExecutor:
    return LocalExecutor(parallel=request.parallel, tree=tree, ahead=request.ahead)

def stop_status(exc: BaseException) -> str:
    """The status a run ends with when ``exc`` (a KeyboardInterrupt) ends it."""
    return "stopped" if isinstance(exc, RunStopped) else "interrupted"


@contextmanager
def sigterm_stops_runs() -> Iterator[None]:
    """In the main thread: SIGTERM raises :class:`RunStopped` (once) instead of ending the process on the spot, so the
    runs in progress are finished ("stopped", with their end time), never left "running". The handler it replaces
    (the default, or ``ray.init``'s, a bare ``sys.exit``) is put back after. No-op in another thread.

    Python runs signal handlers in the main thread only, between bytecodes: a main thread that waits should wait
    with a timeout (in a loop), or a signal delivered to another thread is only handled when the wait ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    fired = False

    def handler(signum: int, _frame) -> None:
        nonlocal fired
        if fired:  # a second SIGTERM while the runs are being finished: let that finish
            return
        fired = True
        raise RunStopped(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class _RunEnd:
    """Finishes one run exactly once, from whichever thread gets there first (its own, or a stop request)."""

    def __init__(self, recorder: outbox.Recorder) -> None:
        self.recorder = recorder
        self.status = ""
        self.peaks: tuple[float | None, float | None] = (None, None)
        self._lock = threading.Lock()

    def finish(self, status: str, wait_s: float | None = None) -> bool:
        with self._lock:
            if self.status:
                return False
            self.status = status
        self.peaks = self.recorder.finish(status, wait_s)
        return True


class RunStop:
    """A stop request for runs whose executors work in other threads (the cluster driver's chip threads).

    The thread that catches the signal (the main thread) calls :meth:`request`: every run in progress is finished at
    once with that status, and :attr:`event` tells their executors to cancel what runs and schedule nothing more.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.status = ""
        self._runs: dict[str, _RunEnd] = {}
        self._lock = threading.Lock()

    def request(self, status: str) -> list[str]:
        """Stop: finish every run in progress as ``status``; returns their ids."""
        with self._lock:
            self.status = self.status or status
            self.event.set()
            runs = dict(self._runs)
        finished = []
        for run_id, end in runs.items():
            try:
                if end.finish(self.status, STOP_SPOOL_WAIT_S):
                    finished.append(run_id)
            except Exception:  # noqa: BLE001 - one run's database error must not leave the others running
                continue
        return finished

    def _add(self, run_id: str, end: _RunEnd) -> None:
        with self._lock:
            self._runs[run_id] = end

    def _discard(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)


def execute_run(request: LocalRunRequest, progress: Progress | None = None,
                on_planned: Callable[[int], None] | None = None) -> RunOutcome:
    """Plan the suite for the local chip, run every job, record every result; returns the counts."""
    if request.resume:
        return _resume(request, progress, on_planned)
    target, suite = resolve_run(request.repo, request.commit, request.suite)  # harness/spec/target.py
    ident = chip_id.detect(request.chip_label)
    db = outbox.open_store(request.db_url)
    try:
        jobs, only = kept(plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent)),
                          request.keep)
        if on_planned:
            on_planned(sum(job.trials for job in jobs))  # each trial of a benchmark is a job process
        context = RunContext(ident=ident, facts=chip_id.machine_facts(), commit=named(target.commit, request),
                             dirty=target.dirty, suite=suite.suite.name, executor="local",
                             options={"suite": suite.source, **_replay_options(request), **only})
        return run_planned(db, jobs, _local_executor(request, target.tree), context,
                           progress=progress)
    finally:
        db.close()


def named(commit: dict, request: RunRequest, stored: str | None = None) -> dict:
    """The commit row under the repository name ``--repo-name`` gives (that of the run resumed), if any."""
    name = request.repo_name or stored
    return {**commit, "repo": name} if name else commit


def _replay_options(request: LocalRunRequest) -> dict:
    """What `harness run --resume` needs to plan the same jobs again (paths made absolute)."""
    def absolute(path: str | None) -> str | None:
        return str(Path(path).resolve()) if path and Path(path).exists() else path

    return {"suite_arg": absolute(request.suite), "repo": absolute(request.repo), "commit_arg": request.commit,
            "chip_label": request.chip_label, **({"repo_name": request.repo_name} if request.repo_name else {})}


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
        planned = plan_suite(suite, ident.chip_class, plugin_dir=str(Path(suite.source).resolve().parent))
        if "only_keys" in opts:  # a run of part of its suite (a bisect probe): that part only
            planned = [job for job in planned if job.key in set(opts["only_keys"])]
        jobs = plan_trials(planned, int(opts.get("trial_seed", 0)))  # the run's own order
        todo = [job for job in jobs if job.unit not in stored.units]
        if on_planned:
            on_planned(len(jobs))
        context = RunContext(ident=ident, facts=chip_id.machine_facts(),
                             commit=named(target.commit, request, opts.get("repo_name")), dirty=target.dirty,
                             suite=suite.suite.name, executor="local")
        return run_planned(db, todo, _local_executor(request, target.tree), context,
                           progress=progress, resume=Resume(request.resume, stored.statuses))
    finally:
        db.close()


def run_planned(db: store.Store, jobs: list[Job], executor: Executor, context: RunContext, *,
                progress: Progress | None = None, resume: Resume | None = None,
                stop: RunStop | None = None) -> RunOutcome:
    """One run (one commit on one chip): create it, execute its planned jobs, record each result once, finish it.

    Shared by the local path and the cluster driver (which calls it once per chip, each with its own executor).
    ``resume``: an existing run (``jobs`` are then only its missing ones).
    A result the database cannot take (unreachable, locked) is spooled to disk (harness/record/spool.py) and written
    at the end of the run, or by the next harness command that opens the database.
    A run never stays "running" when its process is told to stop: Ctrl-C finishes it "interrupted", SIGTERM (in the
    main thread: :func:`sigterm_stops_runs`) or ``stop`` (a :class:`RunStop` requested from another thread)
    "stopped", both with their end time.
    """
    if stop is not None and stop.event.is_set():
        raise HarnessError(f"the run was {stop.status} before it started")
    done = resume.done if resume else Counter()
    if resume:
        run_id = resume.run_id
        store.reopen_run(db, run_id)
    else:
        seed = context.options.get("trial_seed", trial_seed())
        jobs = plan_trials(jobs, seed)
        run_id = store.create_run(db, ident=context.ident, facts=context.facts, commit=context.commit,
                                  suite=context.suite, dirty=context.dirty, executor=context.executor,
                                  planned_jobs=len(jobs), options={**context.options, "trial_seed": seed})
    planned = len(jobs) + sum(done.values())
    outcome = RunOutcome(run_id, context.ident.key, context.commit["sha"], context.dirty, planned=planned)
    outcome.counts.update(done)
    lock = threading.Lock()
    recorder = outbox.Recorder(db, run_id)
    end = _RunEnd(recorder)
    if stop is not None:
        stop._add(run_id, end)

    def on_result(job: Job, result: JobResult) -> None:
        result.trial = job.trial  # whichever executor or failure path made the result, it is this trial's
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
        with sigterm_stops_runs():
            executor.execute(jobs, on_result)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in this (main) thread
        end.finish(stop_status(exc), STOP_SPOOL_WAIT_S)
        raise
    except Exception:
        end.finish(stop.status if stop is not None and stop.status else "failed")  # never leave a run "running"
        raise
    finally:
        if stop is not None:
            stop._discard(run_id)
    end.finish(outcome.status)
    outcome.status, outcome.peaks = end.status, end.peaks  # "stopped" if a stop request finished it first
    outcome.spooled, outcome.spool_dir = recorder.left, str(spool.folder(db.url))
    return outcome
