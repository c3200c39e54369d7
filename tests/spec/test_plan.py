"""Planning: stable keys, calibration first, grids per chip class, duplicates collapsed."""

from __future__ import annotations

from harness.core.job import job_key, shape_label
from harness.spec.plan import plan_suite
from harness.spec.suite import load_suite, parse_suite
from testkit.suites import GOOD


def test_keys_are_readable_and_independent_of_dict_order():
    a = job_key("benchmark", "k", "v", {"S": 8, "B": 1}, "float16")
    b = job_key("benchmark", "k", "v", {"B": 1, "S": 8}, "float16")
    assert a == b == "benchmark/k/v/float16/B=1,S=8"
    assert shape_label({"D": 64, "B": 2}) == "B=2,D=64"


def test_the_same_suite_plans_the_same_keys_twice():
    suite = parse_suite(GOOD)
    assert [j.key for j in plan_suite(suite, "cpu")] == [j.key for j in plan_suite(suite, "cpu")]


def test_the_cpu_plan_expands_variants_dtypes_shapes_and_checks():
    suite = parse_suite(GOOD)
    jobs = plan_suite(suite, "cpu")
    from kernels import REGISTRY

    n_variants = len(REGISTRY["flash_prefill"].variants)
    assert [j.kind for j in jobs].count("correctness") == 1
    assert [j.kind for j in jobs].count("benchmark") == n_variants
    bench = next(j for j in jobs if j.kind == "benchmark")
    assert bench.shape == {"B": 1, "H": 2, "S_q": 64, "S_kv": 64, "D": 32}  # normalized by the kernel
    assert bench.timing["samples"] == 10 and bench.timeout_s >= 120


def test_a_chip_class_without_a_grid_plans_no_benchmarks():
    assert [j for j in plan_suite(parse_suite(GOOD), "gpu") if j.kind == "benchmark"] == []


def test_calibration_comes_first_and_builtin_plans_are_sized_per_chip_class():
    suite = load_suite()
    cpu, gpu = plan_suite(suite, "cpu"), plan_suite(suite, "gpu")
    assert cpu[0].kind == "calibration" and gpu[0].kind == "calibration"
    cpu_s = {j.shape["S_q"] for j in cpu if j.kind == "benchmark" and j.kernel == "flash_prefill"}
    gpu_s = {j.shape["S_q"] for j in gpu if j.kind == "benchmark" and j.kernel == "flash_prefill"}
    assert max(cpu_s) <= 512 < max(gpu_s)


def test_duplicate_expansions_run_once():
    doc = {**GOOD, "correctness": GOOD["correctness"] + [{**GOOD["correctness"][0], "name": "c2"}]}
    jobs = plan_suite(parse_suite(doc), "cpu")
    assert len([j for j in jobs if j.kind == "correctness"]) == 1
    assert len({j.key for j in jobs}) == len(jobs)


def test_a_suite_of_one_or_two_series_measures_four_trials_so_a_change_can_show_by_rank():
    """A lone series has no grid to borrow a spread from (harness.stats.trials, rank check): 3 trials a side can
    never separate beyond chance by rank (p >= 0.1), so the plan raises them to 4; a grid keeps the suite's 3."""
    from kernels import REGISTRY

    def trials_planned(variants, trials: int) -> set[int]:
        doc = {**GOOD, "timing": {**GOOD.get("timing", {}), "trials": trials},
               "benchmark": [{**GOOD["benchmark"][0], "variants": variants}]}
        return {j.trials for j in plan_suite(parse_suite(doc), "cpu") if j.kind == "benchmark"}

    variants = list(REGISTRY["flash_prefill"].variants)
    assert len(variants) >= 3
    assert trials_planned(variants[:1], 3) == trials_planned(variants[:2], 3) == {4}
    assert trials_planned(variants[:3], 3) == {3}  # three series: moderated, the suite's count stands
    assert trials_planned(variants[:1], 1) == {1}  # no spread asked for: a single trial stays single
    assert trials_planned(variants[:1], 6) == {6}
