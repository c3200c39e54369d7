"""A report's sessions only read (``Database.reading``): on SQLite they begin deferred and hold no write lock, so
its forked processes and the runs recording results meanwhile do not queue behind its reads; its writes (the
analysis cache, ``Database.writing``) still take the lock from their start."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError

from harness.pipeline import report
from harness.record import analysis_cache, outbox
from harness.record.models import Chip
from tests.analysis.test_analysis_cache import build


@pytest.fixture
def two_stores(sqlite_url, monkeypatch):
    """Two stores on one SQLite file, as two processes open it; a writer gives up on a held lock in 0.2 s."""
    monkeypatch.setenv("HARNESS_SQLITE_BUSY_MS", "200")
    first, second = outbox.open_store(sqlite_url), outbox.open_store(sqlite_url)
    yield first, second
    first.close()
    second.close()


def _write(store) -> None:  # noqa: ANN001 - a Store
    analysis_cache.write_entries(store, "chip", "test", {"row": analysis_cache.Entry("key", b"payload")})


def test_a_read_within_reading_holds_no_write_lock(two_stores):
    """Without ``reading`` a session's BEGIN IMMEDIATE held the write lock through every read: another process's
    write waited for it (here: gave up, "database is locked")."""
    reader, writer = two_stores
    with reader.reading(), reader.session() as session:
        session.execute(select(Chip.id)).all()  # the transaction has begun: a snapshot held open
        _write(writer)
    with reader.session() as session:  # outside ``reading``: the lock is taken, as before
        session.execute(select(Chip.id)).all()
        with pytest.raises(OperationalError, match="locked"):
            _write(writer)


def test_a_write_within_reading_takes_the_lock_first(two_stores):
    """``writing`` within ``reading``: BEGIN IMMEDIATE, so a concurrent writer queues (here: gives up) instead of
    failing mid-transaction."""
    first, second = two_stores
    with first.reading(), first.writing() as session:
        session.execute(select(Chip.id)).all()
        with pytest.raises(OperationalError, match="locked"):
            _write(second)
    _write(second)


def test_a_report_reads_deferred_and_writes_immediate(sqlite_url, tmp_path):
    """Every transaction of a report's own process: a plain BEGIN, unless it writes the analysis cache."""
    store = outbox.open_store(sqlite_url)
    try:
        build(store, commits=6)
        transactions: list[list[str]] = []

        def keep(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001 - SQLAlchemy's hook
            if statement.startswith("BEGIN"):
                transactions.append([statement])
            elif transactions:
                transactions[-1].append(statement)

        event.listen(store.engine, "before_cursor_execute", keep)
        try:
            report.build_report(store, tmp_path / "site", report.ReportOptions(change_points=False))
        finally:
            event.remove(store.engine, "before_cursor_execute", keep)
    finally:
        store.close()
    writes = [t for t in transactions if any(s.split()[0] in ("INSERT", "DELETE", "UPDATE") for s in t[1:])]
    reads = [t for t in transactions if t not in writes]
    assert writes and reads
    assert {t[0] for t in reads} == {"BEGIN"}, [t[:3] for t in reads if t[0] != "BEGIN"]
    assert {t[0] for t in writes} == {"BEGIN IMMEDIATE"}


def test_a_thread_started_within_reading_keeps_the_write_lock(two_stores):
    """``reading`` is the calling thread's: another thread of the process (a run's result writer) begins its
    sessions as before, BEGIN IMMEDIATE, so a write of its never meets a stale snapshot."""
    import threading

    reader, writer = two_stores
    opened, release, failures = threading.Event(), threading.Event(), []

    def hold() -> None:
        with reader.session() as session:
            session.execute(select(Chip.id)).all()
            opened.set()
            release.wait(10)

    with reader.reading():
        thread = threading.Thread(target=hold)
        thread.start()
        try:
            assert opened.wait(10)
            try:
                _write(writer)
            except OperationalError as exc:
                failures.append(str(exc))
        finally:
            release.set()
            thread.join()
    assert failures and "locked" in failures[0]


def test_a_process_forked_within_reading_reads_deferred(sqlite_url):
    """The report's forked analysis (``harness.core.fork.ForkedWork``) inherits ``reading``: its reads too hold no
    write lock."""
    from harness.core.fork import ForkedWork
    from harness.record import db

    store = outbox.open_store(sqlite_url)
    try:
        with store.reading():
            work = ForkedWork(lambda send: send(db._reading.get()))
            assert work.receive() == (True, True)
            work.close()
    finally:
        store.close()
