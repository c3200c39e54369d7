"""Verdicts of settling rounds from ABBA pairs: each trial of the head against the base trial measured next to it
(docs/statistics.md, section 6).

Two commits measured interleaved (``harness compare --settle``) give, per series, pairs of trials run one after the
other: base round r and head round r are adjacent in the ABBA order. Load that comes and goes over seconds moves both
trials of a pair alike; the difference of their log medians ``d`` cancels it, where pooling every trial of a side
(an unpaired test) keeps it in the spread and, worse, counts trials of one burst as independent. The verdict reads
the mean of ``d`` (a t interval on the pairs, their variance moderated across the series of the call as
``harness.stats.moderation`` does for trials, BH across them) and flags a change only where the
signs of ``d`` also agree beyond chance: the exact Wilcoxon signed-rank test, distribution-free for pairs whose two
orders are alike (ABBA alternates which commit runs first). Seven pairs are the fewest that can pass it at the first
look's level (alpha / 2).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
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
from harness.stats.measure import Spread, t_test
from harness.stats.moderation import fit_prior, moderate_variances
from harness.stats.policy import MAX_MORE_TRIALS, Policy
from harness.stats.samples import Samples, positive_finite, safe_exp

__all__ = ["Pair", "compare_paired", "min_pairs", "pair_differences", "signed_rank_p"]

K = TypeVar("K", bound=Hashable)
Pair = tuple[Samples, Samples]  # one base trial's samples and the head trial's measured next to it


def min_pairs(alpha: float) -> int:
    """The fewest pairs whose perfect agreement in sign passes the signed-rank test at ``alpha``: 2 / 2^n <= alpha."""
    return max(2, math.ceil(math.log2(2.0 / alpha)))


def pair_differences(pairs: Sequence[Pair]) -> tuple[npt.NDArray[np.float64], int, int]:
    """log median(head trial) - log median(base trial) of every pair whose both trials have a valid sample, and the
    valid samples of each side in those pairs."""
    differences, samples_base, samples_head = [], 0, 0
    for base, head in pairs:
        kept_base, kept_head = positive_finite(base), positive_finite(head)
        if kept_base.size and kept_head.size:
            differences.append(math.log(float(np.median(kept_head))) - math.log(float(np.median(kept_base))))
            samples_base += kept_base.size
            samples_head += kept_head.size
    return np.array(differences, dtype=np.float64), samples_base, samples_head


def signed_rank_p(differences: npt.NDArray[np.float64]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences (exact for small samples without ties)."""
    if differences.size < 1 or not np.any(differences):
        return 1.0
    from scipy import stats as scipy_stats  # ~1 s to load: only where a settling round decides

    return float(scipy_stats.wilcoxon(differences, alternative="two-sided").pvalue)


def _more_pairs(effect: float, sd: float, have: int, df: float, policy: Policy) -> int:
    """Pairs beyond ``have`` at which the interval clears the nearest band edge and the rank test can pass (``df``:
    the interval's now, which grows with the pairs)."""
    distance = distance_to_band(effect, policy.min_effect)
    floor = max(1, min_pairs(policy.alpha) - have)
    if not (distance > 0 and math.isfinite(sd)):
        return MAX_MORE_TRIALS
    total = np.arange(have + 1, have + MAX_MORE_TRIALS + 1, dtype=np.float64)
    half = distributions.t_ppf(1.0 - policy.alpha / 2.0, df + total - have) * sd / np.sqrt(total)
    clears = np.flatnonzero(half < distance)
    return max(floor, int(total[clears[0]]) - have) if clears.size else MAX_MORE_TRIALS


def _no_evidence(samples: tuple[int, int], count: int, policy: Policy) -> TrialComparison:
    more = max(1, min_pairs(policy.alpha) - count)
    return TrialComparison(verdict="inconclusive", ratio=math.nan, ci_low=math.nan, ci_high=math.nan,
                           p_value=math.nan, p_adjusted=math.nan, n_base=samples[0], n_head=samples[1],
                           more_samples_needed=more, trials_base=count, trials_head=count, more_trials_needed=more,
                           basis="none")


def compare_paired(
    pairs: Mapping[K, Sequence[Pair]],
    *,
    min_effect: float = defaults.MIN_EFFECT,
    alpha: float = defaults.ALPHA,
    broken: Collection[K] = (),
    incomparable: Collection[K] = (),
) -> dict[K, TrialComparison]:
    """Head vs base of every ``key -> pairs of trials`` (module docstring): basis ``pairs``; ``broken`` and
    ``incomparable`` keys as in ``trials.compare_trials`` (outside the BH family)."""
    policy = Policy(min_effect, alpha)
    keys = list(pairs)
    measured = [pair_differences(pairs[key]) for key in keys]
    is_broken, not_alike = set(broken), set(incomparable)
    healthy = np.array([key not in is_broken and key not in not_alike for key in keys], dtype=bool)
    effect = np.array([d.mean() if d.size else math.nan for d, _, _ in measured])
    count = np.array([d.size for d, _, _ in measured], dtype=np.int64)
    own_variance = np.array([d.var(ddof=1) if d.size > 1 else math.nan for d, _, _ in measured])
    own_df = np.maximum(count - 1, 0)
    # moderated across the series of the call, as trials.compare_trials does (section 2)
    variance, total_df = moderate_variances(own_variance, own_df,
                                            fit_prior(own_variance, np.where(healthy, own_df, 0)))
    sd = np.sqrt(variance)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = sd / np.sqrt(count)
    tested = (count > 1) & (se > 0) & np.isfinite(se)
    zeros = np.zeros(len(keys))
    spread = Spread(se=np.where(tested, se, math.nan), df=np.where(tested, total_df, math.nan), noise=sd / math.sqrt(2),
                    basis=["pairs" if t else "none" for t in tested], floor_variance=zeros, floor_df=zeros)
    t = t_test(effect, spread, alpha)
    p_value, ci_low, ci_high, detectable, df = t.p_value, t.ci_low, t.ci_high, t.detectable, spread.df
    in_family = tested & healthy
    adjusted = benjamini_hochberg(p_value, in_family)
    result: dict[K, TrialComparison] = {}
    for i, key in enumerate(keys):
        differences, samples_base, samples_head = measured[i]
        if not tested[i]:
            comparison = _no_evidence((samples_base, samples_head), differences.size, policy)
        else:
            ratio = safe_exp(float(effect[i]))
            p_adj = float(adjusted[i]) if in_family[i] else float(p_value[i])
            verdict = decide(ratio, float(ci_low[i]), float(ci_high[i]), p_adj, policy)
            more = 0
            if verdict in ("regressed", "improved") and not signed_rank_p(differences) <= alpha:
                verdict, more = "inconclusive", max(1, min_pairs(alpha) - differences.size)
            elif verdict == "inconclusive":
                more = _more_pairs(float(effect[i]), float(sd[i]), differences.size, float(df[i]), policy)
            comparison = TrialComparison(
                verdict=verdict, ratio=ratio, ci_low=float(ci_low[i]), ci_high=float(ci_high[i]),
                p_value=float(p_value[i]), p_adjusted=p_adj, n_base=samples_base, n_head=samples_head,
                more_samples_needed=more, trials_base=differences.size, trials_head=differences.size,
                more_trials_needed=more, basis="pairs",
                noise=float(spread.noise[i]),  # one trial's log sd, the pairs' two trials independent
                detectable=float(detectable[i]))
        if key in is_broken:
            comparison = as_broken(comparison)
        elif key in not_alike:
            comparison = as_incomparable(comparison)
        result[key] = comparison
    return result
