"""Outbox: every result reaches the database exactly once, through the spool while the database is unreachable.

- :func:`open_store` is how every command opens the results database: open (create, migrate), then write what
  an earlier command left in the spool (``harness.record.spool``), before anything else reads or writes.
- :class:`Recorder` writes a run's results as they arrive, spooling them while the database refuses, and
  finishes the run (roofline, status) once everything is in.
- :func:`drain` / :func:`drain_with_retry` write a database's spooled results; ``record_result`` is idempotent
  on (run, key), so a drain interrupted between the write and the delete writes nothing twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.job import Job, JobResult, job_from_dict
from harness.record import spool
from harness.record import store as store_mod
from harness.record.store import Store, open_database


def open_store(url: str | None = None, *, must_exist: bool = False) -> Store:
    """Open (creating and migrating if needed) the database at ``url``, then write its spooled results first, then
    finish as "abandoned" the runs whose driver process on this machine died without finishing them
    (``store.reap_abandoned_runs``): no run stays "running" for good.

    ``must_exist``: a reading command's database: a missing SQLite file is refused (one clear error) rather than
    created empty, unless this database has spooled results waiting, which then create it.
    """
    waiting = must_exist and spool.folder(url or store_mod.default_db_url()).is_dir()
    opened = open_database(url, must_exist=must_exist and not waiting)
    if spool.folder(opened.url).is_dir():
        drain(opened)
    store_mod.reap_abandoned_runs(opened)
    return opened


@dataclass
class DrainOutcome:
    written: int = 0  # entries the database accepted (or already had)
    remaining: int = 0  # entries still on disk (the database went away again)
    runs_finished: int = 0


def drain(store: Store) -> DrainOutcome:
    """Write this database's spooled results (then finished-run markers); stops at the first unreachable error."""
    outcome = DrainOutcome()
    base = spool.folder(store.url)
    if not base.is_dir():
        return outcome
    try:
        for run_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            _drain_run(store, run_dir, outcome)
    except Exception as exc:
        if not spool.is_unreachable(exc):
            raise
    outcome.remaining = spool.pending(store.url)
    return outcome


def _drain_run(store: Store, run_dir: Path, outcome: DrainOutcome) -> None:
    """One run's spooled results, then its finish marker once no result is left; the folder goes when empty."""
    for entry in sorted(p for p in run_dir.glob("*.json") if p.name != spool.FINISH):
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue  # another drainer wrote and removed it
        store_mod.record_result(store, data["run_id"], job_from_dict(data["job"]), JobResult.from_dict(data["result"]))
        entry.unlink(missing_ok=True)
        outcome.written += 1
    finish = run_dir / spool.FINISH
    if finish.exists() and not any(p.name != spool.FINISH for p in run_dir.glob("*.json")):
        with contextlib.suppress(FileNotFoundError):  # gone: another drainer finished the run
            status = json.loads(finish.read_text(encoding="utf-8"))["status"]
            store_mod.finalize_roofline(store, run_dir.name)
            store_mod.finish_run(store, run_dir.name, status)
        finish.unlink(missing_ok=True)
        outcome.runs_finished += 1
    with contextlib.suppress(OSError):  # not empty: a run still spooling
        run_dir.rmdir()


def drain_with_retry(store: Store, budget_s: float, first_delay_s: float = 0.5) -> DrainOutcome:
    """Drain, retrying with exponential backoff (capped at 10 s) for at most ``budget_s`` seconds."""
    deadline = time.monotonic() + budget_s
    delay = first_delay_s
    outcome = drain(store)
    total = outcome.written
    while outcome.remaining and time.monotonic() + delay <= deadline:
        time.sleep(delay)
        delay = min(delay * 2, 10.0)
        outcome = drain(store)
        total += outcome.written
    outcome.written = total
    return outcome


class Recorder:
    """record_result, or the spool while the database is unreachable (retried after a growing back-off)."""

    def __init__(self, db: Store, run_id: str) -> None:
        self.db, self.run_id = db, run_id
        self.lock = threading.Lock()
        self.spooled = 0  # results that went to the spool during the run
        self.left = 0  # results still in the spool at the end
        self.retry_at = 0.0
        self.backoff = 1.0

    def record(self, job: Job, result: JobResult) -> None:
        if time.monotonic() >= self.retry_at:
            try:
                store_mod.record_result(self.db, self.run_id, job, result)
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

    def finish(self, status: str, wait_s: float | None = None) -> tuple[float | None, float | None]:
        """Write what was spooled (bounded retry: ``wait_s``, else $HARNESS_SPOOL_WAIT_S, default 60 s), then close
        the run. A run being stopped passes a short ``wait_s``: what is left stays spooled with its finish marker."""
        if self.spooled:
            wait = float(os.environ.get("HARNESS_SPOOL_WAIT_S", "60")) if wait_s is None else wait_s
            self.left = drain_with_retry(self.db, wait).remaining
        if not self.left:
            try:
                peaks = store_mod.finalize_roofline(self.db, self.run_id)
                store_mod.finish_run(self.db, self.run_id, status)
                return peaks
            except Exception as exc:
                if not spool.is_unreachable(exc):
                    raise
        spool.put_finish(self.db.url, self.run_id, status)
        self.left = max(self.left, spool.pending(self.db.url))
        return (None, None)
