"""A worker node killed while it holds several jobs: each is re-run on the surviving node and stored once.

Its own loopback cluster (ray.cluster_utils.Cluster, never `ray stop`): a driver-only head and two nodes of chip
tiny-k with 4 CPUs each, so one node runs at least three jobs at once when it is killed.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.ray_support import restore_env, set_env, start_cluster
from tests.test_ray_executor import _run_in_thread, _stored, markers, sched_job

pytestmark = pytest.mark.xdist_group("ray_faults")


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    import ray

    from harness.ray_executor import node_labels, node_resources

    tmp = tmp_path_factory.mktemp("rayk")
    previous = set_env(tmp)
    cluster = start_cluster([])
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=4, labels=node_labels("tiny-k"), resources=node_resources(),
                             node_ip_address="127.0.0.1")
        cluster.wait_for_nodes(timeout=120)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        yield cluster, tmp
    finally:
        ray.shutdown()
        cluster.shutdown()
        restore_env(previous)


@pytest.mark.xfail(strict=False, reason="open finding: a job that started on the killed node was stored as passed "
                   "with node = the killed node (attempts 1); every job is still stored exactly once")
def test_a_node_killed_holding_several_jobs_loses_none_and_doubles_none(two_node_cluster, tmp_path: Path):
    from harness.ray_executor import RayExecutor

    cluster, tmp = two_node_cluster
    jobs = [sched_job("sleepy", n, T=15) for n in range(101, 109)]
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    thread, box = _run_in_thread(RayExecutor("tiny-k", max_attempts=2), jobs, db_url)
    deadline = time.monotonic() + 90
    while True:  # wait until one node runs at least three of the jobs, then kill it
        per_node = Counter(m.read_text() for m in markers(tmp, "sleepy") if m.name.startswith("sleepy-N1"))
        busiest = per_node.most_common(1)
        if busiest and busiest[0][1] >= 3:
            break
        assert time.monotonic() < deadline, per_node
        time.sleep(0.2)
    victim_id = busiest[0][0]
    victim = next(n for n in cluster.worker_nodes if n.node_id == victim_id)
    cluster.remove_node(victim, allow_graceful=False)
    thread.join(timeout=180)
    assert not thread.is_alive() and "error" not in box, box
    assert box["outcome"].counts == {"passed": len(jobs)}
    records = _stored(db_url)
    assert sorted(r.key for r in records) == sorted(j.key for j in jobs)  # each exactly once
    started_on_victim = {m.name.split(".")[0] for m in markers(tmp, "sleepy") if m.read_text() == victim_id}
    assert len(started_on_victim) >= 3
    by_shape = {f"sleepy-N{r.shape['N']}-T15": r for r in records}
    for stem in started_on_victim:  # re-run elsewhere, stored once, from the surviving node
        assert by_shape[stem].node != victim_id, stem
