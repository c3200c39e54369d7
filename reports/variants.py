"""The cross-chip variant matrix page: its rows, verdict reasons and per-variant roll-up."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# --- the cross-chip variant matrix --------------------------------------------------------------------------------


@dataclass
class MatrixRow:
    """One (kernel, dtype, shape): per variant and chip its verdict, or why there is none."""

    kernel: str
    dtype: str
    shape_key: str
    default: str
    cells: dict[str, list[Any]]  # chip -> VariantCell-like records, by variant name
    best: dict[str, str]  # chip -> best variant
    variants: list[str] = field(default_factory=list)  # the row's variants other than the default, sorted
    by_variant: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant -> chip -> cell
    gaps: dict[str, dict[str, str]] = field(default_factory=dict)  # chip -> variant -> why it has no verdict there
    absent: dict[str, str] = field(default_factory=dict)  # chip -> why the chip has no verdict in this row at all
    sources: dict[str, str] = field(default_factory=dict)  # chip -> which older runs its verdicts come from

    @property
    def measured_on(self) -> list[str]:
        return sorted(self.cells)

    @property
    def shared(self) -> bool:
        """Measured on two chips or more: the rows that can show which variant wins on which chip."""
        return len(self.cells) > 1


def _reason_summary(reasons: Iterable[str]) -> str:
    """One line for several variants' reasons: the reason when they agree, else each with its count."""
    counts: dict[str, int] = defaultdict(int)
    for reason in reasons:
        counts[reason] += 1
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{reason} ({n})" for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def matrix_rows(matrix: Any) -> tuple[list[str], list[MatrixRow]]:
    """Group a VariantMatrix's cells into rows (kernel, dtype, shape) × columns (chips): rows measured on two chips
    or more first, then by kernel, dtype and shape. A chip with no verdict in a row says why (``absent``, from the
    matrix's gaps); a chip whose verdicts of the row come from an older run than its newest names that commit."""
    if matrix is None:
        return [], []
    chips = sorted({cell.chip for cell in matrix.cells} | set(getattr(matrix, "shas", {}) or {}))
    newest = dict(getattr(matrix, "shas", {}) or {})
    rows: dict[tuple[str, str, str], MatrixRow] = {}
    for cell in matrix.cells:
        key = (cell.kernel, cell.dtype, cell.shape_key)
        row = rows.setdefault(key, MatrixRow(*key, cell.default_variant, {}, {}))
        row.cells.setdefault(cell.chip, []).append(cell)
        row.by_variant.setdefault(cell.variant, {})[cell.chip] = cell
    for gap in getattr(matrix, "gaps", ()):
        row = rows.get((gap.kernel, gap.dtype, gap.shape_key))
        if row is not None:
            row.gaps.setdefault(gap.chip, {})[gap.variant] = gap.reason
            row.by_variant.setdefault(gap.variant, {})
    for best in matrix.best:
        row = rows.get((best.kernel, best.dtype, best.shape_key))
        if row is not None:
            row.best[best.chip] = best.variant
    for row in rows.values():
        for chip, cells in row.cells.items():
            cells.sort(key=lambda c: c.variant)
            older = [c.sha for c in cells if getattr(c, "sha", "") and newest.get(chip) and c.sha != newest[chip]]
            if older:
                shas = ", ".join(sorted({sha[:12] for sha in older}))
                row.sources[chip] = (f"from the older run at {shas}" if len(older) == len(cells) else
                                     f"{len(older)} of {len(cells)} verdicts from the older run at {shas}")
        row.variants = sorted(v for v in row.by_variant if v != row.default)
        for chip in chips:
            if chip not in row.cells:
                row.absent[chip] = _reason_summary(row.gaps.get(chip, {}).values()) or "no verdict on this chip"
    ordered = sorted(rows, key=lambda key: (not rows[key].shared, key))
    return chips, [rows[key] for key in ordered]


@dataclass(frozen=True)
class ChipTally:
    """One variant's verdicts on one chip, over every (dtype, shape) of its kernel compared there; ``shared_*``
    over the rows measured on two chips or more; ``median_ratio``: the median of its cells' ratios (< 1: faster)."""

    chip: str
    cells: int
    wins: int
    losses: int
    ties: int
    inconclusive: int
    broken: int
    shared: int
    shared_wins: int
    shared_losses: int
    median_ratio: float


@dataclass(frozen=True)
class VariantRollup:
    """A variant of a kernel across chips: its tally per chip. ``divergent``: it wins on one chip and loses on
    another (on any of their shapes), the answer a kernel engineer looks for first."""

    kernel: str
    variant: str
    default_variant: str
    chips: tuple[ChipTally, ...]

    @property
    def divergent(self) -> bool:
        return any(a.wins and b.losses for a in self.chips for b in self.chips if a.chip != b.chip)

    @property
    def spread(self) -> float:
        """How far apart its chips' median ratios are (log scale): the roll-up's order after divergence."""
        logs = [math.log(t.median_ratio) for t in self.chips if t.median_ratio > 0]
        return max(logs) - min(logs) if logs else 0.0


def variant_rollup(matrix: Any) -> list[VariantRollup]:
    """Per (kernel, variant) of a VariantMatrix: its verdicts on each chip counted, the divergent variants first,
    then by how far apart its chips' median ratios are, then by name."""
    if matrix is None:
        return []
    rows_on: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    grouped: dict[tuple[str, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    defaults: dict[str, str] = {}
    for cell in matrix.cells:
        rows_on[(cell.kernel, cell.dtype, cell.shape_key)].add(cell.chip)
        grouped[(cell.kernel, cell.variant)][cell.chip].append(cell)
        defaults[cell.kernel] = cell.default_variant
    rollups = []
    for (kernel, variant), by_chip in grouped.items():
        tallies = []
        for chip, cells in sorted(by_chip.items()):
            shared = [c for c in cells if len(rows_on[(c.kernel, c.dtype, c.shape_key)]) > 1]
            ratios = [c.ratio for c in cells if c.ratio is not None and math.isfinite(c.ratio)]

            def count(outcome: str, among: list[Any] = cells) -> int:
                return sum(1 for c in among if c.outcome == outcome)

            tallies.append(ChipTally(chip, len(cells), count("win"), count("lose"), count("tie"),
                                     count("inconclusive"), count("broken"), len(shared), count("win", shared),
                                     count("lose", shared), statistics.median(ratios) if ratios else math.nan))
        rollups.append(VariantRollup(kernel, variant, defaults[kernel], tuple(tallies)))
    return sorted(rollups, key=lambda r: (not r.divergent, -r.spread, r.kernel, r.variant))
