"""`harness compare BASE HEAD --settle`: the undecided series re-measured, both commits interleaved, until decided.

A one-benchmark repository (testkit.e2e's abkern), one `harness run` a side, the cold start of a pull-request gate:
the stored runs alone leave its one series inconclusive (nothing tells a change from a shift of the whole run),
whatever the code. Under two random busy loops (testkit.load), --settle must call a ~2x slowdown regressed (exit
1) and an empty commit unchanged (exit 0). bench/settle_under_load.py runs the same 10 times for the figures.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.e2e import AB_BENCH, AB_PACKAGE, AB_SUITE, commit, git, new_repo
from testkit.load import random_load
from testkit.paths import ROOT


def harness(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(root / "cache"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)


def test_settle_finds_a_doubling_and_not_an_empty_commit_under_load(tmp_path: Path):
    repo = tmp_path / "abkern"
    c0 = new_repo(repo, {"abkern/__init__.py": AB_PACKAGE.format(repeats=1), "abkern/bench.py": AB_BENCH,
                         "harness.toml": AB_SUITE.format(), "README": "0\n"}, "c0")
    c1 = commit(repo, {"abkern/__init__.py": AB_PACKAGE.format(repeats=2)}, "c1 sorts twice")
    git(repo, "commit", "-q", "--allow-empty", "-m", "c2 empty")
    c2 = git(repo, "rev-parse", "HEAD")
    db_file = tmp_path / "gate.db"
    db = f"sqlite:///{db_file}"
    with random_load(2, seed=39):
        ends = [harness(tmp_path, "run", "--repo", str(repo), "--commit", sha, "--db", db, "--no-report")
                for sha in (c0, c1, c2)]
        assert all(done.returncode == 0 for done in ends), ends[-1].stderr[-2000:]
        # The end of a run offers the exact command that settles its inconclusive rows
        offered = " ".join(ends[1].stdout.split())  # the end of a run: results, on stdout
        assert f"to settle the inconclusive: harness compare {c0} {c1} --settle --repo {repo} --db {db}" in offered
        plain = harness(tmp_path, "compare", c0, c1, "--db", db, "--format", "json")
        (row,) = json.loads(plain.stdout)["rows"]
        assert plain.returncode == 0 and row["verdict"] == "inconclusive"  # held, or short of trials

        outcomes = []
        for base, head in ((c0, c1), (c1, c2), (c0, c1), (c1, c2)):
            done = harness(tmp_path, "compare", base, head, "--settle", "--repo", str(repo), "--db", db,
                           "--budget", "90s", "--format", "json")
            assert done.returncode in (0, 1), done.stderr[-2000:]
            (row,) = json.loads(done.stdout)["rows"]
            assert "settle round 1: 1 series undecided" in done.stderr
            outcomes.append((head == c1, done.returncode, row["verdict"], round(row["ratio"], 3)))
    slower = [o for o in outcomes if o[0]]
    same = [o for o in outcomes if not o[0]]
    assert all(code == 1 and verdict == "regressed" for _, code, verdict, _ in slower), outcomes
    # the bar: exit 0 and nothing flagged (unchanged 20 of 20 in bench/settle_under_load.py; inconclusive
    # would be a budget spent before the interval narrowed, not a wrong verdict)
    assert all(code == 0 and verdict not in ("regressed", "improved") for _, code, verdict, _ in same), outcomes

    with sqlite3.connect(db_file) as conn:
        settling = conn.execute("select count(*) from run where settling").fetchone()[0]
    assert settling >= 8  # a base and a head run per round, each settle at least one round
    # Settling runs are read by their comparison alone: the commits still resolve to their one stored run each
    again = harness(tmp_path, "compare", c0, c1, "--db", db, "--format", "json")
    report = json.loads(again.stdout)
    assert [len(ids) for ids in report["base"]["runs"].values()] == [1]
    assert [len(ids) for ids in report["head"]["runs"].values()] == [1]


@pytest.mark.parametrize(("args", "message"), [
    (("--settle", "--ab"), "--settle and --ab"),
    (("--settle", "--trials", "3"), "no --chip or --trials"),
    (("--settle", "--budget", "soon"), "--budget 'soon'"),
    (("--budget", "10"), "--budget and --address for --settle"),
    (("--address", "127.0.0.1:6379"), "--budget and --address for --settle"),
    (("--settle", "--address", "127.0.0.1:6379", "--chip-label", "x"), "no --chip-label"),
])
def test_settle_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args, message):
    (tmp_path / "x.db").touch()
    done = harness(tmp_path, "compare", "a", "b", "--db", f"sqlite:///{tmp_path / 'x.db'}", *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
