"""harness.stats.paired: settling rounds decided on ABBA pairs of trials (docs/statistics.md, section 6)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.stats import paired, trials
from harness.stats.settling import excludes_a_real_change
from testkit.load import abba_session


def _trial(rng: np.random.Generator, level: float) -> np.ndarray:
    return level * np.exp(rng.normal(0.0, 0.02, 10))


def _session(rng: np.random.Generator, rounds: int, effect: float, busy: float, stay: float) -> list[paired.Pair]:
    return abba_session(rng, rounds, effect=effect, busy=busy, stay=stay, within=0.02)


def test_min_pairs_is_the_fewest_whose_perfect_agreement_passes_the_signed_rank_test():
    assert paired.min_pairs(0.05) == 6 and paired.min_pairs(0.025) == 7 and paired.min_pairs(0.005) == 9
    for alpha in (0.05, 0.025, 0.005):
        n = paired.min_pairs(alpha)
        assert paired.signed_rank_p(np.full(n, 0.1) + np.arange(n) * 1e-3) <= alpha
        assert paired.signed_rank_p(np.full(n - 1, 0.1) + np.arange(n - 1) * 1e-3) > alpha


def test_a_doubling_is_regressed_and_its_pairs_counted():
    rng = np.random.default_rng(0)
    pairs = [(_trial(rng, 1.0), _trial(rng, 2.0)) for _ in range(9)]
    (result,) = paired.compare_paired({"k": pairs}, alpha=0.005).values()
    assert result.verdict == "regressed" and result.basis == "pairs"
    assert result.trials_base == result.trials_head == 9 and result.n_base == result.n_head == 90
    assert 1.9 < result.ci_low < result.ratio < result.ci_high < 2.1


def test_a_flag_needs_the_signs_to_agree_not_only_the_mean():
    """Six pairs: a t interval beyond the band, but six agreeing signs cannot pass the signed-rank test at 0.025."""
    pairs = [(np.array([1.0]), np.array([v])) for v in (1.50, 1.52, 1.54, 1.56, 1.58, 1.60)]
    (result,) = paired.compare_paired({"k": pairs}, alpha=0.025).values()
    assert result.verdict == "inconclusive" and result.more_trials_needed == 1
    assert result.ci_low > 1.05  # the t interval alone would have flagged it
    (seven,) = paired.compare_paired({"k": [*pairs, (np.array([1.0]), np.array([1.55]))]}, alpha=0.025).values()
    assert seven.verdict == "regressed"


def test_load_that_hits_both_trials_of_a_pair_cancels():
    """Load on for whole rounds (both trials of a pair alike): the pairs settle identical code as unchanged within
    25 % and find a 10 % slowdown, where pooling every trial of a side (the unpaired test) decides neither."""
    rng = np.random.default_rng(3)
    levels = rng.choice([1.0, 2.5], size=14)
    null = [(_trial(rng, level), _trial(rng, level)) for level in levels]
    slower = [(_trial(rng, level), _trial(rng, 1.1 * level)) for level in levels]
    decided = paired.compare_paired({"null": null, "slower": slower}, alpha=0.0025)
    assert decided["null"].verdict == "unchanged"
    assert excludes_a_real_change(decided["null"].ci_low, decided["null"].ci_high)
    assert decided["slower"].verdict == "regressed"
    pooled = trials.compare_trials({key: ([b for b, _ in p], [h for _, h in p])
                                    for key, p in (("null", null), ("slower", slower))},
                                   same_session=True, alpha=0.0025)
    assert pooled["slower"].verdict != "regressed"
    assert not excludes_a_real_change(pooled["null"].ci_low, pooled["null"].ci_high)


@pytest.mark.parametrize(("busy", "stay"), [(1.8, 0.0), (3.0, 0.0), (3.0, 0.7)])
def test_identical_code_under_random_load_is_flagged_at_most_at_the_level(busy: float, stay: float):
    """600 sessions of 9 pairs of identical code under load switching on and off at random (independent from trial
    to trial, or lasting): flags at most at the level (0.005), plus sampling error."""
    rng = np.random.default_rng(int(busy * 10 + stay * 100))
    flagged = sum(paired.compare_paired({"k": _session(rng, 9, 1.0, busy, stay)}, alpha=0.005)["k"].verdict
                  in ("regressed", "improved") for _ in range(600))
    assert flagged <= 0.005 * 600 + 3


def test_trials_without_a_valid_sample_leave_their_pair_out_and_one_pair_decides_nothing():
    pairs = [(np.array([1.0]), np.array([np.nan])), (np.array([1.0, 1.1]), np.array([2.0, 2.1]))]
    (result,) = paired.compare_paired({"k": pairs}).values()
    assert result.verdict == "inconclusive" and result.basis == "none" and result.trials_base == 1
    assert result.more_trials_needed == paired.min_pairs(0.05) - 1


def test_broken_and_incomparable_stay_out_of_the_family():
    rng = np.random.default_rng(1)
    pairs = [(_trial(rng, 1.0), _trial(rng, 2.0)) for _ in range(9)]
    decided = paired.compare_paired({"a": pairs, "b": pairs, "c": pairs}, alpha=0.005, broken={"a"},
                                    incomparable={"b"})
    assert decided["a"].verdict == "broken" and decided["b"].basis == "incomparable"
    assert decided["b"].verdict == "inconclusive" and decided["c"].verdict == "regressed"


def test_the_pairs_spread_is_moderated_across_the_series_of_a_round():
    """Six series of 4 pairs each: each borrows the others' spread (empirical Bayes, as for trials), so the interval
    of each is narrower than that series' own 3-df interval alone."""
    rng = np.random.default_rng(11)
    family = {i: [(_trial(rng, 1.0) * np.exp(rng.normal(0, 0.05)), _trial(rng, 1.0) * np.exp(rng.normal(0, 0.05)))
                  for _ in range(4)] for i in range(6)}
    together = paired.compare_paired(family, alpha=0.005)
    for key, pairs in family.items():
        (alone,) = paired.compare_paired({key: pairs}, alpha=0.005).values()
        assert together[key].ci_high / together[key].ci_low < alone.ci_high / alone.ci_low
        assert together[key].verdict == "unchanged"
