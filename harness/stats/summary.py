"""The stored summary of a benchmark's raw samples: median, its order-statistic CI, and the relative spread.

Computed where results are recorded, with numpy alone (no scipy). The interval's rule: docs/statistics.md,
section 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.stats.samples import median_ci as stats_median_ci


@dataclass(frozen=True)
class Summary:
    """Median with a distribution-free confidence interval, and the relative spread."""

    median: float
    ci_low: float
    ci_high: float
    iqr_rel: float
    n: int


def sorted_medians(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The median of each run ``values[start:start + size]`` of sorted values (size >= 1), as ``np.median``
    computes it: the middle value, or the mean of the two middle ones."""
    return (values[starts + (sizes - 1) // 2] + values[starts + sizes // 2]) / 2.0


def median_ci(samples: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Median and the order-statistic CI of ``harness.stats.samples.median_ci`` (the one the verdicts use).

    Stored with every result, so it never raises for a short run: with fewer than 3 samples there is no
    useful interval and the bounds are min and max; no samples at all is an error.
    """
    values = np.sort(np.asarray(samples, dtype=float))
    if values.size == 0:
        raise ValueError("no samples")
    if values.size < 3:
        return float(np.median(values)), float(values[0]), float(values[-1])
    return stats_median_ci(values, confidence)


def summarize(samples: list[float]) -> Summary:
    median, lo, hi = median_ci(samples)
    q75, q25 = np.percentile(samples, [75, 25])
    return Summary(median, lo, hi, float((q75 - q25) / median) if median > 0 else 0.0, len(samples))
