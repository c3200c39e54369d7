"""`harness bisect` checks what it is asked to follow before it runs anything, and a correctness probe runs only the
jobs it reads.

- A mistyped ``--kernel`` (or ``--gate``, or options no job of the kernel has) is refused from the good commit's
  planned suite, before any run: one line with the valid names, exit 2 (it used to run both endpoints, 145 s on
  VeloxQuant-MLX, before saying ``no correctness job matching nope``).
- A correctness probe plans only the selection it follows (no calibration, no benchmark, no other selection): on
  VeloxQuant-MLX a probe ran the whole suite, 80-90 s where the tests alone take 55 s.
- "1 commit", not "1 commits".

End to end through the real CLI on a generated repository with real pytest.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.e2e import commit, new_repo
from testkit.paths import ROOT

PACKAGE = '''def add(a, b):
    return a + b{bug}
'''

BENCH = '''def bench_work(N):
    return lambda: sum(range(N))
'''

UNIT = '''import tinysel


def test_add():
    assert tinysel.add(2, 3) == 5
'''

OTHER = '''def test_other():
    assert True
'''

SUITE = '''[suite]
name = "tinysel"

[timing]
warmup_s = 0.0
warmup_calls = 1
min_sample_s = 0.002
samples = 5

[[pytest]]
name = "unit"
paths = ["tests/unit"]
args = ["-p", "no:hypothesispytest", "-p", "no:cacheprovider"]

[[pytest]]
name = "other"
paths = ["tests/other"]
args = ["-p", "no:hypothesispytest", "-p", "no:cacheprovider"]

[[function]]
name = "work"
target = "tinysel.bench:bench_work"
grid.cpu = { N = [1000] }
grid.gpu = { N = [1000] }
'''


TIMED_CLI = """import sys, time
import harness.cli.main, harness.cli.bisect
clock, sys.argv = sys.argv[1], ["harness", *sys.argv[2:]]
start = time.perf_counter()
try:
    harness.cli.main.main()
finally:
    open(clock, "w").write(str(time.perf_counter() - start))
"""


class Repo:
    def __init__(self, root: Path):
        self.root = root
        self.repo = root / "tinysel"
        self.db = root / "results.db"
        files = {"tinysel/__init__.py": PACKAGE.format(bug=""), "tinysel/bench.py": BENCH,
                 "tests/unit/test_unit.py": UNIT, "tests/other/test_other.py": OTHER, "harness.toml": SUITE}
        self.shas = [new_repo(self.repo, files, "c0 initial"),
                     commit(self.repo, {"README": "1\n"}, "c1 docs"),
                     commit(self.repo, {"tinysel/__init__.py": PACKAGE.format(bug=" + 1")}, "c2 off by one")]

    def bisect(self, *args: str, good: int = 0, bad: int = 2) -> tuple[subprocess.CompletedProcess, float]:
        """The real CLI (`harness.cli.main.main`, as `python -m harness`); the seconds from the verb's start (the
        interpreter and the CLI's imports excluded: on this shared 2-core machine they vary from 1 to 13 s)."""
        clock = self.root / "verb-seconds"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"), "COLUMNS": "200"}
        done = subprocess.run([sys.executable, "-c", TIMED_CLI, str(clock), "bisect", "--repo", str(self.repo),
                               "--good", self.shas[good], "--bad", self.shas[bad], "--db", f"sqlite:///{self.db}",
                               *args], cwd=self.root, env=env, capture_output=True, text=True, timeout=600)
        return done, float(clock.read_text())

    def query(self, sql: str) -> list[tuple]:
        if not self.db.exists():
            return []
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql).fetchall()


@pytest.fixture(scope="module")
def tinysel(tmp_path_factory) -> Repo:
    return Repo(tmp_path_factory.mktemp("selection-first"))


def _error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # one line, no traceback, no progress
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (("--mode", "correctness", "--kernel", "nope"),
     "--kernel 'nope': no correctness job or pytest selection of that name in the suite at the good commit {good} "
     "(its correctness jobs and selections: other, unit)"),
    (("--mode", "perf", "--kernel", "nope"),
     "--kernel 'nope': no benchmark of that name in the suite at the good commit {good} (its benchmarks: "
     "tinysel.bench:bench_work, work)"),
    (("--mode", "perf", "--kernel", "work", "--gate", "unti"),
     "--gate 'unti': no correctness job or pytest selection of that name in the suite at the good commit {good} "
     "(its correctness jobs: other, unit)"),
    (("--mode", "perf", "--kernel", "work", "--shape", "N=7"),
     "no benchmark of 'work' at the good commit {good} matches --shape N=7 (its series: "
     "tinysel.bench:bench_work "),  # then "[default, N=1000])", once errors are printed as plain text (issue 36)
])
def test_a_selection_the_suite_does_not_have_is_refused_before_anything_runs(tinysel: Repo, args, expected):
    done, seconds = tinysel.bisect(*args)
    print(f"{' '.join(args)}: exit {done.returncode} {seconds:.2f} s after the verb started (nothing ran)")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert _error_line(done).startswith("error: " + expected.format(good=tinysel.shas[0][:12]))
    assert done.stdout == ""
    assert tinysel.query("select id from run") == []  # nothing ran: not one endpoint


def test_a_check_naming_no_test_is_refused_after_the_good_endpoint_only(tinysel: Repo, tmp_path: Path):
    """A pytest test is known only once its selection ran: the good endpoint runs, the bad one does not."""
    tinysel.db = tmp_path / "fresh.db"
    done, seconds = tinysel.bisect("--mode", "correctness", "--kernel", "unit", "--check", "::test_nope")
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: --check '::test_nope': no test of unit at the good endpoint "
                           f"{tinysel.shas[0][:12]} matches (its tests: tests/unit/test_unit.py::test_add)")
    assert [sha for (sha,) in tinysel.query("select c.sha from run r join `commit` c on c.id = r.commit_id")] \
        == [tinysel.shas[0]]
    print(f"--check ::test_nope: exit 2 after {seconds:.1f} s, one run (the good endpoint's selection)")


def test_a_correctness_probe_runs_only_the_selection_it_follows(tinysel: Repo, tmp_path: Path):
    tinysel.db = tmp_path / "results.db"
    done, seconds = tinysel.bisect("--mode", "correctness", "--kernel", "unit", "--format", "json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["status"] == "found" and report["culprit"]["sha"] == tinysel.shas[2]
    runs = tinysel.query("select id, planned_jobs, options from run")
    assert len(runs) == report["runs"] == 3  # both endpoints and c1
    for run_id, planned, options in runs:
        jobs = tinysel.query(f"select kind, key from job where run_id = '{run_id}' order by key")
        assert jobs == [("pytest", "pytest/unit"), ("test", "test/unit/tests/unit/test_unit.py::test_add")]
        assert planned == 1 and json.loads(options)["only_keys"] == ["pytest/unit"]
    print(f"correctness bisect of 3 commits, a probe = the selection only: {seconds:.1f} s")


def test_one_commit_is_one_commit(tinysel: Repo, capsys):
    done, _ = tinysel.bisect("--mode", "correctness", "--kernel", "unit", good=1, bad=2)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"good {tinysel.shas[1][:12]} 'c1 docs', bad {tinysel.shas[2][:12]} 'c2 off by one' (1 commit)" \
        in done.stdout
    assert "bisecting 1 commit after" in done.stderr
