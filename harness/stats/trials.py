"""Verdicts at trial level: head against base from the spread between trials (fresh processes), moderated across the
series of a comparison, floored by the base branch's history, run shifts held (docs/statistics.md)."""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from harness.core import defaults
from harness.stats import distributions
from harness.stats.decide import (
    TrialComparison,
    as_broken,
    as_incomparable,
    benjamini_hochberg,
    decide,
    distance_to_band,
)
from harness.stats.measure import Measured, Spread, Tested, Trials, measure, spread_of, t_test
from harness.stats.moderation import fit_prior, moderate
from harness.stats.policy import MAX_MORE_TRIALS, Policy
from harness.stats.runshift import Floor, floor_terms, hold_run_shifts, lacks_run_noise, run_counts
from harness.stats.samples import safe_exp
from harness.stats.variants import VariantVerdict, as_variant_verdict

__all__ = [
    "BASES",
    "compare_measured",
    "compare_trials",
    "min_trials_alone",
    "rank_p_value",
    "variant_measured_grid",
    "variant_trials_grid",
]

K = TypeVar("K", bound=Hashable)

BASES = ("trials", "history", "pairs", "none", "incomparable")  # pairs: harness.stats.paired


def _default_trials() -> int:
    return int(getattr(defaults, "TRIALS", 3))


def _clamp_more(count: float) -> int:
    if not math.isfinite(count):
        return MAX_MORE_TRIALS
    return int(min(MAX_MORE_TRIALS, max(1, math.ceil(count))))


def _more_trials_to_clear_band(
    effect: float,
    variance: float,
    prior_df: float,
    floor_term: float,
    floor_df: float,
    have: tuple[int, int],
    *,
    min_effect: float,
    alpha: float,
) -> int:
    """Trials per side (beyond the smaller side's) at which the interval clears the nearest band edge."""
    distance = distance_to_band(effect, min_effect)
    if not distance > 0 or not math.isfinite(variance):
        return MAX_MORE_TRIALS
    per_side = np.arange(1, MAX_MORE_TRIALS + max(have) + 1, dtype=np.float64)
    trial_term = variance * 2.0 / per_side
    by_trials = trial_term >= floor_term
    df = np.where(by_trials, prior_df + 2.0 * (per_side - 1.0), floor_df)
    with np.errstate(invalid="ignore"):
        half = distributions.t_ppf(1.0 - alpha / 2.0, df) * np.sqrt(np.maximum(trial_term, floor_term))
    clears = np.flatnonzero(half < distance)
    if clears.size == 0:
        return MAX_MORE_TRIALS
    return _clamp_more(per_side[clears[0]] - min(have))


def min_trials_alone(alpha: float = defaults.ALPHA) -> int:
    """Trials per side at which a series judged on its own spread can pass the rank check at level ``alpha``:
    the smallest n whose perfect separation of n against n trials has exact two-sided p = 2 / C(2n, n) <= alpha."""
    n = 2
    while 2.0 / math.comb(2 * n, n) > alpha:
        n += 1
    return n


def rank_p_value(base: npt.NDArray[np.float64], head: npt.NDArray[np.float64]) -> float:
    """Two-sided Mann-Whitney p-value of two sides' trial values (exact for small sides): distribution-free."""
    if base.size < 1 or head.size < 1:
        return math.nan
    from scipy import stats as scipy_stats  # ~1 s to load: only for a one-process comparison

    return float(scipy_stats.mannwhitneyu(head, base, alternative="two-sided").pvalue)


def _no_spread_more(have: tuple[int, int]) -> int:
    return max(1, _default_trials() - min(have))


# ---------------------------------------------------------------------------
# Public comparisons
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    """Everything known about one series before the BH step."""

    effect: float
    tested: bool
    p_value: float
    ci: tuple[float, float]
    counts: tuple[int, int, int, int]  # samples base/head, trials base/head
    basis: str
    noise: float
    detectable: float
    variance: float
    floor: tuple[float, float]  # floor term of SE^2, floor df
    rank_p: float = math.nan  # set only where the series is judged on its own spread alone (see _lacks_rank_support)


def _lacks_rank_support(row: _Row, policy: Policy) -> bool:
    """A flag decided on the series' own trials alone (no moderation prior; its trials' spread, not a history floor,
    decided) whose trials do not separate beyond chance by rank. Four degrees of freedom of a t-test trust normal
    trial values; under load that switches on and off at random they are a mixture, and 3 + 3 trials that happen to
    split by load look like a change: in CI, an A/B of identical code came out "improved" x0.90, interval
    [0.85, 0.95]."""
    return math.isfinite(row.rank_p) and not row.rank_p <= policy.alpha


def _decide_row(row: _Row, p_adjusted: float, prior_df: float, policy: Policy) -> TrialComparison:
    samples_base, samples_head, trials_base, trials_head = row.counts
    have = (trials_base, trials_head)
    ratio = safe_exp(row.effect) if math.isfinite(row.effect) else math.nan
    if not row.tested:
        verdict, more, p_adjusted = "inconclusive", _no_spread_more(have), math.nan
    else:
        verdict = decide(ratio, *row.ci, p_adjusted, policy)
        more = 0
        if verdict in ("regressed", "improved") and _lacks_rank_support(row, policy):
            verdict, more = "inconclusive", max(1, min_trials_alone(policy.alpha) - min(have))
        elif verdict == "inconclusive":
            more = _more_trials_to_clear_band(row.effect, row.variance, prior_df, *row.floor, have,
                                              min_effect=policy.min_effect, alpha=policy.alpha)
    return TrialComparison(
        verdict=verdict,
        ratio=ratio,
        ci_low=row.ci[0],
        ci_high=row.ci[1],
        p_value=row.p_value,
        p_adjusted=p_adjusted,
        n_base=samples_base,
        n_head=samples_head,
        more_samples_needed=more,
        trials_base=trials_base,
        trials_head=trials_head,
        more_trials_needed=more,
        basis=row.basis,
        noise=row.noise,
        detectable=row.detectable,
    )


def _rows(measured: Measured, spread: Spread, tested: Tested, variance: npt.NDArray[np.float64],
          alone: bool) -> list[_Row]:
    """``alone``: no moderation prior, so a series on basis ``trials`` is judged on its own trials only."""
    rows = []
    for i in range(measured.effect.size):
        is_tested = spread.basis[i] != "none" and bool(np.isfinite(tested.p_value[i]))
        by_own_trials = alone and is_tested and spread.basis[i] == "trials"
        rows.append(
            _Row(
                effect=float(measured.effect[i]),
                tested=is_tested,
                p_value=float(tested.p_value[i]) if is_tested else math.nan,
                ci=(float(tested.ci_low[i]), float(tested.ci_high[i])) if is_tested else (math.nan, math.nan),
                counts=(
                    int(measured.samples_base[i]),
                    int(measured.samples_head[i]),
                    int(measured.trials_base[i]),
                    int(measured.trials_head[i]),
                ),
                basis=spread.basis[i] if is_tested else "none",
                noise=float(spread.noise[i]) if is_tested else math.nan,
                detectable=float(tested.detectable[i]) if is_tested else math.nan,
                variance=float(variance[i]),
                floor=(float(spread.floor_variance[i]), float(spread.floor_df[i])),
                rank_p=rank_p_value(*measured.logs[i]) if by_own_trials else math.nan,
            )
        )
    return rows




def compare_trials(
    pairs: Mapping[K, tuple[Trials, Trials]],
    *,
    floors: Mapping[K, Floor] | None = None,
    runs: Mapping[K, tuple[int, int]] | None = None,
    same_session: bool = False,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
    rank_check: bool = True,
    separate_runs: bool = False,
    history_runs: Mapping[K, int] | None = None,
    run_groups: Mapping[K, Hashable] | None = None,
) -> dict[K, TrialComparison]:
    """Head vs base of every ``key -> (base trials, head trials)``, from the spread between trials.

    Variances are moderated across the series of the call, the history floor (unless ``same_session``)
    bounds the standard error from below, and Benjamini-Hochberg runs across all tested series; keys in
    ``broken`` get verdict ``broken`` and stay out of the family (and out of the moderation prior).  ``runs``
    gives the distinct runs behind each side, (1, 1) when absent.  Keys in ``incomparable`` (the two sides were
    not measured alike, e.g. timed in different modes) are ``inconclusive`` with basis ``incomparable``, also
    outside the family and the prior: no amount of trials settles them.  ``rank_check``: the rank check of a
    series judged on its own trials alone (docs/statistics.md, section 5); bisect, whose probes must agree with one
    endpoint and differ from the other on run-level evidence, turns it off.  ``separate_runs``: the sides are separate
    runs (``harness compare``, the regression list): a flag of a series without a floor whose side is a single run
    must stand out from the common shift of the series measured in the same runs (``run_groups``: one value per
    run pair, e.g. the chip; default one group), else it is ``inconclusive`` asking for the base runs that would
    give it a floor, ``FLOOR_MIN_RUNS`` less those of its base branch's history (``history_runs``; default the
    base side's runs).  See docs/statistics.md.
    """
    keys = list(pairs)
    return compare_measured(keys, measure([pairs[key] for key in keys]), floors=floors, runs=runs,
                            same_session=same_session, min_effect=min_effect, alpha=alpha, broken=broken,
                            incomparable=incomparable, rank_check=rank_check, separate_runs=separate_runs,
                            history_runs=history_runs, run_groups=run_groups)


def compare_measured(
    keys: Sequence[K],
    measured: Measured,
    *,
    floors: Mapping[K, Floor] | None = None,
    runs: Mapping[K, tuple[int, int]] | None = None,
    same_session: bool = False,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
    rank_check: bool = True,
    separate_runs: bool = False,
    history_runs: Mapping[K, int] | None = None,
    run_groups: Mapping[K, Hashable] | None = None,
) -> dict[K, TrialComparison]:
    """``compare_trials`` of the pairs ``measure`` measured, ``keys`` naming them in its order."""
    is_broken, not_alike = set(broken), set(incomparable)
    # The timings of wrong code, or of sides measured differently, say nothing about the noise of the others
    healthy = np.array([key not in is_broken and key not in not_alike for key in keys], dtype=bool)
    prior = fit_prior(measured.variance, np.where(healthy, measured.df, 0))
    variance, total_df = moderate(measured, prior)
    floor_term, floor_df, floor_sd = floor_terms(keys, None if same_session else floors, runs)
    spread = spread_of(measured, variance, total_df, floor_term, floor_df, floor_sd)
    tested = t_test(measured.effect, spread, alpha)
    rows = _rows(measured, spread, tested, variance, alone=rank_check and prior.df == 0)
    in_family = np.array([row.tested for row in rows], dtype=bool) & healthy
    adjusted = benjamini_hochberg(np.array([row.p_value for row in rows]), in_family)
    policy = Policy(min_effect, alpha)
    result: dict[K, TrialComparison] = {}
    for i, (key, row) in enumerate(zip(keys, rows, strict=True)):
        p_adjusted = float(adjusted[i]) if in_family[i] else row.p_value
        comparison = _decide_row(row, p_adjusted, prior.df, policy)
        if key in is_broken:
            comparison = as_broken(comparison)
        elif key in not_alike:
            comparison = as_incomparable(comparison)
        result[key] = comparison
    if separate_runs and not same_session:
        runs_base, _ = run_counts(keys, runs)
        hold_run_shifts(keys, result, measured, spread, lacks_run_noise(floor_term), in_family, run_groups,
                         history_runs, runs_base, policy)
    return result


def variant_trials_grid(
    cells: Mapping[K, tuple[Trials, Trials]],
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
) -> dict[K, VariantVerdict]:
    """Variant vs default per cell ``key -> (default trials, variant trials)``, measured interleaved in one run.

    ``win`` means the variant is faster; BH across all cells; floors do not apply (``same_session``);
    ``incomparable`` cells are ``inconclusive`` (see ``compare_trials``).
    """
    keys = list(cells)
    return variant_measured_grid(keys, measure([cells[key] for key in keys]), min_effect=min_effect, alpha=alpha,
                                 broken=broken, incomparable=incomparable)


def variant_measured_grid(
    keys: Sequence[K],
    measured: Measured,
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
) -> dict[K, VariantVerdict]:
    """``variant_trials_grid`` of the cells ``measure`` measured (default side first), ``keys`` in its order."""
    comparisons = compare_measured(keys, measured, same_session=True, min_effect=min_effect, alpha=alpha,
                                   broken=broken, incomparable=incomparable)
    return {key: as_variant_verdict(comparison) for key, comparison in comparisons.items()}


