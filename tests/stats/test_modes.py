"""harness.stats.modes: series timed in different modes are not compared."""

from __future__ import annotations

from harness.stats.modes import same_mode


def test_only_series_timed_alike_are_compared():
    assert same_mode("pipelined", "pipelined") and same_mode("per-call", "per-call")
    assert not same_mode("pipelined", "per-call")
    assert not same_mode("pipelined+per-call", "pipelined")  # a side mixing modes is alike an identical one only
    assert same_mode("pipelined+per-call", "pipelined+per-call")
    assert same_mode(None, "per-call") and same_mode("pipelined", "")  # not recorded: before modes were
