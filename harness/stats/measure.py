"""Per-series trial measurements: each trial's log median, the pooled between-trial spread, the standard error (trials
or history floor) and the t test (docs/statistics.md, sections 1, 3 and 5)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.stats import distributions
from harness.stats.samples import Samples, positive_finite

__all__ = ["POWER", "Measured", "Spread", "Tested", "Trials", "concat_measured", "measure", "spread_of", "t_test",
           "valid_trials"]

Trials = Sequence[Samples]  # one inner sequence of raw samples (seconds per call) per trial (process)
POWER = 0.8  # "detectable": the change found significant with this power


def valid_trials(trials: Trials) -> list[npt.NDArray[np.float64]]:
    kept = [positive_finite(trial) for trial in trials]
    return [trial for trial in kept if trial.size]


@dataclass(frozen=True)
class Measured:
    """Per-series arrays (one entry per series, in call order): what ``measure`` takes of each pair's trials, all a
    comparison reads of them (``compare_measured``)."""

    trials_base: npt.NDArray[np.int64]
    trials_head: npt.NDArray[np.int64]
    samples_base: npt.NDArray[np.int64]
    samples_head: npt.NDArray[np.int64]
    effect: npt.NDArray[np.float64]  # d = mean log head - mean log base (nan if a side has no trial)
    variance: npt.NDArray[np.float64]  # pooled between-trial variance s^2 (nan when df == 0)
    df: npt.NDArray[np.int64]
    # per series: (base, head) trial values, for the rank check (not kept by vectorised screens that never decide)
    logs: Sequence[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = ()


def _squared_deviations(logs: npt.NDArray[np.float64]) -> float:
    return float(np.sum((logs - logs.mean()) ** 2)) if logs.size else 0.0


def _batch_log_medians(sides: Sequence[Trials]) -> list[tuple[npt.NDArray[np.float64], int]]:
    """Per side: the log median of every valid trial, and the number of valid samples in them. The trials are
    grouped by length, one median per group (a grid's thousands of small per-trial medians cost more in numpy's call
    overhead than in the work)."""
    kept = [valid_trials(side) for side in sides]
    flat = [trial for side in kept for trial in side]
    medians = np.empty(len(flat))
    by_length: dict[int, list[int]] = {}
    for index, trial in enumerate(flat):
        by_length.setdefault(trial.size, []).append(index)
    for indices in by_length.values():  # valid trials are never empty
        medians[indices] = np.median(np.stack([flat[i] for i in indices]), axis=1)
    logs = np.log(medians)
    out, start = [], 0
    for side in kept:
        out.append((logs[start:start + len(side)], sum(trial.size for trial in side)))
        start += len(side)
    return out


def concat_measured(parts: Sequence[Measured]) -> Measured:
    """The series of ``parts``, in order, as one ``Measured`` (each part's series measured alone: the same values)."""
    def joined(name: str, dtype: type) -> npt.NDArray[Any]:
        return np.concatenate([getattr(part, name) for part in parts]) if parts else np.zeros(0, dtype=dtype)

    return Measured(trials_base=joined("trials_base", np.int64), trials_head=joined("trials_head", np.int64),
                    samples_base=joined("samples_base", np.int64), samples_head=joined("samples_head", np.int64),
                    effect=joined("effect", np.float64), variance=joined("variance", np.float64),
                    df=joined("df", np.int64), logs=[pair for part in parts for pair in part.logs])


def measure(pairs: Sequence[tuple[Trials, Trials]]) -> Measured:
    """Each (base, head) pair's valid trials: their log medians, counts and pooled spread."""
    measured = _batch_log_medians([side for pair in pairs for side in pair])
    sides = list(zip(measured[0::2], measured[1::2], strict=True))
    trials_base = np.array([b[0].size for b, _ in sides], dtype=np.int64)
    trials_head = np.array([h[0].size for _, h in sides], dtype=np.int64)
    with np.errstate(invalid="ignore"):
        effect = np.array(
            [h[0].mean() - b[0].mean() if b[0].size and h[0].size else math.nan for b, h in sides], dtype=np.float64
        )
        df = np.maximum(trials_base - 1, 0) + np.maximum(trials_head - 1, 0)
        squares = np.array([_squared_deviations(b[0]) + _squared_deviations(h[0]) for b, h in sides])
        variance = np.where(df > 0, squares / np.maximum(df, 1), math.nan)
    return Measured(
        trials_base=trials_base,
        trials_head=trials_head,
        samples_base=np.array([b[1] for b, _ in sides], dtype=np.int64),
        samples_head=np.array([h[1] for _, h in sides], dtype=np.int64),
        effect=effect,
        variance=variance,
        df=df,
        logs=[(b[0], h[0]) for b, h in sides],
    )




@dataclass(frozen=True)
class Spread:
    se: npt.NDArray[np.float64]  # nan where untested
    df: npt.NDArray[np.float64]
    noise: npt.NDArray[np.float64]
    basis: list[str]
    floor_variance: npt.NDArray[np.float64]  # the floor term of SE^2 (0 without a floor)
    floor_df: npt.NDArray[np.float64]




def spread_of(
    measured: Measured,
    variance: npt.NDArray[np.float64],
    total_df: npt.NDArray[np.float64],
    floor_term: npt.NDArray[np.float64],
    floor_df: npt.NDArray[np.float64],
    floor_sd: npt.NDArray[np.float64],
) -> Spread:
    with np.errstate(invalid="ignore", divide="ignore"):
        trial_term = variance * (1.0 / measured.trials_base + 1.0 / measured.trials_head)
    has_sides = np.isfinite(measured.effect)
    by_floor = has_sides & (floor_term > 0) & ~(trial_term >= floor_term)  # a nan trial term loses
    by_trials = has_sides & ~by_floor & np.isfinite(trial_term)
    se = np.where(by_floor, np.sqrt(floor_term), np.where(by_trials, np.sqrt(trial_term), math.nan))
    df = np.where(by_floor, floor_df, np.where(by_trials, total_df, math.nan))
    noise = np.where(by_floor, floor_sd, np.where(by_trials, np.sqrt(variance), math.nan))
    basis = ["history" if f else "trials" if t else "none" for f, t in zip(by_floor, by_trials, strict=True)]
    return Spread(se, df, noise, basis, floor_term, floor_df)


# ---------------------------------------------------------------------------
# Test, interval, detectable change
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tested:
    p_value: npt.NDArray[np.float64]
    ci_low: npt.NDArray[np.float64]
    ci_high: npt.NDArray[np.float64]
    detectable: npt.NDArray[np.float64]


def t_test(effect: npt.NDArray[np.float64], spread: Spread, alpha: float) -> Tested:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = np.where(spread.se > 0, effect / spread.se, math.nan)
        p_value = 2.0 * distributions.t_sf(np.abs(t), spread.df)
        quantile = distributions.t_ppf(1.0 - alpha / 2.0, spread.df)
        half = quantile * spread.se
        ci_low, ci_high = np.exp(effect - half), np.exp(effect + half)
        detectable = np.expm1((quantile + distributions.norm_ppf(POWER)) * spread.se)
    return Tested(p_value, ci_low, ci_high, detectable)



