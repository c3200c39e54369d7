"""Empirical-Bayes moderation of the series' between-trial variances across a comparison (limma's fitFDist, moment
method; docs/statistics.md, section 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.stats.measure import Measured
from harness.stats.policy import MIN_SERIES_TO_MODERATE, NOISE_FLOOR
from harness.stats.special import special

__all__ = ["NO_PRIOR", "Prior", "fit_prior", "moderate", "moderate_variances"]

_ZERO_VARIANCE_OFFSET = 1e-5  # limma: exactly-zero variances -> 1e-5 x the median variance


def _trigamma_inverse(value: float) -> float:
    """y with trigamma(y) = value (> 0), by limma's Newton iteration."""
    if value > 1e7:
        return 1.0 / math.sqrt(value)
    if value < 1e-6:
        return 1.0 / value
    y = 0.5 + 1.0 / value
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1.0 - tri / value) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


@dataclass(frozen=True)
class Prior:
    variance: float  # s0^2
    df: float  # d0; 0 = no moderation


NO_PRIOR = Prior(math.nan, 0.0)


def fit_prior(variance: npt.NDArray[np.float64], df: npt.NDArray[np.int64]) -> Prior:
    usable = (df >= 1) & np.isfinite(variance)
    if int(usable.sum()) < MIN_SERIES_TO_MODERATE:
        return NO_PRIOR
    s2, f = variance[usable], df[usable].astype(np.float64)
    middle = float(np.median(s2))
    s2 = np.maximum(s2, _ZERO_VARIANCE_OFFSET * middle if middle > 0 else NOISE_FLOOR**2)
    e = np.log(s2) - special.digamma(f / 2) + np.log(f / 2)
    excess = float(np.var(e, ddof=1) - np.mean(special.polygamma(1, f / 2)))
    most = float(f.sum())
    d0 = min(2.0 * _trigamma_inverse(excess), most) if excess > 0 else most
    s0_squared = math.exp(float(e.mean()) + float(special.digamma(d0 / 2)) - math.log(d0 / 2))
    return Prior(s0_squared, d0)


def moderate(measured: Measured, prior: Prior) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Posterior variance and its df; series with df == 0 keep nan (they do not get the prior)."""
    return moderate_variances(measured.variance, measured.df, prior)


def moderate_variances(variance: npt.NDArray[np.float64], df: npt.NDArray[np.int64],
                       prior: Prior) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``moderate`` of plain per-series variances and their df (the pairs' differences, ``harness.stats.paired``)."""
    own_df = df.astype(np.float64)
    if prior.df > 0:
        with np.errstate(invalid="ignore"):
            posterior = (prior.df * prior.variance + own_df * variance) / (prior.df + own_df)
        total_df = own_df + prior.df
    else:
        posterior, total_df = variance.copy(), own_df
    own = df >= 1
    posterior = np.where(own, np.maximum(posterior, NOISE_FLOOR**2), math.nan)
    return posterior, np.where(own, total_df, 0.0)

