"""Machines starting on one fresh PostgreSQL database at once: the first migrates, the others wait for its lock and
find the schema at the head, instead of dying in the race (UniqueViolation on pg_type, nothing stored)."""

from __future__ import annotations

import subprocess
import sys
import time

from sqlalchemy import create_engine, text

from harness.record import store
from testkit.pg import scratch_database

STARTERS = 3
TRIES = 3
OPEN = """
import sys, time
start = float(sys.argv[2])
from harness.record import store
time.sleep(max(0.0, start - time.time()))  # every starter opens the database at the same moment
store.open_database(sys.argv[1]).close()
"""


def test_concurrent_first_starters_on_a_fresh_postgresql_database_all_succeed(pg_server):
    for _ in range(TRIES):
        with scratch_database(pg_server) as url:
            start = time.time() + 4.0  # after every interpreter has imported the store
            starters = [subprocess.Popen([sys.executable, "-c", OPEN, url, str(start)], stderr=subprocess.PIPE,
                                         text=True) for _ in range(STARTERS)]
            errors = [(p.wait(timeout=120), p.stderr.read()) for p in starters]
            assert [code for code, _ in errors] == [0] * STARTERS, [err[-800:] for _, err in errors]
            engine = create_engine(url)
            with engine.connect() as connection:
                assert connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
                    store.SCHEMA_HEAD]
            engine.dispose()
