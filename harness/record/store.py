"""The store: ``open_database`` hands out a ``Store``, and the names the stages use to write it are gathered here
from their homes: db.py (URLs, engine, migrations, sessions), writes.py (runs, jobs, results), links.py (commits
linked to their repository's history) and trial_summary.py (what a job's samples sum to)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import inspect
from sqlalchemy.exc import DatabaseError

from harness.core.errors import HarnessError
from harness.record.db import (
    DEFAULT_DB_URL,
    DEFAULT_DIR,
    MIGRATIONS,
    NO_RESULTS,
    SCHEMA_HEAD,
    Database,
    NewerSchemaError,
    as_db_url,
    check_sqlite_results,
    default_db_url,
    make_engine,
    mask_url,
    migrate,
    parse_url,
    sqlite_path,
)
from harness.record.links import adopt, link_repository, record_ancestry
from harness.record.trial_summary import (
    TRIAL_RECORD,
    apply_roofline,
    packed_summaries,
    sample_writer,
    trial_summaries,
    unpacked_trials,
)
from harness.record.writes import (
    ABANDONED,
    StoredRun,
    create_run,
    finalize_roofline,
    finish_run,
    get_or_create_chip,
    get_or_create_commit,
    get_or_create_machine,
    reap_abandoned_runs,
    record_result,
    reopen_run,
    set_peaks,
    stored_keys,
    stored_run,
)

__all__ = [
    "ABANDONED", "DEFAULT_DB_URL", "DEFAULT_DIR", "MIGRATIONS", "SCHEMA_HEAD", "TRIAL_RECORD", "NewerSchemaError",
    "Store", "StoredRun", "adopt", "apply_roofline", "as_db_url", "create_run", "default_db_url", "finalize_roofline",
    "finish_run", "get_or_create_chip", "get_or_create_commit", "get_or_create_machine", "link_repository",
    "make_engine", "mask_url", "migrate", "open_database", "packed_summaries", "parse_url", "reap_abandoned_runs",
    "record_ancestry", "record_result", "reopen_run", "sample_writer", "set_peaks", "sqlite_path", "stored_keys",
    "stored_run", "trial_summaries", "unpacked_trials",
]


@dataclass
class Store(Database):
    """A migrated database and a session factory, as ``open_database`` opens it (engine, URL, sessions, memo and
    snapshot: :class:`harness.record.db.Database`); the functions gathered here write to it."""


def open_database(url: str | None = None, *, must_exist: bool = False) -> Store:
    """Open (creating and migrating if needed) the database at ``url``; one clear error if unreachable.

    ``must_exist``: for commands that only read (report, compare, variants, export): a SQLite file that is not
    there is refused instead of created empty.
    Commands open it through :func:`harness.record.outbox.open_store`, which also writes the spooled results.
    """
    given_as = "--db" if url else "$HARNESS_DB"
    url = as_db_url(url) if url else default_db_url()
    engine = make_engine(url, must_exist=must_exist, given_as=given_as)  # a bad URL is refused here, lazily
    if must_exist:
        check_sqlite_results(url)  # before the engine's first connection (which sets WAL)
    try:
        if must_exist and not inspect(engine).has_table("alembic_version"):  # PostgreSQL: an empty database
            engine.dispose()
            raise HarnessError(f"{mask_url(url)} {NO_RESULTS}")
        migrate(engine)
    except DatabaseError as exc:  # unreachable (OperationalError), or not a database at all
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise HarnessError(f"cannot open database {mask_url(url)}: {reason}") from None
    except NewerSchemaError as exc:
        engine.dispose()
        raise HarnessError(f"cannot open database {mask_url(url)}: {exc}") from None
    return Store(engine, url)
