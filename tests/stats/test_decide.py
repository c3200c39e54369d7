"""Tests for harness.stats.decide: the decision rules, first match wins (docs/statistics.md, section 5)."""

from __future__ import annotations

import math

import numpy as np

from harness.stats.decide import benjamini_hochberg, decide
from harness.stats.policy import VERDICTS, Policy

POLICY = Policy()  # min effect 2 %, alpha 0.05, largest unchanged x2


def test_a_flag_needs_significance_and_the_whole_interval_beyond_the_band() -> None:
    assert decide(1.10, 1.05, 1.15, 0.01, POLICY) == "regressed"
    assert decide(0.90, 0.85, 0.95, 0.01, POLICY) == "improved"
    assert decide(1.03, 1.01, 1.05, 0.01, POLICY) == "inconclusive"  # significant, straddles the band's edge
    assert decide(1.10, 1.05, 1.15, 0.06, POLICY) == "inconclusive"  # beyond the band, not surviving BH


def test_unchanged_is_the_interval_inside_the_band_or_no_evidence_of_a_change() -> None:
    assert decide(1.005, 0.99, 1.01, 0.001, POLICY) == "unchanged"  # significant but immaterial
    assert decide(1.01, 0.95, 1.08, 0.6, POLICY) == "unchanged"  # not significant, interval contains 1


def test_a_change_whose_own_interval_excludes_one_is_not_unchanged() -> None:
    """H200: a planted 5-15 % slowdown, CI [1.03, 1.30], p(BH) 0.06 -- "unchanged" would be wrong and sure of it."""
    assert decide(1.16, 1.03, 1.30, 0.06, POLICY) == "inconclusive"
    assert decide(0.86, 0.77, 0.97, 0.06, POLICY) == "inconclusive"


def test_a_doubling_is_never_unchanged() -> None:
    assert decide(2.5, 0.6, 9.0, 0.4, POLICY) == "inconclusive"
    assert decide(0.4, 0.1, 1.5, 0.4, POLICY) == "inconclusive"
    assert decide(1.5, 0.4, 5.0, 0.4, POLICY) == "unchanged"  # within x2 on the same noise: no evidence
    assert decide(2.5, 0.6, 9.0, 0.4, Policy(largest_unchanged=3.0)) == "unchanged"


def test_the_policy_sets_the_band_and_the_level() -> None:
    assert decide(1.04, 1.03, 1.05, 0.01, Policy(min_effect=0.05)) == "unchanged"
    assert decide(1.10, 1.05, 1.15, 0.04, Policy(alpha=0.01)) == "inconclusive"
    assert {decide(r, r * 0.9, r * 1.1, p, POLICY) for r in (0.5, 1.0, 1.5) for p in (0.01, 0.5)} <= set(VERDICTS)


def test_benjamini_hochberg_adjusts_the_family_only() -> None:
    p = np.array([0.01, 0.04, 0.03, math.nan])
    adjusted = benjamini_hochberg(p, np.array([True, True, False, False]))
    assert adjusted[:2].tolist() == [0.02, 0.04] and np.isnan(adjusted[2:]).all()
