"""Variant verdicts: a tuning variant against its kernel's default, the divergent variants and the best variant per
chip (docs/statistics.md, section 9)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from harness.stats.decide import Comparison
from harness.stats.policy import VariantOutcome, Verdict

__all__ = [
    "Divergence",
    "TuningChange",
    "VariantVerdict",
    "as_variant_verdict",
    "best_variant",
    "best_variants",
    "find_divergent",
    "tuning_drift",
]

K = TypeVar("K", bound=Hashable)

_VERDICT_TO_OUTCOME: dict[Verdict, VariantOutcome] = {
    "regressed": "lose",
    "improved": "win",
    "unchanged": "tie",
    "inconclusive": "inconclusive",
    "broken": "broken",
}


@dataclass(frozen=True)
class VariantVerdict:
    """Variant vs default variant on one chip.  ``ratio`` = variant / default time."""

    outcome: VariantOutcome
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_default: int
    n_variant: int
    more_samples_needed: int



@dataclass(frozen=True)
class Divergence:
    """A variant that wins on ``winning_chip`` and loses on ``losing_chip``."""

    kernel: Hashable
    shape: Hashable
    variant: Hashable
    winning_chip: Hashable
    losing_chip: Hashable
    win_evidence: VariantVerdict
    lose_evidence: VariantVerdict


@dataclass(frozen=True)
class TuningChange:
    """The best variant for ``key`` changed from ``before`` to ``after``."""

    key: Hashable
    before: str
    after: str


def as_variant_verdict(comparison: Comparison) -> VariantVerdict:
    """A comparison of a variant (head) with its default (base) as a variant verdict: win = improved, lose =
    regressed, tie = unchanged."""
    return VariantVerdict(
        outcome=_VERDICT_TO_OUTCOME[comparison.verdict],
        ratio=comparison.ratio,
        ci_low=comparison.ci_low,
        ci_high=comparison.ci_high,
        p_value=comparison.p_value,
        p_adjusted=comparison.p_adjusted,
        n_default=comparison.n_base,
        n_variant=comparison.n_head,
        more_samples_needed=comparison.more_samples_needed,
    )



def _chip_order(chip: Hashable) -> str:
    return str(chip)


def find_divergent(
    cells: Mapping[tuple[Hashable, Hashable, Hashable], Mapping[Hashable, VariantVerdict]],
) -> list[Divergence]:
    """Variants that win on one chip and lose on another, one record per (winner, loser) chip pair."""
    divergences: list[Divergence] = []
    for (kernel, shape, variant), per_chip in cells.items():
        winners = sorted((c for c, v in per_chip.items() if v.outcome == "win"), key=_chip_order)
        losers = sorted((c for c, v in per_chip.items() if v.outcome == "lose"), key=_chip_order)
        divergences.extend(
            Divergence(kernel, shape, variant, win_chip, lose_chip, per_chip[win_chip], per_chip[lose_chip])
            for win_chip in winners
            for lose_chip in losers
        )
    return divergences


def best_variant(verdicts: Mapping[str, VariantVerdict], default: str = "default") -> str:
    """The winning variant with the smallest ratio (then ``ci_high``, then name), else ``default``."""
    winners = [(v.ratio, v.ci_high, name) for name, v in verdicts.items() if v.outcome == "win"]
    return min(winners)[2] if winners else default


def best_variants(
    cells: Mapping[tuple[Hashable, Hashable, str], Mapping[Hashable, VariantVerdict]],
    default: str = "default",
) -> dict[tuple[Hashable, Hashable, Hashable], str]:
    """``best_variant`` for every (kernel, shape, chip) of a ``find_divergent``-shaped grid."""
    per_key: dict[tuple[Hashable, Hashable, Hashable], dict[str, VariantVerdict]] = {}
    for (kernel, shape, variant), per_chip in cells.items():
        for chip, verdict in per_chip.items():
            per_key.setdefault((kernel, shape, chip), {})[variant] = verdict
    return {key: best_variant(verdicts, default) for key, verdicts in per_key.items()}


def tuning_drift(best_before: Mapping[K, str], best_after: Mapping[K, str]) -> list[TuningChange]:
    """Keys present in both mappings whose best variant changed (in ``best_after`` order).

    Keys present on one side only are coverage changes, not tuning drift, and
    are not reported.
    """
    return [
        TuningChange(key, best_before[key], after)
        for key, after in best_after.items()
        if key in best_before and best_before[key] != after
    ]

