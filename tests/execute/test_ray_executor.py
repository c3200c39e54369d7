"""RayExecutor and the cluster driver on a real loopback Ray cluster of chip-labelled nodes.

One cluster per module (and per xdist worker): a head that runs drivers only, one node each for chips tiny-a,
tiny-b and tiny-c, two nodes of tiny-d (a node dies, its job re-runs on the other) and one of tiny-e (a node dies,
its jobs are recorded lost).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.core.chip import detect
from harness.core.errors import HarnessError
from harness.core.job import JobResult
from harness.pipeline.run import ClusterRunRequest
from harness.record.models import Commit, JobRecord, Run
from harness.spec import git
from testkit.ray import (
    make_remote_repo,
    markers,
    restore_env,
    run_in_thread,
    sched_job,
    set_env,
    start_cluster,
    stored_jobs,
)

pytestmark = pytest.mark.xdist_group("ray_executor")

CHIPS = ["tiny-a", "tiny-b", "tiny-c", "tiny-d", "tiny-d", "tiny-e"]
SUITE = "tests/plugins/ray_sched.toml"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    import ray

    tmp = tmp_path_factory.mktemp("ray")
    previous = set_env(tmp)
    cluster = start_cluster(CHIPS)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        yield cluster, tmp
    finally:
        ray.shutdown()
        cluster.shutdown()
        restore_env(previous)


@pytest.fixture(scope="module")
def remote_repo(tmp_path_factory):
    return make_remote_repo(tmp_path_factory.mktemp("remote") / "repo")


def nodes_of(chip: str) -> set[str]:
    from harness.execute.ray_executor import live_chips

    return set(live_chips().get(chip, []))


def test_run_lands_every_job_on_a_node_of_its_chip(ray_cluster, remote_repo, tmp_path):
    """Three chips, one stored run each, every job on a node of its own chip, from a worktree of the commit."""
    from harness.cluster.driver import run_on_cluster

    cluster, tmp = ray_cluster
    repo, sha = remote_repo
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    chips = ("tiny-a", "tiny-b", "tiny-c")
    outcome = run_on_cluster(ClusterRunRequest(suite=SUITE, db_url=db_url, commit=sha, repo=str(repo),
                                               chips=chips), log=lambda line: None)
    assert outcome.errors == {}
    assert sorted(r.chip_key for r in outcome.runs) == sorted(chips)
    assert all(r.counts["passed"] == r.planned == 2 for r in outcome.runs)

    from harness.record.outbox import open_store

    db = open_store(db_url)
    try:
        with db.session() as session:
            runs = session.scalars(select(Run)).all()
            assert len(runs) == 3
            for run in runs:
                assert run.executor == "ray" and run.status == "complete" and not run.dirty
                assert session.get(Commit, run.commit_id).sha == sha  # the sha is stored with every result
                records = session.scalars(select(JobRecord).where(JobRecord.run_id == run.id)).all()
                assert len(records) == 2
                allowed = nodes_of(run.chip.key)
                assert allowed and {r.node for r in records} <= allowed, (run.chip.key, records[0].node)
    finally:
        db.close()
    # the nodes ran the commit from their per-node cache: a bare clone and a worktree of exactly that sha
    worktrees = list((tmp / "cache" / "worktrees").glob(f"*-{sha[:12]}"))
    assert worktrees and git.resolve(worktrees[0], "HEAD").sha == sha


def test_chip_without_a_live_node_fails_fast(ray_cluster, tmp_path):
    from harness.cluster.driver import run_on_cluster
    from harness.execute.ray_executor import RayExecutor

    start = time.monotonic()
    with pytest.raises(HarnessError, match=r"no live node labelled chip=tiny-zz .*live chips: .*tiny-a"):
        RayExecutor("tiny-zz").execute([sched_job("ok", 1)], lambda job, result: None)
    db_path = tmp_path / "never.db"
    with pytest.raises(HarnessError, match="chip=tiny-zz"):
        run_on_cluster(ClusterRunRequest(suite=SUITE, db_url=f"sqlite:///{db_path}", commit="HEAD", repo=".",
                                         chips=("tiny-a", "tiny-zz")), log=lambda line: None)
    assert time.monotonic() - start < 10
    assert not db_path.exists()  # nothing was scheduled or stored


def _kill_node_running(cluster, tmp: Path, variant: str, timeout: float = 60) -> str:
    """Wait for the job's first marker (written by the job process), then kill the node that runs it."""
    deadline = time.monotonic() + timeout
    while not markers(tmp, variant):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    node_id = markers(tmp, variant)[0].read_text()
    victim = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    cluster.remove_node(victim, allow_graceful=False)
    return node_id


def test_node_dying_mid_job_reruns_it_on_another_node_of_the_chip(ray_cluster, tmp_path):
    from harness.execute.ray_executor import RayExecutor

    cluster, tmp = ray_cluster
    survivors = nodes_of("tiny-d")
    assert len(survivors) == 2
    job = sched_job("sleepy", 1, T=40)
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    thread, box = run_in_thread(RayExecutor("tiny-d", max_attempts=2), [job], db_url)
    killed = _kill_node_running(cluster, tmp, "sleepy-N1")
    thread.join(timeout=90)
    assert not thread.is_alive() and "error" not in box, box
    assert box["outcome"].counts == {"passed": 1}
    records = stored_jobs(db_url)
    assert len(records) == 1  # stored once, after the re-run
    assert records[0].status == "passed" and records[0].attempts == 2
    assert records[0].node in survivors - {killed}
    assert len(markers(tmp, "sleepy-N1")) == 2


def test_node_dying_without_a_spare_records_its_jobs_lost(ray_cluster, tmp_path):
    from harness.execute.ray_executor import RayExecutor

    cluster, tmp = ray_cluster
    (only,) = nodes_of("tiny-e")
    running, queued = sched_job("sleepy", 2, T=40), sched_job("ok", 3)
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    thread, box = run_in_thread(RayExecutor("tiny-e", max_attempts=3), [running, queued], db_url)
    killed = _kill_node_running(cluster, tmp, "sleepy-N2")
    assert killed == only
    thread.join(timeout=90)
    assert not thread.is_alive() and "error" not in box, box
    assert box["outcome"].counts == {"lost": 2}
    records = {r.key: r for r in stored_jobs(db_url)}
    assert set(records) == {running.key, queued.key}  # never silently dropped, each stored once
    assert records[running.key].status == "lost" and records[running.key].node == killed
    assert "no other live node of chip tiny-e" in records[running.key].detail
    # the queued job was never run: lost too (whether it still waited here or already in Ray's queue)
    assert records[queued.key].status == "lost" and records[queued.key].attempts <= 1
    assert "tiny-e" in records[queued.key].detail and not markers(tmp, "ok-N3")


def test_a_job_lost_while_running_records_the_node_it_was_lost_on(ray_cluster, tmp_path):
    """Lost without an error that names its node (here: the run's deadline passed while it ran): the node the
    attempt started on is recorded all the same, and the executor leaves nothing in the cluster's key-value store."""
    from ray.experimental import internal_kv

    from harness.execute.ray_executor import KV_NAMESPACE, RayExecutor

    _cluster, tmp = ray_cluster
    (only,) = nodes_of("tiny-c")
    job = sched_job("sleepy", 7, T=25)
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    thread, box = run_in_thread(RayExecutor("tiny-c", deadline_s=15), [job], db_url)
    thread.join(timeout=90)
    assert not thread.is_alive() and "error" not in box, box
    [record] = stored_jobs(db_url)
    assert markers(tmp, "sleepy-N7")  # it did start on the node
    assert record.status == "lost" and "deadline" in record.detail
    assert record.node == only  # not ""
    assert not internal_kv._internal_kv_list(b"harness-attempt/", namespace=KV_NAMESPACE)


def test_store_is_idempotent_for_a_result_delivered_twice(tmp_path):
    """What makes a re-run safe: a second result for the same (run, key) is not stored again."""
    from harness.record.outbox import open_store
    from harness.record.store import record_result

    db = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        from harness.record.store import create_run

        run_id = create_run(db, ident=detect("tiny-x"), facts={"hostname": "t"}, commit={"sha": "s", "repo": "r"},
                            suite="t", dirty=False, executor="ray", planned_jobs=1)
        job = sched_job("ok", 1)
        assert record_result(db, run_id, job, JobResult(job.key, "passed", node="n1"))
        assert not record_result(db, run_id, job, JobResult(job.key, "lost", node="n2"))
    finally:
        db.close()


def test_harness_run_executor_ray_from_a_shell(ray_cluster, remote_repo, tmp_path):
    from typer.testing import CliRunner

    from harness.cli.main import app

    cluster, _tmp = ray_cluster
    repo, sha = remote_repo
    done = CliRunner().invoke(app, ["run", "--executor", "ray", "--address", cluster.address, "--repo", str(repo),
                                    "--commit", sha, "--suite", SUITE, "--chips", "tiny-b",
                                    "--db", f"sqlite:///{tmp_path / 'r.db'}", "--no-report"])
    assert done.exit_code == 0, done.output
    assert f"on tiny-b at {sha[:12]}: 2 passed, 0 failed" in " ".join(done.output.split())


def test_a_rounds_benchmark_jobs_run_as_one_batch_task_and_each_result_comes_back(ray_cluster, monkeypatch):
    """As locally (harness.execute.local.run_batch): the benchmark jobs of one trial round share a task and a job
    process on the node, and every job's result is reported on its own."""
    from harness.core.job import KernelJob
    from harness.execute import ray_executor
    from harness.execute.ray_executor import RayExecutor
    from harness.spec.plan import plan_trials

    submitted: list[str] = []
    real = ray_executor._run_batch_task

    class Counting:  # the driver's handle on the batch task, counting what it submits
        def options(self, **kwargs):
            submitted.append(kwargs["name"])
            return real.options(**kwargs)

    monkeypatch.setattr(ray_executor, "_run_batch_task", Counting())
    timing = {"trials": 2, "warmup_s": 0.0, "warmup_calls": 1, "min_sample_s": 0.001, "samples": 3}
    jobs = plan_trials([KernelJob.of("benchmark", "flash_prefill", "sdpa", {"B": 1, "H": 1, "S": s, "D": 32},
                                     "float32", name="b", timing=timing) for s in (16, 32)], seed=3)
    results: dict[str, JobResult] = {}
    chip = sorted(ray_executor.live_chips())[0]  # any chip still alive (other tests of this module kill nodes)
    RayExecutor(chip).execute(jobs, lambda job, result: results.setdefault(job.unit, result))
    assert set(results) == {job.unit for job in jobs} and len(results) == 4
    assert all(r.status == "passed" and len(r.samples) == 3 and r.node in nodes_of(chip) for r in results.values())
    assert submitted == [f"harness-batch:{jobs[0].unit}", f"harness-batch:{jobs[2].unit}"]  # one task per round
