"""`harness compare --ab BASE HEAD`: measure two commits in one session on this machine, interleaved, as Chromium's
Pinpoint does when history is thin.

Each commit gets its own run (its benchmark jobs only, R trials each). The runs' trial rounds alternate in ABBA
order -- base round 0, head round 0, head round 1, base round 1, base round 2, ... -- so a drift of clocks,
temperature or load during the session lands on both sides alike; both runs shuffle their rounds with one seed.
The two runs then compare on the spread between their trials alone (``same_session``): no history floor.

A suite of one or two series runs at least 4 trials a side (``harness.spec.plan.plan_suite``: a lone series is
judged on its own trials, which must also separate by rank); ``--trials`` overrides it.
"""


from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness.core import chip as chip_id
from harness.core.errors import HarnessError
from harness.core.job import Job, RunContext
from harness.core.proc import kill_started
from harness.execute.local import LocalExecutor, OnResult
from harness.pipeline.run import Progress, RunOutcome, run_planned, sigterm_stops_runs
from harness.record import outbox
from harness.spec.plan import plan_suite, trial_seed
from harness.spec.target import resolve_run

TURN_WAIT_S = 1.0  # a side waiting for its turn wakes this often to see whether the other side gave up


@dataclass(frozen=True)
class ABRequest:
    base: str
    head: str
    repo: str = "."
    suite: str | None = None
    db_url: str | None = None
    chip_label: str | None = None
    trials: int | None = None  # None: the suite's [timing] trials
    # Only these series, (kernel, variant, dtype, shape key) (None: all); ``harness compare --settle``'s undecided
    series: frozenset[tuple[str, str, str, str]] | None = None
    settle: bool = False  # the runs are settling runs (``Run.settling``): read by their comparison alone
    node: str | None = None  # the Ray node measuring (``harness compare --settle --address``): in the runs' options


def abba(rounds: int) -> list[tuple[int, int]]:
    """(side, round) in the order they run: side 0 (base) first in even pairs of turns, side 1 (head) in odd ones."""
    order = []
    for number in range(rounds):
        sides = (0, 1) if number % 2 == 0 else (1, 0)
        order.extend((side, number) for side in sides)
    return order


class Turns:
    """Lets each side's executor run a round only when the ABBA schedule reaches it."""

    def __init__(self, schedule: list[tuple[int, int]]) -> None:
        self.schedule, self.position = schedule, 0
        self.failed = False
        self.condition = threading.Condition()

    def wait_for(self, side: int, number: int) -> None:
        with self.condition:
            while not self.failed and self.position < len(self.schedule) and \
                    self.schedule[self.position] != (side, number):
                self.condition.wait(TURN_WAIT_S)
            if self.failed:
                raise HarnessError("the other side of the A/B session failed")

    def done(self, side: int, number: int) -> None:
        with self.condition:
            if self.position < len(self.schedule) and self.schedule[self.position] == (side, number):
                self.position += 1
            self.condition.notify_all()

    def fail(self) -> None:
        with self.condition:
            self.failed = True
            self.condition.notify_all()


class TurnExecutor:
    """A local executor that runs one side's rounds (jobs grouped by trial) on that side's turns."""

    def __init__(self, side: int, turns: Turns, inner: LocalExecutor) -> None:
        self.side, self.turns, self.inner = side, turns, inner

    def execute(self, jobs: list[Job], on_result: OnResult) -> None:
        rounds: dict[int, list[Job]] = {}
        for job in jobs:
            rounds.setdefault(job.trial, []).append(job)
        for number in range(max(rounds, default=-1) + 1):
            self.turns.wait_for(self.side, number)
            try:
                self.inner.execute(rounds.get(number, []), on_result)
            finally:
                self.turns.done(self.side, number)


def series_of(job: Job) -> tuple[str, str, str, str]:
    """A benchmark job's series as compare keys it (chip aside): kernel, variant, dtype, shape key."""
    labels = job.labels
    return labels.kernel, labels.variant, labels.dtype, labels.shape_key


def _side_jobs(repo: str, rev: str, suite: str | None, chip_class: str, trials: int | None,
               series: frozenset[tuple[str, str, str, str]] | None = None):
    target, loaded = resolve_run(repo, rev, suite)
    jobs = [job for job in plan_suite(loaded, chip_class, plugin_dir=str(Path(loaded.source).resolve().parent))
            if job.kind == "benchmark" and (series is None or series_of(job) in series)]
    if not jobs:
        what = "the series to settle" if series is not None else "benchmark jobs"
        raise HarnessError(f"the suite has no {what} for a {chip_class} chip at {rev}: nothing to compare")
    if trials is not None:
        jobs = [replace(job, timing={**job.timing, "trials": trials}) for job in jobs]  # type: ignore[call-arg]
    return target, loaded, jobs


def execute_ab(request: ABRequest, progress: Progress | None = None,
               on_planned: Callable[[int], None] | None = None) -> tuple[RunOutcome, RunOutcome]:
    """Both commits' benchmark runs, interleaved ABBA; returns (base outcome, head outcome)."""
    ident = chip_id.detect(request.chip_label)
    sides = [_side_jobs(request.repo, rev, request.suite, ident.chip_class, request.trials, request.series)
             for rev in (request.base, request.head)]
    rounds = max(job.trials for _, _, jobs in sides for job in jobs)
    turns = Turns(abba(rounds))
    seed, session = trial_seed(), uuid.uuid4().hex[:12]
    if on_planned:
        on_planned(sum(job.trials for _, _, jobs in sides for job in jobs))
    db = outbox.open_store(request.db_url)
    outcomes: list[RunOutcome | None] = [None, None]
    errors: list[BaseException] = []

    def one_side(index: int) -> None:
        target, suite, jobs = sides[index]
        context = RunContext(ident=ident, facts=chip_id.machine_facts(), commit=target.commit, dirty=target.dirty,
                             suite=suite.suite.name, executor="local",
                             options={"trial_seed": seed, "ab_session": session, "ab_side": ("base", "head")[index],
                                      **({"settle": True} if request.settle else {}),
                                      **({"node": request.node} if request.node else {})})
        try:
            outcomes[index] = run_planned(db, jobs, TurnExecutor(index, turns, LocalExecutor(tree=target.tree)),
                                          context, progress=progress)
        except BaseException as exc:
            errors.append(exc)
            turns.fail()

    try:
        with sigterm_stops_runs():  # SIGTERM as Ctrl-C: the sides' job processes are killed, not left running
            threads = [threading.Thread(target=one_side, args=(index,), name=f"ab-{index}") for index in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(TURN_WAIT_S)  # a timed wait: Ctrl-C reaches the main thread
    except KeyboardInterrupt:
        turns.fail()
        kill_started()  # the job processes of both sides' threads (and what they started)
        raise
    finally:
        db.close()
    if errors:
        raise errors[0]
    base, head = outcomes
    assert base is not None and head is not None
    return base, head
