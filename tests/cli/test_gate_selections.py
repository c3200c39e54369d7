"""The VeloxQuant case through the real CLI: a repository whose suite has overlapping pytest selections, the
failures in the first of them (alphabetically), one of them in two selections, a failure message that looks like
Rich markup. `harness run` must exit 1, run every job, print the message verbatim, put its results on stdout, and
`run`, `compare` (text and json) and the report's index must agree on how many tests failed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.e2e import commit, new_repo
from testkit.paths import ROOT

PACKAGE = """def add(a, b):
    return a + b{bug}
"""

# The message is what pytest prints as the first line of the failure: brackets a Rich console reads as markup
# (a closing tag that closes nothing raises MarkupError; an unknown tag vanishes).
MESSAGE = "kernel [metal_kernel] wrote outside [/x/y] [bold]"

TESTS = """from calc import add


def test_ok():
    assert 1 + 1 == 2


def test_shared():
    assert add(2, 3) == 5


def test_markup():
    assert add(1, 1) == 2, {message!r}
"""

# a_all collects everything, b_shared one failing test again, c_ok (alphabetically last) only a passing one
SUITE = """[suite]
name = "velox-like"

[[pytest]]
name = "a_all"
paths = ["tests"]

[[pytest]]
name = "b_shared"
paths = ["tests"]
k = "shared"

[[pytest]]
name = "c_ok"
paths = ["tests"]
k = "ok"
"""


class Velox:
    def __init__(self, root: Path) -> None:
        self.root, self.repo, self.db = root, root / "velox", f"sqlite:///{root / 'results.db'}"
        files = {"calc/__init__.py": PACKAGE.format(bug=""), "tests/test_calc.py": TESTS.format(message=MESSAGE),
                 "harness.toml": SUITE}
        self.base = new_repo(self.repo, files, "calc")
        self.head = commit(self.repo, {"calc/__init__.py": PACKAGE.format(bug=" + 1")}, "add is off by one [/x]")

    def harness(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"), "COLUMNS": "1000"}
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=self.root, env=env, capture_output=True,
                              text=True, timeout=300)

    def run(self, sha: str, *more: str) -> subprocess.CompletedProcess:
        return self.harness("run", "--repo", str(self.repo), "--commit", sha, "--db", self.db, "--no-report", *more)


@pytest.fixture(scope="module")
def velox(tmp_path_factory) -> Velox:
    repo = Velox(tmp_path_factory.mktemp("velox"))
    repo.base_run = repo.run(repo.base)
    repo.head_run = repo.run(repo.head)
    return repo


def test_a_failure_in_the_first_of_several_selections_fails_the_run(velox: Velox):
    assert velox.base_run.returncode == 0, velox.base_run.stdout + velox.base_run.stderr
    done = velox.head_run
    assert done.returncode == 1, done.stdout + done.stderr  # exit 0 when only the last selection (c_ok) was judged
    assert "jobs: 1 passed, 2 failed" in done.stdout  # every selection ran: the markup did not stop the run
    assert "  a_all: 1 passed, 2 failed" in done.stdout and "  c_ok: 1 passed" in done.stdout


def test_failure_text_is_printed_verbatim_not_as_markup(velox: Velox):
    done = velox.head_run
    assert "MarkupError" not in done.stderr
    line = f"failed tests/test_calc.py::test_markup: AssertionError: {MESSAGE}"
    assert line in done.stderr  # as it happened, on stderr
    assert line in done.stdout  # and with the results


def test_results_go_to_stdout_and_quiet_leaves_only_them(velox: Velox):
    """`harness run > log` keeps the results; progress and failures as they happen are stderr's; --quiet drops
    those and keeps the results (the failures among them)."""
    loud = velox.head_run
    assert "running 3 jobs" in loud.stderr and "progress: 3/3 jobs" in loud.stderr  # a log, not a terminal
    assert "running 3 jobs" not in loud.stdout and "progress:" not in loud.stdout
    quiet = velox.run(velox.head, "--quiet")
    assert quiet.returncode == 1
    assert quiet.stderr == "", quiet.stderr
    for text in ("jobs: 1 passed, 2 failed", "tests: 3 distinct: 1 passed, 2 failed", "  a_all: 1 passed, 2 failed",
                 f"failed tests/test_calc.py::test_markup: AssertionError: {MESSAGE}", "database: "):
        assert text in quiet.stdout, quiet.stdout


def test_a_test_in_two_selections_is_one_failed_test_in_run_compare_and_the_report(velox: Velox, tmp_path: Path):
    assert "tests: 3 distinct: 1 passed, 2 failed" in velox.head_run.stdout

    as_json = velox.harness("compare", velox.base, velox.head, "--db", velox.db, "--format", "json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert sorted(f["name"] for f in report["correctness_failures"]) == [
        "tests/test_calc.py::test_markup", "tests/test_calc.py::test_shared"]
    assert (report["newly_failing"], report["already_failing"]) == (2, 0)

    text = velox.harness("compare", velox.base, velox.head, "--db", velox.db)
    assert text.returncode == 1, text.stderr
    assert "Newly failing on head (2)" in text.stdout
    assert "2 correctness failure(s) on head (2 new, 0 already failing at base" in text.stdout
    assert MESSAGE in text.stdout and "add is off by one [/x]" in text.stdout

    site = tmp_path / "site"
    done = velox.harness("report", "--db", velox.db, "--out", str(site))
    assert done.returncode == 0, done.stderr
    index = (site / "index.html").read_text()
    assert re.search(r"\bfail 2\b", index) and re.search(r"\bpass 1\b", index), index
