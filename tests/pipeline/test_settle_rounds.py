"""Settling rounds re-measure only what is still undecided, and a series decided at one look keeps its verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core.job import JobResult
from harness.pipeline.ab import ABRequest, series_of
from harness.pipeline.settle import Budget, SettleRequest, settle
from harness.record import outbox
from testkit.analysis import add_run, bench_job, sha_of, timings

CLEAR = bench_job("clear", "default", {"N": 1})  # head 2x slower: decided by the first round
NOISY = bench_job("noisy", "default", {"N": 1})  # identical code, trials 25 % apart: needs more rounds


def _results(rng: np.random.Generator, trials: int, head: bool, jobs) -> list:
    out = []
    for job in jobs:
        for trial in range(trials):
            level = 2.0 if head and job is CLEAR else float(np.exp(rng.normal(0.0, 0.25 if job is NOISY else 0.01)))
            out.append((job, JobResult(job.key, "passed", samples=timings(rng, 1e-3 * level), inner=1, trial=trial)))
    return out


def test_a_series_decided_at_one_look_is_not_measured_or_decided_again(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    rng = np.random.default_rng(7)
    db = outbox.open_store(url)
    try:
        for commit in (1, 2):
            add_run(db, "chip-a", commit, _results(rng, 1, commit == 2, (CLEAR, NOISY)), minutes=commit)
    finally:
        db.close()
    measured: list[set[str]] = []

    def measure(request: ABRequest, left_s: float | None) -> tuple[str, str]:
        jobs = [job for job in (CLEAR, NOISY) if series_of(job) in (request.series or ())]
        measured.append({job.kernel for job in jobs})
        store = outbox.open_store(url)
        try:
            minutes = 10.0 * len(measured)
            return (add_run(store, "chip-a", 1, _results(rng, request.trials or 1, False, jobs), minutes=minutes),
                    add_run(store, "chip-a", 2, _results(rng, request.trials or 1, True, jobs), minutes=minutes + 1))
        finally:
            store.close()

    request = SettleRequest(ABRequest(base=sha_of(1), head=sha_of(2), db_url=url, chip_label="chip-a"),
                            budget=Budget(trials=80))
    report, rounds = settle(request, say=lambda line: None, measure=measure)
    verdicts = {row.key.kernel: row.verdict for row in report.rows}
    assert measured[0] == {"clear", "noisy"} and len(measured) >= 2
    assert all(kernels == {"noisy"} for kernels in measured[1:])  # the clear one was decided by round 1 ...
    assert verdicts["clear"] == "regressed"  # ... and stays so at the later, stricter looks
    assert report.counts["regressed"] == 1 and rounds[0].series == 2
