"""The exit-status contract of each verb (docs/exit-codes.md), scenario by scenario, through the real CLI on SQLite
and PostgreSQL: a CI gate reads nothing else.

One generated repository (a pytest-only suite of two overlapping selections) has a commit per scenario: all pass,
a failure in the first selection only (the VeloxQuant case: exit 0 while only the last selection was judged), a
crash, a timeout. Each backend's database gets one `harness run` of each, plus synthetic benchmark runs (written
through the real store) for a confirmed regression and an inconclusive-only comparison. `run` and `bisect` run as
subprocesses; the reading verbs go through the same entry point in-process (``main()``, argv parsed as typed).

Not covered here: a *lost* job needs a node of a Ray cluster to die; its exit status is checked through
``submit --wait`` (the driver's summary line, which counts lost jobs as failures) and `harness.core.status`.
``submit --wait`` runs its real code (commit resolution, submission, log streaming, the exit mapping) against a
stand-in for Ray's JobSubmissionClient that plays back what a driver prints: starting a Ray cluster per scenario
is too heavy for this table (the exclusive tests in tests/cluster/ run real Ray jobs).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from harness.cluster.driver import SUMMARY_PREFIX
from harness.record import outbox
from testkit.analysis import add_run, grid_results, sha_of
from testkit.e2e import commit, new_repo
from testkit.paths import ROOT
from testkit.pg import scratch_database

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"

SUITE = """[suite]
name = "contract"

[[pytest]]
name = "a_all"
paths = ["tests"]
timeout_s = {timeout}

[[pytest]]
name = "b_ok"
paths = ["tests"]
k = "ok"
timeout_s = {timeout}
"""
TESTS = """from calc import VALUE


def test_ok():
    assert True


def test_value():
    assert VALUE == 1
"""
PASSING = "VALUE = 1\n"
COMMITS = {  # scenario -> (calc/__init__.py, selection timeout)
    "pass": (PASSING, 120),
    "fail_first": ("VALUE = 2\n", 120),  # test_value fails: only in a_all, the first selection
    "crash": ("import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGSEGV)\n", 120),  # pytest itself dies
    "timeout": ("import time\n\ntime.sleep(600)\nVALUE = 1\n", 3),
}


def cli(*args: str) -> tuple[int, str, str]:
    """The real entry point in-process: (exit status, stdout, stderr)."""
    from harness.cli.main import main

    argv, stdout, stderr = sys.argv, sys.stdout, sys.stderr
    sys.argv, sys.stdout, sys.stderr = ["harness", *args], io.StringIO(), io.StringIO()
    try:
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return code, sys.stdout.getvalue(), sys.stderr.getvalue()
    finally:
        sys.argv, sys.stdout, sys.stderr = argv, stdout, stderr


class World:
    """The repository, one backend's database and the runs in it."""

    def __init__(self, root: Path, repo: Path, shas: dict[str, str], url: str) -> None:
        self.root, self.repo, self.shas, self.url = root, repo, shas, url
        self.runs: dict[str, subprocess.CompletedProcess] = {}

    def harness(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"), "COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=self.root, env=env, capture_output=True,
                              text=True, timeout=300)

    def run(self, scenario: str) -> subprocess.CompletedProcess:
        return self.harness("run", "--repo", str(self.repo), "--commit", self.shas[scenario], "--db", self.url,
                            "--no-report", "--quiet", "--parallel", "2")


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    repo = tmp_path_factory.mktemp("contract") / "repo"
    shas = {}
    for scenario, (package, timeout) in COMMITS.items():
        files = {"calc/__init__.py": package, "tests/test_calc.py": TESTS,
                 "harness.toml": SUITE.format(timeout=timeout)}
        shas[scenario] = commit(repo, files, scenario) if shas else new_repo(repo, files, scenario)
    return repo, shas


def _synthetic(url: str) -> None:
    """Benchmarks of other commits on other chips: a confirmed 1.5x regression (chip-a, 3 trials a side) and a
    1.5x change with one trial a side and no history (chip-b): inconclusive."""
    db = outbox.open_store(url)
    rng = np.random.default_rng(1)
    try:
        add_run(db, "chip-a", 101, grid_results(rng), minutes=1)
        add_run(db, "chip-a", 102, grid_results(rng, {("swiglu", "unfused", 0): 1.5}), minutes=2)
        add_run(db, "chip-b", 201, grid_results(rng, trials=1), minutes=3)
        add_run(db, "chip-b", 202, grid_results(rng, {("swiglu", "unfused", 0): 1.5}, trials=1), minutes=4)
    finally:
        db.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request, repository, tmp_path_factory) -> World:
    repo, shas = repository
    root = tmp_path_factory.mktemp(request.param)
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{root / 'results.db'}"
        else:
            url = stack.enter_context(scratch_database(request.getfixturevalue("pg_server")))
        world = World(root, repo, shas, url)
        world.runs = {scenario: world.run(scenario) for scenario in COMMITS}
        _synthetic(url)
        yield world


RUN = {"all pass": ("pass", 0), "a failure in one of several selections": ("fail_first", 1),
       "a crash": ("crash", 1), "a timeout": ("timeout", 1)}


@pytest.mark.parametrize("scenario", RUN)
def test_run(world: World, scenario: str):
    commit_of, expected = RUN[scenario]
    done = world.runs[commit_of]
    assert done.returncode == expected, done.stdout + done.stderr
    assert "jobs: " in done.stdout and "running " not in done.stderr  # results on stdout; --quiet: no progress


@pytest.mark.parametrize("scenario, args", [
    ("bad input", ["run", "--suite", "no-such-suite.toml", "--no-report"]),
    ("unreachable database", ["run", "--db", UNREACHABLE, "--no-report"]),
])
def test_run_refuses(world: World, scenario: str, args: list[str]):
    done = world.harness(*args, *([] if "--db" in args else ["--db", world.url]))
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr


def _compare_args(world: World, scenario: str) -> list[str]:
    pairs = {"all pass": ("pass", "pass"), "a failure in one of several selections": ("pass", "fail_first"),
             "a crash": ("pass", "crash"), "a timeout": ("pass", "timeout")}
    if scenario in pairs:
        return [world.shas[pairs[scenario][0]], world.shas[pairs[scenario][1]], "--db", world.url]
    return {"a confirmed regression": [sha_of(101), sha_of(102), "--db", world.url],
            "inconclusive only": [sha_of(201), sha_of(202), "--db", world.url],
            "bad input": ["nosuchcommit", world.shas["pass"], "--db", world.url],
            "unreachable database": [world.shas["pass"], world.shas["fail_first"], "--db", UNREACHABLE]}[scenario]


COMPARE = {"all pass": 0, "a failure in one of several selections": 1, "a crash": 1, "a timeout": 1,
           "a confirmed regression": 1, "inconclusive only": 0, "bad input": 2, "unreachable database": 2}


@pytest.mark.parametrize("scenario", COMPARE)
def test_compare(world: World, scenario: str):
    code, stdout, stderr = cli("compare", *_compare_args(world, scenario), "--format", "json", "--quiet")
    assert code == COMPARE[scenario], stdout + stderr
    if code < 2:
        report = json.loads(stdout)
        assert report["exit_code"] == code
        if scenario == "inconclusive only":
            assert report["counts"]["inconclusive"] >= 1 and not report["counts"]["regressed"]
        if scenario == "a confirmed regression":
            assert report["counts"]["regressed"] >= 1
    else:
        assert stderr.startswith("error: ") and len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("scenario, args, expected", [
    ("all there", [], 0),
    ("bad input", ["--format", "nope"], 2),
    ("unreachable database", ["--db", UNREACHABLE], 2),
])
def test_variants(world: World, scenario: str, args: list[str], expected: int):
    code, stdout, stderr = cli("variants", *(args if "--db" in args else [*args, "--db", world.url]))
    assert code == expected, stdout + stderr


@pytest.mark.parametrize("scenario, expected", [("all there", 0), ("bad input", 2), ("unreachable database", 2)])
def test_report(world: World, scenario: str, expected: int, tmp_path: Path):
    out = tmp_path / "site"
    if scenario == "bad input":
        out.write_text("a file where the folder goes")
    db = UNREACHABLE if scenario == "unreachable database" else world.url
    code, stdout, stderr = cli("report", "--db", db, "--out", str(out), "--no-change-points")
    assert code == expected, stdout + stderr


@pytest.mark.parametrize("scenario, expected", [("a bundle", 0), ("again: all already there", 0),
                                                ("bad input", 2), ("unreachable database", 2)])
def test_import(world: World, scenario: str, expected: int, tmp_path: Path):
    bundle = tmp_path / "runs.jsonl.gz"
    if scenario == "bad input":
        bundle.write_bytes(b"not a bundle\n")
    else:
        assert cli("export", "--out", str(bundle), "--db", world.url)[0] == 0
    target = {"a bundle": f"sqlite:///{tmp_path / 'other.db'}", "unreachable database": UNREACHABLE}.get(
        scenario, world.url)
    code, stdout, stderr = cli("import", str(bundle), "--db", target)
    assert code == expected, stdout + stderr


BISECT = {"culprit named": ("pass", "fail_first", None, 0),
          "the bad commit does not fail": ("pass", "fail_first", "tests/test_calc.py::test_ok", 1)}


@pytest.mark.parametrize("scenario", BISECT)
def test_bisect(world: World, scenario: str):
    good, bad, check, expected = BISECT[scenario]
    done = world.harness("bisect", "--good", world.shas[good], "--bad", world.shas[bad], "--kernel", "a_all",
                         "--mode", "correctness", "--repo", str(world.repo), "--db", world.url,
                         *(["--check", check] if check else []))
    assert done.returncode == expected, done.stdout + done.stderr


def test_bisect_results_go_to_stdout_and_quiet_leaves_only_them(world: World):
    args = ("bisect", "--good", world.shas["pass"], "--bad", world.shas["fail_first"], "--kernel", "a_all",
            "--mode", "correctness", "--repo", str(world.repo), "--db", world.url)
    loud, quiet = world.harness(*args), world.harness(*args, "--quiet")
    assert loud.returncode == quiet.returncode == 0, loud.stdout + loud.stderr
    assert loud.stderr.strip() and "culprit: " not in loud.stderr  # progress on stderr, the answer is stdout's
    assert quiet.stderr == "", quiet.stderr
    assert "culprit: " in loud.stdout and "culprit: " in quiet.stdout


@pytest.mark.parametrize("scenario, db", [("bad input", None), ("unreachable database", UNREACHABLE)])
def test_bisect_refuses(world: World, scenario: str, db: str | None):
    good = "nosuchcommit" if scenario == "bad input" else world.shas["pass"]
    done = world.harness("bisect", "--good", good, "--bad", world.shas["fail_first"], "--kernel", "a_all",
                         "--mode", "correctness", "--repo", str(world.repo), "--db", db or world.url)
    assert done.returncode == 2 and "error: " in done.stderr, done.stdout + done.stderr


# --- submit --wait ------------------------------------------------------------------------------------------


class _Status:
    def __init__(self, value: str) -> None:
        self.value = value


class PlayedBackJobs:
    """Ray's JobSubmissionClient as `harness submit` uses it, playing back a finished job: its final status and the
    log its driver printed (the summary line is what `harness.cluster.driver.main` prints)."""

    def __init__(self, status: str, log: str) -> None:
        self.status, self.log, self.stopped = status, log, []

    def submit_job(self, **job) -> str:
        return job["submission_id"]

    def get_job_status(self, job_id: str) -> _Status:
        return _Status(self.status)

    def get_job_logs(self, job_id: str) -> str:
        return self.log

    def stop_job(self, job_id: str) -> None:
        self.stopped.append(job_id)


def _summary(counts: dict[str, int], errors: dict[str, str] | None = None) -> str:
    from harness.cluster.driver import ClusterOutcome
    from harness.pipeline.run import RunOutcome

    outcome = ClusterOutcome([RunOutcome("r1", "chip-a", "0" * 40, False, counts=counts, planned=sum(counts.values()))],
                             errors or {})
    return "[chip-a] run r1: ...\n" + SUMMARY_PREFIX + json.dumps(outcome.summary()) + "\n"


SUBMIT = {
    "all pass": ("SUCCEEDED", _summary({"passed": 3}), 0),
    "a failure": ("FAILED", _summary({"passed": 2, "failed": 1}), 1),
    "a crash": ("FAILED", _summary({"passed": 2, "crashed": 1}), 1),
    "a timeout": ("FAILED", _summary({"passed": 2, "timeout": 1}), 1),
    "a lost job": ("FAILED", _summary({"passed": 2, "lost": 1}), 1),
    "a chip's run could not complete": ("FAILED", _summary({}, {"chip-b": "no live node"}), 2),
    "the driver could not start": ("FAILED", "ModuleNotFoundError: No module named 'sqlalchemy'\n", 2),
    "still running at --timeout": ("RUNNING", "", 2),
}


@pytest.mark.parametrize("scenario", SUBMIT)
def test_submit_wait(repository, monkeypatch, scenario: str):
    import harness.cli.submit as submit

    repo, shas = repository
    status, log, expected = SUBMIT[scenario]
    client = PlayedBackJobs(status, log)
    monkeypatch.setattr(submit, "jobs_client", lambda address, token="": client)
    monkeypatch.setattr(submit, "POLL_S", 0.01)
    code, stdout, stderr = cli("submit", "--address", "http://127.0.0.1:1", "--commit", shas["pass"], "--repo",
                               str(repo), "--wait", "--timeout", "0.2", "--db", "sqlite:///results.db")
    assert code == expected, stdout + stderr
    assert bool(client.stopped) == (status == "RUNNING")  # a job past --timeout is stopped
