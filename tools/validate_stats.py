"""Validate trial-level verdicts (harness.stats.trials) against other rules on real and synthetic noise (not a test).

Rules compared, each deciding regressed / improved / unchanged (/ inconclusive) per series:

* trials: ``compare_trials`` -- t-test on log trial medians, variances moderated across the grid, history
  floor where given, BH across the grid, stats' decision rules (see harness.stats.trials);
* old: ``compare_grid`` (this file) on the pooled samples of each side (Mann-Whitney + bootstrap, BH) -- the rule
  the harness used before trials;
* asv: airspeed velocity's ``asv compare`` rule (``_is_result_better`` with ``statistics.is_different``):
  flagged when median(head) / median(base) is beyond ``--asv-factor`` (default 1.1, either way) AND a
  two-sided Mann-Whitney test on the pooled samples gives p < ``--asv-p`` (asv's ``p_threshold``,
  default 0.002 -- asv's own default, stricter than 0.05).  asv uses the normal approximation above 20
  samples a side, we use scipy's exact test when there are no ties (<= 100 a side); no multiplicity control,
  as in asv;
* MWU: two-sided Mann-Whitney on the pooled samples at p < 0.05, direction from the ratio of medians,
  no multiplicity control and no materiality band -- a plain significance test.

Sections:

(a) real null runs on an H200 (shared/data/h200-null: three runs of one commit; each run is one trial,
    one process per job): null pairs of 2 runs against 1 (runs = (2, 1), for each choice of head run) and
    of 1 run against 1; recall with the head's samples multiplied by 1.05 and 1.10 (every series shifted);
(b) two-level synthetic noise: per series a between-trial log sd drawn lognormal with median 4.0 % and
    p90 12.9 % (as measured between runs on the H200; sd of log sd = ln(12.9/4.0)/z_0.9 = 0.91), plus
    lognormal within-trial noise 2.6 % on 10 samples, R = 3 trials a side, grids of ``--grid-size``
    series.  Null grids give the false alarms; step grids plant a step in 10 % of the series and report
    the fraction of those called regressed.  Protocol rows: the H200 default; a quiet protocol (between-trial
    sd median 0.5 %, as measured for pipelined timing on the H200, same dispersion); a 10-run history floor
    on the base branch (each history run measured like a side: the mean log median of R trials); and a run
    effect shared by the trials of one side (sd equal to the series' between-trial sd) without and with the
    floor -- the case floors exist for;
(c) this CPU machine: two real `harness run`s of the built-in benchmark sections, at a copy of this checkout and
    at an empty commit on top of it (identical kernels), optionally under a background load that switches on and
    off at random (``--cpu-load N``); `harness compare` of the two runs, and every rule on the same trials.

Run: ``python tools/validate_stats.py`` (about 25 s for (a) and (b), plus the two runs of (c): a few minutes;
``--skip-cpu`` leaves (c) out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.core import defaults  # noqa: E402
from harness.stats import decide, distributions, runshift, trials  # noqa: E402
from harness.stats.decide import Comparison  # noqa: E402
from harness.stats.policy import Verdict  # noqa: E402
from harness.stats.samples import Samples, log_spread, midpoint, positive_finite, safe_exp, sorted_median  # noqa: E402
from testkit.e2e import copy_checkout, git  # noqa: E402
from testkit.load import random_load  # noqa: E402
from testkit.suites import benchmark_sections  # noqa: E402

Array = npt.NDArray[np.float64]
TrialPair = tuple[list[Array], list[Array]]
Grid = dict[str, TrialPair]
Run = dict[str, Array]  # series key -> samples of one run
Case = tuple[Grid, "Context"]
FLAGGED = ("regressed", "improved")
METHODS = ("trials", "old", "asv", "MWU")

SAMPLES = 10
WITHIN_SD = 0.026
BETWEEN_MEDIAN, BETWEEN_P90 = 0.040, 0.129
QUIET_MEDIAN = 0.005
Z90 = 1.2815515655446004
HISTORY_RUNS = 10
PLANTED_FRACTION = 0.1
STEPS = (0.03, 0.05, 0.10)
SHIFTS = (1.05, 1.10)


# ---------------------------------------------------------------------------
# The old rule: Mann-Whitney + bootstrap of pooled samples, BH (the harness's rule before trials; kept here as a
# baseline, nothing in harness/ uses it)
# ---------------------------------------------------------------------------

OLD_N_BOOT = 2000  # bootstrap resamples for the ratio-of-medians interval
OLD_MIN_SAMPLES = 5  # fewer samples on a side: inconclusive
MAX_MORE_SAMPLES = 1000
K = TypeVar("K", bound=Hashable)
_EXACT_MWU_MAX_N = 100


def mann_whitney_pvalues(
    base_rows: npt.NDArray[np.float64], head_rows: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Two-sided Mann-Whitney p-value per row (rows: series of equal sizes).

    Exact null distribution for rows without ties and <= 100 samples per
    side, tie-corrected normal approximation otherwise, p = 1 when all values
    are equal; one vectorised scipy call per method.
    """
    pooled = np.sort(np.concatenate([base_rows, head_rows], axis=1), axis=1)
    constant = pooled[:, -1] == pooled[:, 0]
    has_ties = (np.diff(pooled, axis=1) == 0).any(axis=1)
    small = max(base_rows.shape[1], head_rows.shape[1]) <= _EXACT_MWU_MAX_N
    exact = ~constant & ~has_ties & small
    from scipy import stats as scipy_stats  # ~1 s to load: only when samples are tested

    p_values = np.ones(len(base_rows))
    for method, rows in (("exact", exact), ("asymptotic", ~constant & ~exact)):
        if rows.any():
            result = scipy_stats.mannwhitneyu(
                head_rows[rows], base_rows[rows], alternative="two-sided", method=method, axis=1
            )
            p_values[rows] = np.asarray(result.pvalue, dtype=np.float64)
    return np.where(np.isfinite(p_values), p_values, 1.0)


def _bootstrap_median_ranks(
    n: int, rng: np.random.Generator, n_boot: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Order-statistic positions of the median of ``n_boot`` resamples of size n.

    A resample is summarised by how often it draws each order statistic; its
    median is the order statistic at which the running count first reaches
    rank (n+1)//2 (and n//2+1, averaged, for even n).  The positions depend
    only on the draws, so one set serves every series with n samples:
    O(n_boot * n), no per-row sort.
    """
    draws = rng.integers(0, n, size=(n_boot, n))
    row_offsets = (np.arange(n_boot) * n)[:, None]
    counts = np.bincount((draws + row_offsets).ravel(), minlength=n_boot * n).reshape(n_boot, n)
    running = np.cumsum(counts, axis=1)
    lower = (running < (n + 1) // 2).sum(axis=1)
    upper = (running < n // 2 + 1).sum(axis=1)
    return lower, upper


def _bootstrap_log_ratio_ci(
    base_sorted: npt.NDArray[np.float64],
    head_sorted: npt.NDArray[np.float64],
    *,
    alpha: float,
    n_boot: int,
    seed: int,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Percentile CI of log(median head / median base) per row (rows: series of equal sizes)."""
    rng = np.random.default_rng(seed)
    head_lower, head_upper = _bootstrap_median_ranks(head_sorted.shape[1], rng, n_boot)
    base_lower, base_upper = _bootstrap_median_ranks(base_sorted.shape[1], rng, n_boot)
    head_medians = midpoint(head_sorted[:, head_lower], head_sorted[:, head_upper])
    base_medians = midpoint(base_sorted[:, base_lower], base_sorted[:, base_upper])
    log_ratios = np.log(head_medians) - np.log(base_medians)
    low, high = np.quantile(log_ratios, [alpha / 2.0, 1.0 - alpha / 2.0], axis=1)
    return low, high




def _clamp_more(count: float) -> int:
    if not math.isfinite(count):
        return MAX_MORE_SAMPLES
    return int(min(MAX_MORE_SAMPLES, max(1, math.ceil(count))))


def _more_samples_for_too_few(
    base: npt.NDArray[np.float64],
    head: npt.NDArray[np.float64],
    *,
    min_effect: float,
    alpha: float,
    min_samples: int,
) -> int:
    have = min(base.size, head.size)
    shortfall = min_samples - have
    sigma = log_spread(base, head)
    if not math.isfinite(sigma) or sigma <= 0:
        return _clamp_more(shortfall)
    z = distributions.norm_ppf(1.0 - alpha / 2.0)
    target = math.log1p(min_effect)
    with np.errstate(over="ignore"):
        needed_per_side = np.pi * np.square(z * sigma / target) if target > 0 else math.inf
    return _clamp_more(max(shortfall, float(needed_per_side) - have))


def _safe_log(value: float) -> float:
    """log that maps 0 (an underflowed ratio) to -inf instead of raising."""
    return math.log(value) if value > 0 else -math.inf


def _more_samples_to_clear_band(
    ratio: float, ci_low: float, ci_high: float, n_base: int, n_head: int, min_effect: float
) -> int:
    log_ratio = _safe_log(ratio)
    half_width = max(log_ratio - _safe_log(ci_low), _safe_log(ci_high) - log_ratio)
    edges = (math.log1p(min_effect), math.log1p(-min_effect) if min_effect < 1 else -math.inf)
    distance = min(abs(log_ratio - edge) for edge in edges)
    if not distance > 0:
        return MAX_MORE_SAMPLES
    effective_n = 2.0 / (1.0 / n_base + 1.0 / n_head)
    with np.errstate(over="ignore", invalid="ignore"):
        needed_per_side = float(effective_n * np.square(np.float64(half_width) / distance))
    return _clamp_more(needed_per_side - min(n_base, n_head))


def _decide(
    ratio: float,
    ci_low: float,
    ci_high: float,
    p_adjusted: float,
    n_base: int,
    n_head: int,
    *,
    min_effect: float,
    alpha: float,
) -> tuple[Verdict, int]:
    """Rules 2-6 of the module docstring (rule 1 is applied by the caller)."""
    significant = p_adjusted < alpha
    if significant and ci_low > 1.0 + min_effect:
        return "regressed", 0
    if significant and ci_high < 1.0 - min_effect:
        return "improved", 0
    if 1.0 - min_effect <= ci_low and ci_high <= 1.0 + min_effect:
        return "unchanged", 0
    if not significant and 1.0 / defaults.LARGEST_UNCHANGED <= ratio <= defaults.LARGEST_UNCHANGED:
        return "unchanged", 0
    return "inconclusive", _more_samples_to_clear_band(ratio, ci_low, ci_high, n_base, n_head, min_effect)


def _too_few_samples(
    base: npt.NDArray[np.float64],
    head: npt.NDArray[np.float64],
    *,
    min_effect: float,
    alpha: float,
    min_samples: int,
) -> Comparison:
    ratio = _median_ratio(base, head) if base.size and head.size else math.nan
    more = _more_samples_for_too_few(base, head, min_effect=min_effect, alpha=alpha, min_samples=min_samples)
    return Comparison("inconclusive", ratio, math.nan, math.nan, math.nan, math.nan, base.size, head.size, more)


def _median_ratio(base: npt.NDArray[np.float64], head: npt.NDArray[np.float64]) -> float:
    return safe_exp(math.log(sorted_median(np.sort(head))) - math.log(sorted_median(np.sort(base))))


def _compare_equal_sizes(
    base_rows: npt.NDArray[np.float64],
    head_rows: npt.NDArray[np.float64],
    *,
    min_effect: float,
    alpha: float,
    n_boot: int,
    seed: int,
) -> list[Comparison]:
    """Test and bootstrap every row at once; rows are series with the same (n_base, n_head)."""
    base_sorted, head_sorted = np.sort(base_rows, axis=1), np.sort(head_rows, axis=1)
    n_base, n_head = base_sorted.shape[1], head_sorted.shape[1]
    p_values = mann_whitney_pvalues(base_sorted, head_sorted)
    log_low, log_high = _bootstrap_log_ratio_ci(base_sorted, head_sorted, alpha=alpha, n_boot=n_boot, seed=seed)
    comparisons = []
    for row, p_value in enumerate(p_values.tolist()):
        ratio = _median_ratio(base_sorted[row], head_sorted[row])
        ci_low, ci_high = safe_exp(log_low[row]), safe_exp(log_high[row])
        verdict, more = _decide(ratio, ci_low, ci_high, p_value, n_base, n_head, min_effect=min_effect, alpha=alpha)
        comparisons.append(Comparison(verdict, ratio, ci_low, ci_high, p_value, p_value, n_base, n_head, more))
    return comparisons


def _compare_many(
    pairs: Sequence[tuple[Samples, Samples]],
    *,
    min_effect: float,
    alpha: float,
    n_boot: int,
    seed: int,
    min_samples: int,
) -> list[Comparison]:
    """Unadjusted comparisons (``p_adjusted == p_value``), batched by sample sizes.

    Every series draws its bootstrap resamples from ``default_rng(seed)``, so
    a series' interval depends only on its own data and ``seed``, never on
    which other series share the batch.
    """
    cleaned = [(positive_finite(base), positive_finite(head)) for base, head in pairs]
    results: list[Comparison | None] = [None] * len(cleaned)
    by_sizes: dict[tuple[int, int], list[int]] = {}
    for position, (base, head) in enumerate(cleaned):
        if min(base.size, head.size) < min_samples:
            results[position] = _too_few_samples(
                base, head, min_effect=min_effect, alpha=alpha, min_samples=min_samples
            )
        else:
            by_sizes.setdefault((base.size, head.size), []).append(position)
    for positions in by_sizes.values():
        base_rows = np.stack([cleaned[p][0] for p in positions])
        head_rows = np.stack([cleaned[p][1] for p in positions])
        batch = _compare_equal_sizes(base_rows, head_rows, min_effect=min_effect, alpha=alpha, n_boot=n_boot, seed=seed)
        for position, comparison in zip(positions, batch, strict=True):
            results[position] = comparison
    return [comparison for comparison in results if comparison is not None]




def _is_tested(comparison: Comparison) -> bool:
    return comparison.verdict != "broken" and math.isfinite(comparison.p_value)


def apply_fdr(
    comparisons: Mapping[K, Comparison],
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
) -> dict[K, Comparison]:
    """Benjamini-Hochberg-adjust the raw p-values of tested series and re-decide.

    Only ``p_value`` (raw) is read, so applying it twice gives the same
    result.  Untested series (too few samples, ``broken``) are returned
    unchanged and do not count towards the family size.
    """
    tested = [key for key, comparison in comparisons.items() if _is_tested(comparison)]
    adjusted: dict[K, float] = {}
    if tested:
        raw = np.array([comparisons[key].p_value for key in tested])
        adjusted = dict(zip(tested, distributions.bh(raw).tolist(), strict=True))
    result: dict[K, Comparison] = {}
    for key, c in comparisons.items():
        if key not in adjusted:
            result[key] = c
            continue
        p_adjusted = adjusted[key]
        verdict, more = _decide(
            c.ratio, c.ci_low, c.ci_high, p_adjusted, c.n_base, c.n_head, min_effect=min_effect, alpha=alpha
        )
        result[key] = Comparison(verdict, c.ratio, c.ci_low, c.ci_high, c.p_value, p_adjusted, c.n_base, c.n_head, more)
    return result


def compare_each(
    pairs: Mapping[K, tuple[Samples, Samples]],
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    n_boot: int = OLD_N_BOOT,
    seed: int = 0,
    min_samples: int = OLD_MIN_SAMPLES,
) -> dict[K, Comparison]:
    """``compare_samples`` on every ``key -> (base, head)``, batched, *without* multiplicity control.

    Each result equals ``compare_samples`` on that pair (a family of one).
    Meant for composing families by hand with ``apply_fdr``; for one commit's
    grid use ``compare_grid``.
    """
    keys = list(pairs)
    measured = _compare_many(
        [pairs[key] for key in keys],
        min_effect=min_effect,
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
        min_samples=min_samples,
    )
    return dict(zip(keys, measured, strict=True))


def compare_grid(
    pairs: Mapping[K, tuple[Samples, Samples]],
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    n_boot: int = OLD_N_BOOT,
    seed: int = 0,
    min_samples: int = OLD_MIN_SAMPLES,
    broken: Collection[K] = (),
) -> dict[K, Comparison]:
    """``compare_samples`` on every ``key -> (base, head)``, then BH across the grid.

    Every series uses the same ``seed``, so a series' interval does not depend
    on which other series share the grid.  Keys in ``broken`` get verdict
    ``broken`` and stay out of the BH family.
    """
    raw = compare_each(pairs, min_effect=min_effect, alpha=alpha, n_boot=n_boot, seed=seed, min_samples=min_samples)
    gated = {key: dataclasses.replace(c, verdict="broken", more_samples_needed=0) if key in broken else c
             for key, c in raw.items()}
    return apply_fdr(gated, min_effect=min_effect, alpha=alpha)



# ---------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    floors: dict[str, runshift.Floor] | None = None
    runs: dict[str, tuple[int, int]] | None = None
    separate_runs: bool = False  # the sides are separate runs, as `harness compare` of runs (trials.compare_trials)


def pooled(grid: Grid) -> dict[str, tuple[Array, Array]]:
    return {key: (np.concatenate(base), np.concatenate(head)) for key, (base, head) in grid.items()}


def mann_whitney(samples: Mapping[str, tuple[Array, Array]]) -> dict[str, float]:
    """Two-sided Mann-Whitney p per series, batched by sizes (stats' exact/asymptotic choice)."""
    by_sizes: dict[tuple[int, int], list[str]] = {}
    for key, (base, head) in samples.items():
        by_sizes.setdefault((base.size, head.size), []).append(key)
    p_values: dict[str, float] = {}
    for keys in by_sizes.values():
        base_rows = np.stack([samples[k][0] for k in keys])
        head_rows = np.stack([samples[k][1] for k in keys])
        p_values.update(zip(keys, mann_whitney_pvalues(base_rows, head_rows).tolist(), strict=True))
    return p_values


def direction(ratio: float, flagged: bool) -> str:
    if not flagged:
        return "unchanged"
    return "regressed" if ratio > 1 else "improved"


def compare(grid: Grid, context: Context) -> dict[str, decide.TrialComparison]:
    return trials.compare_trials(grid, floors=context.floors, runs=context.runs, separate_runs=context.separate_runs)


def rule_trials(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    return {key: c.verdict for key, c in compare(grid, context).items()}


def rule_old(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    return {key: c.verdict for key, c in compare_grid(pooled(grid)).items()}


def median_ratios(samples: Mapping[str, tuple[Array, Array]]) -> dict[str, float]:
    return {key: float(np.median(head) / np.median(base)) for key, (base, head) in samples.items()}


def rule_asv(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    samples = pooled(grid)
    p_values, ratios = mann_whitney(samples), median_ratios(samples)
    factor = args.asv_factor
    return {
        key: direction(ratio, (ratio > factor or ratio < 1 / factor) and p_values[key] < args.asv_p)
        for key, ratio in ratios.items()
    }


def rule_mwu(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    samples = pooled(grid)
    p_values, ratios = mann_whitney(samples), median_ratios(samples)
    return {key: direction(ratio, p_values[key] < 0.05) for key, ratio in ratios.items()}


RULES: dict[str, Callable[[Grid, Context, argparse.Namespace], dict[str, str]]] = {
    "trials": rule_trials,
    "old": rule_old,
    "asv": rule_asv,
    "MWU": rule_mwu,
}


# ---------------------------------------------------------------------------
# Tallies and printing
# ---------------------------------------------------------------------------


@dataclass
class Tally:
    flagged: int = 0
    regressed: int = 0
    inconclusive: int = 0
    total: int = 0

    def add(self, verdicts: Sequence[str]) -> None:
        self.flagged += sum(v in FLAGGED for v in verdicts)
        self.regressed += sum(v == "regressed" for v in verdicts)
        self.inconclusive += sum(v == "inconclusive" for v in verdicts)
        self.total += len(verdicts)

    def pct(self, count: int) -> float:
        return 100.0 * count / self.total if self.total else math.nan

    def null_cell(self) -> str:
        unchanged = self.total - self.flagged - self.inconclusive
        return f"{self.pct(self.flagged):5.1f} {self.pct(self.inconclusive):5.1f} {self.pct(unchanged):5.1f}"


def run_rules(grid: Grid, context: Context, args: argparse.Namespace, keys: Sequence[str] | None = None) -> dict:
    """Verdicts of every rule, restricted to ``keys`` when given."""
    chosen = list(grid) if keys is None else list(keys)
    verdicts = {name: rule(grid, context, args) for name, rule in RULES.items()}
    return {name: [found[k] for k in chosen] for name, found in verdicts.items()}


def print_null_header(label: str) -> None:
    cells = " | ".join(f"{name:^17}" for name in METHODS)
    print(f"{label:<34} | {cells}")
    print(f"{'':<34} | " + " | ".join(f"{'flag  inc.  unch':>17}" for _ in METHODS))


def print_null_row(label: str, tallies: Mapping[str, Tally]) -> None:
    print(f"{label:<34} | " + " | ".join(f"{tallies[name].null_cell():>17}" for name in METHODS))


# ---------------------------------------------------------------------------
# (a) Real H200 null runs
# ---------------------------------------------------------------------------


def default_h200_dir() -> Path:
    return (Path(__file__).resolve().parents[1] / "../shared/data/h200-null").resolve()


def load_run(path: Path) -> Run:
    """Series key -> raw samples of one run (passed benchmark jobs), read-only."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "select j.key, s.seconds from job j join sample s on s.job_id = j.id "
            "where j.kind = 'benchmark' and j.status = 'passed' order by j.key, s.idx"
        ).fetchall()
    finally:
        connection.close()
    series: dict[str, list[float]] = {}
    for key, seconds in rows:
        series.setdefault(key, []).append(seconds)
    return {key: np.asarray(values, dtype=np.float64) for key, values in series.items()}


def h200_grids(runs: Sequence[Run], keys: Sequence[str], scale: float) -> list[Case]:
    """Null (or shifted, ``scale``) grids of two runs against one, one per choice of head run."""
    grids = []
    for head in range(3):
        base = [i for i in range(3) if i != head]
        grid = {k: ([runs[base[0]][k], runs[base[1]][k]], [runs[head][k] * scale]) for k in keys}
        grids.append((grid, Context(runs={k: (2, 1) for k in keys}, separate_runs=True)))
    return grids


def h200_single_grids(runs: Sequence[Run], keys: Sequence[str], scale: float) -> list[Case]:
    """Null (or shifted) grids of one run against one, for each pair of runs."""
    pairs = ((0, 1), (0, 2), (1, 2))
    return [({k: ([runs[b][k]], [runs[h][k] * scale]) for k in keys}, Context(separate_runs=True)) for b, h in pairs]


def tally_grids(grids: Sequence[Case], args: argparse.Namespace) -> dict[str, Tally]:
    tallies = {name: Tally() for name in METHODS}
    for grid, context in grids:
        for name, verdicts in run_rules(grid, context, args).items():
            tallies[name].add(verdicts)
    return tallies


def median_detectable(grids: Sequence[Case]) -> float:
    values = [c.detectable for grid, context in grids for c in compare(grid, context).values()]
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def section_a(args: argparse.Namespace) -> None:
    directory = Path(args.h200_dir) if args.h200_dir else default_h200_dir()
    paths = [directory / f"run{i}.db" for i in (1, 2, 3)]
    missing = [str(p) for p in paths if not p.is_file()]
    print("(a) Real null runs on an H200 (one commit, three runs; each run = one trial per series)")
    if missing:
        print(f"(a) skipped: {', '.join(missing)} not found (pass --h200-dir DIR)")
        return
    runs = [load_run(p) for p in paths]
    keys = sorted(set(runs[0]) & set(runs[1]) & set(runs[2]))
    print(f"    {len(keys)} series in all three runs; % of comparisons (flagged = regressed + improved)")
    print_null_header("null pairs")
    two = tally_grids(h200_grids(runs, keys, 1.0), args)
    print_null_row(f"2 runs vs 1 (3 x {len(keys)})", two)
    one = tally_grids(h200_single_grids(runs, keys, 1.0), args)
    print_null_row(f"1 run vs 1 (3 x {len(keys)})", one)
    all_keys = sorted(set(runs[0]) & set(runs[2]))
    whole = {k: ([runs[0][k]], [runs[2][k]]) for k in all_keys}
    print_null_row(f"run1 vs run3, all {len(all_keys)} series",
                   tally_grids([(whole, Context(separate_runs=True))], args))
    detectable = median_detectable(h200_grids(runs, keys, 1.0))
    print(f"    trials, 2 runs vs 1: median detectable change {detectable:.1%} (80 % power, before BH)")
    print()
    print("    recall: % called regressed with the head's samples x scale (every series shifted)")
    print(f"    {'scale':<30} | " + " | ".join(f"{name:>7}" for name in METHODS))
    for scale in SHIFTS:
        for label, make in (("2 runs vs 1", h200_grids), ("1 run vs 1", h200_single_grids)):
            tallies = tally_grids(make(runs, keys, scale), args)
            cells = " | ".join(f"{tallies[name].pct(tallies[name].regressed):6.1f}%" for name in METHODS)
            print(f"    x{scale:.2f}, {label:<23} | {cells}")


# ---------------------------------------------------------------------------
# (b) Synthetic two-level noise
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    label: str
    between_median: float
    run_effect: bool = False  # trials of one side share a run-level shift (sd = the series' between-trial sd)
    floor: bool = False  # a 10-run history floor on the base branch
    run_shift: float = 0.0  # sd of one shift of the head run shared by every series of the grid (a whole-run load)
    separate_runs: bool = False  # judged as `harness compare` of two single runs (a flag must stand out of the shift)


PROTOCOLS = (
    Protocol("H200-like: between-trial 4.0 %", BETWEEN_MEDIAN),
    Protocol("quiet: between-trial 0.5 %", QUIET_MEDIAN),
    Protocol("H200-like + 10-run floor", BETWEEN_MEDIAN, floor=True),
    Protocol("+ run effect, no floor", BETWEEN_MEDIAN, run_effect=True),
    Protocol("+ run effect + 10-run floor", BETWEEN_MEDIAN, run_effect=True, floor=True),
    Protocol("whole-run shift 8 %, trials only", BETWEEN_MEDIAN, run_shift=0.08),
    Protocol("whole-run shift 8 %, as compare", BETWEEN_MEDIAN, run_shift=0.08, separate_runs=True),
    Protocol("H200-like, as compare", BETWEEN_MEDIAN, separate_runs=True),
)


def between_sds(rng: np.random.Generator, median: float, n: int) -> Array:
    spread = math.log(BETWEEN_P90 / BETWEEN_MEDIAN) / Z90  # sd of log sd, 0.91
    return median * np.exp(rng.normal(0.0, spread, n))


def draw_side(rng: np.random.Generator, sd: float, protocol: Protocol, trials_per_side: int, shift: float) -> list:
    run_level = rng.normal(0.0, sd) if protocol.run_effect else 0.0
    levels = shift + run_level + rng.normal(0.0, sd, trials_per_side)
    return [1e-4 * np.exp(level + rng.normal(0.0, WITHIN_SD, SAMPLES)) for level in levels]


def history(rng: np.random.Generator, sd: float, protocol: Protocol, trials_per_side: int) -> runshift.Floor | None:
    """The floor from 10 earlier base runs, each measured like a side (mean log median of its trials)."""
    medians = [
        math.exp(float(np.mean([np.log(np.median(t)) for t in draw_side(rng, sd, protocol, trials_per_side, 0.0)])))
        for _ in range(HISTORY_RUNS)
    ]
    return runshift.history_floor(medians)


def synthetic_grid(
    rng: np.random.Generator, protocol: Protocol, size: int, step: float, trials_per_side: int
) -> tuple[Grid, Context, list[str]]:
    """A grid with ``step`` planted (log1p) in a random 10 % of the series; returns the planted keys."""
    sds = between_sds(rng, protocol.between_median, size)
    planted = set(rng.choice(size, size=int(PLANTED_FRACTION * size), replace=False).tolist()) if step else set()
    grid: Grid = {}
    floors: dict[str, runshift.Floor] = {}
    whole_run = rng.normal(0.0, protocol.run_shift) if protocol.run_shift else 0.0
    for i, sd in enumerate(sds):
        key = f"s{i}"
        shift = (math.log1p(step) if i in planted else 0.0) + whole_run
        grid[key] = (
            draw_side(rng, sd, protocol, trials_per_side, 0.0),
            draw_side(rng, sd, protocol, trials_per_side, shift),
        )
        floor = history(rng, sd, protocol, trials_per_side) if protocol.floor else None
        if floor is not None:
            floors[key] = floor
    context = Context(floors=floors or None, runs={k: (1, 1) for k in grid} if floors else None,
                      separate_runs=protocol.separate_runs)
    return grid, context, [f"s{i}" for i in sorted(planted)]


def section_b(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    size, reps, per_side = args.grid_size, args.grids, args.trials
    print(
        f"(b) Synthetic two-level noise: {per_side} trials a side, {SAMPLES} samples a trial, within-trial "
        f"{WITHIN_SD:.1%}; between-trial sd lognormal (p90 / median = {BETWEEN_P90 / BETWEEN_MEDIAN:.2f})"
    )
    print(
        f"    nulls: {reps} grids x {size} series, % flagged / inconclusive; recall: % of the planted series "
        f"({PLANTED_FRACTION:.0%} of {reps} x {size}) called regressed"
    )
    steps = " ".join(f"{'rec' + format(s, '.0%'):>7}" for s in STEPS)
    print(f"    {'protocol':<31} {'rule':<6} | {'flag%':>6} {'inc%':>6} | {steps} | detectable")
    for protocol in PROTOCOLS:
        nulls = {name: Tally() for name in METHODS}
        detect: list[float] = []
        for _ in range(reps):
            grid, context, _ = synthetic_grid(rng, protocol, size, 0.0, per_side)
            for name, verdicts in run_rules(grid, context, args).items():
                nulls[name].add(verdicts)
            detect += [c.detectable for c in compare(grid, context).values()]
        recall = {(name, step): Tally() for name in METHODS for step in STEPS}
        for step in STEPS:
            for _ in range(reps):
                grid, context, planted = synthetic_grid(rng, protocol, size, step, per_side)
                for name, verdicts in run_rules(grid, context, args, planted).items():
                    recall[(name, step)].add(verdicts)
        for name in METHODS:
            tally = nulls[name]
            rec = " ".join(f"{recall[(name, s)].pct(recall[(name, s)].regressed):6.1f}%" for s in STEPS)
            det = f"{np.median(detect):6.1%}" if name == "trials" else ""
            label = protocol.label if name == METHODS[0] else ""
            print(
                f"    {label:<31} {name:<6} | {tally.pct(tally.flagged):5.2f}% {tally.pct(tally.inconclusive):5.1f}% "
                f"| {rec} | {det}"
            )


# ---------------------------------------------------------------------------
# (c) This CPU machine
# ---------------------------------------------------------------------------


def _harness(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "HARNESS_CACHE": str(cwd / "cache")}
    code = "from harness.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True)


def _cpu_grid(db_url: str, base_run: str, head_run: str) -> tuple[Grid, Context]:
    from harness.record import query  # the store layer loads only for this section
    from harness.record.store import open_database

    store = open_database(db_url, must_exist=True)
    try:
        base, head = query.series_trials(store, [base_run]), query.series_trials(store, [head_run])
    finally:
        store.close()
    keys = sorted(base.keys() & head.keys())
    grid = {str(key): (base[key].trials, head[key].trials) for key in keys}
    return grid, Context(runs={str(key): (1, 1) for key in keys}, separate_runs=True)


def section_c(args: argparse.Namespace) -> None:
    """Two `harness run`s of the built-in benchmark sections on this machine, at a base commit and at an empty head
    commit (identical kernels), then `harness compare` of the two runs and the other rules on the same trials."""
    if args.skip_cpu:
        print("(c) skipped (--skip-cpu)")
        return
    with tempfile.TemporaryDirectory(prefix="validate-cpu-") as scratch:
        folder = Path(scratch)
        repo = folder / "repo"
        repo.mkdir()
        base = copy_checkout(repo, "base")
        git(repo, "commit", "-q", "--allow-empty", "-m", "head: nothing changed")
        head = git(repo, "rev-parse", "HEAD")
        suite = folder / "benchmarks.toml"
        suite.write_text(benchmark_sections((ROOT / "jobs" / "builtin.toml").read_text()))
        db_url = f"sqlite:///{folder / 'cpu.db'}"
        started = time.perf_counter()
        with random_load(args.cpu_load):
            runs = []
            for sha in (base, head):
                done = _harness(folder, "run", "--repo", str(repo), "--commit", sha, "--suite", str(suite), "--db",
                                db_url, "--no-report")
                if done.returncode != 0:
                    print(f"(c) harness run at {sha[:12]} failed ({done.returncode}): {done.stderr[-500:]}")
                    return
                runs.append(re.search(r"run ([0-9a-f]{32})", done.stdout + done.stderr).group(1))
        elapsed = time.perf_counter() - started
        compared = _harness(folder, "compare", *runs, "--db", db_url, "--format", "json")
        report = json.loads(compared.stdout)
        grid, context = _cpu_grid(db_url, *runs)
    counts = report["counts"]
    total = sum(counts.values())
    flagged = counts["regressed"] + counts["improved"]
    print(f"(c) this CPU machine: the built-in benchmark sections, base {base[:12]} vs an empty head commit "
          f"{head[:12]} (identical kernels), {args.cpu_load} random on/off background burner(s), "
          f"two runs in {elapsed:.0f} s")
    print(f"    harness compare: exit {compared.returncode}, {total} series: "
          + ", ".join(f"{counts[v]} {v}" for v in ("regressed", "improved", "inconclusive", "unchanged", "broken"))
          + f" -> {100.0 * flagged / total if total else math.nan:.1f}% flagged")
    print_null_header("rule on the same trials")
    print_null_row(f"run vs run ({len(grid)} series)", tally_grids([(grid, context)], args))


# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h200-dir", help="folder with run1.db, run2.db, run3.db (default: ../shared/data/h200-null)")
    parser.add_argument("--seed", type=int, default=20241130, help="seed of the synthetic section")
    parser.add_argument("--grid-size", type=int, default=300, help="series per synthetic grid")
    parser.add_argument("--grids", type=int, default=5, help="synthetic grids per cell")
    parser.add_argument("--trials", type=int, default=3, help="trials per side in the synthetic section")
    parser.add_argument("--asv-factor", type=float, default=1.1, help="asv compare's --factor")
    parser.add_argument("--asv-p", type=float, default=0.002, help="asv's Mann-Whitney p_threshold")
    parser.add_argument("--skip-cpu", action="store_true", help="skip (c), the two real runs on this machine")
    parser.add_argument("--cpu-load", type=int, default=0, metavar="N",
                        help="(c) N background processes that load the CPU on and off at random during the runs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    print(
        "Rules: trials = compare_trials; old = compare_grid (this file) on pooled samples; "
        f"asv = ratio of medians beyond "
        f"{args.asv_factor} and Mann-Whitney p < {args.asv_p}; MWU = Mann-Whitney p < 0.05 (pooled samples)\n"
    )
    section_a(args)
    print()
    section_b(args)
    print()
    section_c(args)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
