"""Trials end to end: planned in seeded interleaved rounds, run in batches of one round per job process (a crash
re-runs the rest alone), every trial of a series timed in one mode, stored per trial, resumed per trial, read as
trials, and old single-trial databases still read."""

from __future__ import annotations

import shutil
import sqlite3
import textwrap
from collections import Counter

import pytest

from harness.core.job import JobResult, KernelJob
from harness.execute import local
from harness.execute.local import LocalExecutor, batches, run_batch
from harness.pipeline.ab import Turns, abba
from harness.record import outbox, query, store
from harness.spec.plan import plan_trials
from testkit.analysis import add_run, bench_job, grid_results
from testkit.paths import ROOT

H200_NULL = ROOT.parent / "shared" / "data" / "h200-null"


PLUGIN_DIR: list[str] = []  # set by the module's fixture: where the test plugin was written


def bench(variant: str, n: int, trials: int = 3, **timing) -> KernelJob:
    return KernelJob.of("benchmark", "trialk", variant, {"N": n}, "float32", name="b",
                        timing={"trials": trials, "warmup_s": 0.0, "warmup_calls": 1, "min_sample_s": 0.001,
                                "samples": 3, **timing},
                        plugins=("trial_kernels",), plugin_dir=PLUGIN_DIR[0] if PLUGIN_DIR else "")


def test_trials_are_planned_in_seeded_shuffled_rounds_after_everything_else():
    check = KernelJob.of("correctness", "trialk", "ok", {"N": 1}, "float32", "reference", name="c")
    jobs = [check, *(bench("ok", n) for n in range(1, 6)), bench("ok", 9, trials=1)]
    planned = plan_trials(jobs, seed=7)
    assert planned == plan_trials(jobs, seed=7) and planned != plan_trials(jobs, seed=8)  # the seed is the order
    assert planned[0] == check  # other kinds once, first (executors run kinds in phases anyway)
    rounds = [[job for job in planned if job.trial == t] for t in range(3)]
    assert [len(r) for r in rounds] == [7, 5, 5]  # the one-trial job only in round 0
    assert planned[1:] == rounds[0][1:] + rounds[1] + rounds[2]  # round after round
    orders = [[job.key for job in r if job.kind == "benchmark"] for r in rounds[1:]]
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])  # each round shuffled anew
    assert len({job.unit for job in planned}) == len(planned)  # each execution known by its own unit


def test_batches_hold_one_rounds_benchmark_jobs_and_nothing_else():
    check = KernelJob.of("correctness", "trialk", "ok", {"N": 1}, "float32", "reference", name="c")
    jobs = plan_trials([bench("ok", n) for n in range(1, 6)], seed=1)
    grouped = list(batches([check, *jobs], size=4))
    assert grouped[0] == [check]
    assert all(len(b) <= 4 and len({job.trial for job in b}) == 1 for b in grouped[1:])
    assert [job for b in grouped[1:] for job in b] == jobs
    threaded = [bench("ok", 1), bench("ok", 2, threads=1)]
    assert len(list(batches(threaded, size=4))) == 2  # another thread setting: another process


def test_a_batch_that_crashes_re_runs_its_unfinished_jobs_one_per_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAL_MARKS", str(tmp_path))
    jobs = [bench("ok", 1), bench("segv", 2), bench("ok", 3), bench("ok", 4)]
    got: dict[str, JobResult] = {}
    run_batch(jobs, lambda job, result: got.setdefault(job.key, result))
    assert {key.split("/")[2]: r.status for key, r in got.items()} == {"ok": "passed", "segv": "crashed"}
    assert [got[job.key].status for job in jobs] == ["passed", "crashed", "passed", "passed"]
    processes = Counter(path.read_text() for path in tmp_path.glob("pid-*"))
    # the first job ran in the batch's process with the crash; the two after it each in a process of its own
    assert len(processes) == 1 + 1 + 2 and all(n == 1 for n in processes.values())


def test_later_trials_of_an_auto_job_are_timed_in_the_mode_the_first_trial_chose(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAL_MARKS", str(tmp_path))
    seen: list[tuple[int, str]] = []
    original = local.run_in_subprocess

    def spy(job, tree=None, **kwargs):
        seen.append((job.trial, job.timing["mode"]))
        result = original(job, tree, **kwargs)
        if job.trial == 0:
            result.mode = "per-call"  # as if the pilot had chosen per-call
        return result

    monkeypatch.setattr(local, "run_in_subprocess", spy)
    jobs = plan_trials([bench("ok", 1, mode="auto")], seed=0)
    results = []
    LocalExecutor(batch=1).execute(jobs, lambda job, result: results.append(result))
    assert seen == [(0, "auto"), (1, "per-call"), (2, "per-call")] and len(results) == 3


def test_trials_are_stored_per_trial_once_each_and_a_failed_trial_shows(sqlite_url):
    db = outbox.open_store(sqlite_url)
    job = bench_job("flash_prefill", "sdpa", {"B": 1, "H": 1, "S": 64, "D": 32})
    run_id = add_run(db, "chip-a", 1, [], minutes=0)
    first = JobResult(job.key, "passed", samples=[1.0, 1.1, 1.2], inner=1, mode="pipelined", round_trip_s=2e-5)
    assert store.record_result(db, run_id, job, first)
    assert not store.record_result(db, run_id, job, first)  # the same trial again: nothing written
    second = JobResult(job.key, "passed", samples=[2.0, 2.1], inner=1, trial=1)
    assert store.record_result(db, run_id, job, second) and not store.record_result(db, run_id, job, second)
    third = JobResult(job.key, "crashed", "job process died", trial=2)
    assert store.record_result(db, run_id, job, third)
    (row,) = query.get_run(db, run_id).jobs
    assert (row["trials"], row["n_samples"], row["status"], row["timing_mode"]) == (2, 5, "crashed", "pipelined")
    assert row["detail"] == "trial 3: job process died" and row["median_s"] == pytest.approx(1.2)
    (series,) = query.series_trials(db, [run_id]).values()
    assert [list(t) for t in series.trials] == [[1.0, 1.1, 1.2], [2.0, 2.1]] and series.runs == 1
    stored = store.stored_run(db, run_id)
    assert set(stored.units) == {job.key, f"{job.key}#trial1"}  # a resume re-runs the crashed trial only
    db.close()


def test_a_job_is_host_paced_when_any_of_its_trials_was(sqlite_url):
    db = outbox.open_store(sqlite_url)
    jobs = {name: bench_job("flash_prefill", name, {"B": 1, "H": 1, "S": 64, "D": 32}) for name in ("a", "b", "c")}
    run_id = add_run(db, "chip-a", 1, [], minutes=0)
    backlogs = {"a": (18.0, 1.5, None), "b": (18.0, None, 17.0), "c": (None, None, None)}  # per trial
    for name, per_trial in backlogs.items():
        for trial, backlog in enumerate(per_trial):
            store.record_result(db, run_id, jobs[name], JobResult(jobs[name].key, "passed", samples=[1.0, 1.1],
                                                                  inner=8, mode="pipelined", trial=trial,
                                                                  backlog_calls=backlog))
    stored = {row["variant"]: row["backlog_calls"] for row in query.get_run(db, run_id).jobs}
    assert stored == {"a": 1.5, "b": 17.0, "c": None}  # the least recorded backlog: host-paced in any trial shows
    assert {key.variant for key in query.host_paced_series(db, [run_id])} == {"a"}
    db.close()


def test_history_medians_come_from_the_base_commit_and_its_first_parent_ancestors(sqlite_url):
    import numpy as np
    from sqlalchemy import update

    from harness.record.models import Commit
    from testkit.analysis import sha_of

    db = outbox.open_store(sqlite_url)
    rng = np.random.default_rng(0)
    ids = {commit: add_run(db, "chip-a", commit, grid_results(rng, trials=1), minutes=commit) for commit in range(1, 6)}
    with db.session() as session:
        for commit in range(2, 5):  # 1 <- 2 <- 3 <- 4; commit 5 a root of its own; commit 6's parents unknown
            session.execute(update(Commit).where(Commit.sha == sha_of(commit)).values(parents=[sha_of(commit - 1)]))
        for commit in (1, 5):
            session.execute(update(Commit).where(Commit.sha == sha_of(commit)).values(parents=[]))
    ids[6] = add_run(db, "chip-a", 6, grid_results(rng, trials=1), minutes=6)
    with db.session() as session:  # add_run links the synthetic line: make commit 6's parents unknown again
        session.execute(update(Commit).where(Commit.sha == sha_of(6)).values(parents=None))
    for run_id in ids.values():
        store.finish_run(db, run_id, "complete")
    assert {len(v) for v in query.history_medians(db, [ids[3]]).values()} == {3}  # commits 3, 2, 1
    assert {len(v) for v in query.history_medians(db, [ids[4]], limit=2).values()} == {2}
    assert {len(v) for v in query.history_medians(db, [ids[5]]).values()} == {1}  # a root: nothing older
    # ancestry unknown: the chip's runs up to it in time order, as previous_run_id falls back to
    assert {len(v) for v in query.history_medians(db, [ids[6]], limit=4).values()} == {4}
    db.close()


@pytest.mark.skipif(not (H200_NULL / "run1.db").exists(), reason="the recorded H200 runs are not here")
def test_a_database_from_before_trials_upgrades_and_reads_one_trial_per_job(tmp_path):
    copy = tmp_path / "run1.db"
    shutil.copy(H200_NULL / "run1.db", copy)
    db = outbox.open_store(f"sqlite:///{copy}")
    (run_id,) = [run.id for run in query.runs(db)]
    measured = query.series_trials(db, [run_id])
    assert len(measured) > 100 and all(len(s.trials) == 1 and s.runs == 1 for s in measured.values())
    db.close()
    with sqlite3.connect(copy) as conn:
        assert conn.execute("select count(*) from sample where trial != 0").fetchone() == (0,)
        assert conn.execute("select distinct trials from job").fetchall() == [(1,)]


def test_abba_alternates_which_side_goes_first():
    assert abba(3) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]


def test_turns_let_each_side_run_only_on_its_turn():
    import threading

    turns, order = Turns(abba(2)), []

    def side(index: int) -> None:
        for number in range(2):
            turns.wait_for(index, number)
            order.append((index, number))
            turns.done(index, number)

    threads = [threading.Thread(target=side, args=(i,)) for i in (1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == abba(2)


PLUGIN = textwrap.dedent('''
    """Benchmark jobs for the trial tests: ``ok`` returns a small array, ``segv`` crashes its process."""
    import ctypes
    import os

    import mlx.core as mx
    import numpy as np

    from kernels import REGISTRY, Kernel, Variant, register


    def _mark():
        folder = os.environ.get("TRIAL_MARKS")
        if folder:
            with open(os.path.join(folder, f"pid-{os.getpid()}"), "w") as out:
                out.write(str(os.getpid()))


    def _ok(x):
        return x + 1


    def _segv(x):
        ctypes.string_at(0)


    def _inputs(shape, dtype, seed):
        _mark()
        return {"x": mx.ones((4,))}


    if "trialk" not in REGISTRY:
        register(Kernel(name="trialk", description="trial tests", default_variant="ok",
                        variants={"ok": Variant("ok", _ok), "segv": Variant("segv", _segv)},
                        normalize_shape=dict, make_inputs=_inputs, reference=lambda inputs: np.ones(4),
                        tolerance={"float32": 1e-6}, flops=lambda shape: 4.0, bytes_moved=lambda shape, dtype: 16.0))
''')


@pytest.fixture(autouse=True, scope="module")
def trial_plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trial_plugin")
    (folder / "trial_kernels.py").write_text(PLUGIN)
    PLUGIN_DIR[:] = [str(folder)]
    yield
    PLUGIN_DIR.clear()


def test_a_trial_appended_to_a_stored_job_shows_in_the_chip_history_read_before_it(sqlite_url):
    """The report process reads a chip's history, a run's later trial lands, the history is read again: the
    in-process history cache must not serve the version without that trial."""
    db = outbox.open_store(sqlite_url)
    job = bench_job("flash_prefill", "sdpa", {"B": 1, "H": 1, "S": 64, "D": 32})
    run_id = add_run(db, "chip-a", 1, [], minutes=0)
    store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=[1.0, 1.1], inner=1))
    assert query.chip_history(db, "chip-a").trial_counts.sum() == 1
    store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=[2.0, 2.1], inner=1, trial=1))
    assert query.chip_history(db, "chip-a").trial_counts.sum() == 2
    db.close()


def test_a_round_keeps_each_kernel_variants_jobs_together_and_one_process_compiles_it_once():
    """MLX compiles a source kernel in every process (bench/results/README.md): a round plans a (kernel, variant,
    dtype)'s shapes next to each other, and a batch never splits them when they fit in one process."""
    jobs = [bench(variant, n) for variant in ("ok", "slow", "other") for n in range(1, 5)]
    planned = plan_trials(jobs, seed=3)
    for trial in range(3):
        this_round = [job.variant for job in planned if job.trial == trial]
        runs = [v for i, v in enumerate(this_round) if i == 0 or this_round[i - 1] != v]
        assert sorted(runs) == ["ok", "other", "slow"]  # each variant's 4 jobs in one stretch
    orders = {tuple(job.key for job in planned if job.trial == t) for t in range(3)}
    assert len(orders) == 3  # each round in an order of its own
    for batch in batches(planned, size=6):  # 3 groups of 4 do not fit two to a process: one group per batch
        assert len({job.variant for job in batch}) == 1 and len(batch) == 4
    big = plan_trials([bench("ok", n, trials=1) for n in range(1, 11)], seed=1)
    assert [len(b) for b in batches(big, size=4)] == [4, 4, 2]  # larger than a batch: whole batches of it
