"""Trial summaries (``models.TrialSummary``): written with the samples by every writer (a trial appended later
merged into its job's), filled by the migration, and
read by the report's analysis instead of every sample (``query.load_cell_trials``) with the same cells, bit for
bit, as the samples give -- for jobs of one trial (their samples are read), of several, with invalid samples, with
a trial appended later, and for jobs whose summaries are missing or do not add up (read from their samples)."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import delete, select, update

from harness.analysis import cache
from harness.analysis.history import MIN_TRIALS_FOR_CI
from harness.core.job import JobResult
from harness.record import analysis_cache, outbox, store
from harness.record.models import JobRecord, Sample, TrialSummary
from testkit.analysis import add_run, bench_job, grid_results
from testkit.migrations import downgraded

SAMPLES_BELOW = MIN_TRIALS_FOR_CI  # as the analysis cache asks (harness.analysis.cache.cells.load_cells)


@pytest.fixture
def db(db_url):
    handle = outbox.open_store(db_url)
    yield handle
    handle.close()


def test_a_summary_is_the_count_the_valid_count_and_numpy_s_median_of_the_valid_samples():
    rng = np.random.default_rng(1)
    rows, expected = [], []
    for job in (3, 1, 2):
        for trial in (2, -1, 0):
            seconds = rng.lognormal(-7, 0.3, size=int(rng.integers(1, 9))).tolist()
            seconds += [float("nan"), 0.0, -1.0, float("inf")][:int(rng.integers(0, 5))]
            rng.shuffle(seconds)
            rows += [(job, i, s, trial) for i, s in enumerate(seconds)]
            valid = [s for s in seconds if np.isfinite(s) and s > 0]
            expected.append((job, trial, len(seconds), len(valid), float(np.median(valid))))
    rows += [(9, 0, float("nan"), 0), (9, 1, 0.0, 0)]  # a trial without one valid sample
    expected.append((9, 0, 2, 0, float("nan")))
    rng.shuffle(rows)
    assert repr(store.trial_summaries(rows)) == repr(sorted(expected))  # repr: nan == nan
    assert store.trial_summaries([]) == []
    packed = store.packed_summaries(store.trial_summaries(rows))
    assert sorted(packed) == [1, 2, 3, 9] and packed[9][0] == 2
    assert packed[1][1]["trial"].tolist() == [-1, 0, 2]
    assert store.unpacked_trials(packed[1][1].tobytes()).tobytes() == packed[1][1].tobytes()
    assert store.unpacked_trials(b"x" * 5) is None


def _chip_commits(db, chip: str) -> list[tuple]:
    from harness.record import query

    with db.session() as session:
        return query.arranged(session, chip, False, None)[0]


def _both(db, chip: str = "chip-a"):
    commits = _chip_commits(db, chip)
    from_samples = analysis_cache.commit_history(db, chip, commits)
    from_summaries = analysis_cache.commit_history(db, chip, commits, samples_below=SAMPLES_BELOW)
    return from_samples, from_summaries


def assert_same_cells(db, chip: str = "chip-a") -> None:
    (plain, plain_jobs), (summed, summed_jobs) = _both(db, chip)
    assert plain.series == summed.series
    np.testing.assert_array_equal(plain_jobs, summed_jobs)
    for name in ("counts", "trial_counts", "trial_offsets", "trial_sizes", "trial_runs"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(summed, name), err_msg=name)
    assert plain.trial_medians().tobytes() == summed.trial_medians().tobytes()
    expected, got = cache.cells.commit_cells(plain, plain_jobs), cache.cells.commit_cells(summed, summed_jobs)
    assert expected.keys() == got.keys()
    for commit_id, cells in expected.items():
        assert got[commit_id].series == cells.series and got[commit_id].digest == cells.digest
        for name, values in cells.arrays.items():
            assert got[commit_id].arrays[name].tobytes() == values.tobytes(), (commit_id, name)


def _mixed(db) -> None:
    """Commits of 1, 2 and 3 trials a job (most of 3; a commit of 2 + 1 trials in two runs), invalid samples, a
    trial appended."""
    rng = np.random.default_rng(3)
    for i, trials in enumerate((3, 1, 3, 2, 3, 2, 3, 3)):
        add_run(db, "chip-a", i, grid_results(rng, trials=trials), minutes=10 * i)
    add_run(db, "chip-a", 3, grid_results(rng, trials=1), minutes=35)
    job = bench_job("flash_prefill", "sdpa", {"B": 1, "H": 1, "S": 64, "D": 32})
    # (no nan: SQLite stores it as NULL, which the sample table refuses)
    run = add_run(db, "chip-a", 8, [(job, JobResult(job.key, "passed", inner=1, trial=t, samples=[
        1e-3, float("inf"), 1.1e-3, 0.0, 0.9e-3, 1.2e-3][:6 - t])) for t in range(3)], minutes=90)
    store.record_result(db, run, job, JobResult(job.key, "passed", inner=1, trial=5, samples=[2e-3, 2.1e-3]))


def test_the_cells_from_the_summaries_are_the_cells_from_the_samples(db):
    _mixed(db)
    (_, _), (summed, _) = _both(db)
    assert (summed.trial_starts < 0).any() and (summed.trial_starts >= 0).any()  # both kinds of trial are there
    assert_same_cells(db)


def test_samples_are_read_only_for_cells_of_few_trials(db):
    _mixed(db)
    (_, _), (summed, _) = _both(db)
    read = summed.trial_starts >= 0
    cell_trials = np.repeat(summed.trial_counts.ravel(), summed.trial_counts.ravel())
    assert read.tolist() == (cell_trials < SAMPLES_BELOW).tolist()
    assert summed.values.size == int(summed.trial_sizes[read].sum())
    many = int(np.flatnonzero(summed.trial_counts.ravel() >= SAMPLES_BELOW)[0])
    with pytest.raises(ValueError, match="not loaded"):
        summed.trials(many)


@pytest.mark.parametrize("damage", ["deleted", "garbled", "stale"])
def test_a_job_whose_summaries_do_not_add_up_is_read_from_its_samples(db, damage):
    _mixed(db)
    with db.session() as session:
        job_id = session.scalar(select(JobRecord.id).where(JobRecord.trials == 3).order_by(JobRecord.id).limit(1))
        if damage == "deleted":  # as in a database written before the summaries
            session.execute(delete(TrialSummary).where(TrialSummary.job_id == job_id))
        elif damage == "garbled":  # not a summary this harness wrote
            session.execute(update(TrialSummary).where(TrialSummary.job_id == job_id).values(trials=b"x" * 7))
        else:  # a sample removed behind the store's back: the summary counts one more
            first = session.scalar(select(Sample.id).where(Sample.job_id == job_id).limit(1))
            session.execute(delete(Sample).where(Sample.id == first))
            job = session.get(JobRecord, job_id)
            job.n_samples -= 1
    assert_same_cells(db)


def test_a_history_of_few_trials_a_cell_is_read_from_its_samples(db):
    rng = np.random.default_rng(4)
    for i in range(4):
        add_run(db, "chip-a", i, grid_results(rng, trials=1), minutes=10 * i)
    (_, _), (summed, _) = _both(db)
    assert summed._trial_medians is None and (summed.trial_starts >= 0).all()  # load_samples itself
    assert_same_cells(db)


def test_without_summaries_the_samples_are_read(db):
    _mixed(db)
    with db.session() as session:
        session.execute(delete(TrialSummary))
    (_, _), (summed, _) = _both(db)
    assert (summed.trial_starts >= 0).all()
    assert_same_cells(db)


def test_the_migration_fills_the_summaries_from_the_stored_samples(sqlite_url):
    db = outbox.open_store(sqlite_url)
    _mixed(db)
    with db.session() as session:
        written = sorted(session.execute(select(TrialSummary.job_id, TrialSummary.n, TrialSummary.trials)).all())
    db.close()
    from sqlalchemy import inspect

    with downgraded(sqlite_url, "0004") as engine:
        assert "trial_summary" not in inspect(engine).get_table_names()
    again = outbox.open_store(sqlite_url)
    try:
        with again.session() as session:
            filled = sorted(session.execute(select(TrialSummary.job_id, TrialSummary.n, TrialSummary.trials)).all())
    finally:
        again.close()
    assert filled == written and len(written) > 40
    appended = [records for _, n, records in written if n == 6 + 5 + 4 + 2]  # the job of 3 trials, then trial 5
    assert [store.unpacked_trials(r)["trial"].tolist() for r in appended] == [[0, 1, 2, 5]]
