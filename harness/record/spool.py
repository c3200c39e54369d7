"""Spool: job results that could not reach the database wait on local disk until it is back.

Layout, under the harness cache (``harness.core.config.cache_dir()``, i.e. ``$HARNESS_CACHE`` or
``~/.cache/mlx-harness``)::

    spool/<sha1(db url)[:16]>/db.txt                   the database URL, password masked (for `harness spool status`)
    spool/<sha1(db url)[:16]>/<run id>/<sha1(key)>.json one job result: {"run_id", "job", "result"}
    spool/<sha1(db url)[:16]>/<run id>/_finish.json     the run's final status, written after its results

Every file is written atomically (a temporary file, fsync, rename), so a crash never leaves half an entry. An
entry is deleted only after the database accepted it (``store.record_result`` is idempotent on (run, key), so a
drain interrupted between the write and the delete writes nothing twice). Any command that opens the database
drains its spool first (``store.open_store``); ``harness spool flush`` and ``harness spool status`` do it by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

if TYPE_CHECKING:
    from harness.core.job import Job, JobResult
    from harness.record.store import Store

FINISH = "_finish.json"


def is_unreachable(exc: BaseException) -> bool:
    """True for the database being down, refusing, locked or read-only: the errors a spool waits out."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def root() -> Path:
    from harness.core.config import cache_dir

    return cache_dir() / "spool"


def folder(db_url: str) -> Path:
    """This database's spool folder (keyed on the full URL's hash: the URL itself is never written unmasked)."""
    return root() / hashlib.sha1(db_url.encode()).hexdigest()[:16]


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _label(db_url: str) -> None:
    from harness.record.store import mask_url

    label = folder(db_url) / "db.txt"
    if not label.exists():
        _write_atomic(label, {"db": mask_url(db_url)})


def put(db_url: str, run_id: str, job: Job, result: JobResult) -> Path:
    """Spool one result; returns the entry's path."""
    _label(db_url)
    path = folder(db_url) / run_id / f"{hashlib.sha1(job.key.encode()).hexdigest()}.json"
    _write_atomic(path, {"run_id": run_id, "job": json.loads(job.to_json()), "result": result.to_dict()})
    return path


def put_finish(db_url: str, run_id: str, status: str) -> None:
    """Spool the run's final status: applied (roofline, finish_run) once all its results are written."""
    _label(db_url)
    _write_atomic(folder(db_url) / run_id / FINISH, {"run_id": run_id, "status": status})


def pending(db_url: str) -> int:
    """Results waiting for this database (finish markers not counted)."""
    base = folder(db_url)
    if not base.is_dir():
        return 0
    return sum(1 for p in base.glob("*/*.json") if p.name != FINISH)


@dataclass
class DrainOutcome:
    written: int = 0  # entries the database accepted (or already had)
    remaining: int = 0  # entries still on disk (the database went away again)
    runs_finished: int = 0


def drain(store: Store) -> DrainOutcome:
    """Write this database's spooled results (then finished-run markers); stops at the first unreachable error."""
    outcome = DrainOutcome()
    base = folder(store.url)
    if not base.is_dir():
        return outcome
    try:
        for run_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            _drain_run(store, run_dir, outcome)
    except Exception as exc:
        if not is_unreachable(exc):
            raise
    outcome.remaining = pending(store.url)
    return outcome


def _drain_run(store: Store, run_dir: Path, outcome: DrainOutcome) -> None:
    """One run's spooled results, then its finish marker once no result is left; the folder goes when empty."""
    from harness.core.job import Job, JobResult
    from harness.record import store as store_mod

    for entry in sorted(p for p in run_dir.glob("*.json") if p.name != FINISH):
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue  # another drainer wrote and removed it
        store_mod.record_result(store, data["run_id"], Job.from_dict(data["job"]), JobResult.from_dict(data["result"]))
        entry.unlink(missing_ok=True)
        outcome.written += 1
    finish = run_dir / FINISH
    if finish.exists() and not any(p.name != FINISH for p in run_dir.glob("*.json")):
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


def status() -> list[tuple[str, Path, int, int]]:
    """Every spool folder: (masked DB URL, folder, results waiting, runs waiting to be finished)."""
    rows = []
    if not root().is_dir():
        return rows
    for base in sorted(p for p in root().iterdir() if p.is_dir()):
        label = base / "db.txt"
        try:
            db = json.loads(label.read_text(encoding="utf-8"))["db"]
        except (OSError, ValueError, KeyError):
            db = "<unknown database>"
        results = sum(1 for p in base.glob("*/*.json") if p.name != FINISH)
        finishes = sum(1 for _ in base.glob(f"*/{FINISH}"))
        if results or finishes:
            rows.append((db, base, results, finishes))
    return rows
