"""A repository suite's parts without the CLI: schema errors, planning, install keys, environments, the
pytest plugin's outcome folding, per-test rows in the store, and benchmark functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from harness.bench import benchmark, counts
from harness.core.chip import ChipIdentity
from harness.core.errors import SuiteError
from harness.core.job import (
    KEY_CHARS,
    PHASES,
    FunctionJob,
    InstallJob,
    JobResult,
    PytestJob,
    job_from_dict,
    per_test_key,
)
from harness.execute import envs
from harness.record import outbox, store
from harness.record.models import JobRecord
from harness.spec.plan import plan_suite
from harness.spec.suite import check_tree, parse_suite
from testkit.paths import ROOT

BASE = {"suite": {"name": "r"}}
REPO = {**BASE, "install": {"command": "python -c 'print(1)'"},
        "pytest": [{"name": "unit", "paths": ["tests"], "k": "not slow", "workers": 2},
                   {"name": "gpu-only", "paths": ["tests/gpu"], "chips": ["gpu"]}],
        "function": [{"target": "pkg.bench:bench_mm", "grid": {"cpu": {"N": [8, 16]}}},
                     {"target": "pkg.bench:bench_bare", "dtypes": ["float16", "float32"]}]}


@pytest.mark.parametrize(("doc", "field"), [
    ({"pytest": [{"name": "u", "paths": ["/abs"]}]}, "pytest[0].paths"),
    ({"pytest": [{"name": "u", "paths": ["../up"]}]}, "pytest[0].paths"),
    ({"pytest": [{"name": "a/b"}]}, "pytest[0].name"),
    ({"pytest": [{"name": "u", "workers": "many"}]}, "pytest[0].workers"),
    ({"pytest": [{"name": "u", "chips": ["tpu"]}]}, "pytest[0].chips[0]"),
    ({"pytest": [{"name": "u", "marks": "x"}]}, "pytest[0].marks"),
    ({"pytest": [{"name": "u"}, {"name": "u"}]}, "pytest[1].name"),
    ({"function": [{"target": "no_colon"}]}, "function[0].target"),
    ({"function": [{"target": "m:f", "grid": {"cpu": {"N": []}}}]}, "function[0].grid"),
    ({"function": [{"target": "m:f", "timing": {"samples": 0}}]}, "function[0].timing"),
    ({"function": [{"target": "m:f", "dtypes": ["int4"]}]}, "function[0].dtypes[0]"),
    ({"install": {"command": "  "}}, "install.command"),
    ({"install": {"command": "x", "key_files": ["../lock"]}}, "install.key_files"),
    ({"install": {"cmd": "x"}}, "install.command"),
])
def test_bad_repository_sections_name_the_field(doc, field):
    with pytest.raises(SuiteError) as info:
        parse_suite({**BASE, **doc}, source="harness.toml")
    message = str(info.value)
    assert message.startswith(f"harness.toml: {field}") and "\n" not in message, message


def test_pytest_paths_must_exist_in_the_commits_tree(tmp_path):
    suite = parse_suite(REPO, source="harness.toml")
    (tmp_path / "tests").mkdir()
    with pytest.raises(SuiteError, match=r"pytest\[1\]\.paths: 'tests/gpu' does not exist"):
        check_tree(suite, tmp_path)
    (tmp_path / "tests" / "gpu").mkdir()
    check_tree(suite, tmp_path)


def test_a_repository_suite_plans_install_selections_and_grid_points():
    suite = parse_suite(REPO)
    assert suite.needs_tree and not parse_suite(BASE).needs_tree
    cpu, gpu = plan_suite(suite, "cpu"), plan_suite(suite, "gpu")
    assert [j.key for j in cpu] == [
        "install", "pytest/unit",
        "benchmark/pkg.bench:bench_mm/default/-/N=8", "benchmark/pkg.bench:bench_mm/default/-/N=16",
        "benchmark/pkg.bench:bench_bare/default/float16/", "benchmark/pkg.bench:bench_bare/default/float32/"]
    assert {j.key for j in gpu} == {"install", "pytest/unit", "pytest/gpu-only",
                                    "benchmark/pkg.bench:bench_bare/default/float16/",
                                    "benchmark/pkg.bench:bench_bare/default/float32/"}
    install, unit = cpu[0], cpu[1]
    assert isinstance(install, InstallJob) and isinstance(unit, PytestJob)
    assert install.kind == "install" and unit.install == install.install and unit.install["nonce"]
    assert unit.selection == {"selection": "unit", "paths": ["tests"], "k": "not slow", "m": "", "args": [],
                              "workers": 2, "timeout_s": 900.0}
    assert all(isinstance(j, FunctionJob) and j.install for j in cpu[2:]) and cpu[2].target == "pkg.bench:bench_mm"
    assert plan_suite(suite, "cpu")[0].install["nonce"] != install.install["nonce"]  # a new plan, a new try
    assert job_from_dict(json.loads(unit.to_json())) == unit  # what the Ray executor ships
    assert [kind for kind, _ in PHASES] == ["install", "calibration", "correctness", "pytest", "benchmark"]


def test_the_install_key_follows_the_command_and_the_key_files(tmp_path):
    install = {"command": "pip install .", "key_files": ["pyproject.toml", "requirements*.txt", "*.lock"]}
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    first = envs.install_key(install, tmp_path)
    (tmp_path / "kernel.py").write_text("code changes do not matter")
    assert envs.install_key(install, tmp_path) == first
    (tmp_path / "requirements-dev.txt").write_text("numpy\n")
    second = envs.install_key(install, tmp_path)
    (tmp_path / "uv.lock").write_text("lock")
    third = envs.install_key(install, tmp_path)
    assert len({first, second, third, envs.install_key({**install, "command": "pip install -e ."}, tmp_path)}) == 4


def test_an_environment_sees_the_harness_packages_and_a_failure_is_kept_for_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    tree.mkdir()
    attempts = tmp_path / "attempts"
    command = f"echo try >> {attempts}; python -c 'import sys; print(sys.prefix); sys.exit(7)'"
    failed = envs.ensure({"command": command, "nonce": "run-1"}, tree)
    assert not failed.ok and failed.reason.endswith("): " + str(failed.path))  # no error line: the last line
    kept = envs.envs_dir() / envs.LOGS_DIR
    assert f"exited with status 7 (log: {kept}/{failed.key[:16]}-" in failed.reason
    again = envs.ensure({"command": command, "nonce": "run-1"}, tree)  # another job of the same run
    assert not again.ok and again.reused and attempts.read_text().count("try") == 1
    envs.ensure({"command": command, "nonce": "run-2"}, tree)  # the next run tries again
    assert attempts.read_text().count("try") == 2
    result = envs.install_failed("pytest/unit", again)
    assert result.status == "failed" and result.detail.startswith("install failed: ")
    assert str(failed.path) in result.output_tail

    good = envs.ensure({"command": "python -c 'print(1)'", "nonce": "x"}, tree)
    assert good.ok and not good.reused and envs.ensure({"command": "python -c 'print(1)'", "nonce": "y"}, tree).reused
    probe = subprocess.run([str(good.python), "-c", "import sys, numpy, pytest, mlx.core; print(sys.prefix)"],
                           capture_output=True, text=True, env=envs.activated(os.environ, good.path))
    assert probe.returncode == 0 and probe.stdout.strip() == str(good.path), probe.stderr
    assert envs.install_result("install", good).detail.endswith("installed in " + f"{good.seconds:.1f} s")


PLUGIN_TESTS = """
import pytest

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown exploded")

def test_teardown_error(bad_teardown):
    pass

@pytest.mark.xfail(strict=True, reason="must fail")
def test_strict_xpass():
    pass

@pytest.mark.xfail(run=False, reason="not run")
def test_xfail_not_run():
    pass

@pytest.mark.skipif(True, reason="Metal not available")
def test_skipif():
    pass
"""


def test_the_plugin_folds_phases_into_one_outcome_per_test(tmp_path):
    (tmp_path / "test_p.py").write_text(PLUGIN_TESTS)
    (tmp_path / "test_broken.py").write_text("import not_a_module\n")
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_PYTEST_OUT": str(out)}
    subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.execute.pytest_plugin", "-p", "no:cacheprovider",
                    "-q",                     "--continue-on-collection-errors"],
                   cwd=tmp_path, env=env, capture_output=True, timeout=120)
    outcomes = {e["nodeid"]: (e["outcome"], e["detail"]) for e in map(json.loads, out.read_text().splitlines())}
    assert outcomes["test_p.py::test_teardown_error"][0] == "error"
    assert outcomes["test_p.py::test_teardown_error"][1].startswith("teardown failed: RuntimeError")
    assert outcomes["test_p.py::test_strict_xpass"][0] == "failed"
    assert outcomes["test_p.py::test_xfail_not_run"] == ("xfailed", "[NOTRUN] not run")  # pytest's own wasxfail
    assert outcomes["test_p.py::test_skipif"] == ("skipped", "Metal not available")
    assert outcomes["test_broken.py"][0] == "error" and "not_a_module" in outcomes["test_broken.py"][1]


CHIP = ChipIdentity(key="test-chip", backend="cpu", device_name="Test", architecture="x86_64", memory_bytes=1)


def test_tests_are_stored_once_per_run_and_key(db_url):
    db = outbox.open_store(db_url)
    try:
        run_id = store.create_run(db, ident=CHIP, facts={"hostname": "h"}, commit={"sha": "abc"}, suite="s",
                                  dirty=False, executor="local", planned_jobs=1)
        job = PytestJob.of({"selection": "unit"})
        long_id = "tests/test_x.py::test_param[" + "x" * 600 + "]"
        tests = [{"nodeid": "tests/test_x.py::test_a", "outcome": "passed", "duration_s": 0.5},
                 {"nodeid": "tests/test_x.py::test_b", "outcome": "skipped", "detail": "Metal not available"},
                 {"nodeid": long_id, "outcome": "xfailed", "detail": "known"}]
        result = JobResult(job.key, "passed", "1 passed, 1 skipped, 1 xfailed", tests=tests)
        assert store.record_result(db, run_id, job, result)
        assert not store.record_result(db, run_id, job, result)  # a resubmission adds nothing
        with db.session() as session:
            rows = {r.key: (r.kind, r.status, r.detail) for r in session.scalars(select(JobRecord))}
            assert session.scalar(select(func.count()).select_from(JobRecord)) == 4
        assert rows["pytest/unit"] == ("pytest", "passed", "1 passed, 1 skipped, 1 xfailed")
        assert rows["test/unit/tests/test_x.py::test_b"] == ("test", "skipped", "Metal not available")
        long_key = per_test_key("unit", long_id)
        assert len(long_key) == KEY_CHARS and rows[long_key][1] == "xfailed"
        assert long_key != per_test_key("unit", long_id + "y")
    finally:
        db.close()


def test_the_decorator_attaches_counts_of_the_grid_point():
    @benchmark(flops=lambda N, **_: 2 * N**3, bytes=12)
    def bench_mm(N):
        return lambda: None

    def plain(N):
        return lambda: None

    assert counts(bench_mm, {"N": 4}) == (128.0, 12.0)
    assert counts(plain, {"N": 4}) == (None, None)
    assert benchmark(plain) is plain and counts(plain, {"N": 1}) == (None, None)


def test_a_function_job_times_mlx_and_plain_callables_and_skips(tmp_path, monkeypatch):
    from harness.execute import repo_jobs

    (tmp_path / "kb.py").write_text(
        "import mlx.core as mx\nfrom harness.bench import benchmark, skip\n"
        "@benchmark(flops=lambda N, dtype: N * N)\n"
        "def bench_mx(N, dtype):\n    a = mx.ones((N, N), dtype=getattr(mx, dtype))\n    return lambda: a + a\n"
        "def bench_py():\n    return lambda: sum(range(10))\n"
        "def bench_gone():\n    skip('Metal not available')\n"
        "def bench_wrong(N):\n    return N\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    timing = {"warmup_s": 0.0, "warmup_calls": 1, "min_sample_s": 0.001, "samples": 3}

    def job(target: str, shape: dict, dtype: str = "") -> FunctionJob:
        return FunctionJob.of(target, shape, dtype, name="b", timing=timing)

    mlx = repo_jobs.run_function(job("kb:bench_mx", {"N": 8}, "float16"))
    assert mlx.status == "passed" and len(mlx.samples) == 3 and mlx.flops == 64 and "mx.async_eval" in mlx.detail
    assert mlx.mode in ("pipelined", "per-call") and mlx.round_trip_s > 0
    plain = repo_jobs.run_function(job("kb:bench_py", {}))
    assert plain.status == "passed" and plain.flops is None and "no sync" in plain.detail
    assert (repo_jobs.run_function(job("kb:bench_gone", {})).status,
            repo_jobs.run_function(job("kb:bench_gone", {})).detail) == ("skipped", "Metal not available")
    assert "must return the callable" in repo_jobs.run_function(job("kb:bench_wrong", {"N": 1})).detail
    assert "has no function" in repo_jobs.run_function(job("kb:bench_none", {})).detail
