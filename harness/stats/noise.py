"""The noise meter: one series' noise within a trial, between trials and between runs, and the change it could detect
against itself (docs/statistics.md, section 10)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.stats import distributions
from harness.stats.measure import POWER, Trials, valid_trials
from harness.stats.policy import DEFAULT_ALPHA, NOISE_FLOOR
from harness.stats.runshift import Floor
from harness.stats.samples import log_spread, relative_change

__all__ = ["NoiseMeter", "detectable_against_itself", "noise_meter"]


@dataclass(frozen=True)
class NoiseMeter:
    """One series' noise at each level, in log sd (~ relative sd)."""

    within: float  # pooled robust sd of log samples inside a trial
    between_trial: float  # sd of log trial medians
    between_run: float  # the history floor's sd
    trials: int
    detectable: float  # smallest relative change detectable against itself at this many trials per side



def detectable_against_itself(between_trial: float, trials: int, floor: Floor | None, alpha: float) -> float:
    """As ``compare_trials``' detectable, for this series against itself: ``trials`` per side, one run each."""
    trial_term = between_trial**2 * 2.0 / trials if trials >= 2 and math.isfinite(between_trial) else math.nan
    if floor is not None and not trial_term >= 2.0 * floor.sd**2:
        variance, df = 2.0 * floor.sd**2, max(1.0, floor.runs - 1.0)
    elif math.isfinite(trial_term):
        variance, df = trial_term, 2.0 * (trials - 1)
    else:
        return math.nan
    quantile = float(distributions.t_ppf(1.0 - alpha / 2.0, df)) + float(distributions.norm_ppf(POWER))
    return relative_change(quantile * math.sqrt(variance))


def noise_meter(trials: Trials, floor: Floor | None = None, *, alpha: float = DEFAULT_ALPHA) -> NoiseMeter:
    """One series' noise within a trial, between trials and between runs, and what it could detect.

    ``detectable`` compares the series with itself at its trial count per side, one run each (the floor,
    when given, bounds it from below as in ``compare_trials``).
    """
    kept = valid_trials(trials)
    within = log_spread(*kept) if kept else math.nan
    logs = np.log(np.array([np.median(trial) for trial in kept], dtype=np.float64))
    between_trial = max(float(np.std(logs, ddof=1)), NOISE_FLOOR) if logs.size >= 2 else math.nan
    between_run = floor.sd if floor is not None else math.nan
    detectable = detectable_against_itself(between_trial, logs.size, floor, alpha)
    return NoiseMeter(within, between_trial, between_run, int(logs.size), detectable)
