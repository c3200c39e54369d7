"""The CI gate sees a repository's tests: `harness compare` fails (exit 1) on a failing or erroring test of a
pytest selection and names it, newly failing apart from already failing at base. Real git, real pytest, the
real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.e2e import commit, new_repo
from testkit.paths import ROOT

PACKAGE = """def add(a, b):
    return a + b{bug}


def half(x):
    return x / 3  # a known bug: fails at every commit
"""

TESTS = """import pytest

from calc import add, half


def test_add():
    assert add(2, 3) == 5


def test_half():
    assert half(4) == 2


def test_metal():
    pytest.skip("Metal not available")


@pytest.fixture
def broken_fixture():
    raise RuntimeError("fixture setup failed")


def test_uses_a_broken_fixture(broken_fixture):
    pass
"""

SUITE = """[suite]
name = "calc"

[[pytest]]
name = "unit"
paths = ["tests"]

[[pytest]]
name = "adding"
paths = ["tests"]
k = "add"
"""


class Calc:
    def __init__(self, root: Path) -> None:
        self.root, self.repo, self.db = root, root / "calc", f"sqlite:///{root / 'results.db'}"
        files = {"calc/__init__.py": PACKAGE.format(bug=""), "tests/test_calc.py": TESTS, "harness.toml": SUITE}
        self.base = new_repo(self.repo, files, "calc")
        self.docs = commit(self.repo, {"README": "calc\n"}, "docs only")
        self.head = commit(self.repo, {"calc/__init__.py": PACKAGE.format(bug=" + 1")}, "add is off by one")

    def harness(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"), "COLUMNS": "1000"}
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=self.root, env=env, capture_output=True,
                              text=True, timeout=300)

    def run(self, sha: str) -> str:
        done = self.harness("run", "--repo", str(self.repo), "--commit", sha, "--db", self.db, "--no-report")
        assert done.returncode == 1, done.stdout + done.stderr  # the known bug and the fixture error fail the run
        return done.stdout + done.stderr

    def compare(self, base: str, head: str, *more: str) -> subprocess.CompletedProcess:
        return self.harness("compare", base, head, "--db", self.db, *more)


@pytest.fixture(scope="module")
def calc(tmp_path_factory) -> Calc:
    repo = Calc(tmp_path_factory.mktemp("gate"))
    repo.outputs = [repo.run(sha) for sha in (repo.base, repo.docs, repo.head)]
    return repo


def _failing(report: dict) -> dict[tuple[str, str], tuple[str, bool]]:
    return {(f["kernel"], f["name"]): (f["status"], f["new"]) for f in report["correctness_failures"]}


def test_the_tests_line_counts_each_test_once_and_each_selection(calc: Calc):
    """Two selections share test_add: 4 distinct tests, not 5, then one line per selection."""
    out = calc.outputs[2]
    assert "tests: 4 distinct: 2 failed, 1 error, 1 skipped" in out
    assert "  adding: 1 failed" in out and "  unit: 2 failed, 1 error, 1 skipped" in out


def test_a_commit_that_breaks_a_test_fails_the_gate_and_names_it_as_new(calc: Calc):
    done = calc.compare(calc.base, calc.head, "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] == 1, done.stderr
    assert _failing(report) == {
        ("adding, unit", "tests/test_calc.py::test_add"): ("failed", True),  # one test, in both selections
        ("unit", "tests/test_calc.py::test_half"): ("failed", False),
        ("unit", "tests/test_calc.py::test_uses_a_broken_fixture"): ("error", False),
    }  # the skipped test is not a failure; a selection's own row is not counted on top of its tests
    assert (report["newly_failing"], report["already_failing"]) == (1, 2)
    assert all(f["kind"] == "test" for f in report["correctness_failures"])

    text = calc.compare(calc.base, calc.head)
    assert text.returncode == 1
    assert "Newly failing on head (1)" in text.stdout and "Already failing at base (2)" in text.stdout
    assert "adding, unit: tests/test_calc.py::test_add" in text.stdout and "assert 6 == 5" in text.stdout
    assert text.stdout.rstrip().splitlines()[-1].startswith("FAIL:")
    assert "3 correctness failure(s) on head (1 new, 2 already failing at base" in text.stdout


def test_failures_already_there_at_base_still_fail_the_gate_but_are_not_new(calc: Calc):
    done = calc.compare(calc.base, calc.docs, "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert (report["newly_failing"], report["already_failing"]) == (0, 2)
    assert ("unit", "tests/test_calc.py::test_add") not in _failing(report)


def test_the_report_shows_the_tests_per_selection_with_the_new_failure_first(calc: Calc, tmp_path: Path):
    done = calc.harness("report", "--db", calc.db, "--out", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    chip_page = next((tmp_path / "site").glob("chip-*.html")).read_text()
    index = (tmp_path / "site" / "index.html").read_text()
    assert "No correctness jobs" not in chip_page and "Repository tests" in chip_page
    selections = chip_page.split('id="selections"')[1].split("</table>")[0].split("<tr")[2:]
    assert "adding" in selections[0] and "failed 1" in selections[0]
    assert "unit" in selections[1] and "error 1" in selections[1] and "failed 2" in selections[1]
    assert "skipped 1" in selections[1]
    failing = chip_page.split('id="failing-tests"')[1].split("</table>")[0]
    rows = failing.split("<tr")[2:]  # after the header row
    assert len(rows) == 4 and all("test_add" in row and "new" in row and "assert 6 == 5" in row for row in rows[:2])
    assert all("already failing" in row for row in rows[2:])
    # the index counts the tests as correctness, each once as `harness run` does: 3 failing (test_add, in both
    # selections, once; test_half; the fixture error) and 1 skipped, none passed
    assert "pass 0" in index and "fail 3" in index and "skip 1" in index


def test_the_regressions_page_lists_a_newly_failing_test_at_the_commit_that_broke_it(calc: Calc, tmp_path: Path):
    done = calc.harness("report", "--db", calc.db, "--out", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "site" / "regressions.html").read_text()
    groups = [group.split("</section>")[0] for group in page.split('<section class="reg-group')[1:]]
    entries = [group for group in groups if "test_add" in group]  # a block per commit, its failures inside
    assert entries, "test_add's failure is not on the regressions page"
    assert all(calc.head[:12] in entry.split("</h3>")[0] for entry in entries)  # at the commit that broke it
