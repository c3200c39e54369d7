"""The thresholds every verdict is decided with, in one object (docs/statistics.md, section 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.core import defaults

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MIN_EFFECT",
    "FLOOR_MIN_RUNS",
    "MAD_TO_SIGMA",
    "MAX_MORE_TRIALS",
    "MIN_SERIES_TO_MODERATE",
    "NOISE_FLOOR",
    "SETTLED_WITHIN",
    "SETTLE_SHARE",
    "VARIANT_OUTCOMES",
    "VERDICTS",
    "Policy",
    "VariantOutcome",
    "Verdict",
]

Verdict = Literal["regressed", "improved", "unchanged", "inconclusive", "broken"]
VariantOutcome = Literal["win", "lose", "tie", "inconclusive", "broken"]

VERDICTS: tuple[Verdict, ...] = ("regressed", "improved", "unchanged", "inconclusive", "broken")
VARIANT_OUTCOMES: tuple[VariantOutcome, ...] = ("win", "lose", "tie", "inconclusive", "broken")

DEFAULT_MIN_EFFECT = defaults.MIN_EFFECT
DEFAULT_ALPHA = defaults.ALPHA
MAX_MORE_TRIALS = 100  # "more trials needed" is capped here: not resolvable in practice
FLOOR_MIN_RUNS = 3  # history_floor: fewer runs on the base branch give no floor
MIN_SERIES_TO_MODERATE = 3  # series of a call with their own spread needed for a moderation prior
MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD of a normal sample -> its standard deviation
NOISE_FLOOR = 1e-4  # log units (0.01 %): no timing history is more precise than this
# A settled "unchanged" must exclude a change of 25 %: rule 5 calls a series unchanged when its interval merely
# contains 1, and under load (2 cores, load 15) 4 + 4 interleaved trials of a real 2x slowdown came out "unchanged"
# x1.46 on an interval that contains 1; a settle round more tells them apart.
SETTLED_WITHIN = 0.25
# Settling spends a fifth of alpha over all its looks (settling.look_alpha): a gate that re-measures until it decides
# gets a fresh chance to be wrong at every look, and a false "regressed" fails a pull request. Spending all of alpha,
# identical code came out "improved" x0.754 in one of two tries of a CI run under load.
SETTLE_SHARE = 0.2


@dataclass(frozen=True)
class Policy:
    """What a verdict needs: ``min_effect`` (the band [1 - m, 1 + m] a flag's interval must leave), ``alpha`` (the
    false discovery rate, or one test's level), ``largest_unchanged`` (an observed ratio beyond it, or below its
    inverse, is never ``unchanged``), ``floor_min_runs`` (base-branch runs a history floor needs) and
    ``settled_within`` (a settled ``unchanged`` stands only on an interval within [1 / (1 + w), 1 + w]) and
    ``settle_share`` (the part of alpha that settling's looks spend in all)."""

    min_effect: float = DEFAULT_MIN_EFFECT
    alpha: float = DEFAULT_ALPHA
    largest_unchanged: float = defaults.LARGEST_UNCHANGED
    floor_min_runs: int = FLOOR_MIN_RUNS
    settled_within: float = SETTLED_WITHIN
    settle_share: float = SETTLE_SHARE
