"""Spool: job results that could not reach the database wait on local disk until it is back.

Layout, under the harness cache (``harness.core.config.cache_dir()``, i.e. ``$HARNESS_CACHE`` or
``~/.cache/mlx-harness``)::

    spool/<sha1(db url)[:16]>/db.txt                   the database URL, password masked (for `harness spool status`)
    spool/<sha1(db url)[:16]>/<run id>/<sha1(key)>.json one job result: {"run_id", "job", "result"}
    spool/<sha1(db url)[:16]>/<run id>/_finish.json     the run's final status, written after its results

Every file is written atomically (a temporary file, fsync, rename), so a crash never leaves half an entry. An
entry is deleted only after the database accepted it (``store.record_result`` is idempotent on (run, key), so a
drain interrupted between the write and the delete writes nothing twice). Any command that opens the database
drains its spool first (``harness.record.outbox.open_store``); ``harness spool flush`` and ``harness spool status``
do it by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from harness.core.config import cache_dir
from harness.record.store import mask_url

if TYPE_CHECKING:
    from harness.core.job import Job, JobResult

FINISH = "_finish.json"


def is_unreachable(exc: BaseException) -> bool:
    """True for the database being down, refusing, locked or read-only: the errors a spool waits out."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def root() -> Path:
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
    label = folder(db_url) / "db.txt"
    if not label.exists():
        _write_atomic(label, {"db": mask_url(db_url)})


def put(db_url: str, run_id: str, job: Job, result: JobResult) -> Path:
    """Spool one result; returns the entry's path."""
    _label(db_url)
    path = folder(db_url) / run_id / f"{hashlib.sha1(job.unit.encode()).hexdigest()}.json"
    _write_atomic(path, {"run_id": run_id, "job": job.to_dict(), "result": result.to_dict()})
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
