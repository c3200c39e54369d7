"""Acknowledged regressions (``regression_ack``): stored by ``harness ack``, read by the report."""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from harness.record.models import RegressionAck
from harness.record.store import Store

__all__ = ["Ack", "acknowledge", "acks", "forget"]


@dataclass(frozen=True)
class Ack:
    ack_id: str
    note: str
    acked_at: datetime | None
    acked_by: str


def acknowledge(store: Store, ack_id: str, note: str, by: str | None = None) -> Ack:
    """Mark ``ack_id`` acknowledged with ``note`` (again: the note and time are replaced)."""
    if by is None:
        try:
            by = getpass.getuser()
        except (KeyError, OSError):
            by = ""
    now = datetime.now(UTC)
    with store.session() as session:
        row = session.get(RegressionAck, ack_id)
        if row is None:
            session.add(RegressionAck(ack_id=ack_id, note=note, acked_at=now, acked_by=by))
        else:
            row.note, row.acked_at, row.acked_by = note, now, by
    return Ack(ack_id, note, now, by)


def forget(store: Store, ack_id: str) -> bool:
    """Remove an acknowledgement; whether there was one."""
    with store.session() as session:
        row = session.get(RegressionAck, ack_id)
        if row is None:
            return False
        session.delete(row)
        return True


def acks(store: Store) -> dict[str, Ack]:
    """Every acknowledgement by id (none when the table cannot be read)."""
    try:
        with store.session() as session:
            rows = session.execute(select(RegressionAck)).scalars().all()
            return {r.ack_id: Ack(r.ack_id, r.note, r.acked_at, r.acked_by) for r in rows}
    except SQLAlchemyError:
        return {}
