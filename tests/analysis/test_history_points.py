"""``HistoryPoints``: a series' history points kept as columns, equal to (and read as) the records they stand for."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest

from harness.analysis.records import HistoryPoint, HistoryPoints, SeriesHistory
from harness.record.query import SeriesKey

COMMITS = [(f"{i:040x}", f"commit {i}", "main", datetime(2026, 1, 1, i, tzinfo=UTC)) for i in range(5)]


def records() -> tuple[HistoryPoint, ...]:
    return tuple(HistoryPoint(*COMMITS[row], 1e-3 * (1 + row), 0.9e-3 * (1 + row), 1.1e-3 * (1 + row), 10 + row)
                 for row in (0, 2, 3))


def columns() -> HistoryPoints:
    return HistoryPoints(COMMITS, [0, 2, 3], [1e-3 * (1 + r) for r in (0, 2, 3)],
                         [0.9e-3 * (1 + r) for r in (0, 2, 3)], [1.1e-3 * (1 + r) for r in (0, 2, 3)], [10, 12, 13])


def test_columns_read_as_the_records_they_stand_for():
    points = columns()
    assert len(points) == 3 and tuple(points) == records() and points == records() and points == list(records())
    assert points[1] == records()[1] and points[-1] == records()[-1] and points[-3] == records()[0]
    assert isinstance(points[1].median, float) and isinstance(points[1].n, int)
    assert points.shas == [COMMITS[r][0] for r in (0, 2, 3)] and points.median.tolist() == [1e-3, 3e-3, 4e-3]
    assert points[1:] == records()[1:] and isinstance(points[1:], HistoryPoints)
    with pytest.raises(IndexError):
        points[3]
    with pytest.raises(IndexError):
        points[-4]
    assert hash(points) == hash(records()) and points != records()[:2] and points != "x"


def test_a_series_history_keeps_records_as_columns_and_serialises_them_as_before():
    from_records = SeriesHistory(SeriesKey("k", "v", "float16", "S=1", "chip"), records(), ())
    from_columns = SeriesHistory(SeriesKey("k", "v", "float16", "S=1", "chip"), columns(), ())
    assert isinstance(from_records.points, HistoryPoints) and from_records == from_columns
    payload = json.loads(json.dumps(from_columns.to_dict()))
    assert payload["points"][1] == {"sha": COMMITS[2][0], "message": "commit 2", "branch": "main",
                                    "started_at": COMMITS[2][3].isoformat(), "median": 3e-3,
                                    "ci_low": pytest.approx(2.7e-3), "ci_high": pytest.approx(3.3e-3), "n": 12}
    nan = HistoryPoints(COMMITS, [0], [math.nan], [math.nan], [math.nan], [0])
    assert json.loads(json.dumps(SeriesHistory(from_records.key, nan, ()).to_dict()))["points"][0]["median"] is None
