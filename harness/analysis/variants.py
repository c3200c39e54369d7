"""Variant verdicts: each tuning variant against its kernel's default variant, per (kernel, dtype, shape, chip),
with BH across the whole matrix (``stats.variant_verdict_grid``); the divergent variants (win on one chip, lose on
another), the best variant of each cell, the tuning drift between two commits, and the kernels' default variants
(``default_variants``, from ``kernels.REGISTRY``).  Runs, samples and failures come from ``harness.record.query``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from harness.analysis.compare import resolve_side, same_mode
from harness.analysis.records import (
    BestVariant,
    CorrectnessFailure,
    DivergentVariant,
    TuningDrift,
    VariantCell,
    VariantMatrix,
)
from harness.core import stats, trials
from harness.record import query
from harness.record.query import SeriesKey
from harness.record.store import Store

__all__ = ["OUTCOME_ORDER", "default_variants", "tuning_drift", "variant_matrix"]

OUTCOME_ORDER = ("broken", "lose", "win", "inconclusive", "tie")
"""Display order of variant cells."""


def default_variants() -> dict[str, str]:
    """Each registered kernel's default (baseline) variant."""
    from kernels import REGISTRY  # imports mlx: only when baselines are needed

    return {name: kernel.default_variant for name, kernel in REGISTRY.items()}


def _matrix_runs(store: Store, commit: str | None) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Per chip: the runs to analyse and their commit sha (the latest run, or every run of ``commit``)."""
    if commit is not None:
        side = resolve_side(store, commit)
        return side.runs, {chip: side.sha for chip in side.runs}
    return query.latest_runs(store)


def _cell(key: tuple[str, str, str, str, str], default: str, verdict: stats.VariantVerdict) -> VariantCell:
    kernel, dtype, shape_key, variant, chip = key
    return VariantCell(kernel=kernel, variant=variant, dtype=dtype, shape_key=shape_key, chip=chip,
                       default_variant=default, **dataclasses.asdict(verdict))


def variant_matrix(
    store: Store,
    commit: str | None = None,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
    defaults: Mapping[str, str] | None = None,
) -> VariantMatrix:
    """Each variant vs its kernel's default variant, per (kernel, dtype, shape, chip), BH across the whole matrix.

    Runs: each chip's latest run, or all runs of ``commit`` on each chip (pooled).  A cell is ``broken`` when the
    variant or the default failed a correctness job of that kernel on that chip in those runs.  ``defaults``
    (kernel -> default variant) overrides ``kernels.REGISTRY``; kernels known to neither are left out.
    """
    defaults = {**default_variants(), **(defaults or {})}
    runs, shas = _matrix_runs(store, commit)
    run_ids = [run_id for ids in runs.values() for run_id in ids]
    samples = {key: series.trials for key, series in query.series_trials(store, run_ids).items()}
    failures = [CorrectnessFailure(*row) for row in query.correctness_failures(store, run_ids)]
    failed = {(f.chip, f.kernel, f.variant) for f in failures}
    grid: dict[tuple[str, str, str, str, str], tuple[list[npt.NDArray[np.float64]], list[npt.NDArray[np.float64]]]] = {}
    broken = set()
    for key, values in samples.items():
        default = defaults.get(key.kernel)
        if default is None or key.variant == default:
            continue
        baseline = samples.get(SeriesKey(key.kernel, default, key.dtype, key.shape_key, key.chip))
        if baseline is None:
            continue
        cell_key = (key.kernel, key.dtype, key.shape_key, key.variant, key.chip)
        grid[cell_key] = (baseline, values)
        if (key.chip, key.kernel, key.variant) in failed or (key.chip, key.kernel, default) in failed:
            broken.add(cell_key)
    # A variant and its default were measured in the same runs, their trials interleaved: the spread between trials
    # is the noise of the comparison (harness.core.trials).
    modes = query.timing_modes(store, run_ids)

    def mode_of(cell: tuple[str, str, str, str, str], variant: str) -> str | None:
        kernel, dtype, shape_key, _, chip = cell
        return modes.get(SeriesKey(kernel, variant, dtype, shape_key, chip))

    mixed = {cell for cell in grid if not same_mode(mode_of(cell, defaults[cell[0]]), mode_of(cell, cell[3]))}
    verdicts = trials.variant_trials_grid(grid, min_effect=min_effect, alpha=alpha, broken=broken, incomparable=mixed)
    cells = {key: _cell(key, defaults[key[0]], verdict) for key, verdict in sorted(verdicts.items())}
    per_chip: dict[tuple[str, tuple[str, str], str], dict[str, stats.VariantVerdict]] = {}
    for (kernel, dtype, shape_key, variant, chip), verdict in verdicts.items():
        per_chip.setdefault((kernel, (dtype, shape_key), variant), {})[chip] = verdict
    divergent = [
        DivergentVariant(d.kernel, d.variant, d.shape[0], d.shape[1], d.winning_chip, d.losing_chip,
                         cells[(d.kernel, *d.shape, d.variant, d.winning_chip)],
                         cells[(d.kernel, *d.shape, d.variant, d.losing_chip)])
        for d in stats.find_divergent(per_chip)
    ]
    best = []
    for kernel in sorted({key[0] for key in per_chip}):
        kernel_cells = {key: value for key, value in per_chip.items() if key[0] == kernel}
        for (_, (dtype, shape_key), chip), variant in sorted(stats.best_variants(kernel_cells, defaults[kernel])
                                                             .items()):
            evidence = cells.get((kernel, dtype, shape_key, variant, chip))
            best.append(BestVariant(kernel, dtype, shape_key, chip, variant, defaults[kernel], evidence))
    return VariantMatrix(runs, shas, tuple(cells.values()), tuple(divergent), tuple(best), tuple(failures))


def tuning_drift(
    store: Store,
    base_commit: str,
    head_commit: str,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
    defaults: Mapping[str, str] | None = None,
) -> list[TuningDrift]:
    """(kernel, dtype, shape, chip) whose best variant changed between two commits (chips and shapes on both)."""
    before = variant_matrix(store, base_commit, min_effect=min_effect, alpha=alpha, defaults=defaults)
    after = variant_matrix(store, head_commit, min_effect=min_effect, alpha=alpha, defaults=defaults)

    def best_map(matrix: VariantMatrix) -> dict[tuple[str, str, str, str], BestVariant]:
        return {(b.kernel, b.dtype, b.shape_key, b.chip): b for b in matrix.best}

    best_before, best_after = best_map(before), best_map(after)
    changes = stats.tuning_drift({k: b.variant for k, b in best_before.items()},
                                 {k: b.variant for k, b in best_after.items()})
    return [TuningDrift(*change.key, change.before, change.after, best_before[change.key].evidence,
                        best_after[change.key].evidence) for change in changes]
