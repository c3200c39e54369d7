"""A worker node killed while it holds several running and queued jobs: none lost, none stored twice.

Its own loopback cluster (ray.cluster_utils.Cluster, never `ray stop`): a driver-only head and two nodes of chip
tiny-k. The executor runs 3 correctness jobs at once per node (``parallel=3``) and keeps as many queued behind
them, so at the kill the victim runs three sleeping jobs and more wait in Ray's queue.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from testkit.ray import markers, restore_env, run_in_thread, sched_job, set_env, start_cluster, stored_jobs

pytestmark = pytest.mark.xdist_group("ray_faults")

PARALLEL = 3
SLEEP_S = 10  # the first attempt of every job sleeps this long: the kill lands while the first wave sleeps


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    import ray

    from harness.execute.ray_executor import node_labels, node_resources

    tmp = tmp_path_factory.mktemp("rayk")
    previous = set_env(tmp)
    cluster = start_cluster([])
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=PARALLEL, labels=node_labels("tiny-k"), resources=node_resources(),
                             node_ip_address="127.0.0.1")
        cluster.wait_for_nodes(timeout=120)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        yield cluster, tmp
    finally:
        ray.shutdown()
        cluster.shutdown()
        restore_env(previous)


def _first_attempts(tmp: Path) -> dict[str, str]:
    """Job stem -> the node its first attempt started on (marker ``<stem>.0`` holds the node id)."""
    return {m.name.split(".")[0]: m.read_text() for m in markers(tmp, "sleepy") if m.name.endswith(".0")}


def test_a_node_killed_holding_several_jobs_loses_none_and_doubles_none(two_node_cluster, tmp_path: Path):
    from harness.execute.ray_executor import RayExecutor

    cluster, tmp = two_node_cluster
    jobs = [sched_job("sleepy", n, T=SLEEP_S) for n in range(101, 113)]  # 12 jobs: 6 run at once, 6 queued
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    thread, box = run_in_thread(RayExecutor("tiny-k", parallel=PARALLEL, max_attempts=2), jobs, db_url)
    deadline = time.monotonic() + 90
    while True:  # wait until one node runs PARALLEL sleeping jobs, then kill it mid-sleep
        per_node = Counter(_first_attempts(tmp).values())
        busiest = per_node.most_common(1)
        if busiest and busiest[0][1] >= PARALLEL:
            break
        assert time.monotonic() < deadline, per_node
        time.sleep(0.1)
    victim_id = busiest[0][0]
    victim = next(n for n in cluster.worker_nodes if n.node_id == victim_id)
    running_on_victim = {stem for stem, node in _first_attempts(tmp).items() if node == victim_id}
    not_started = {f"sleepy-N{j.shape['N']}-T{SLEEP_S}" for j in jobs} - set(_first_attempts(tmp))
    cluster.remove_node(victim, allow_graceful=False)
    thread.join(timeout=240)
    assert not thread.is_alive() and "error" not in box, box
    records = stored_jobs(db_url)
    assert box["outcome"].counts == {"passed": len(jobs)}, [(r.key, r.status, r.detail, r.node, r.attempts)
                                                             for r in records if r.status != "passed"]
    assert sorted(r.key for r in records) == sorted(j.key for j in jobs)  # each stored exactly once
    assert len(running_on_victim) == PARALLEL and not_started, (running_on_victim, not_started)
    by_stem = {f"sleepy-N{r.shape['N']}-T{SLEEP_S}": r for r in records}
    for stem in running_on_victim:  # killed mid-sleep: re-run on the surviving node, stored from there, once
        assert by_stem[stem].node != victim_id and by_stem[stem].attempts == 2, (stem, by_stem[stem].node)
        assert len(list((tmp / "markers").glob(f"{stem}.*"))) == 2
    for stem in not_started:  # queued at the kill: run once on the survivor (or re-queued if Ray had placed it)
        assert by_stem[stem].node != victim_id and by_stem[stem].attempts in (1, 2), stem
    assert all(r.node != victim_id for r in records)
