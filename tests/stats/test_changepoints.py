"""Tests for harness.stats.changepoints: steps and drifts along a per-commit history."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from harness.stats.changepoints import (
    CHANGE_KINDS,
    WINDOW,
    ChangePoint,
    Window,
    detect_change_points,
    robust_noise,
    robust_noise_rows,
    stitched,
    windows,
    winsorise,
    winsorise_rows,
)

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



@pytest.mark.parametrize("window", [8, 9, 64, WINDOW])
def test_windows_own_every_commit_once_with_context_on_both_sides(window: int) -> None:
    for n in range(0, 5 * window):
        found = windows(n, window)
        assert [i for w in found for i in range(w.own_start, w.own_stop)] == list(range(n))
        for w in found:
            assert w.stop - w.start == min(n, window)
            assert w.start == 0 or w.own_start - w.start >= window // 4
            assert w.stop == n or w.stop - w.own_stop >= window // 4


def test_a_new_commit_moves_only_the_newest_window() -> None:
    """Every window but the last ends at a fixed commit: a new commit leaves them (and their searches) as they were."""
    for n in range(WINDOW, 4 * WINDOW):
        before, after = windows(n), windows(n + 1)
        assert {(w.start, w.stop) for w in before[:-1]} <= {(w.start, w.stop) for w in after}
        assert {(w.start, w.stop) for w in after} - {(w.start, w.stop) for w in before} == {(after[-1].start, n + 1)}


@pytest.mark.parametrize("at", [100, 191, 192, 193, 320, 500, 830, 990])
def test_a_step_in_a_long_history_is_found_once_wherever_the_windows_fall(at: int) -> None:
    """One 10 % step in a 1,000-commit history: one change, at its commit, as the whole-history search finds it,
    whether the step lies in the middle of a window, at the edge of what a window owns, or among the newest commits."""
    rng = np.random.default_rng(at)
    history = lognormal(rng, 1000, 0.01) * np.where(np.arange(1000) >= at, 1.10, 1.0)
    found = detect_change_points(history)
    assert [(c.kind, c.index) for c in found] == [("step", at)]
    assert [(c.kind, c.index) for c in detect_change_points(history, window=None)] == [("step", at)]
    assert 1.07 < found[0].ratio < 1.13


@pytest.mark.parametrize(("rate", "start", "length"), [(1.002, 300, 150), (1.001, 300, 400), (1.003, 700, 200)])
def test_a_drift_across_windows_is_one_drift_from_its_start_to_its_end(rate: float, start: int, length: int) -> None:
    """A ramp longer than what a window owns (0.1-0.3 %/commit over 150-400 commits, into the newest commits for the
    last) is one drift, carried from window to window: where it starts, where it ends, its whole change."""
    rng = np.random.default_rng(length)
    ramp = rate ** np.clip(np.arange(1000) - start, 0, length)
    (drift,) = detect_change_points(lognormal(rng, 1000, 0.005) * ramp)
    assert drift.kind == "drift" and abs(drift.index - start) <= 8
    assert abs(drift.end_index - min(start + length, 999)) <= 8
    assert drift.ratio == pytest.approx(rate ** min(length, 999 - start), rel=0.03)


def test_stitched_carries_a_drift_cut_at_its_window_end_only_into_one_that_overlaps_it() -> None:
    first, second = Window(0, 10, 0, 7), Window(5, 15, 7, 15)
    cut = ChangePoint(4, "drift", 1.0, 1.2, 1.2, 9)  # runs to its window's last commit
    going_on = ChangePoint(2, "drift", 1.1, 1.5, 1.5 / 1.1, 8)  # 7..13 in the history: overlaps it
    assert stitched([(first, [cut]), (second, [going_on])]) == [ChangePoint(4, "drift", 1.0, 1.5, 1.5, 13)]
    later = ChangePoint(6, "drift", 1.1, 1.5, 1.5 / 1.1, 8)  # 11..13: starts after it ends
    assert stitched([(first, [cut]), (second, [later])]) == [cut, dataclasses.replace(later, index=11, end_index=13)]
    ended = dataclasses.replace(cut, end_index=8)  # ended inside its window: nothing to carry on (the next one's own)
    assert stitched([(first, [ended]), (second, [going_on])]) == [ended, dataclasses.replace(going_on, index=7,
                                                                                              end_index=13)]


def test_a_drift_two_windows_start_on_either_side_of_their_boundary_is_kept() -> None:
    """The window 128-383 starts this drift (planted at 320, where its own commits end) at 321, the next window at 317:
    each outside its own commits. Near that boundary the later window's changes count: one drift, from 319."""
    values = 0.005 * np.random.default_rng(17).standard_normal(1000)
    values[320:520] -= 0.0025 * np.arange(200)
    values[520:] -= 0.0025 * 199
    history = np.exp(values)
    found = detect_change_points(history)
    assert [(c.kind, c.index, c.end_index) for c in found] == [("drift", 319, 518)]
    assert [(c.kind, c.index) for c in found] == [(c.kind, c.index) for c in detect_change_points(history, window=None)]


def test_stitched_takes_the_changes_near_a_boundary_from_one_window() -> None:
    first, second = Window(0, 64, 0, 48), Window(32, 96, 48, 96)  # boundary 48, "near": 4 commits either side
    late = ChangePoint(14, "step", 1.0, 1.2, 1.2, 14)  # 46 in the history: the first window's own commits
    early = ChangePoint(17, "step", 1.0, 1.2, 1.2, 17)  # 49: the second's
    assert stitched([(first, [ChangePoint(49, "step", 1.0, 1.2, 1.2, 49)]), (second, [])]) == [
        ChangePoint(49, "step", 1.0, 1.2, 1.2, 49)]  # found beyond its own commits, by the first window only
    assert stitched([(first, [ChangePoint(46, "step", 1.0, 1.2, 1.2, 46)]), (second, [early])]) == [
        dataclasses.replace(early, index=49, end_index=49)]  # the later window's, once
    assert stitched([(first, [ChangePoint(40, "step", 1.0, 1.2, 1.2, 40)]), (second, [late])]) == [
        ChangePoint(40, "step", 1.0, 1.2, 1.2, 40), dataclasses.replace(late, index=46, end_index=46)]


def test_the_noise_and_winsorised_values_of_many_rows_are_each_rows_own() -> None:
    """``detect_windows`` prepares the windows of one length at once: each row's noise and winsorised values are
    the ones of that row alone, bit for bit (sorts, medians and means along rows of any count)."""
    rng = np.random.default_rng(5)
    for n in (2, 3, 6, 31, 256):
        values = np.log(lognormal(rng, 40 * n, rng.choice([1e-4, 0.01, 0.05])).reshape(40, n))
        values[3, n // 2:] += 0.3
        sigma = robust_noise_rows(values)
        cleaned = winsorise_rows(values, sigma)
        for row in range(values.shape[0]):
            assert sigma[row] == robust_noise(values[row].copy())
            np.testing.assert_array_equal(cleaned[row], winsorise(values[row].copy(), float(sigma[row])))
