"""The results database itself: its URL (parsed, masked), the engine and its SQLite pragmas, migrations to
``SCHEMA_HEAD`` (under PostgreSQL's advisory lock), and sessions (plus a report's memo and a read snapshot)."""

from __future__ import annotations

import importlib
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.dialects import sqlite  # the default store's: loaded with the modules, not by its first engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from harness.core.errors import HarnessError, first_line

DEFAULT_DIR = Path("harness-out")
DEFAULT_DB_URL = f"sqlite:///{DEFAULT_DIR / 'results.db'}"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def default_db_url() -> str:
    """``$HARNESS_DB`` if set (a plain path read as SQLite), else ``sqlite:///harness-out/results.db`` (relative to
    the current folder)."""
    return as_db_url(os.environ.get("HARNESS_DB", DEFAULT_DB_URL))


def as_db_url(text: str) -> str:
    """``text`` as a database URL: a plain file path (no scheme, no ``user@host``) means that SQLite file
    (``~`` expanded); anything else is returned as given, for :func:`parse_url` to accept or explain."""
    if re.match(r"[A-Za-z][\w+.-]*:", text) or "@" in text or not text.strip():  # a scheme, a server, nothing
        return text
    return f"sqlite:///{os.path.expanduser(text)}"


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***: safe for logs, reports and bundles."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid database URL>"


def _mask_text(text: str) -> str:
    """Something given as a database URL that is not one, safe to print: a ``user:password@`` part is masked
    (everything between the user's ``:`` and the last ``@``, whatever the password holds)."""
    head, at, tail = text.rpartition("@")
    if not at:
        return text
    scheme, sep, userinfo = head.rpartition("://") if "://" in head else ("", "", head)
    if ":" not in userinfo:
        return text
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{tail}"


SUPPORTED = ("sqlite", "postgresql")


def parse_url(url: str, given_as: str = "--db") -> URL:
    """``url`` parsed, or one clear error: what was given (password masked) and what a URL looks like; a database
    kind other than SQLite or PostgreSQL is refused here, naming the supported ones. ``given_as``: where the
    value came from, for the message (``--db`` or ``$HARNESS_DB``)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        shown = _mask_text(url)
        if "@" in url and "://" not in url:  # a server without its scheme
            use = f"postgresql://{shown}"
        else:
            use = "sqlite:///path/to/results.db or postgresql://user@host/db"
        value = shown if shown.strip() else repr(url)
        label = f"{given_as}={value}" if given_as.startswith("$") else f"{given_as} {value}"
        raise HarnessError(f"{label} is not a database URL: use {use}") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        hint = " (did you mean postgresql://?)" if backend == "postgres" else ""
        raise HarnessError(f"cannot use database {mask_url(url)}: unknown database kind {backend!r}{hint}; "
                           f"supported: {', '.join(SUPPORTED)} (e.g. sqlite:///results.db, "
                           "postgresql://user@host/db)")
    return parsed


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for an in-memory database or another kind)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:" \
            or parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


def _check_exists(url: str) -> None:
    """A reading command's database must be there already: a missing SQLite file (or folder) is refused."""
    path = sqlite_path(url)
    if path is None or path.is_file():
        return
    why = f"no folder {path.parent}" if not path.parent.is_dir() else f"no file {path}"
    raise HarnessError(f"no database at {mask_url(url)} ({why}): `harness run` or `harness import` creates one")


NO_RESULTS = "holds no harness results (no harness tables): `harness run` or `harness import` fills one"


def check_sqlite_results(url: str) -> None:
    """A reading command's SQLite file must be a harness database, checked read-only before anything opens it to
    write (a SQLite engine sets WAL on connect; migrating would write the schema into the file it was asked to
    read): a text file or an empty one is refused, untouched."""
    path = sqlite_path(url)
    if path is None or not path.is_file():
        return
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise HarnessError(f"{mask_url(url)} is not a SQLite database ({exc})") from None
    if "alembic_version" not in tables:
        raise HarnessError(f"{mask_url(url)} {NO_RESULTS}")


WAL_AUTOCHECKPOINT_PAGES = 1000
"""SQLite's default: a commit that leaves the write-ahead log past this many pages copies it into the database."""

SQLITE_MMAP_BYTES = 1 << 31
"""How much of a SQLite file is read through a memory map (SQLite caps it at its build's limit, 2 GB by default):
without one, every page read is a ``pread`` call -- a report on a long history reads ~190,000 pages, ~1 s of system
time (measured by ``tools/bench_report.py``). Nothing here shrinks a file while it is open (no VACUUM)."""


# Within ``Database.reading`` / ``Database.writing``: per thread (a thread started within is outside: a run's writer
# threads keep their BEGIN IMMEDIATE), and a child forked within inherits it.
_reading: ContextVar[bool] = ContextVar("reading", default=False)
_writing: ContextVar[bool] = ContextVar("writing", default=False)


def _sqlite_pragmas(engine: Engine, begin: str = "BEGIN IMMEDIATE") -> None:
    """WAL + busy timeout, reads through a memory map (``SQLITE_MMAP_BYTES``), and BEGIN IMMEDIATE so concurrent
    writers queue instead of failing mid-transaction (``begin``: a read snapshot's plain, deferred BEGIN; within
    ``Database.reading`` every session's, but those within ``Database.writing``).

    ``secure_delete=FAST``: Debian's and others' SQLite builds turn secure delete on, which writes zeros over every
    page a replaced row frees; a report replaces a chip's whole analysis (16 MB on a 1,000-commit history) after
    each new run, and the zeros doubled what it wrote and checkpointed (measured after one new run on the 1,000 x
    4 x 400 benchmark: 25,600 page writes a report, 13,300 with FAST, 0.2 s less system time). FAST still clears
    deleted content where that costs no extra write; nothing here is secret."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let us emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(os.environ.get('HARNESS_SQLITE_BUSY_MS', '30000'))}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        cursor.execute("PRAGMA secure_delete=FAST")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        reading = _reading.get()
        # within ``reading`` (a report) a commit copies no one else's log into the database: a report writes a few
        # rows, its analysis' process a chip's whole analysis (16 MB on a 1,000-commit history), and the commit
        # that found the log past SQLite's threshold did it all -- measured, 0.12-0.14 s of the report's own
        # process, waiting on the disk mid-build; the analysis' process copies it instead (``Database.checkpoint``).
        # Set where it changes only (``info`` lives as long as the DBAPI connection; SQLite starts at its default).
        wanted = 0 if reading else WAL_AUTOCHECKPOINT_PAGES
        if conn.info.get("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES) != wanted:
            conn.exec_driver_sql(f"PRAGMA wal_autocheckpoint={wanted}")
            conn.info["wal_autocheckpoint"] = wanted
        conn.exec_driver_sql("BEGIN" if reading and not _writing.get() else begin)


def make_engine(url: str, *, must_exist: bool = False, given_as: str = "--db") -> Engine:
    """An engine for ``url`` (SQLite: its folder is created unless ``must_exist``, which refuses a missing file)."""
    parsed = parse_url(url, given_as)
    if must_exist:
        _check_exists(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})
        _sqlite_pragmas(engine)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        return create_engine(parsed, pool_pre_ping=True, connect_args=_pg_args(parsed))
    except Exception as exc:  # noqa: BLE001 - unknown driver, missing driver package
        raise HarnessError(f"cannot use database {mask_url(url)}: {first_line(exc)}") from None


def _pg_args(parsed) -> dict[str, Any]:
    return {"connect_timeout": 10} if parsed.get_backend_name() == "postgresql" else {}


class NewerSchemaError(HarnessError):
    """The database was migrated by a newer harness: this one does not know its schema revision."""


SCHEMA_HEAD = "0011"  # the newest migration's revision (tests/record/test_store.py holds it to Alembic's head)


def _at_head(engine: Engine) -> bool:
    """Whether the schema is already at ``SCHEMA_HEAD``: one query, without loading Alembic (~0.3 s) and its
    scripts, which every command opening a database would otherwise pay."""
    try:
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))] == [
                SCHEMA_HEAD]
    except SQLAlchemyError:  # no version table yet (a new database): Alembic creates it
        return False


MIGRATION_LOCK = 0x6D6C7868  # the PostgreSQL advisory lock key migrations hold ("mlxh")


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent); a database at a revision this harness does
    not know (written by a newer one) is refused, untouched."""
    if _at_head(engine):
        return
    from alembic import command  # Alembic (~0.3 s) only when the schema is not at the head: see _at_head
    from alembic.config import Config  # (the same)
    from alembic.runtime.migration import MigrationContext  # (the same)
    from alembic.script import ScriptDirectory  # (the same)

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(config)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Machines starting on one fresh database at once: one migrates, the others wait here and find it
            # done (without the lock two CREATE TABLEs race: UniqueViolation on pg_type). Released at commit.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        current = MigrationContext.configure(connection).get_current_heads()
        known = {revision.revision for revision in script.walk_revisions()}
        if unknown := sorted(set(current) - known):
            raise NewerSchemaError(
                f"the database's schema is at revision {', '.join(unknown)}, newer than this harness knows "
                f"(up to {script.get_current_head()}): it was written by a newer harness; upgrade this checkout")
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def upsert_insert(dialect: str, table: Any) -> Any:
    """An INSERT into ``table`` that takes an ``ON CONFLICT`` clause (``on_conflict_do_update`` / ``_do_nothing``), for
    a ``dialect`` that has one (SQLite, PostgreSQL), else None. PostgreSQL's module is looked up here, where its
    engine has loaded it: imported with the modules, it cost every command ~16 ms, and a SQLite user never needs it."""
    if dialect == "sqlite":
        return sqlite.insert(table)
    if dialect == "postgresql":
        return importlib.import_module("sqlalchemy.dialects.postgresql").insert(table)
    return None


@dataclass
class Database:
    """A migrated database and a session factory (what every function writing or reading the store takes;
    ``harness.record.store.Store`` is the one ``open_database`` hands out)."""

    engine: Engine
    url: str
    _memo: dict[Any, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @contextmanager
    def memoised(self) -> Iterator[None]:
        """Within it, the reads that go through ``memo`` are made once each: a report's pages read the same runs
        again and again (the newest run's samples: its compare, noise and variant cells). They do not see what is
        written meanwhile, as a report, which writes only its analysis cache, does not need to. Nested: one memo."""
        outer = self._memo
        self._memo = {} if outer is None else outer
        try:
            yield
        finally:
            self._memo = outer

    @property
    def memoising(self) -> bool:
        """Whether reads through ``memo`` are kept (within ``memoised``)."""
        return self._memo is not None

    def memo(self, key: Any, read: Callable[[], Any]) -> Any:
        """``read()``, or within ``memoised`` its first answer for ``key`` (the caller must not change it)."""
        if self._memo is None:
            return read()
        if key not in self._memo:
            self._memo[key] = read()
        return self._memo[key]

    @property
    def sessions(self) -> sessionmaker[Session]:
        return sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Within it, this thread's sessions (and those of a process forked within) only read, but those within
        ``writing``: on a SQLite file they begin deferred, a snapshot without the write lock every other session
        takes (BEGIN IMMEDIATE), so the processes of one report (``harness.core.fork``) and the runs recording
        results meanwhile do not queue behind each other's reads: with the lock, a report's four processes on a
        1,000-commit history ran one at a time for seconds (``bench/README.md``). Elsewhere it changes nothing."""
        token = _reading.set(True)
        try:
            yield
        finally:
            _reading.reset(token)

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A session that writes, with the write lock from its start (BEGIN IMMEDIATE), within ``reading`` too."""
        token = _writing.set(True)
        try:
            with self.session() as session:
                yield session
        finally:
            _writing.reset(token)

    def close(self) -> None:
        self.engine.dispose()

    @property
    def _sqlite_file(self) -> bool:
        """Whether the database is a SQLite file (not an in-memory SQLite one, nor another kind)."""
        url = self.engine.url
        return url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")

    @property
    def shared_by_processes(self) -> bool:
        """Whether another process opening this URL reaches the same database (not an in-memory SQLite one)."""
        return self.engine.url.get_backend_name() != "sqlite" or self._sqlite_file

    def checkpoint(self, *, tries: int = 10, pause_s: float = 0.02) -> None:
        """On a SQLite file, copy the write-ahead log into the database now (``PRAGMA wal_checkpoint(PASSIVE)``,
        again while readers hold part of it back, ``tries`` times at most); elsewhere nothing. A report's analysis
        calls it once its rows are stored, in a thread of its own (no commit within ``reading`` does it). One that
        cannot run now is left to SQLite: the next commit past its threshold, or the last connection's close."""
        if not self._sqlite_file:
            return
        connection = self.engine.raw_connection()  # outside a transaction: no checkpoint runs inside one
        try:
            for _ in range(tries):
                busy, logged, copied = connection.cursor().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if not busy and copied >= logged:
                    return
                time.sleep(pause_s)
        except sqlite3.Error:
            return
        finally:
            connection.close()

    def forked(self) -> None:
        """In a forked process: leave the parent's open connections alone (this process opens its own)."""
        self.engine.dispose(close=False)

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read transaction that sees one consistent state of the database.

        On a SQLite file this is a deferred BEGIN on a connection of its own: WAL gives it a snapshot without the
        write lock the store's sessions take (BEGIN IMMEDIATE), so runs recording results meanwhile are not held up.
        """
        if not self._sqlite_file:
            with self.session() as session:
                yield session
            return
        engine = create_engine(self.engine.url, connect_args={"timeout": 30}, poolclass=NullPool)
        _sqlite_pragmas(engine, begin="BEGIN")
        try:
            with Session(engine) as session, session.begin():
                yield session
        finally:
            engine.dispose()
