"""The SQL a piece of code runs, and SQLite's plan for it: for tests that hold a read to an index."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from harness.record import query


def patch_plain_rows(monkeypatch: Any, replacement: Any) -> None:
    """``query.plain_rows`` replaced in the package and in each of its modules that reads through it."""
    for module in (query, query.history, query.report, query.samples, query.series):
        monkeypatch.setattr(module, "plain_rows", replacement)


@contextmanager
def captured_statements(store: Any, monkeypatch: Any) -> Iterator[list[tuple[str, Any]]]:
    """Within it, every statement ``store`` runs, with its parameters: through SQLAlchemy (its hook) and through
    ``query.plain_rows`` (the DBAPI cursor, which no hook sees: its statement with the values written in)."""
    statements: list[tuple[str, Any]] = []

    def keep(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001, ANN202 - SQLAlchemy's hook
        statements.append((statement, parameters))

    plain_rows = query.plain_rows

    def kept_rows(session, statement):  # noqa: ANN001, ANN202 - as plain_rows
        statements.append((str(statement.compile(dialect=session.get_bind().dialect,
                                                 compile_kwargs={"literal_binds": True})), ()))
        return plain_rows(session, statement)

    patch_plain_rows(monkeypatch, kept_rows)
    event.listen(store.engine, "before_cursor_execute", keep)
    try:
        yield statements
    finally:
        event.remove(store.engine, "before_cursor_execute", keep)
        patch_plain_rows(monkeypatch, plain_rows)


def job_read_plan(store: Any, statements: list[tuple[str, Any]]) -> list[str]:
    """SQLite's plan (its steps' texts) for the one captured statement that reads the job table."""
    (statement, parameters), = [(s, p) for s, p in statements if "FROM job" in s]
    with store.engine.connect() as conn:
        return [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]


TableRows = list[tuple[Any, list[dict[str, Any]]]]


def table_rows(store: Any) -> TableRows:
    """Every row of the harness's tables, parents first: a database's content, to copy into another
    (``copy_rows``) instead of writing it again through the record path."""
    from sqlalchemy import select

    from harness.record.models import Base

    with store.engine.connect() as conn:
        return [(table, [dict(row._mapping) for row in conn.execute(select(table))])
                for table in Base.metadata.sorted_tables]


def copy_rows(store: Any, rows: TableRows) -> None:
    """``table_rows``' rows written into ``store``'s (empty, migrated) database as they were, ids included; on
    PostgreSQL each id sequence then continues after the highest id copied, as after the writes themselves."""
    from sqlalchemy import Integer, text

    with store.engine.begin() as conn:
        for table, values in rows:
            if values:
                conn.execute(table.insert(), values)
        if conn.dialect.name != "postgresql":
            return
        for table, values in rows:
            column = table.c.get("id")
            if values and column is not None and isinstance(column.type, Integer) and column.autoincrement:
                conn.execute(text("select setval(pg_get_serial_sequence(:table, 'id'), :top)"),
                             {"table": f'"{table.name}"', "top": max(value["id"] for value in values)})
