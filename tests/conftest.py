"""Shared fixtures: a safe Ray environment, temporary SQLite and PostgreSQL databases, the tiny suites."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit.pg import PG_ADMIN_URL, pg_admin, scratch_database

# Nothing leaves the machine; loopback-only clusters never hang on macOS-style cluster checks.
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"



@pytest.fixture(scope="session")
def pg_server() -> str:
    """The PostgreSQL server's admin URL; fails (not skips) when it is unreachable, as CI always has one."""
    from sqlalchemy import text

    engine = pg_admin()
    with engine.connect() as conn:
        conn.execute(text("select 1"))
    engine.dispose()
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_server: str):
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    with scratch_database(pg_server) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path: Path) -> str:
    """Every storage test runs against both backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def db(db_url):
    """An open store on ``db_url`` (both backends), closed afterwards."""
    from harness.record import outbox

    handle = outbox.open_store(db_url)
    yield handle
    handle.close()
