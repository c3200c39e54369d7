"""Tests for harness.stats.changepoints: steps and drifts along a per-commit history."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from harness.stats.changepoints import CHANGE_KINDS, detect_change_points

BASE_SECONDS = 1.5e-4  # a typical kernel time; only ratios matter


def lognormal(rng: np.random.Generator, n: int, cv: float, scale: float = 1.0) -> np.ndarray:
    return BASE_SECONDS * scale * np.exp(rng.normal(0.0, cv, n))


def test_single_step_is_detected_at_the_right_commit() -> None:
    rng = np.random.default_rng(25)
    history = np.r_[lognormal(rng, 40, 0.01), lognormal(rng, 40, 0.01, scale=1.10)]
    (change,) = detect_change_points(history)
    assert change.kind == "step"
    assert change.index == change.end_index == 40
    assert 1.07 < change.ratio < 1.13
    assert change.after / change.before == pytest.approx(change.ratio)


def test_improvement_step_has_ratio_below_one() -> None:
    rng = np.random.default_rng(26)
    history = np.r_[lognormal(rng, 30, 0.02), lognormal(rng, 30, 0.02, scale=0.85)]
    (change,) = detect_change_points(history)
    assert change.kind == "step" and abs(change.index - 30) <= 1 and change.ratio < 0.9


def test_slow_drift_is_reported_as_one_drift() -> None:
    rng = np.random.default_rng(27)
    ramp = 1.01 ** np.clip(np.arange(80) - 30, 0, 20)  # 1 %/commit for 20 commits: +22 %
    history = lognormal(rng, 80, 0.01) * ramp
    (change,) = detect_change_points(history)
    assert change.kind == "drift"
    assert abs(change.index - 30) <= 4 and abs(change.end_index - 50) <= 4
    assert change.ratio > 1.10


def test_drift_still_going_at_the_newest_commit() -> None:
    rng = np.random.default_rng(28)
    history = lognormal(rng, 60, 0.01) * 1.01 ** np.clip(np.arange(60) - 40, 0, None)
    (change,) = detect_change_points(history)
    assert change.kind == "drift" and change.end_index == 59 and change.ratio > 1.1


def test_no_change_points_on_flat_noisy_histories() -> None:
    rng = np.random.default_rng(29)
    for n, cv in ((30, 0.02), (100, 0.03), (300, 0.01), (1000, 0.02)):
        assert detect_change_points(lognormal(rng, n, cv)) == []


def test_change_points_skip_missing_commits_and_keep_positions() -> None:
    rng = np.random.default_rng(30)
    history = np.r_[lognormal(rng, 20, 0.01), lognormal(rng, 20, 0.01, scale=1.2)].tolist()
    history[5] = math.nan
    history[25] = 0.0
    (change,) = detect_change_points(history)
    assert change.index == 20 and change.kind in CHANGE_KINDS
    assert detect_change_points([]) == [] and detect_change_points([1.0, 2.0]) == []
    assert detect_change_points([1.0] * 50) == []


def test_change_points_are_fast_for_1000_commits() -> None:
    rng = np.random.default_rng(31)
    history = lognormal(rng, 1000, 0.01) * np.repeat(rng.choice([1.0, 1.1, 0.9], 20), 50)
    start = time.perf_counter()
    changes = detect_change_points(history)
    assert time.perf_counter() - start < 3.0
    assert all(c.index % 50 == 0 for c in changes if c.kind == "step")

