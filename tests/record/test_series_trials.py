"""``query.series_trials`` groups a side's samples with numpy (``series._grouped_trials``): the same series, trials,
labels and run counts, in the same order, as grouping them one sample at a time."""

from __future__ import annotations

import numpy as np
import pytest

from harness.record.query.common import SeriesKey
from harness.record.query.series import _TRIAL_SAMPLE, _grouped_trials


def _one_at_a_time(jobs, rows):  # noqa: ANN001, ANN202 - the grouping the numpy one replaced, as it was
    named = {job[0]: job[1:] for job in jobs}
    grouped: dict = {}
    for job_id, trial, seconds in rows.tolist():
        *series, run_id = named[job_id]
        grouped.setdefault(SeriesKey(*series), {}).setdefault((run_id, trial), []).append(seconds)
    result = {}
    for key, trials in grouped.items():
        arrays = [np.array(values, dtype=np.float64) for values in trials.values()]
        kept = [(label, a[np.isfinite(a) & (a > 0)]) for label, a in zip(trials, arrays, strict=True)]
        kept = [(label, a) for label, a in kept if a.size]
        if kept:
            result[key] = ([a.tolist() for _, a in kept], len({run for run, _ in trials}),
                           tuple(label for label, _ in kept))
    return result


@pytest.mark.parametrize("seed", range(25))
def test_grouped_as_one_sample_at_a_time(seed):
    """Several runs and chips, two jobs of one series in one run, trial numbers out of order and negative, samples
    that are nan, zero or negative (a trial with none valid is left out, its run still counted)."""
    rng = np.random.default_rng(seed)
    series = [("k", f"v{i % 3}", "float16", f"S={i}", f"chip-{i % 2}") for i in range(int(rng.integers(1, 6)))]
    runs = [f"run-{i}" for i in range(int(rng.integers(1, 4)))]
    jobs = [(job_id, *series[int(rng.integers(len(series)))], runs[int(rng.integers(len(runs)))])
            for job_id in rng.permutation(100)[: int(rng.integers(1, 12))].tolist()]
    rows = []
    for job_id, *_ in sorted(jobs):
        for _ in range(int(rng.integers(0, 9))):
            value = float(rng.choice([1e-3 * rng.random() + 1e-6, np.nan, 0.0, -1.0, np.inf], p=[.7, .1, .1, .05, .05]))
            rows.append((job_id, int(rng.integers(-1, 3)), value))
    array = np.array(rows, dtype=_TRIAL_SAMPLE) if rows else np.zeros(0, dtype=_TRIAL_SAMPLE)
    found = {key: ([a.tolist() for a in value.trials], value.runs, value.labels)
             for key, value in _grouped_trials(jobs, array).items()}
    expected = _one_at_a_time(jobs, array)
    assert list(found) == list(expected)
    assert found == expected
