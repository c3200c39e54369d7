"""The decision: a series' ratio, interval and adjusted p-value -> its verdict (docs/statistics.md, section 5)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.stats import distributions
from harness.stats.policy import Policy, Verdict

__all__ = ["Comparison", "TrialComparison", "as_broken", "as_incomparable", "band", "benjamini_hochberg", "decide",
           "distance_to_band", "inside_band"]


@dataclass(frozen=True)
class Comparison:
    """Head vs base of one series.  ``ratio`` = median(head) / median(base)."""

    verdict: Verdict
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_base: int
    n_head: int
    more_samples_needed: int


@dataclass(frozen=True)
class TrialComparison(Comparison):
    """Head vs base of one series from trials; the ``Comparison`` fields keep their meaning.

    ``ratio`` = exp(mean log trial median of head - that of base); ``n_base`` / ``n_head`` count valid
    samples, ``trials_base`` / ``trials_head`` valid trials.  ``basis`` says which spread decided
    (``trials``, ``history`` or ``none``), ``noise`` is that spread (log sd per trial or per run) and
    ``detectable`` the smallest relative change this comparison finds significant with 80 % power.
    """

    trials_base: int = 0
    trials_head: int = 0
    more_trials_needed: int = 0
    basis: str = ""
    noise: float = math.nan
    detectable: float = math.nan
    more_runs_needed: int = 0  # of the base, where trials cannot settle it: its between-run noise is unknown
    run_shift: float = math.nan  # held against the common shift of its run (ratio; nan: no other series to tell)


def band(min_effect: float) -> tuple[float, float]:
    """The ratios of an immaterial change, [1 / (1 + m), 1 + m]: symmetric in log, so swapping the sides mirrors
    every verdict (with [1 - m, 1 + m], a head 5.5 % slower was "regressed" and, swapped, 5.2 % faster and
    "inconclusive")."""
    return 1.0 / (1.0 + min_effect), 1.0 + min_effect


def distance_to_band(effect: float, min_effect: float) -> float:
    """How far a log ratio lies from the nearer edge of the band (``band``), in log units: what an interval's half
    width must drop below to clear it."""
    edge = math.log1p(min_effect)
    return min(abs(effect - edge), abs(effect + edge))


def inside_band(ci_low: float, ci_high: float, min_effect: float) -> bool:
    """The whole interval within the band (``band``): any change is immaterial."""
    low, high = band(min_effect)
    return low <= ci_low and ci_high <= high


def decide(ratio: float, ci_low: float, ci_high: float, p_adjusted: float, policy: Policy) -> Verdict:
    """The verdict of a tested series, first match wins: significant (``p_adjusted < alpha``) with the whole interval
    beyond the band (``band``) -> regressed / improved; the interval inside the band -> unchanged; not significant,
    an interval that contains 1 and an observed ratio within [1 / largest_unchanged, largest_unchanged] ->
    unchanged; else inconclusive. A change whose own interval excludes 1 and leaves the band but does not survive BH is
    inconclusive, not unchanged (H200: a planted 5-15 % slowdown, CI [1.03, 1.30], p(BH) 0.06); so is an observed
    doubling or halving (in CI, code doing 8x the work came out "unchanged" against a floor of 3 loaded runs)."""
    significant = p_adjusted < policy.alpha
    low, high = band(policy.min_effect)
    if significant and ci_low > high:
        return "regressed"
    if significant and ci_high < low:
        return "improved"
    if inside_band(ci_low, ci_high, policy.min_effect):
        return "unchanged"
    shows_a_change = ci_low > 1.0 or ci_high < 1.0
    largest = policy.largest_unchanged
    if not significant and not shows_a_change and 1.0 / largest <= ratio <= largest:
        return "unchanged"
    return "inconclusive"


def benjamini_hochberg(p_value: npt.NDArray[np.float64], in_family: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """Benjamini-Hochberg adjusted p-values of the series ``in_family`` (nan elsewhere)."""
    adjusted = np.full(p_value.shape, math.nan)
    if in_family.any():
        adjusted[in_family] = distributions.bh(p_value[in_family])
    return adjusted


def as_broken(comparison: TrialComparison) -> TrialComparison:
    """A series whose kernel failed a correctness job on the head: verdict ``broken``, nothing more to measure."""
    return dataclasses.replace(
        comparison, verdict="broken", p_adjusted=comparison.p_value, more_samples_needed=0, more_trials_needed=0
    )


def as_incomparable(comparison: TrialComparison) -> TrialComparison:
    """A series whose sides were not timed alike: ``inconclusive`` on basis ``incomparable``, whatever its ratio (no
    amount of trials settles it)."""
    return dataclasses.replace(
        comparison, verdict="inconclusive", p_adjusted=comparison.p_value, more_samples_needed=0,
        more_trials_needed=0, basis="incomparable"
    )
