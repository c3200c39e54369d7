"""`harness bisect --mode correctness` of a pytest selection: the tests that pass at the good commit are followed,
skips and tests already failing there are ignored (the latter listed), a followed test that is skipped or missing
later makes that commit a skip, `--check` narrows to one test. Unit tests on stored-row fixtures, then end to end
through the real CLI on a generated repository with real pytest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bisect.probes import Baseline, BisectRequest, answers, correctness_outcome, follow
from harness.core.errors import HarnessError
from harness.record.runs import StoredJob
from testkit.e2e import commit, new_repo
from testkit.paths import ROOT

# ---------------------------------------------------------------------------------------------------------------
# Stored-row fixtures
# ---------------------------------------------------------------------------------------------------------------


def row(kind: str, key: str, status: str = "passed", *, kernel: str = "unit", name: str = "", detail: str = "",
        variant: str = "default", check: str = "") -> StoredJob:
    return StoredJob(1, "r", kind, key, kernel, name or key, variant, "", "", check, status, detail)


def test_row(nodeid: str, status: str = "passed", detail: str = "", selection: str = "unit") -> StoredJob:
    return row("test", f"test/{selection}/{nodeid}", status, kernel=selection, name=nodeid, detail=detail)


test_row.__test__ = False  # a helper, not a test


def selection_row(status: str = "passed", detail: str = "", selection: str = "unit") -> StoredJob:
    return row("pytest", f"pytest/{selection}", status, kernel=selection, name=selection, detail=detail)


ADD, SCALE, METAL, KNOWN = ("tests/t.py::test_add", "tests/t.py::test_scale", "tests/t.py::test_metal",
                            "tests/t.py::test_known_bug")


def at_good() -> list[StoredJob]:
    """The good commit: two passing tests, one skipped everywhere, one already failing (so the selection failed)."""
    return [selection_row("failed", "2 passed, 1 failed, 1 skipped"), test_row(ADD), test_row(SCALE),
            test_row(METAL, "skipped", "Metal not available"), test_row(KNOWN, "failed", "assert 2 == 3")]


def request(**extra) -> BisectRequest:
    return BisectRequest("g", "b", kernel="unit", mode="correctness", **extra)


def test_the_tests_passing_at_good_are_followed_skips_and_failures_there_ignored():
    baseline = follow(at_good(), request())
    assert [job.name for job in baseline.followed] == [ADD, SCALE]
    assert [(job.name, job.status) for job in baseline.pre_existing] == [(KNOWN, "failed")]
    assert [job.name for job in baseline.ignored] == [METAL]
    # The good commit itself is good: the selection row failed (KNOWN), but per-test rows decide.
    assert correctness_outcome(at_good(), request(), baseline).state == "good"
    # Without a baseline every matching row decides: the pre-existing failure makes the good commit bad.
    assert correctness_outcome(at_good(), request()).state == "bad"


def test_a_followed_test_that_fails_makes_the_commit_bad():
    baseline = follow(at_good(), request())
    later = [selection_row("failed"), test_row(ADD, "failed", "assert 6 == 5"), test_row(SCALE),
             test_row(METAL, "skipped"), test_row(KNOWN, "failed")]
    verdict = correctness_outcome(later, request(), baseline)
    assert verdict.state == "bad" and verdict.reason == f"test/unit/{ADD} failed: assert 6 == 5"
    errored = [test_row(ADD), test_row(SCALE, "error", "fixture exploded"), test_row(KNOWN, "failed")]
    assert correctness_outcome(errored, request(), baseline).reason == f"test/unit/{SCALE} error: fixture exploded"


def test_a_followed_test_skipped_or_missing_later_makes_the_commit_a_skip():
    baseline = follow(at_good(), request())
    skipped = [selection_row(), test_row(ADD), test_row(SCALE, "skipped", "GPU busy"), test_row(KNOWN, "failed")]
    verdict = correctness_outcome(skipped, request(), baseline)
    assert verdict.state == "skip" and verdict.reason == f"test/unit/{SCALE} skipped: GPU busy"
    missing = [selection_row(), test_row(ADD)]
    verdict = correctness_outcome(missing, request(), baseline)
    assert verdict.state == "skip" and verdict.reason == f"test/unit/{SCALE} not in this run"
    crashed = [selection_row("crashed", "killed by SIGKILL"), test_row(ADD)]
    verdict = correctness_outcome(crashed, request(), baseline)
    assert verdict.state == "skip" and verdict.reason == (f"test/unit/{SCALE} not in this run (pytest/unit crashed: "
                                                          "killed by SIGKILL)")
    # A failure still wins over a skip.
    both = [test_row(ADD, "failed", "boom"), test_row(SCALE, "skipped")]
    assert correctness_outcome(both, request(), baseline).state == "bad"


def test_new_tests_and_pre_existing_failures_do_not_decide():
    baseline = follow(at_good(), request())
    later = [selection_row("failed"), test_row(ADD), test_row(SCALE), test_row(KNOWN, "error", "other"),
             test_row("tests/t.py::test_new", "failed", "new and broken")]
    verdict = correctness_outcome(later, request(), baseline)
    assert verdict.state == "good" and verdict.reason == "2 followed test(s) passed"


def test_a_collection_error_or_a_selection_that_stopped_breaks_the_followed_tests():
    baseline = follow(at_good(), request())
    collection = [selection_row("failed"), test_row("tests/t.py", "error", "SyntaxError: invalid syntax")]
    verdict = correctness_outcome(collection, request(), baseline)
    assert verdict.state == "bad" and verdict.reason == "test/unit/tests/t.py error: SyntaxError: invalid syntax"
    directory = [selection_row("failed"), test_row("tests", "error", "ImportError in conftest")]
    assert correctness_outcome(directory, request(), baseline).state == "bad"
    stopped = [selection_row("failed", "pytest exited with status 4: usage error")]
    verdict = correctness_outcome(stopped, request(), baseline)
    assert verdict.state == "bad" and verdict.reason == "pytest/unit failed: pytest exited with status 4: usage error"


def test_check_narrows_to_one_test_with_one_line_errors():
    baseline = follow(at_good(), request(check="::test_scale"))
    assert [job.name for job in baseline.followed] == [SCALE] and baseline.pre_existing == ()
    add_broken = [selection_row("failed"), test_row(ADD, "failed"), test_row(SCALE), test_row(KNOWN, "failed")]
    assert correctness_outcome(add_broken, request(check="::test_scale"), baseline).state == "good"
    assert follow(at_good(), request(check=ADD)).followed[0].name == ADD
    with pytest.raises(HarnessError) as gone:
        follow(at_good(), request(check="::test_gone"), where="the good endpoint abc")
    message = str(gone.value)
    assert "\n" not in message and message.startswith("--check '::test_gone': no test of unit at the good "
                                                      "endpoint abc matches")
    assert ADD in message and KNOWN in message
    with pytest.raises(HarnessError, match=r"^the good endpoint abc cannot be tested: test/unit/tests/t.py::"
                                           r"test_metal skipped: Metal not available$"):
        follow(at_good(), request(check="test_metal"), where="the good endpoint abc")
    with pytest.raises(HarnessError, match=r"^the good endpoint abc already fails: test/unit/tests/t.py::"
                                           r"test_known_bug failed: assert 2 == 3$"):
        follow(at_good(), request(check="::test_known_bug"), where="the good endpoint abc")
    twice = [*at_good(), test_row("tests/u.py::test_add")]
    with pytest.raises(HarnessError, match=r"^--check 'test_add' matches 2 tests of unit at the good commit: "):
        follow(twice, request(check="test_add"))
    # A stored run holding the selection answers a --check request (no rerun to find out the test is absent).
    assert answers(request(check="::test_gone"))(at_good())


def test_no_passing_test_at_good_is_a_clear_error():
    rows = [selection_row("passed"), test_row(METAL, "skipped", "Metal not available")]
    with pytest.raises(HarnessError, match=r"^the good commit has no passing test of unit to follow \(1 skipped\)$"):
        follow(rows, request())


def test_kernel_correctness_jobs_keep_their_rules():
    key = "correctness/k/v/float32/N=1/reference"
    passed = row("correctness", key, kernel="k", variant="v", check="reference")
    wrong = row("correctness", key, "failed", kernel="k", variant="v", check="reference", detail="max error 3")
    crashed = row("correctness", key, "crashed", kernel="k", variant="v", check="reference", detail="SIGSEGV")
    kernel = BisectRequest("g", "b", kernel="k", mode="correctness", variant="v")
    baseline = follow([passed], kernel)
    assert baseline == Baseline()
    assert correctness_outcome([passed], kernel, baseline).state == "good"
    assert correctness_outcome([wrong], kernel, baseline).reason == f"{key} failed: max error 3"
    assert correctness_outcome([crashed], kernel, baseline).state == "skip"
    assert correctness_outcome([], kernel, baseline).state == "skip"


# ---------------------------------------------------------------------------------------------------------------
# End to end: a generated repository, real pytest, the real CLI
# ---------------------------------------------------------------------------------------------------------------

PACKAGE = '''def add(a, b):
    return a + b{bug}


def scale(x, s):
    return x * s
'''

TESTS = '''import pytest

import tinyops


def test_add():
    assert tinyops.add(2, 3) == 5


def test_scale():
{scale}    assert tinyops.scale(2, 3) == 6


def test_metal():
    pytest.skip("Metal not available")


def test_known_bug():
    assert tinyops.add(1, 1) == 3
'''

SUITE = '''[suite]
name = "tinyops"

[[pytest]]
name = "unit"
paths = ["tests"]
args = ["-p", "no:hypothesispytest"]
'''


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(repo: Path) -> list[str]:
    """Six commits. At every one test_metal is skipped ("Metal not available") and test_known_bug fails; c2 skips
    test_scale for a while (c3 restores it); c4 breaks add(), so test_add fails from there on."""
    steps = [
        ("c0 initial", {"tinyops/__init__.py": PACKAGE.format(bug=""), "tests/test_ops.py": TESTS.format(scale=""),
                        "harness.toml": SUITE, "README": "0\n"}),
        ("c1 docs", {"README": "1\n"}),
        ("c2 skip test_scale for now", {"tests/test_ops.py": TESTS.format(scale='    pytest.skip("GPU busy")\n')}),
        ("c3 restore test_scale", {"tests/test_ops.py": TESTS.format(scale="")}),
        ("c4 off by one", {"tinyops/__init__.py": PACKAGE.format(bug=" + 1")}),
        ("c5 docs", {"README": "5\n"}),
    ]
    (first_message, first_files), *rest = steps
    return [new_repo(repo, first_files, first_message)] + [commit(repo, files, message) for message, files in rest]


class Repo:
    def __init__(self, root: Path):
        self.root = root
        self.repo = root / "tinyops"
        self.db = root / "results.db"
        self.shas = make_repo(self.repo)

    def bisect(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"), "COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "harness", "bisect", "--repo", str(self.repo), "--good",
                               self.shas[0], "--bad", self.shas[5], "--db", f"sqlite:///{self.db}", "--mode",
                               "correctness", "--kernel", "unit", *args],
                              cwd=self.root, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tinyops(tmp_path_factory) -> Repo:
    return Repo(tmp_path_factory.mktemp("selection-bisect"))


@pytest.fixture(scope="module")
def first(tinyops: Repo) -> subprocess.CompletedProcess:
    return tinyops.bisect("--format", "json")


def test_bisect_of_a_selection_ignores_skips_and_pre_existing_failures(tinyops: Repo, first):
    assert first.returncode == 0, (first.stdout, first.stderr)
    report = json.loads(first.stdout)
    shas = tinyops.shas
    assert report["status"] == "found" and report["culprit"]["sha"] == shas[4]
    assert report["culprit"]["subject"] == "c4 off by one" and report["last_good"]["sha"] == shas[3]
    assert report["detail"].startswith("test/unit/tests/test_ops.py::test_add failed: ")
    assert report["followed_tests"] == 2  # test_add and test_scale pass at good
    (known,) = report["pre_existing_failures"]
    assert known["name"] == "tests/test_ops.py::test_known_bug" and known["status"] == "failed"
    assert [t["name"] for t in report["ignored_at_good"]] == ["tests/test_ops.py::test_metal"]
    # c2 skips a followed test: no answer, not bad.
    (skipped,) = report["skipped"]
    assert skipped["sha"] == shas[2]
    assert skipped["reason"] == "test/unit/tests/test_ops.py::test_scale skipped: GPU busy"


def test_a_repeated_selection_bisect_in_text_runs_nothing(tinyops: Repo, first):
    done = tinyops.bisect()
    assert done.returncode == 0, (done.stdout, done.stderr)
    out, shas = done.stdout, tinyops.shas
    assert "following 2 test(s) of unit that pass at the good commit" in out
    assert "pre-existing failure (ignored): tests/test_ops.py::test_known_bug failed: " in out
    assert f"culprit: {shas[4][:12]} 'c4 off by one'" in out
    assert f"skipped: {shas[2][:12]} 'c2 skip test_scale for now': test/unit/tests/test_ops.py::test_scale " \
           "skipped: GPU busy" in out
    assert re.search(r" (\d+) run\(s\) of which \1 reused", out) and "running " not in done.stderr
    assert "OK: " in out


def test_check_names_one_test_of_the_selection(tinyops: Repo, first):
    done = tinyops.bisect("--check", "::test_add", "--format", "json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["culprit"]["sha"] == tinyops.shas[4] and report["followed_tests"] == 1
    assert report["pre_existing_failures"] == [] and report["runs"] == report["reused_runs"]
    done = tinyops.bisect("--check", "::test_gone")
    assert done.returncode == 2 and "running " not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "--check '::test_gone': no test of unit at the good endpoint" in line
    assert "tests/test_ops.py::test_add" in line
    done = tinyops.bisect("--check", "tests/test_ops.py::test_metal")
    assert done.returncode == 2
    assert "cannot be tested: test/unit/tests/test_ops.py::test_metal skipped: Metal not available" in done.stderr
