"""Another repository's suite, per commit, through the real CLI: its pytest selections stored test by test (and
checked against pytest's own junit XML on the same commit), its benchmark functions timed with roofline
counts, its install step run once per install key, and the errors a user can make, one line each."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.e2e import commit, git
from testkit.paths import ROOT

PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tinykern"
version = "0.1"
"""

PACKAGE = """import numpy as np


def add(a, b):
    return np.asarray(a) + np.asarray(b){bug}


def scale(x, s):
    return np.asarray(x) * s
"""

BENCH = """import numpy as np

try:
    from harness.bench import benchmark, skip
except ImportError:  # the package also imports without the harness
    def benchmark(**_):
        return lambda f: f

    def skip(reason):
        raise RuntimeError(reason)


@benchmark(flops=lambda N, **_: 2 * N**3, bytes=lambda N, **_: 3 * 4 * N * N)
def bench_matmul(N):
    import mlx.core as mx

    a = mx.random.normal((N, N))
    mx.eval(a)
    return lambda: a @ a


def bench_add(N):
    x = np.ones(N)
    return lambda: x + x


def bench_metal():
    skip("Metal not available")
"""

CONFTEST = """import pytest


@pytest.fixture
def broken():
    raise RuntimeError("fixture exploded")
"""

TESTS = """import pytest

import tinykern


def test_add():
    assert tinykern.add(1, 2) == 3


@pytest.mark.parametrize("s", [1, 2])
def test_scale(s):
    assert tinykern.scale(2, s) == 2 * s


def test_wrong():
    assert tinykern.add(1, 1) == 3


@pytest.mark.skip(reason="Metal not available")
def test_metal():
    pass


def test_skip_inside():
    pytest.skip("needs CUDA")


@pytest.mark.xfail(reason="known bug")
def test_known_bug():
    assert tinykern.add(1, 1) == 5


@pytest.mark.xfail(reason="sometimes")
def test_xpass():
    assert tinykern.add(1, 1) >= 2  # passes with and without the planted bug: an xpass on every commit


def test_fixture_error(broken):
    pass


@pytest.mark.slow
def test_slow():
    pass
"""

INSTALL_SCRIPT = """import os
import sys

with open(os.environ["TINYKERN_INSTALLS"], "a") as log:
    log.write(sys.prefix + "\\n")
"""

SUITE = """[suite]
name = "tinykern"

[install]
command = "{install}"

[timing]
warmup_s = 0.0
warmup_calls = 1
min_sample_s = 0.002
samples = 3

[calibration.cpu]
matmul_n = [64]
copy_n = [65536]
dtype = "float32"

[[pytest]]
name = "unit"
paths = ["tests"]
m = "not slow"
{extra}
[[pytest]]
name = "unit-xdist"
paths = ["tests/test_ops.py"]
k = "scale or wrong or metal or known_bug or fixture"
workers = 2

[[function]]
target = "tinykern.bench:bench_matmul"
grid.cpu = {{ N = [32, 64] }}
grid.gpu = {{ N = [1024] }}

[[function]]
target = "tinykern.bench:bench_add"
grid.cpu = {{ N = [1000] }}

[[function]]
target = "tinykern.bench:bench_metal"
"""

# Later commits carry a leaner suite (the suite is the commit's own): one selection and one function.
LEAN = """[suite]
name = "tinykern"

[install]
command = "{install}"

[timing]
warmup_s = 0.0
warmup_calls = 1
min_sample_s = 0.002
samples = 3

[[pytest]]
name = "unit"
paths = ["tests"]
m = "not slow"
{extra}
[[function]]
target = "tinykern.bench:bench_add"
grid.cpu = {{ N = [1000] }}
"""

TRIVIAL_INSTALL = "python tools/install.py"
PIP_INSTALL = "pip install -e . --no-deps"  # the documented default (docs/external-repos.md)


class Kern:
    """The generated kernel repository, its commits, and the CLI wired to a private cache and database."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = root / "tinykern"
        self.db = root / "results.db"
        self.installs = root / "installs.txt"
        self.cache = root / "cache"
        self.repo.mkdir()
        git(self.repo, "init", "-q")
        git(self.repo, "config", "user.email", "k@example.com")
        git(self.repo, "config", "user.name", "K")
        base = {"pyproject.toml": PYPROJECT, "tinykern/__init__.py": PACKAGE.format(bug=""),
                "tinykern/bench.py": BENCH, "tests/conftest.py": CONFTEST, "tests/test_ops.py": TESTS,
                "tools/install.py": INSTALL_SCRIPT, "harness.toml": SUITE.format(install=TRIVIAL_INSTALL, extra="")}
        self.good = commit(self.repo, base, "tinykern with tests and benchmarks")
        # The same install key (pyproject.toml and the command unchanged): the environment is reused, and the
        # new code must still be what runs: add() is now off by one.
        self.buggy = commit(self.repo, {"tinykern/__init__.py": PACKAGE.format(bug=" + 1"),
                                        "harness.toml": LEAN.format(install=TRIVIAL_INSTALL, extra="")}, "off by one")
        self.bad_field = commit(self.repo, {"harness.toml": LEAN.format(install=TRIVIAL_INSTALL,
                                                                        extra="workers = -1\n")}, "bad field")
        self.no_install = commit(self.repo, {"pyproject.toml": "[project\nname = broken",
                                             "harness.toml": LEAN.format(install=PIP_INSTALL, extra="")},
                                 "broken pyproject: pip cannot install it")

    def harness(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.cache),
               "TINYKERN_INSTALLS": str(self.installs), "COLUMNS": "1000"}
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=self.root, env=env,
                              capture_output=True, text=True, timeout=timeout)

    def run(self, sha: str, *more: str, repo: str | None = None) -> subprocess.CompletedProcess:
        return self.harness("run", "--repo", repo or str(self.repo), "--commit", sha, "--db", f"sqlite:///{self.db}",
                            "--no-report", *more)

    def rows(self, sql: str, *params) -> list[tuple]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql, params).fetchall()

    def jobs(self, sha: str, kind: str) -> dict[str, tuple]:
        """key -> (status, detail, ...) of one kind of job stored for commit ``sha``."""
        found = self.rows("select j.key, j.status, j.detail, j.name, j.duration_s, j.n_samples, j.flops, "
                          "j.pct_peak, j.kernel, j.variant from job j join run r on r.id = j.run_id "
                          "join `commit` c on c.id = r.commit_id where c.sha = ? and j.kind = ?", sha, kind)
        return {row[0]: row[1:] for row in found}

    def junit(self, sha: str, *selection: str) -> dict[str, tuple[str, str]]:
        """What pytest itself reports on a checkout of ``sha``: (classname, name) -> (outcome, type)."""
        tree = self.root / f"checkout-{sha[:8]}"
        if not tree.exists():
            git(self.repo, "worktree", "add", "--detach", str(tree), sha)
        xml = self.root / f"junit-{sha[:8]}-{len(list(self.root.glob('junit-*')))}.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={xml}", *selection],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, timeout=120)
        cases = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            children = {child.tag: child for child in case}
            if "error" in children:
                outcome = ("error", "")
            elif "failure" in children:
                outcome = ("failure", "")
            elif "skipped" in children:
                outcome = ("skipped", children["skipped"].get("type", ""))
            else:
                outcome = ("passed", "")
            cases[(case.get("classname"), case.get("name"))] = outcome
        return cases


def junit_address(nodeid: str) -> tuple[str, str]:
    """pytest's junit (classname, name) of a node id (as _pytest.junitxml.mangle_test_address builds it)."""
    path, *names = nodeid.split("::")
    module = path.replace("/", ".").removesuffix(".py")
    return ".".join([module, *names[:-1]]), names[-1]


# Our outcome -> what junit shows for it: an xfail is a skipped testcase of type pytest.xfail, and a
# (non-strict) xpass is a plain pass there.
AS_JUNIT: dict[str, tuple[str, str]] = {"passed": ("passed", ""), "xpassed": ("passed", ""),
                                        "failed": ("failure", ""), "error": ("error", ""),
                                        "skipped": ("skipped", "pytest.skip"), "xfailed": ("skipped", "pytest.xfail")}


@pytest.fixture(scope="module")
def kern(tmp_path_factory) -> Kern:
    return Kern(tmp_path_factory.mktemp("external"))


@pytest.fixture(scope="module")
def good_run(kern: Kern) -> subprocess.CompletedProcess:
    return kern.run(kern.good, "--parallel", "2")  # the two selections at once: they share one environment


def assert_same_as_junit(kern: Kern, sha: str, selection: str, stored: dict[str, tuple], *pytest_args: str,
                         expected: dict[str, str] | None = None) -> None:
    ours = {key.removeprefix(f"test/{selection}/"): row for key, row in stored.items()
            if key.startswith(f"test/{selection}/")}
    junit = kern.junit(sha, *pytest_args)
    assert {junit_address(nodeid) for nodeid in ours} == set(junit), "not the same tests"
    for nodeid, (status, *_rest) in ours.items():
        assert AS_JUNIT[status] == junit[junit_address(nodeid)], nodeid
    if expected is not None:
        assert {nodeid: row[0] for nodeid, row in ours.items()} == expected


def test_pytest_outcomes_are_stored_per_test_and_match_junit(kern: Kern, good_run: subprocess.CompletedProcess):
    assert good_run.returncode == 1, good_run.stderr  # a test failed and one errored: the run fails
    tests = kern.jobs(kern.good, "test")
    m = "tests/test_ops.py::"
    assert_same_as_junit(kern, kern.good, "unit", tests, "-m", "not slow", "tests", expected={
        m + "test_add": "passed", m + "test_scale[1]": "passed", m + "test_scale[2]": "passed",
        m + "test_wrong": "failed", m + "test_metal": "skipped", m + "test_skip_inside": "skipped",
        m + "test_known_bug": "xfailed", m + "test_xpass": "xpassed", m + "test_fixture_error": "error"})
    # The xdist selection: the reports reach the controller, which alone records them.
    assert_same_as_junit(kern, kern.good, "unit-xdist", tests, "-k",
                         "scale or wrong or metal or known_bug or fixture", "tests/test_ops.py")
    detail = {key.split("::")[-1]: (row[0], row[1]) for key, row in tests.items() if key.startswith("test/unit/")}
    assert detail["test_metal"] == ("skipped", "Metal not available")  # a skip, with its reason: not a failure
    assert detail["test_skip_inside"] == ("skipped", "needs CUDA")
    assert detail["test_known_bug"] == ("xfailed", "known bug")
    assert "assert" in detail["test_wrong"][1] and "test_ops.py" in detail["test_wrong"][1]
    assert detail["test_fixture_error"][1].startswith("setup failed: RuntimeError: fixture exploded")
    selections = kern.jobs(kern.good, "pytest")
    assert selections["pytest/unit"][:2] == ("failed", "3 passed, 1 failed, 1 error, 2 skipped, 1 xfailed, "
                                                       "1 xpassed")
    assert selections["pytest/unit-xdist"][0] == "failed"
    out = good_run.stdout + good_run.stderr  # the results, then the failures as they happened
    # unit-xdist's tests are all in unit too: each test counted once, then each selection's own counts
    assert "tests: 9 distinct: 3 passed, 1 failed, 1 error, 2 skipped, 1 xfailed, 1 xpassed" in out
    assert "  unit-xdist: 2 passed, 1 failed, 1 error, 1 skipped, 1 xfailed" in out
    assert "failed tests/test_ops.py::test_wrong" in out and "error tests/test_ops.py::test_fixture_error" in out
    assert "test_metal" not in out  # skips are not reported as problems


def test_benchmark_functions_are_timed_with_their_counts(kern: Kern, good_run: subprocess.CompletedProcess):
    bench = kern.jobs(kern.good, "benchmark")
    assert set(bench) == {"benchmark/tinykern.bench:bench_matmul/default/-/N=32",
                          "benchmark/tinykern.bench:bench_matmul/default/-/N=64",
                          "benchmark/tinykern.bench:bench_add/default/-/N=1000",
                          "benchmark/tinykern.bench:bench_metal/default/-/"}
    status, detail, _name, _dur, n, flops, pct, kernel, variant = bench["benchmark/tinykern.bench:bench_matmul/"
                                                                        "default/-/N=64"]
    # 3 samples in each of the default 3 trials (job processes)
    assert (status, n, flops, kernel, variant) == ("passed", 9, 2 * 64**3, "tinykern.bench:bench_matmul", "default")
    assert pct > 0 and "mx.async_eval" in detail  # roofline % against this run's calibration
    status, detail, *_rest, n, flops, pct, _k, _v = bench["benchmark/tinykern.bench:bench_add/default/-/N=1000"]
    assert (status, n, flops, pct) == ("passed", 9, None, None) and "no sync" in detail
    assert bench["benchmark/tinykern.bench:bench_metal/default/-/"][:2] == ("skipped", "Metal not available")
    samples = kern.rows("select count(*) from sample s join job j on j.id = s.job_id where j.kind = 'benchmark' "
                        "and j.status = 'passed'")
    assert samples == [(27,)]


def test_the_environment_is_reused_and_still_imports_the_commit(kern: Kern, good_run: subprocess.CompletedProcess):
    """The next commit, fetched by URL this time (file:// goes through the clone cache like any remote)."""
    done = kern.run(kern.buggy, repo=f"file://{kern.repo}")
    assert done.returncode == 1, done.stderr
    prefixes = kern.installs.read_text().splitlines()
    assert len(prefixes) == 1 and Path(prefixes[0]).parent == kern.cache / "envs"  # installed once, in the venv
    installs = {sha: kern.jobs(sha, "install")["install"][:2] for sha in (kern.good, kern.buggy)}
    assert installs[kern.good][0] == installs[kern.buggy][0] == "passed"
    assert "reused" in installs[kern.buggy][1] and "installed in" in installs[kern.good][1]
    before, after = kern.jobs(kern.good, "test"), kern.jobs(kern.buggy, "test")
    add, wrong = "test/unit/tests/test_ops.py::test_add", "test/unit/tests/test_ops.py::test_wrong"
    assert (before[add][0], before[wrong][0]) == ("passed", "failed")
    assert (after[add][0], after[wrong][0]) == ("failed", "passed")  # the buggy commit's own code ran
    assert {key.split("/")[1] for key in after} == {"unit"}  # and its own, leaner suite
    # a file:// URL names no host: the repository is its root commit, as when run from its path
    assert kern.rows("select repo from `commit` where sha = ?", kern.buggy) == [(f"root:{kern.good}",)]
    assert kern.rows("select repo from `commit` where sha = ?", kern.good) == [(f"root:{kern.good}",)]


def test_a_failed_install_fails_the_commits_jobs_with_the_log(kern: Kern, good_run: subprocess.CompletedProcess):
    done = kern.run(kern.no_install)
    assert done.returncode == 1, done.stderr
    (install,) = kern.rows("select j.status, j.detail, j.output_tail from job j join run r on r.id = j.run_id "
                           "join `commit` c on c.id = r.commit_id where c.sha = ? and j.kind = 'install'",
                           kern.no_install)
    assert install[0] == "failed" and install[1].startswith(f"install failed: `{PIP_INSTALL}` exited with status")
    assert "TOMLDecodeError" in install[2]  # the install log's tail
    others = kern.rows("select j.kind, j.status, j.detail from job j join run r on r.id = j.run_id "
                       "join `commit` c on c.id = r.commit_id where c.sha = ? and j.kind in ('pytest', 'benchmark')",
                       kern.no_install)
    assert sorted(kind for kind, _status, _detail in others) == ["benchmark", "pytest"]
    assert all(status == "failed" and detail == install[1] for _kind, status, detail in others)
    assert kern.jobs(kern.no_install, "test") == {}


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_a_bad_suite_field_is_one_line_naming_it(kern: Kern):
    line = one_line_error(kern.run(kern.bad_field))
    assert "harness.toml: pytest[0].workers:" in line


@pytest.mark.parametrize("case", ["no-such-commit", "no-such-repo", "no-such-path"])
def test_missing_commits_and_repositories_are_one_line_errors(kern: Kern, case: str):
    db = f"sqlite:///{kern.db}"
    calls: dict[str, Callable[[], subprocess.CompletedProcess]] = {
        "no-such-commit": lambda: kern.run("0123456789abcdef0123456789abcdef01234567"),
        "no-such-repo": lambda: kern.harness("run", "--repo", f"file://{kern.root}/nowhere.git", "--commit",
                                             kern.good, "--db", db, "--no-report"),
        "no-such-path": lambda: kern.harness("run", "--repo", str(kern.root / "nowhere"), "--db", db,
                                             "--no-report"),
    }
    line = one_line_error(calls[case]())
    assert {"no-such-commit": "does not exist", "no-such-repo": "nowhere.git",
            "no-such-path": "no such directory"}[case] in line
