"""Tests for harness.core.stats: planted effects, nulls, multiplicity, change points, variants, gating."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import false_discovery_control

from harness.core.stats import (
    CHANGE_KINDS,
    MAX_MORE_SAMPLES,
    VARIANT_OUTCOMES,
    VERDICTS,
    Comparison,
    Divergence,
    TuningChange,
    VariantVerdict,
    apply_fdr,
    best_variant,
    best_variants,
    compare_each,
    compare_grid,
    compare_samples,
    detect_change_points,
    find_divergent,
    gate,
    median_ci,
    tuning_drift,
    variant_verdict,
    variant_verdict_grid,
)

BASE_SECONDS = 1.5e-4  # a typical kernel time; only ratios matter


def lognormal(rng: np.random.Generator, n: int, cv: float, scale: float = 1.0) -> np.ndarray:
    return BASE_SECONDS * scale * np.exp(rng.normal(0.0, cv, n))


# ---------------------------------------------------------------------------
# median_ci
# ---------------------------------------------------------------------------


def test_median_ci_uses_binomial_order_statistics() -> None:
    samples = np.arange(1.0, 11.0)[::-1]  # unsorted on purpose
    assert median_ci(samples) == (5.5, 2.0, 9.0)  # n = 10 at 95 %: x(2), x(9), coverage 97.9 %
    median, lo, hi = median_ci(np.arange(1.0, 101.0))
    assert (median, lo, hi) == (50.5, 40.0, 61.0)  # textbook ranks 40 and 61 for n = 100


def test_median_ci_small_samples() -> None:
    assert all(math.isnan(v) for v in median_ci([]))
    median, lo, hi = median_ci([3.0])
    assert median == 3.0 and math.isnan(lo) and math.isnan(hi)
    median, lo, hi = median_ci([1.0, 2.0])
    assert median == 1.5 and math.isnan(lo) and math.isnan(hi)
    assert median_ci([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 1.0, 5.0)  # 95 % not attainable: min, max
    assert median_ci([1.0, 2.0, 3.0, math.nan, math.inf]) == (2.0, 1.0, 3.0)  # non-finite dropped


# ---------------------------------------------------------------------------
# compare_samples
# ---------------------------------------------------------------------------


def test_ten_percent_step_at_two_percent_cv_is_regressed() -> None:
    rng = np.random.default_rng(11)
    result = compare_samples(lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02, scale=1.10))
    assert result.verdict == "regressed"
    assert 1.06 < result.ratio < 1.14
    assert 1.02 < result.ci_low <= result.ratio <= result.ci_high
    assert result.p_value < 0.01 and result.p_adjusted == result.p_value
    assert (result.n_base, result.n_head, result.more_samples_needed) == (10, 10, 0)


def test_improvement_is_detected() -> None:
    rng = np.random.default_rng(12)
    result = compare_samples(lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02, scale=0.90))
    assert result.verdict == "improved"
    assert result.ci_high < 0.98


def test_same_distribution_is_unchanged() -> None:
    rng = np.random.default_rng(13)
    result = compare_samples(lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02))
    assert result.verdict == "unchanged" and result.more_samples_needed == 0
    assert result.ci_low < 1.0 < result.ci_high
    # One series alone, untested for multiplicity: ~5 % of nulls reach p < 0.05 by chance, and then
    # (interval straddling the band edge) read "inconclusive" -- never "regressed" / "improved".
    pairs = {i: (lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02)) for i in range(100)}
    verdicts = [c.verdict for c in compare_each(pairs).values()]  # each == compare_samples on its own
    assert verdicts.count("unchanged") >= 90
    assert set(verdicts) <= {"unchanged", "inconclusive"}


def test_tiny_but_significant_shift_is_unchanged_when_ci_inside_band() -> None:
    rng = np.random.default_rng(14)
    result = compare_samples(lognormal(rng, 300, 0.01), lognormal(rng, 300, 0.01, scale=1.005))
    assert result.p_value < 0.05  # a real 0.5 % shift ...
    assert 0.98 <= result.ci_low and result.ci_high <= 1.02  # ... that is shown to be immaterial
    assert result.verdict == "unchanged"


def test_outliers_do_not_create_a_regression() -> None:
    rng = np.random.default_rng(15)
    base, head = lognormal(rng, 15, 0.02), lognormal(rng, 15, 0.02)
    head[:2] *= 10.0  # two pre-empted runs
    assert compare_samples(base, head).verdict == "unchanged"


def test_too_few_samples_is_inconclusive_with_count_needed() -> None:
    rng = np.random.default_rng(16)
    result = compare_samples(lognormal(rng, 3, 0.02), lognormal(rng, 3, 0.02, scale=1.2))
    assert result.verdict == "inconclusive"
    assert result.more_samples_needed >= 2  # at least up to min_samples = 5
    assert math.isnan(result.p_value) and math.isnan(result.ci_low)
    assert result.ratio > 1.1

    noisy = compare_samples(lognormal(rng, 4, 0.05), lognormal(rng, 4, 0.05))
    assert noisy.verdict == "inconclusive"
    assert noisy.more_samples_needed > 20  # power calculation on ~5 % noise wants ~77 per side

    single = compare_samples([1.0], [2.0])
    assert (single.verdict, single.more_samples_needed, single.ratio) == ("inconclusive", 4, 2.0)
    empty = compare_samples([], [math.nan, -1.0])
    assert empty.verdict == "inconclusive" and math.isnan(empty.ratio) and empty.n_head == 0


def test_significant_change_straddling_threshold_is_inconclusive() -> None:
    rng = np.random.default_rng(17)
    result = compare_samples(lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02, scale=1.03))
    assert result.p_value < 0.05
    assert result.ci_low < 1.02 < result.ci_high
    assert result.verdict == "inconclusive"
    assert 0 < result.more_samples_needed <= MAX_MORE_SAMPLES


def test_a_doubling_that_is_not_significant_is_inconclusive_not_unchanged() -> None:
    rng = np.random.default_rng(18)
    base, head = lognormal(rng, 6, 1.0), lognormal(rng, 6, 1.0)  # noise wider than a doubling
    head *= 3.0 / (np.median(head) / np.median(base))  # an observed x3
    result = compare_samples(base, head)
    assert result.p_value > 0.05 and result.ratio == pytest.approx(3.0)
    assert result.verdict == "inconclusive" and result.more_samples_needed > 0
    near = compare_samples(base, head / 2.0)  # x1.5 on the same noise: no evidence of a change
    assert near.verdict == "unchanged" and near.more_samples_needed == 0


def test_compare_is_deterministic_and_independent_of_the_grid() -> None:
    rng = np.random.default_rng(18)
    base, head = lognormal(rng, 10, 0.03), lognormal(rng, 10, 0.03, scale=1.05)
    alone = compare_samples(base, head)
    assert compare_samples(base, head) == alone
    others = {f"null{i}": (lognormal(rng, 10, 0.03), lognormal(rng, 10, 0.03)) for i in range(20)}
    in_grid = compare_grid({"target": (base, head), **others})["target"]
    assert (in_grid.ratio, in_grid.ci_low, in_grid.ci_high, in_grid.p_value) == (
        alone.ratio,
        alone.ci_low,
        alone.ci_high,
        alone.p_value,
    )


# ---------------------------------------------------------------------------
# compare_grid and Benjamini-Hochberg
# ---------------------------------------------------------------------------


def test_null_grid_of_300_series_has_almost_no_false_alarms() -> None:
    rng = np.random.default_rng(19)
    pairs = {}
    for i in range(300):
        cv = (0.01, 0.02, 0.05)[i % 3]
        pairs[i] = (lognormal(rng, 10, cv), lognormal(rng, 10, cv))
    results = compare_grid(pairs)
    flagged = [k for k, c in results.items() if c.verdict in ("regressed", "improved")]
    assert len(flagged) <= 0.05 * len(pairs)
    assert len(flagged) <= 1  # realistically zero


def test_grid_finds_a_lone_regression_among_500_series() -> None:
    rng = np.random.default_rng(20)
    pairs = {i: (lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02)) for i in range(499)}
    pairs["slow"] = (lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02, scale=1.15))
    results = compare_grid(pairs)
    assert results["slow"].verdict == "regressed"  # exact Mann-Whitney p ~ 1e-5 survives BH at M = 500
    assert sum(c.verdict == "regressed" for c in results.values()) == 1


def test_benjamini_hochberg_changes_a_decision() -> None:
    base = np.array([1.00, 1.01, 1.02, 0.99, 0.98]) * BASE_SECONDS
    head = base * 1.10  # complete separation with 5 + 5 samples: exact p = 2/252
    alone = compare_samples(base, head)
    assert alone.verdict == "regressed" and alone.p_value < 0.05

    rng = np.random.default_rng(21)
    pairs = {"slow": (base, head)}
    pairs.update({f"null{i}": (lognormal(rng, 5, 0.02), lognormal(rng, 5, 0.02)) for i in range(49)})
    in_grid = compare_grid(pairs)["slow"]
    assert in_grid.p_value == alone.p_value < 0.05
    assert in_grid.p_adjusted >= 0.05
    assert in_grid.verdict == "unchanged"


def test_apply_fdr_matches_scipy_and_skips_untested_series() -> None:
    rng = np.random.default_rng(22)
    pairs = {i: (lognormal(rng, 8, 0.02), lognormal(rng, 8, 0.02, scale=1.0 + 0.01 * i)) for i in range(6)}
    pairs["few"] = (lognormal(rng, 2, 0.02), lognormal(rng, 2, 0.02))
    results = compare_grid(pairs, broken={5})
    tested = list(range(5))
    expected = false_discovery_control([results[i].p_value for i in tested], method="bh")
    np.testing.assert_allclose([results[i].p_adjusted for i in tested], expected)
    assert results[5].verdict == "broken"
    assert results["few"].verdict == "inconclusive" and math.isnan(results["few"].p_adjusted)
    assert apply_fdr({}) == {}


def test_compare_each_is_unadjusted_and_apply_fdr_composes_to_compare_grid() -> None:
    rng = np.random.default_rng(34)
    pairs = {i: (lognormal(rng, 9, 0.02), lognormal(rng, 9, 0.02, scale=1.0 + 0.02 * (i % 4))) for i in range(12)}
    each = compare_each(pairs)
    assert all(each[k] == compare_samples(*pairs[k]) for k in pairs)
    grid = compare_grid(pairs)
    assert apply_fdr(each) == grid
    assert apply_fdr(grid) == grid  # reads only the raw p-values: idempotent


def test_500_series_are_fast() -> None:
    rng = np.random.default_rng(23)
    pairs = {i: (lognormal(rng, 10, 0.02), lognormal(rng, 12, 0.02)) for i in range(500)}
    start = time.perf_counter()
    compare_grid(pairs)
    assert time.perf_counter() - start < 3.0  # ~0.2 s on an idle core


# ---------------------------------------------------------------------------
# Correctness gating
# ---------------------------------------------------------------------------


def test_gate_turns_failed_correctness_into_broken() -> None:
    rng = np.random.default_rng(24)
    result = compare_samples(lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02, scale=1.2))
    assert gate(result, correctness_failed=False) is result
    broken = gate(result, correctness_failed=True)
    assert broken.verdict == "broken" and broken.more_samples_needed == 0
    assert broken.ratio == result.ratio  # evidence kept for reference, no verdict on it

    inconclusive = compare_samples([1.0], [1.0])
    assert gate(inconclusive, True).verdict == "broken"

    variant = variant_verdict(lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02, scale=0.8))
    assert variant.outcome == "win"
    assert gate(variant, True).outcome == "broken"
    assert "broken" in VERDICTS and "broken" in VARIANT_OUTCOMES


# ---------------------------------------------------------------------------
# Change points
# ---------------------------------------------------------------------------


def test_single_step_is_detected_at_the_right_commit() -> None:
    rng = np.random.default_rng(25)
    history = np.r_[lognormal(rng, 40, 0.01), lognormal(rng, 40, 0.01, scale=1.10)]
    (change,) = detect_change_points(history)
    assert change.kind == "step"
    assert change.index == change.end_index == 40
    assert 1.07 < change.ratio < 1.13
    assert change.after / change.before == pytest.approx(change.ratio)


def test_improvement_step_has_ratio_below_one() -> None:
    rng = np.random.default_rng(26)
    history = np.r_[lognormal(rng, 30, 0.02), lognormal(rng, 30, 0.02, scale=0.85)]
    (change,) = detect_change_points(history)
    assert change.kind == "step" and abs(change.index - 30) <= 1 and change.ratio < 0.9


def test_slow_drift_is_reported_as_one_drift() -> None:
    rng = np.random.default_rng(27)
    ramp = 1.01 ** np.clip(np.arange(80) - 30, 0, 20)  # 1 %/commit for 20 commits: +22 %
    history = lognormal(rng, 80, 0.01) * ramp
    (change,) = detect_change_points(history)
    assert change.kind == "drift"
    assert abs(change.index - 30) <= 4 and abs(change.end_index - 50) <= 4
    assert change.ratio > 1.10


def test_drift_still_going_at_the_newest_commit() -> None:
    rng = np.random.default_rng(28)
    history = lognormal(rng, 60, 0.01) * 1.01 ** np.clip(np.arange(60) - 40, 0, None)
    (change,) = detect_change_points(history)
    assert change.kind == "drift" and change.end_index == 59 and change.ratio > 1.1


def test_no_change_points_on_flat_noisy_histories() -> None:
    rng = np.random.default_rng(29)
    for n, cv in ((30, 0.02), (100, 0.03), (300, 0.01), (1000, 0.02)):
        assert detect_change_points(lognormal(rng, n, cv)) == []


def test_change_points_skip_missing_commits_and_keep_positions() -> None:
    rng = np.random.default_rng(30)
    history = np.r_[lognormal(rng, 20, 0.01), lognormal(rng, 20, 0.01, scale=1.2)].tolist()
    history[5] = math.nan
    history[25] = 0.0
    (change,) = detect_change_points(history)
    assert change.index == 20 and change.kind in CHANGE_KINDS
    assert detect_change_points([]) == [] and detect_change_points([1.0, 2.0]) == []
    assert detect_change_points([1.0] * 50) == []


def test_change_points_are_fast_for_1000_commits() -> None:
    rng = np.random.default_rng(31)
    history = lognormal(rng, 1000, 0.01) * np.repeat(rng.choice([1.0, 1.1, 0.9], 20), 50)
    start = time.perf_counter()
    changes = detect_change_points(history)
    assert time.perf_counter() - start < 3.0
    assert all(c.index % 50 == 0 for c in changes if c.kind == "step")


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------


def _verdict(outcome: str, ratio: float) -> VariantVerdict:
    return VariantVerdict(outcome, ratio, ratio - 0.02, ratio + 0.02, 1e-4, 1e-3, 10, 10, 0)  # type: ignore[arg-type]


def test_variant_verdict_outcomes() -> None:
    rng = np.random.default_rng(32)
    default = lognormal(rng, 10, 0.02)
    assert variant_verdict(default, lognormal(rng, 10, 0.02, scale=0.85)).outcome == "win"
    assert variant_verdict(default, lognormal(rng, 10, 0.02, scale=1.15)).outcome == "lose"
    tie = variant_verdict(default, lognormal(rng, 10, 0.02))
    assert tie.outcome == "tie" and tie.n_default == tie.n_variant == 10
    assert variant_verdict(default[:2], default[:2]).outcome == "inconclusive"


def test_divergent_variant_is_flagged_with_both_cells_evidence() -> None:
    rng = np.random.default_rng(33)
    default_m3, default_m4 = lognormal(rng, 10, 0.02), lognormal(rng, 10, 0.02)
    cells = variant_verdict_grid(
        {
            ("sdpa", (1, 8, 1024), "tile64", "M3"): (default_m3, lognormal(rng, 10, 0.02, scale=0.85)),
            ("sdpa", (1, 8, 1024), "tile64", "M4"): (default_m4, lognormal(rng, 10, 0.02, scale=1.20)),
            ("sdpa", (1, 8, 1024), "tile32", "M3"): (default_m3, lognormal(rng, 10, 0.02, scale=0.90)),
            ("sdpa", (1, 8, 1024), "tile32", "M4"): (default_m4, lognormal(rng, 10, 0.02, scale=0.92)),
        }
    )
    grid = {}
    for (kernel, shape, variant, chip), verdict in cells.items():
        grid.setdefault((kernel, shape, variant), {})[chip] = verdict
    (divergence,) = find_divergent(grid)
    assert isinstance(divergence, Divergence)
    assert (divergence.kernel, divergence.variant) == ("sdpa", "tile64")
    assert (divergence.winning_chip, divergence.losing_chip) == ("M3", "M4")
    assert divergence.win_evidence.outcome == "win" and divergence.win_evidence.ci_high < 1.0
    assert divergence.lose_evidence.outcome == "lose" and divergence.lose_evidence.ci_low > 1.0
    assert divergence.win_evidence is grid[("sdpa", (1, 8, 1024), "tile64")]["M3"]

    best = best_variants(grid)
    assert best[("sdpa", (1, 8, 1024), "M3")] == "tile64"  # fastest significant win
    assert best[("sdpa", (1, 8, 1024), "M4")] == "tile32"


def test_best_variant_needs_a_significant_win() -> None:
    verdicts = {"a": _verdict("tie", 0.97), "b": _verdict("win", 0.90), "c": _verdict("win", 0.85)}
    assert best_variant(verdicts) == "c"
    assert best_variant({"a": _verdict("tie", 0.9), "b": _verdict("lose", 1.2)}) == "default"
    assert best_variant({"x": _verdict("broken", 0.5)}, default="ref") == "ref"
    assert best_variant({}) == "default"


def test_tuning_drift_lists_changed_best_variants() -> None:
    before = {("gemm", "4096", "M3"): "tile64", ("gemm", "4096", "M4"): "tile32", ("gemv", "1", "M3"): "default"}
    after = {("gemm", "4096", "M3"): "tile64", ("gemm", "4096", "M4"): "tile128", ("new", "1", "M3"): "x"}
    assert tuning_drift(before, after) == [TuningChange(("gemm", "4096", "M4"), "tile32", "tile128")]
    assert tuning_drift(before, before) == []


# ---------------------------------------------------------------------------
# Property test
# ---------------------------------------------------------------------------

positive_finite = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    base=st.lists(positive_finite, min_size=1, max_size=30),
    head=st.lists(positive_finite, min_size=1, max_size=30),
)
def test_compare_samples_never_raises_on_positive_finite_input(base: list[float], head: list[float]) -> None:
    result = compare_samples(base, head, n_boot=200)
    assert isinstance(result, Comparison)
    assert result.verdict in VERDICTS
    assert result.n_base == len(base) and result.n_head == len(head)
    assert result.more_samples_needed >= 0
    assert (result.more_samples_needed > 0) == (result.verdict == "inconclusive")
    assert dataclasses.replace(result) == result
