"""Validate harness.core.stats against a naive threshold on synthetic timing data (not a test).

Noise model: lognormal samples, log-sd = CV, 10 samples per side.  Planted
slowdowns of 3, 5 and 10 % at CV 1, 2 and 5 %, 200 trials per cell.  Recall
is the fraction of trials called a regression.

Methods compared:

* naive>5%: flag a regression when median(head) / median(base) > 1.05 --
  the kind of fixed threshold many dashboards use;
* naive>2%: the same rule at our ``min_effect`` (2 %), i.e. same
  materiality, no statistics;
* stats, alone: ``compare_samples`` on the series by itself (a BH family of
  one; computed batched with ``compare_each``, which gives identical results);
* stats, in grid: the series placed among 499 null series of the same CV and
  decided with Benjamini-Hochberg across all 500 (``apply_fdr``) -- the worst
  case of a lone regression in a commit's grid.

False alarms: null grids of 500 series per noise level (same distribution
for base and head), counting any ``regressed`` or ``improved`` verdict (for
the naive rules: |ratio - 1| beyond the threshold, either direction).

Run: ``python scripts/validate_stats.py`` (about 10-20 s).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.core.stats import Comparison, apply_fdr, compare_each, compare_grid  # noqa: E402

SAMPLES_PER_SIDE = 10
TRIALS = 200
GRID_SIZE = 500
STEPS = (0.03, 0.05, 0.10)
NOISE_CVS = (0.01, 0.02, 0.05)
NAIVE_THRESHOLDS = (0.05, 0.02)


def draw(rng: np.random.Generator, cv: float, scale: float = 1.0) -> np.ndarray:
    return 1e-4 * scale * np.exp(rng.normal(0.0, cv, SAMPLES_PER_SIDE))


def draw_with_outliers(rng: np.random.Generator, cv: float) -> np.ndarray:
    samples = draw(rng, cv)
    samples[rng.random(SAMPLES_PER_SIDE) < 0.1] *= 1.5  # 10 % of runs pre-empted
    return samples


def median_ratio(base: np.ndarray, head: np.ndarray) -> float:
    return float(np.median(head) / np.median(base))


def null_grid(rng: np.random.Generator, cv: float, outliers: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    sample = draw_with_outliers if outliers else draw
    return {f"null{i}": (sample(rng, cv), sample(rng, cv)) for i in range(GRID_SIZE)}


def recall_table(rng: np.random.Generator) -> None:
    print(f"Recall of planted slowdowns ({SAMPLES_PER_SIDE} samples/side, {TRIALS} trials/cell, lognormal noise)")
    header = (
        f"{'step':>5} {'CV':>4} | {'naive>5%':>8} {'naive>2%':>8} | "
        f"{'stats alone':>11} {'stats grid':>10} | {'alone: inconcl.':>15} {'median more/side':>16}"
    )
    print(header)
    print("-" * len(header))
    for cv in NOISE_CVS:
        null_pool = compare_each(dict(list(null_grid(rng, cv).items())[: GRID_SIZE - 1]))
        for step in STEPS:
            trials = {trial: (draw(rng, cv), draw(rng, cv, scale=1.0 + step)) for trial in range(TRIALS)}
            ratios = np.array([median_ratio(base, head) for base, head in trials.values()])
            naive = {t: float(np.mean(ratios > 1.0 + t)) for t in NAIVE_THRESHOLDS}
            alone = compare_each(trials)  # each series a family of one
            alone_hits = sum(c.verdict == "regressed" for c in alone.values())
            inconclusive = [c.more_samples_needed for c in alone.values() if c.verdict == "inconclusive"]
            grid_hits = 0
            for comparison in alone.values():
                family: dict[str, Comparison] = {"planted": comparison, **null_pool}
                grid_hits += apply_fdr(family)["planted"].verdict == "regressed"
            more = f"{int(np.median(inconclusive))}" if inconclusive else "-"
            print(
                f"{step:>5.0%} {cv:>4.0%} | {naive[0.05]:>8.1%} {naive[0.02]:>8.1%} | "
                f"{alone_hits / TRIALS:>11.1%} {grid_hits / TRIALS:>10.1%} | "
                f"{len(inconclusive) / TRIALS:>15.1%} {more:>16}"
            )


def false_alarm_table(rng: np.random.Generator) -> None:
    print()
    print(f"False alarms on null grids ({GRID_SIZE} series each; any regressed/improved verdict)")
    header = f"{'noise':>22} | {'naive>5%':>8} {'naive>2%':>8} | {'stats alone':>11} {'stats grid (BH)':>15}"
    print(header)
    print("-" * len(header))
    cases = [(f"lognormal CV {cv:.0%}", cv, False) for cv in NOISE_CVS]
    cases.append(("CV 2% + 10% outliers", 0.02, True))
    total_series = total_grid_alarms = 0
    for label, cv, outliers in cases:
        pairs = null_grid(rng, cv, outliers)
        ratios = np.array([median_ratio(base, head) for base, head in pairs.values()])
        naive = {t: float(np.mean(np.abs(ratios - 1.0) > t)) for t in NAIVE_THRESHOLDS}
        flagged = ("regressed", "improved")
        alone = np.mean([c.verdict in flagged for c in compare_each(pairs).values()])
        grid_alarms = sum(c.verdict in flagged for c in compare_grid(pairs).values())
        total_series += len(pairs)
        total_grid_alarms += grid_alarms
        print(
            f"{label:>22} | {naive[0.05]:>8.1%} {naive[0.02]:>8.1%} | {alone:>11.1%} "
            f"{grid_alarms:>6d}/{len(pairs)} ({grid_alarms / len(pairs):.1%})"
        )
    print(f"{'all null series':>22} | stats grid (BH): {total_grid_alarms}/{total_series} false alarms")


def main() -> None:
    start = time.perf_counter()
    rng = np.random.default_rng(20240607)
    recall_table(rng)
    false_alarm_table(rng)
    print(f"\nruntime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
