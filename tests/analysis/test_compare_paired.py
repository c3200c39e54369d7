"""compare(paired=True): settling rounds decided on pairs of trials, matched by round and trial number through the
store (harness.stats.paired)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.analysis.compare import compare, resolve_side, round_pairs
from harness.analysis.records import Side
from harness.core.job import JobResult
from harness.record import outbox, query
from harness.stats.settling import excludes_a_real_change
from testkit.analysis import add_run, bench_job, sha_of, timings

JOB = bench_job("flash", "bq16", {"S": 128})
# Load on or off for whole rounds of the ABBA session: both trials of a pair at one level
LEVELS = ((1.0, 2.5, 1.0, 2.5, 2.5, 1.0, 1.0), (2.5, 1.0, 1.0, 2.5, 1.0, 2.5, 2.5))


def _round_run(db, commit: int, levels: tuple[float, ...], factor: float, rng: np.random.Generator,
               minutes: float) -> str:
    results = [(JOB, JobResult(JOB.key, "passed", samples=timings(rng, 1e-3 * level * factor), inner=1, trial=trial))
               for trial, level in enumerate(levels)]
    return add_run(db, "chip-a", commit, results, minutes=minutes)


def _side(db, commit: int, run_ids: list[str]) -> Side:
    side = resolve_side(db, sha_of(commit), "chip-a")
    return Side(side.ref, "run", side.sha, side.message, side.branch, {"chip-a": tuple(run_ids)}, 0)


def test_rounds_are_decided_on_their_pairs_where_pooling_cannot_tell(tmp_path: Path):
    db = outbox.open_store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        rng = np.random.default_rng(5)
        for head_factor, verdict in ((1.0, "unchanged"), (1.15, "regressed")):
            base = [_round_run(db, 1, levels, 1.0, rng, minutes=2.0 * i) for i, levels in enumerate(LEVELS)]
            head = [_round_run(db, 2, levels, head_factor, rng, minutes=2.0 * i + 1) for i, levels in enumerate(LEVELS)]
            sides = (_side(db, 1, base), _side(db, 2, head))
            by_pairs = compare(db, sha_of(1), sha_of(2), chip="chip-a", sides=sides, paired=True, alpha=0.005)
            (row,) = by_pairs.rows
            assert row.verdict == verdict and row.basis == "pairs" and row.trials_base == row.trials_head == 14
            pooled = compare(db, sha_of(1), sha_of(2), chip="chip-a", sides=sides, same_session=True, alpha=0.005)
            (pooled_row,) = pooled.rows
            assert pooled_row.verdict != "regressed"  # the load's spread, kept by pooling, hides the 15 %
            if verdict == "unchanged":
                assert excludes_a_real_change(row.ci_low, row.ci_high)
                assert not excludes_a_real_change(pooled_row.ci_low, pooled_row.ci_high)
    finally:
        db.close()


def test_round_pairs_match_by_round_and_trial_number_and_drop_a_trial_without_its_partner():
    a, b, c = np.array([1.0]), np.array([2.0]), np.array([3.0])
    base = query.SeriesTrials([a, b, c], 2, (("r1", 0), ("r1", 1), ("r3", 0)))
    head = query.SeriesTrials([c, a, b], 2, (("r2", 1), ("r4", 0), ("r2", 0)))
    pairs = round_pairs(base, head, [("r1", "r2"), ("r3", "r4")])
    assert [(float(x[0]), float(y[0])) for x, y in pairs] == [(1.0, 2.0), (2.0, 3.0), (3.0, 1.0)]
    assert round_pairs(base, head, [("r1", "r4")]) == [(a, a)]  # r1's trial 1 has no partner in r4
