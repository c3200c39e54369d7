"""Suite validation: the built-in suite is valid; every kind of bad input is one error naming the field."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.errors import SuiteError
from harness.spec.suite import BUILTIN_SUITE, load_suite, parse_suite
from testkit.suites import GOOD


def with_(path: str, value):
    doc = copy.deepcopy(GOOD)
    target = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return doc


def test_the_builtin_suite_is_valid():
    suite = load_suite(BUILTIN_SUITE)
    assert suite.suite.name == "builtin"
    assert {spec.kernel for spec in suite.correctness} >= {"flash_prefill"}
    assert "cpu" in suite.calibration and "gpu" in suite.calibration


def test_a_good_document_parses():
    suite = parse_suite(GOOD)
    assert suite.grid_shapes(suite.benchmark[0], "cpu") == [{"B": 1, "H": 2, "S": 64, "D": 32}]
    assert suite.grid_shapes(suite.benchmark[0], "gpu") == []


@pytest.mark.parametrize("path, value, message", [
    ("correctness.0.kernel", "nope", "correctness[0].kernel: unknown kernel 'nope'"),
    ("correctness.0.variants", ["sdpa", "bq99"], "correctness[0].variants: unknown variant 'bq99'"),
    ("correctness.0.variants", [], "correctness[0].variants"),
    ("correctness.0.checks", ["telepathy"], "correctness[0].checks: unknown check 'telepathy'"),
    ("correctness.0.shapes", [], "correctness[0].shapes"),
    ("correctness.0.shapes", [{"B": 1, "H": 1, "S_q": 9, "S_kv": 8, "D": 32}], "correctness[0].shapes[0]"),
    ("correctness.0.dtypes", ["float64"], "correctness[0].dtypes[0]"),
    ("benchmark.0.grid", {}, "benchmark[0].grid"),
    ("benchmark.0.grid", {"cpu": {"S": []}}, "grid.cpu.S is empty"),
    ("benchmark.0.grid", {"tpu": {"S": [1]}}, "benchmark[0].grid.tpu"),
    ("benchmark.0.timing", {"samples": 0}, "benchmark[0].timing: samples"),
    ("benchmark.0.timing", {"threads": 0}, "benchmark[0].timing: threads: Input should be greater than or equal to 1"),
    ("timing", {"threads": 0}, "timing.threads: Input should be greater than or equal to 1"),
    ("timing", {"threads": 1.5}, "timing.threads"),
    ("timing", {"threads": True}, "timing.threads"),
    ("benchmark.0.name", "c", "benchmark[0].name: duplicate job name 'c'"),
    ("suite.name", 5, "suite.name"),
    ("correctness.0.kernel", 3, "correctness[0].kernel"),
])
def test_bad_documents_name_the_bad_field(path, value, message):
    with pytest.raises(SuiteError) as info:
        parse_suite(with_(path, value), "s.toml")
    assert message in str(info.value)
    assert str(info.value).startswith("s.toml: ")
    assert "\n" not in str(info.value)


def test_timing_threads_is_optional_and_reaches_the_benchmark_jobs():
    from harness.spec.plan import plan_suite

    assert parse_suite(GOOD).timing.threads is None  # default: the job process inherits the thread variables
    suite = parse_suite(with_("timing", {"threads": 4}))
    assert suite.timing.threads == 4
    benchmarks = [job for job in plan_suite(suite, "cpu") if job.kind == "benchmark"]
    assert benchmarks and all(job.timing["threads"] == 4 for job in benchmarks)
    override = parse_suite(with_("benchmark.0.timing", {"threads": 1}))
    assert {job.timing["threads"] for job in plan_suite(override, "cpu") if job.kind == "benchmark"} == {1}


def test_timing_mode_device_is_a_suite_setting_that_reaches_the_jobs_and_others_are_refused():
    from harness.spec.plan import plan_suite

    suite = parse_suite(with_("timing", {"mode": "device"}))
    assert {job.timing["mode"] for job in plan_suite(suite, "cpu") if job.kind == "benchmark"} == {"device"}
    with pytest.raises(SuiteError, match="timing.mode"):
        parse_suite(with_("timing", {"mode": "gpu-clock"}))


def test_unknown_top_level_fields_are_rejected():
    with pytest.raises(SuiteError, match="benchmarks"):
        parse_suite({**GOOD, "benchmarks": []})


def test_invalid_toml_and_missing_files_are_clear(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[suite\nname=")
    with pytest.raises(SuiteError, match="not valid TOML"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="cannot read suite"):
        load_suite(tmp_path / "missing.toml")


def test_a_plugin_that_does_not_import_is_named():
    with pytest.raises(SuiteError, match="suite.plugins: cannot import 'no_such_plugin_module'"):
        parse_suite(with_("suite.plugins", ["no_such_plugin_module"]))


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=6))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                              st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                          max_leaves=12)
field_names = st.sampled_from(["suite", "timing", "calibration", "correctness", "benchmark", "name", "kernel",
                               "variants", "dtypes", "checks", "shapes", "grid", "cpu", "gpu", "S", "B", "D"])
documents = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(field_names, inner, max_size=4)),
                         max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(documents, json_value, st.builds(lambda path, v: (path, v), st.sampled_from(
    ["correctness.0.shapes", "benchmark.0.grid", "correctness.0.variants", "benchmark.0.timing", "suite",
     "correctness.0.dtypes", "benchmark.0.grid.cpu"]), json_value)))
def test_random_documents_are_accepted_or_raise_the_project_error(doc):
    if isinstance(doc, tuple):
        doc = with_(*doc)
    try:
        parse_suite(doc)
    except SuiteError:
        pass
