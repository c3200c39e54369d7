"""Tests for harness.stats.variants: divergent variants, the best variant per chip, tuning drift."""

from __future__ import annotations

from harness.stats.decide import Comparison
from harness.stats.policy import VARIANT_OUTCOMES
from harness.stats.variants import (
    Divergence,
    TuningChange,
    VariantVerdict,
    as_variant_verdict,
    best_variant,
    best_variants,
    find_divergent,
    tuning_drift,
)


def _verdict(outcome: str, ratio: float) -> VariantVerdict:
    return VariantVerdict(outcome, ratio, ratio - 0.02, ratio + 0.02, 1e-4, 1e-3, 10, 10, 0)  # type: ignore[arg-type]


def test_a_comparison_maps_to_a_variant_outcome() -> None:
    for verdict, outcome in (("regressed", "lose"), ("improved", "win"), ("unchanged", "tie"),
                             ("inconclusive", "inconclusive"), ("broken", "broken")):
        comparison = Comparison(verdict, 0.9, 0.85, 0.95, 1e-4, 1e-3, 10, 12, 0)  # type: ignore[arg-type]
        variant = as_variant_verdict(comparison)
        assert variant.outcome == outcome and outcome in VARIANT_OUTCOMES
        assert (variant.ratio, variant.ci_low, variant.ci_high, variant.n_default, variant.n_variant) == (
            0.9, 0.85, 0.95, 10, 12)


def test_divergent_variant_is_flagged_with_both_cells_evidence() -> None:
    grid = {
        ("sdpa", (1, 8, 1024), "tile64"): {"M3": _verdict("win", 0.85), "M4": _verdict("lose", 1.20)},
        ("sdpa", (1, 8, 1024), "tile32"): {"M3": _verdict("win", 0.90), "M4": _verdict("win", 0.92)},
    }
    (divergence,) = find_divergent(grid)
    assert isinstance(divergence, Divergence)
    assert (divergence.kernel, divergence.variant) == ("sdpa", "tile64")
    assert (divergence.winning_chip, divergence.losing_chip) == ("M3", "M4")
    assert divergence.win_evidence is grid[("sdpa", (1, 8, 1024), "tile64")]["M3"]
    assert divergence.lose_evidence is grid[("sdpa", (1, 8, 1024), "tile64")]["M4"]

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
