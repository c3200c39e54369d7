"""`[timing] threads = N`: the BLAS/OpenMP thread variables are in the job process's environment from its start
(a BLAS sizes its thread pool once, when numpy is first imported, which may be before the repository's module
sets them), and a job without it gets none of them from the harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.defaults import THREAD_VARS
from harness.core.job import FunctionJob
from harness.execute.local import run_in_subprocess
from harness.spec.plan import plan_suite
from harness.spec.suite import parse_suite

# A benchmark function that records the thread variables of its process.
PROBE = """import json
import os

VARS = {vars!r}


def bench_env(N):
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({{name: os.environ.get(name) for name in VARS}}, out)
    return lambda: None
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    for name in THREAD_VARS:
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "tree"
    root.mkdir()
    (root / "probe.py").write_text(PROBE.format(vars=THREAD_VARS))
    return root


def seen(job: FunctionJob, tree: Path, monkeypatch) -> dict:
    out = tree.parent / f"seen-{len(list(tree.parent.glob('seen-*')))}.json"
    monkeypatch.setenv("PROBE_OUT", str(out))
    result = run_in_subprocess(job, tree=str(tree))
    assert result.status == "passed", (result.detail, result.output_tail)
    return json.loads(out.read_text())


def suite(timing: dict, function_timing: dict) -> dict:
    fast = {"warmup_s": 0.0, "warmup_calls": 1, "min_sample_s": 0.001, "samples": 2}
    return {"suite": {"name": "t"}, "timing": {**fast, **timing},
            "function": [{"target": "probe:bench_env", "grid": {"cpu": {"N": [1]}}, "timing": function_timing}]}


@pytest.mark.parametrize(("timing", "function_timing", "expected"), [
    ({"threads": 2}, {}, "2"),  # the suite's [timing]
    ({"threads": 8}, {"threads": 2}, "2"),  # a function's own timing wins
    ({}, {}, None),  # not set: the harness sets none of them
])
def test_timing_threads_are_in_the_job_process_environment(tree: Path, monkeypatch, timing, function_timing,
                                                            expected):
    (job,) = plan_suite(parse_suite(suite(timing, function_timing)), "cpu")
    assert isinstance(job, FunctionJob) and job.timing["threads"] == (int(expected) if expected else None)
    probe = seen(job, tree, monkeypatch)
    assert probe == dict.fromkeys(THREAD_VARS, expected)


def test_without_threads_the_job_inherits_the_harness_environment(tree: Path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    (job,) = plan_suite(parse_suite(suite({}, {})), "cpu")
    probe = seen(job, tree, monkeypatch)
    assert probe == {**dict.fromkeys(THREAD_VARS), "OMP_NUM_THREADS": "3"}
