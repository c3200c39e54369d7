"""The compiled segment search (``harness.analysis.segment_search``) chooses what the numpy search chooses, bit for
bit, and ``detect_many`` with it still equals ``changepoints.detect_change_points`` on each history."""

from __future__ import annotations

import numpy as np
import pytest

from harness.analysis import segment_search
from harness.analysis.history import _optimal_segments_many, detect_many
from harness.stats import changepoints

pytestmark = pytest.mark.skipif(not segment_search.available(), reason="numba is not importable here")


def _histories(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    """Log levels with noise, a step, a ramp, a flat run (exact ties between starts) and an outlier."""
    values = rng.normal(0.0, 0.01, (rows, n))
    values[0, n // 2:] += 0.3  # a step
    values[1] += np.linspace(0.0, 0.2, n)  # a drift
    values[2] = 0.5  # constant: every start ties, the first minimum must win
    values[3, n // 3] += 2.0  # one outlier
    return values


@pytest.mark.parametrize("n", [6, 7, 8, 9, 16, 61, 400])
def test_the_compiled_search_chooses_what_the_numpy_search_chooses(n):
    rng = np.random.default_rng(n)
    values = _histories(rng, 9, n)
    per_parameter = np.abs(rng.normal(1e-3, 5e-4, values.shape[0]))
    per_parameter[4] = 0.0  # no penalty: as many segments as it may
    per_parameter[5] = 1e6  # a prohibitive one: a single segment
    for min_segment, min_drift in ((3, 8), (2, 3), (1, 1), (4, 50)):
        numpy_choice = _optimal_segments_many(values, 2.0 * per_parameter, per_parameter, min_segment=min_segment,
                                              min_drift_length=min_drift, compiled=False)
        compiled_choice = _optimal_segments_many(values, 2.0 * per_parameter, per_parameter,
                                                 min_segment=min_segment, min_drift_length=min_drift)
        for ours, theirs in zip(compiled_choice, numpy_choice, strict=True):
            assert ours.dtype == theirs.dtype
            np.testing.assert_array_equal(ours, theirs)


def test_detect_many_with_the_compiled_search_equals_detect_change_points():
    rng = np.random.default_rng(7)
    histories = [np.exp(row) for row in _histories(rng, 6, 300)] + [np.exp(rng.normal(0, 0.02, 1000))]
    histories[5][::17] = np.nan  # missing commits
    assert detect_many(histories) == [changepoints.detect_change_points(h) for h in histories]
    assert any(detect_many(histories))  # the planted step and drift are found


def test_search_refuses_without_numba(monkeypatch):
    monkeypatch.setattr(segment_search, "_compiled", lambda: None)
    assert not segment_search.available()
    values = _histories(np.random.default_rng(0), 4, 30)
    penalty = np.full(4, 1e-3)
    with pytest.raises(RuntimeError, match="numba"):
        segment_search.search(*(np.zeros((4, 31)),) * 3, np.zeros(31), np.zeros(31), penalty, penalty,
                              min_segment=3, min_drift=8)
    # the history search falls back to numpy, with the same choices
    assert all(np.array_equal(a, b) for a, b in zip(
        _optimal_segments_many(values, 2 * penalty, penalty, min_segment=3, min_drift_length=8),
        _optimal_segments_many(values, 2 * penalty, penalty, min_segment=3, min_drift_length=8, compiled=False),
        strict=True))
