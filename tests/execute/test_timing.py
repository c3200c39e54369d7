"""Timing protocol: warm-up before timing, inner loop calibrated to the sample length, median CI coverage."""

from __future__ import annotations

import time

import numpy as np
import pytest

from harness.core.summary import median_ci, summarize
from harness.execute.timing import TimingProtocol, calibrate_inner, measure, measure_mlx


def test_warmup_runs_first_and_each_sample_lasts_the_minimum():
    calls = []

    def call():
        calls.append(time.perf_counter())
        time.sleep(0.0005)

    protocol = TimingProtocol(warmup_s=0.01, warmup_calls=5, min_sample_s=0.005, samples=4)
    m = measure(call, lambda: None, protocol)
    assert m.warmup_calls >= 5 and m.warmup_s >= 0.01
    assert len(m.samples) == 4 and m.inner >= 5  # 0.5 ms calls need about 10 of them for 5 ms
    assert all(4e-4 < s < 5e-3 for s in m.samples)


def test_calibration_stops_at_the_cap():
    assert calibrate_inner(lambda: None, lambda: None, TimingProtocol(min_sample_s=10.0, max_inner=64)) == 64


def test_measure_mlx_times_evaluated_work():
    import mlx.core as mx

    a = mx.ones((64, 64))
    m = measure_mlx(lambda: a @ a, TimingProtocol(warmup_s=0.0, min_sample_s=0.001, samples=3))
    assert len(m.samples) == 3 and min(m.samples) > 0


def test_median_ci_brackets_the_median_and_covers_about_95_percent():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        sample = rng.lognormal(0.0, 0.1, size=15)
        med, lo, hi = median_ci(sample.tolist())
        assert lo <= med <= hi
        hits += lo <= 1.0 <= hi  # the true median of lognormal(0, s) is 1
    assert 0.92 <= hits / 400 <= 0.995


def test_small_samples_and_summary():
    assert median_ci([2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        median_ci([])
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.median == 3.0 and s.n == 5 and s.iqr_rel == pytest.approx(2.0 / 3.0)
