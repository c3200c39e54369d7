"""harness.pipeline.settle without measuring: the budget, what counts undecided (rules: tests/stats/test_settling)."""

from __future__ import annotations

import pytest

from harness.analysis.records import CompareRow
from harness.core.errors import HarnessError
from harness.pipeline.settle import Budget, parse_budget, undecided
from harness.record.query import SeriesKey
from harness.stats.policy import SETTLED_WITHIN


def test_the_budget_is_trials_or_time():
    assert parse_budget("24") == Budget(trials=24)
    assert parse_budget("300s") == Budget(seconds=300.0) and parse_budget("10m") == Budget(seconds=600.0)
    for bad in ("soon", "0", "-3", ""):
        with pytest.raises(HarnessError):
            parse_budget(bad)


def row(verdict: str, low: float, high: float, basis: str = "trials", name: str = "k") -> CompareRow:
    return CompareRow(SeriesKey(name, "v", "float32", "N=1", "chip"), verdict, 1.0, low, high, 0.5, 0.5, 10, 10, 0,
                      1e-3, 1e-3, basis=basis)


def test_undecided_rows_are_inconclusive_or_a_settled_unchanged_on_a_wide_interval():
    wide, narrow = row("unchanged", 0.7, 1.4, name="wide"), row("unchanged", 0.95, 1.05, name="narrow")
    held, incomparable = row("inconclusive", 0.9, 1.5, name="held"), row("inconclusive", 0.9, 1.5, "incomparable")
    rows = (wide, narrow, held, incomparable, row("regressed", 1.5, 2.5, name="flag"))
    assert undecided(rows) == [held]  # the stored comparison's unchanged rows stand
    assert undecided(rows, {wide.key, narrow.key, held.key}) == [wide, held]  # a settled unchanged must be narrow
    assert 1 + SETTLED_WITHIN == 1.25
