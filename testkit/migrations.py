"""Take a database's schema down to an older Alembic revision, to test the migrations up from it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine

from harness.record import store


@contextmanager
def downgraded(url: str, revision: str) -> Iterator[Engine]:
    """The database at ``url`` downgraded to ``revision``; the engine to inspect it with (disposed afterwards)."""
    from alembic import command
    from alembic.config import Config

    engine = create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(store.MIGRATIONS))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
        yield engine
    finally:
        engine.dispose()
