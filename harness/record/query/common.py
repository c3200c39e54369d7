"""What the read modules share: the series key, plain DBAPI rows and arrays, a chip's run filter, UTC times."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from harness.record import ancestry
from harness.record.models import Chip, Run
from harness.record.store import Store


class SeriesKey(NamedTuple):
    """One benchmark series: a kernel variant at one dtype and shape, on one chip."""

    kernel: str
    variant: str
    dtype: str
    shape_key: str
    chip: str


def commit_graph(store: Store, session: Session, repos: Sequence[str]) -> ancestry.Graph:
    """``ancestry.load_graph`` of ``repos``, read once within ``store.memoised`` (a report's previous runs, chip tips
    and history runs walk the same repository's commits)."""
    repos = sorted(set(repos))
    return store.memo(("commit graph", *repos), lambda: ancestry.load_graph(session, repos))


def run_filter(query, chip: str, include_dirty: bool):
    query = query.where(Chip.key == chip, Run.settling.is_(False))  # settling runs: never history points
    return query if include_dirty else query.where(Run.dirty.is_(False))


@contextlib.contextmanager
def _executed(session: Session, statement) -> Iterator[Any]:
    """A DBAPI cursor that has executed the compiled SELECT (SQLAlchemy's Row objects skipped)."""
    connection = session.connection()
    compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup)
    cursor = connection.connection.cursor()
    try:
        cursor.execute(str(compiled), params)
        yield cursor
    finally:
        cursor.close()


def plain_rows(session: Session, statement) -> list[tuple]:
    """DBAPI tuples of a SELECT, skipping SQLAlchemy's Row objects (seconds on millions of samples)."""
    with _executed(session, statement) as cursor:
        return cursor.fetchall()


def plain_array(session: Session, statement, dtype: np.dtype) -> npt.NDArray[Any]:
    """``plain_rows`` as a structured array, filled from the cursor row by row: no list of millions of tuples
    (their allocation and the garbage collector's passes over them cost a quarter of a chip's sample read)."""
    with _executed(session, statement) as cursor:
        return np.fromiter(cursor, dtype=dtype)


def positions_of(ids: npt.NDArray[np.int64], wanted: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """Each of ``wanted``'s position in ``ids`` (distinct ids, in any order; every wanted one among them): the job
    of each sample row."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.intp)
    by_id = np.argsort(ids)
    return by_id[np.searchsorted(ids, wanted, sorter=by_id)]


def utc(when: datetime | None) -> datetime | None:
    """A stored time, comparable with the others (SQLite gives them without offset: UTC)."""
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


def joined_modes(modes: dict[Any, set[str]]) -> dict[Any, str]:
    """Each key's recorded timing modes as one string, "+"-joined where its runs differ ("" if none recorded)."""
    return {key: "+".join(sorted(m for m in found if m)) for key, found in modes.items()}
