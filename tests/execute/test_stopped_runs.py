"""A run whose process is told to stop is finished, never left "running" for good.

- `harness run` (a real process) sent SIGTERM mid-run: its run is stored "stopped" with its end time, and
  `harness run --resume` completes it.
- A stop requested from another thread than the run's (the cluster driver: the signal reaches the main thread, the
  runs are in the chip threads): the run is finished at once, and its executor's later error does not change that.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from harness.core.chip import detect
from harness.core.errors import HarnessError
from harness.core.job import RunContext
from harness.pipeline.run import RunStop, run_planned
from harness.record.outbox import open_store
from testkit.faults import harness, query, start, wait_for, write_suite
from testkit.ray import sched_job


def test_harness_run_sent_sigterm_stores_its_run_stopped_and_it_can_be_resumed(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    suite = write_suite(tmp_path, ("quick", "ok", 1, 60), ("slow", "slow", 6, 60))
    proc = start(tmp_path, "run", "--suite", str(suite), "--db", url, "--no-report", HARNESS_TEST_SLOW_S="2")

    def stored() -> int:
        try:
            return query(url, "select count(*) from job")[0][0]
        except Exception:  # noqa: BLE001 - not created yet
            return 0

    try:
        wait_for(lambda: stored() >= 2, what="two stored results")
        proc.send_signal(signal.SIGTERM)  # what `ray job stop`, systemd or a CI runner's cancel sends
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr  # ended as an interruption, not killed on the spot
    [(run_id, status, finished_at)] = query(url, "select id, status, finished_at from run")
    assert status == "stopped" and finished_at is not None
    assert stored() < 7

    resumed = harness(tmp_path, "run", "--resume", run_id, "--db", url, "--no-report", HARNESS_TEST_SLOW_S="0")
    assert resumed.returncode == 0, resumed.stderr
    assert query(url, "select status from run") == [("complete",)]
    assert stored() == 7


class _BlockingExecutor:
    """Runs nothing: waits for the stop, then fails as RayExecutor does when its run is stopped."""

    def __init__(self, stop: threading.Event):
        self.stop, self.started = stop, threading.Event()

    def execute(self, jobs, on_result) -> None:
        self.started.set()
        assert self.stop.wait(timeout=60)
        raise HarnessError("the run was stopped before its jobs finished")


def test_a_stop_requested_from_another_thread_finishes_the_run_at_once(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    db = open_store(url)
    stop = RunStop()
    executor = _BlockingExecutor(stop.event)
    context = RunContext(ident=detect("tiny-x"), facts={"hostname": "t"}, commit={"sha": "s", "repo": "r"},
                         dirty=False, suite="t", executor="ray")
    box: dict = {}

    def chip_thread() -> None:
        try:
            run_planned(db, [sched_job("ok", 1)], executor, context, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - checked below
            box["error"] = exc

    thread = threading.Thread(target=chip_thread, daemon=True)
    try:
        thread.start()
        assert executor.started.wait(timeout=60)
        assert query(url, "select status from run") == [("running",)]
        [run_id] = stop.request("stopped")
        [(stored_id, status, finished_at)] = query(url, "select id, status, finished_at from run")
        assert (stored_id, status) == (run_id, "stopped") and finished_at is not None  # before the thread ends
        thread.join(timeout=60)
        assert not thread.is_alive() and isinstance(box.get("error"), HarnessError)
        assert query(url, "select status from run") == [("stopped",)]  # not overwritten with "failed"
    finally:
        db.close()
