"""`harness compare --settle --address`: the settling rounds of a chip run as a Ray task on a node labelled with it.

A real loopback Ray cluster (testkit.ray) with one node of chip settle-a; a one-benchmark repository (testkit.e2e's
abkern) whose head sorts twice, one `harness run --chip-label settle-a` a side: the stored runs leave its one
series inconclusive; settling on the cluster measures both commits on the settle-a node (the settling runs record
that node) and decides. Runs stored for a chip no node has make the same command a one-line error, exit 2.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.e2e import AB_BENCH, AB_PACKAGE, AB_SUITE, commit, new_repo
from testkit.paths import ROOT
from testkit.ray import restore_env, set_env, start_cluster

# A whole cluster of real processes: alone, after the parallel suite (tools/test.sh).
pytestmark = pytest.mark.exclusive


def harness(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)


def test_settle_on_the_cluster_measures_on_a_node_of_the_chip(tmp_path: Path):
    repo = tmp_path / "abkern"
    c0 = new_repo(repo, {"abkern/__init__.py": AB_PACKAGE.format(repeats=1), "abkern/bench.py": AB_BENCH,
                         "harness.toml": AB_SUITE.format(), "README": "0\n"}, "c0")
    c1 = commit(repo, {"abkern/__init__.py": AB_PACKAGE.format(repeats=2)}, "c1 sorts twice")
    db_file = tmp_path / "gate.db"
    db = f"sqlite:///{db_file}"
    previous = set_env(tmp_path)
    cluster = start_cluster(["settle-a"])
    try:
        (node,) = cluster.worker_nodes
        for sha in (c0, c1):
            done = harness(tmp_path, "run", "--repo", str(repo), "--commit", sha, "--db", db, "--no-report",
                           "--chip-label", "settle-a")
            assert done.returncode == 0, done.stderr[-2000:]
        plain = harness(tmp_path, "compare", c0, c1, "--db", db, "--format", "json")
        assert [row["verdict"] for row in json.loads(plain.stdout)["rows"]] == ["inconclusive"]

        done = harness(tmp_path, "compare", c0, c1, "--settle", "--address", cluster.address, "--repo", str(repo),
                       "--db", db, "--budget", "120s", "--format", "json")
        (row,) = json.loads(done.stdout)["rows"]
        assert (done.returncode, row["verdict"]) == (1, "regressed"), done.stderr[-2000:]
        assert "settle: chip settle-a" in done.stderr and "settle round 1: 1 series undecided" in done.stderr
        with sqlite3.connect(db_file) as conn:
            settling = conn.execute("select chip.key, run.options from run join chip on chip.id = run.chip_id "
                                    "where run.settling").fetchall()
        assert len(settling) >= 2 and len(settling) % 2 == 0
        assert {(chip, json.loads(options)["node"]) for chip, options in settling} == {("settle-a", node.node_id)}

        for sha in (c0, c1):  # runs of a chip that no node of the cluster has
            assert harness(tmp_path, "run", "--repo", str(repo), "--commit", sha, "--db", db, "--no-report",
                           "--chip-label", "settle-z").returncode == 0
        done = harness(tmp_path, "compare", c0, c1, "--settle", "--address", cluster.address, "--repo", str(repo),
                       "--db", db, "--budget", "60s")
        assert done.returncode == 2 and "no live node labelled chip=settle-z" in done.stderr, done.stderr[-2000:]
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        with sqlite3.connect(db_file) as conn:  # nothing measured: the error comes before any round
            assert conn.execute("select count(*) from run where settling").fetchone()[0] == len(settling)
    finally:
        cluster.shutdown()
        restore_env(previous)
