"""Job types: one per kind of work, each round-trips through JSON, reads the previous version's untyped form, and
keeps the keys and stored labels it had."""

from __future__ import annotations

import json

import pytest

from harness.core.job import (
    FunctionJob,
    InstallJob,
    JobLabels,
    KernelJob,
    PytestJob,
    job_from_dict,
    job_key,
)

INSTALL = {"command": "pip install -e .", "key_files": ["pyproject.toml"], "per_commit": False, "timeout_s": 900.0,
           "nonce": "n1"}
SELECTION = {"selection": "unit", "paths": ["tests"], "k": "not slow", "m": "", "args": [], "workers": 2,
             "timeout_s": 900.0}
TIMING = {"samples": 3, "warmup_s": 0.0}

CALIBRATION = KernelJob.of("calibration", "calib_matmul", "matmul", {"N": 64}, "float32", name="calibration",
                           timing=TIMING, plugins=("p",), plugin_dir="/x")
CORRECTNESS = KernelJob.of("correctness", "toy", "double", {"N": 16}, "float32", "reference", name="toy", seed=3,
                           timeout_s=60.0, plugins=("p",), plugin_dir="/x")
BENCHMARK = KernelJob.of("benchmark", "flash", "sdpa", {"S": 8, "B": 1}, "float16", name="b", timeout_s=300.0,
                         timing=TIMING)
FUNCTION = FunctionJob.of("pkg.bench:bench_mm", {"N": 8}, name="mm", timing=TIMING, install=INSTALL)
FUNCTION_DTYPE = FunctionJob.of("pkg.bench:bare", {}, "float16", name="pkg.bench:bare", timing=TIMING)
PYTEST = PytestJob.of(SELECTION, timeout_s=960.0, install=INSTALL)
INSTALL_JOB = InstallJob.of(INSTALL, timeout_s=960.0)
ALL = [CALIBRATION, CORRECTNESS, BENCHMARK, FUNCTION, FUNCTION_DTYPE, PYTEST, INSTALL_JOB]

# What the previous version (one Job type, dataclasses.asdict) wrote for the same jobs: in spool files, in a job
# process's job.json, and from an older commit's planner (harness/cluster/driver.py plan_in_tree).
LEGACY = {
    "calibration": {"check": "", "dtype": "float32", "install": {}, "kernel": "calib_matmul",
                    "key": "calibration/calib_matmul/matmul/float32/N=64", "kind": "calibration", "name": "calibration",
                    "plugin_dir": "/x", "plugins": ["p"], "seed": 0, "shape": {"N": 64}, "spec": {},
                    "timeout_s": 120.0, "timing": TIMING, "variant": "matmul"},
    "correctness": {"check": "reference", "dtype": "float32", "install": {}, "kernel": "toy",
                    "key": "correctness/toy/double/float32/N=16/reference", "kind": "correctness", "name": "toy",
                    "plugin_dir": "/x", "plugins": ["p"], "seed": 3, "shape": {"N": 16}, "spec": {},
                    "timeout_s": 60.0, "timing": {}, "variant": "double"},
    "benchmark": {"check": "", "dtype": "float16", "install": {}, "kernel": "flash",
                  "key": "benchmark/flash/sdpa/float16/B=1,S=8", "kind": "benchmark", "name": "b", "plugin_dir": "",
                  "plugins": [], "seed": 0, "shape": {"S": 8, "B": 1}, "spec": {}, "timeout_s": 300.0,
                  "timing": TIMING, "variant": "sdpa"},
    "function": {"check": "", "dtype": "", "install": INSTALL, "kernel": "pkg.bench:bench_mm",
                 "key": "benchmark/pkg.bench:bench_mm/default/-/N=8", "kind": "benchmark", "name": "mm",
                 "plugin_dir": "/x", "plugins": ["p"], "seed": 0, "shape": {"N": 8},
                 "spec": {"target": "pkg.bench:bench_mm"}, "timeout_s": 120.0, "timing": TIMING,
                 "variant": "default"},
    "function_dtype": {"check": "", "dtype": "float16", "install": {}, "kernel": "pkg.bench:bare",
                       "key": "benchmark/pkg.bench:bare/default/float16/", "kind": "benchmark",
                       "name": "pkg.bench:bare", "plugin_dir": "", "plugins": [], "seed": 0, "shape": {},
                       "spec": {"target": "pkg.bench:bare"}, "timeout_s": 120.0, "timing": TIMING,
                       "variant": "default"},
    "pytest": {"check": "", "dtype": "", "install": INSTALL, "kernel": "unit", "key": "pytest/unit", "kind": "pytest",
               "name": "unit", "plugin_dir": "/x", "plugins": ["p"], "seed": 0, "shape": {}, "spec": SELECTION,
               "timeout_s": 960.0, "timing": {}, "variant": "default"},
    "install": {"check": "", "dtype": "", "install": INSTALL, "kernel": "install", "key": "install", "kind": "install",
                "name": "install", "plugin_dir": "/x", "plugins": ["p"], "seed": 0, "shape": {}, "spec": {},
                "timeout_s": 960.0, "timing": {}, "variant": "default"},
}
# The same jobs, new and legacy; legacy plugins on repository jobs were never used, so they are dropped.
PAIRS = [(CALIBRATION, "calibration"), (CORRECTNESS, "correctness"), (BENCHMARK, "benchmark"),
         (FUNCTION, "function"), (FUNCTION_DTYPE, "function_dtype"), (PYTEST, "pytest"), (INSTALL_JOB, "install")]


@pytest.mark.parametrize("job", ALL, ids=lambda j: j.key)
def test_every_job_type_round_trips_through_json(job):
    data = json.loads(job.to_json())
    assert data["type"] == job.TYPE and data["kind"] == job.kind
    back = job_from_dict(data)
    assert type(back) is type(job) and back == job
    assert job_from_dict(job.to_dict()) == job


@pytest.mark.parametrize(("job", "legacy"), PAIRS, ids=[name for _, name in PAIRS])
def test_the_previous_versions_untyped_dicts_load_as_the_right_type(job, legacy):
    back = job_from_dict(json.loads(json.dumps(LEGACY[legacy])))
    assert type(back) is type(job) and back == job


def test_each_type_has_only_the_fields_its_work_uses():
    assert CORRECTNESS.plugins == ("p",) and CORRECTNESS.check == "reference" and CORRECTNESS.seed == 3
    assert FUNCTION.target == "pkg.bench:bench_mm" and FUNCTION.install == INSTALL and FUNCTION.kind == "benchmark"
    assert PYTEST.selection == SELECTION and PYTEST.name == "unit" and PYTEST.kind == "pytest"
    assert INSTALL_JOB.install == INSTALL and INSTALL_JOB.kind == "install"
    for job in (FUNCTION, PYTEST, INSTALL_JOB):
        assert not hasattr(job, "plugins") and not hasattr(job, "variant") and not hasattr(job, "spec")
    assert not hasattr(CORRECTNESS, "install")
    with pytest.raises(TypeError):
        FunctionJob(key="k", name="n", target="m:f", shape={}, kind="pytest")  # the kind comes with the type


def test_keys_are_unchanged():
    assert [job.key for job in ALL] == [LEGACY[name]["key"] for _, name in PAIRS]
    assert BENCHMARK.key == job_key("benchmark", "flash", "sdpa", {"B": 1, "S": 8}, "float16")
    assert CORRECTNESS.key == job_key("correctness", "toy", "double", {"N": 16}, "float32", "reference")


@pytest.mark.parametrize(("job", "legacy"), PAIRS, ids=[name for _, name in PAIRS])
def test_stored_labels_are_what_the_single_job_type_stored(job, legacy):
    old = LEGACY[legacy]  # the previous version stored these fields as they were
    assert job.labels == JobLabels(old["kernel"], old["variant"], old["shape"], old["dtype"], old["check"])
    assert job.name == old["name"] and job.kind == old["kind"]


def test_stored_labels_of_the_repository_jobs():
    assert INSTALL_JOB.labels == ("install", "default", {}, "", "")
    assert PYTEST.labels == ("unit", "default", {}, "", "")
    assert FUNCTION.labels == ("pkg.bench:bench_mm", "default", {"N": 8}, "", "")
    assert (FUNCTION.labels.shape_key, BENCHMARK.labels.shape_key, PYTEST.labels.shape_key) == ("N=8", "B=1,S=8", "")


def test_an_unknown_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown job type 'kernal'"):
        job_from_dict({**CORRECTNESS.to_dict(), "type": "kernal"})
