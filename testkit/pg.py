"""A scratch PostgreSQL database for tests and benchmark scripts: created fresh, always dropped."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

PG_ADMIN_URL = os.environ.get("HARNESS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def admin_engine(admin_url: str) -> Engine:
    """An autocommit engine on the server's admin database (CREATE/DROP DATABASE cannot run in a transaction)."""
    return create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})


@contextmanager
def scratch_database(admin_url: str, prefix: str = "harness_test") -> Iterator[str]:
    """A new empty database on ``admin_url``'s server; yields its URL (password kept), drops it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = admin_engine(admin_url)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def pg_admin() -> Engine:
    """An engine on the test server's admin database ($HARNESS_TEST_PG)."""
    return admin_engine(PG_ADMIN_URL)
