"""Variant verdicts: each tuning variant against its kernel's default variant, per (kernel, dtype, shape, chip),
with BH across the whole matrix (``harness.stats.trials.variant_measured_grid``); the divergent variants (win on one
chip, lose on another), the best variant of each cell, the variants a chip has no verdict for and why
(``VariantGap``), the tuning drift between two commits, and the kernels' default variants (``default_variants``, from
``kernels.REGISTRY``).
Each cell compares trials of one run (the chip's newest that measured the variant and its default), so a newer
partial run never hides a kernel.  Runs, samples and failures come from ``harness.record.query``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from harness.analysis.compare import resolve_side
from harness.analysis.records import (
    BestVariant,
    CorrectnessFailure,
    DivergentVariant,
    TuningDrift,
    VariantCell,
    VariantGap,
    VariantMatrix,
)
from harness.core.chip import timing_fit
from harness.record import query
from harness.record.query import SeriesKey
from harness.record.store import Store
from harness.stats import measure as trial_measure
from harness.stats import policy, trials, variants
from harness.stats.modes import same_mode

__all__ = ["OUTCOME_ORDER", "MeasureCells", "default_variants", "measure_cells", "tuning_drift", "variant_matrix"]

OUTCOME_ORDER = ("broken", "lose", "win", "inconclusive", "tie")
"""Display order of variant cells."""


def default_variants() -> dict[str, str]:
    """Each registered kernel's default (baseline) variant."""
    from kernels import REGISTRY  # imports mlx: only when baselines are needed

    return {name: kernel.default_variant for name, kernel in REGISTRY.items()}


Cell = tuple[str, str, str, str, str]  # (kernel, dtype, shape_key, variant, chip)
Series = tuple[str, str, str, str, str]  # (kernel, variant, dtype, shape_key, chip)


@dataclasses.dataclass
class _Presence:
    """Which runs measured each benchmark series (newest first), and each series' newest job row."""

    measured: dict[Series, list[str]]
    newest: dict[Series, query.JobPresence]
    shas: dict[str, str]  # run id -> commit sha
    chips: dict[str, list[str]]  # chip -> its runs with benchmarks, newest first


def _presence(store: Store, run_ids: list[str] | None, defaults: Mapping[str, str],
              series: Mapping[SeriesKey, bool] | None = None) -> _Presence:
    """Every run's benchmark rows (or those of ``run_ids``), as much of them as ``_cell_runs`` needs: the newest row
    of each series, and the runs that measured each series, read newest run first, chip by chip, until each variant
    measured on the chip with its default has a run that measured both (all of them with ``run_ids``: those cells
    pool every run). ``measured`` keeps, per chip, the order of the series' first measured rows, newest run
    first."""
    found = _Presence({}, {}, {}, {})
    runs = query.runs_with_jobs(store, ("benchmark",), run_ids=run_ids)
    for run_id, chip, sha in runs:
        found.shas[run_id] = sha
        found.chips.setdefault(chip, []).append(run_id)
    series = series if series is not None and run_ids is None else query.benchmark_series(store, run_ids=run_ids)
    # each chip's own runs, newest first (with ``run_ids``: all of them at once): a chip measured less often is not
    # looked for past every newer run of the others
    groups = [(None, [run_id for run_id, _, _ in runs])] if run_ids is not None else list(found.chips.items())
    for chip, _ in groups:
        for row in query.job_presence(store, run_ids=run_ids, chip=chip, kinds=("benchmark",), newest_per="series",
                                      among=[tuple(key) for key in series if chip is None or key.chip == chip]):
            found.newest[(row.kernel, row.variant, row.dtype, row.shape_key, row.chip)] = row
    anywhere = {tuple(key) for key, measured in series.items() if measured}
    pending = set()
    for kernel, variant, dtype, shape_key, chip in anywhere:
        default = defaults.get(kernel)
        if default is not None and variant != default and (kernel, default, dtype, shape_key, chip) in anywhere:
            pending.add((kernel, variant, dtype, shape_key, chip))
    for chip, order in groups:
        wanted = {key for key in pending if chip is None or key[4] == chip}
        start, size = 0, 1
        while start < len(order) and (wanted or run_ids is not None):
            for key, run_id in query.measured_series(store, run_ids=order[start:start + size]):
                found.measured.setdefault(tuple(key), []).append(run_id)
            start, size = start + size, min(size * 2, 256)
            for key in list(wanted):
                kernel, _, dtype, shape_key, key_chip = key
                if set(found.measured.get(key, ())) & set(found.measured.get(
                        (kernel, defaults[kernel], dtype, shape_key, key_chip), ())):
                    wanted.discard(key)
    return found


def _cell_runs(presence: _Presence, defaults: Mapping[str, str], pooled: bool) -> dict[Cell, tuple[str, ...]]:
    """Per cell, the runs whose trials compare the variant with its default: the newest run that measured both
    (``pooled``: every run of the commit that measured both)."""
    chosen: dict[Cell, tuple[str, ...]] = {}
    for (kernel, variant, dtype, shape_key, chip), runs in presence.measured.items():
        default = defaults.get(kernel)
        if default is None or variant == default:
            continue
        with_default = set(presence.measured.get((kernel, default, dtype, shape_key, chip), ()))
        both = [run for run in runs if run in with_default]
        if both:
            chosen[(kernel, dtype, shape_key, variant, chip)] = tuple(both) if pooled else (both[0],)
    return chosen


MeasureCells = Callable[[Store, str, Mapping[Cell, tuple[str, ...]], Mapping[str, str]],
                        tuple[list[Cell], trial_measure.Measured]]
"""One chip's cells -> the cells with trials on both sides, in key order, and their ``trial_measure.measure``
(``measure_cells``, or the analysis cache's ``VariantCells``)."""


def measure_cells(store: Store, chip: str, cells: Mapping[Cell, tuple[str, ...]], defaults: Mapping[str, str]
                  ) -> tuple[list[Cell], trial_measure.Measured]:
    """The cells of one chip (cell -> its runs) whose variant and default both have trials in the cell's runs, in
    key order, and ``harness.stats.measure.measure`` of their (default, variant) trials: what the matrix reads of the
    samples."""
    by_run = {run: query.series_trials(store, [run]) for run in sorted({r for runs in cells.values() for r in runs})}

    def trials_of(runs: tuple[str, ...], kernel: str, variant: str, dtype: str, shape_key: str
                  ) -> list[npt.NDArray[np.float64]]:
        key = SeriesKey(kernel, variant, dtype, shape_key, chip)
        return [array for run in runs if key in by_run[run] for array in by_run[run][key].trials]

    keys, pairs = [], []
    for cell, runs in sorted(cells.items()):
        kernel, dtype, shape_key, variant, _ = cell
        baseline, values = trials_of(runs, kernel, defaults[kernel], dtype, shape_key), trials_of(
            runs, kernel, variant, dtype, shape_key)
        if baseline and values:
            keys.append(cell)
            pairs.append((baseline, values))
    return keys, trial_measure.measure(pairs)


def _cell(key: Cell, default: str, verdict: variants.VariantVerdict, runs: tuple[str, ...], sha: str, *,
          host_paced: bool = False) -> VariantCell:
    kernel, dtype, shape_key, variant, chip = key
    return VariantCell(kernel=kernel, variant=variant, dtype=dtype, shape_key=shape_key, chip=chip,
                       default_variant=default, **_verdict_fields(verdict), run_ids=runs, sha=sha,
                       host_paced=host_paced)


def _verdict_fields(verdict: variants.VariantVerdict) -> dict[str, object]:
    """``dataclasses.asdict`` of a verdict, whose fields are plain values: without its deep copy of each (a matrix
    has a cell per variant, shape and chip: 1,300 on the 1,000-commit benchmark, 25 ms of a report)."""
    return {name: getattr(verdict, name) for name in _VERDICT_FIELDS}


_VERDICT_FIELDS = tuple(f.name for f in dataclasses.fields(variants.VariantVerdict))


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0][:160] if (text or "").strip() else ""


def _gap_reason(presence: _Presence, series: Series, default: str, commit: str | None) -> tuple[str, str]:
    """(status, reason) of a variant series without a verdict on its chip, from the chip's newest job rows."""
    kernel, variant, dtype, shape_key, chip = series
    row = presence.newest.get(series)
    if row is None:
        return "", "never run at this commit on this chip" if commit else "never run on this chip"
    if row.status == "skipped":  # "variant cuda_x implements float16 only": one wording for every variant
        detail = _first_line(row.detail).replace(f"variant {variant} ", "the variant ")
        return row.status, f"skipped: {detail or 'no reason given'}"
    if not row.measured:
        return row.status, f"{row.status}: {_first_line(row.detail)}".rstrip(": ")
    base = presence.newest.get((kernel, default, dtype, shape_key, chip))
    if base is None:
        return row.status, f"default {default} never run here"
    if not base.measured:
        return row.status, f"default {default} {base.status}: {_first_line(base.detail)}".rstrip(": ")
    return row.status, f"never measured in one run with the default {default}"


def variant_matrix(
    store: Store,
    commit: str | None = None,
    min_effect: float = policy.DEFAULT_MIN_EFFECT,
    alpha: float = policy.DEFAULT_ALPHA,
    defaults: Mapping[str, str] | None = None,
    series: Mapping[SeriesKey, bool] | None = None,
    measure: MeasureCells | None = None,
) -> VariantMatrix:
    """Each variant vs its kernel's default variant, per (kernel, dtype, shape, chip), BH across the whole matrix.

    Runs: per cell, the newest run of the chip that measured both the variant and the default there (a newer run
    that measured other kernels does not hide it), or with ``commit`` every run of that commit on the chip that
    measured both (pooled). A cell is ``broken`` when the variant or the default failed a correctness job of that
    kernel on that chip in the cell's runs (with ``commit``: in any run of that commit there). ``defaults``
    (kernel -> default variant) overrides ``kernels.REGISTRY``; kernels known to neither are left out. ``gaps``
    names, per chip, each variant of a compared row that has no verdict there and why; ``shared`` counts the rows
    with verdicts on two chips or more. ``series``: ``query.benchmark_series(store)`` when the caller has it (read
    otherwise; not used with ``commit``). ``measure``: what reads each chip's cells' samples (``measure_cells``, by
    default; the report's analysis cache keeps them, ``VariantCells``).
    """
    defaults = {**default_variants(), **(defaults or {})}
    side = resolve_side(store, commit) if commit is not None else None
    presence = _presence(store, side.run_ids if side is not None else None, defaults, series)
    cell_runs = _cell_runs(presence, defaults, pooled=side is not None)
    used = sorted({run for runs in cell_runs.values() for run in runs})
    modes = {run: query.timing_modes(store, [run]) for run in used}
    host_paced = query.host_paced_series(store, used)
    failures = [CorrectnessFailure(*row) for row in query.correctness_failures(store, side.run_ids if side else used)]
    if side is not None:  # the commit's runs pooled: a failure in any of them gates every cell of its chip
        failed = {(run, f.kernel, f.variant) for f in failures for run in side.runs.get(f.chip, ())}
    else:
        failed = {(f.run_id, f.kernel, f.variant) for f in failures}

    def mode_of(runs: tuple[str, ...], kernel: str, variant: str, dtype: str, shape_key: str, chip: str) -> str:
        key = SeriesKey(kernel, variant, dtype, shape_key, chip)
        return "+".join(sorted({part for run in runs for part in modes[run].get(key, "").split("+") if part}))

    of_chip: dict[str, dict[Cell, tuple[str, ...]]] = {}
    for cell, runs in cell_runs.items():
        of_chip.setdefault(cell[4], {})[cell] = runs
    keys: list[Cell] = []
    parts = []
    for chip, cells in sorted(of_chip.items()):
        chip_keys, chip_measured = (measure or measure_cells)(store, chip, cells, defaults)
        keys += chip_keys
        parts.append(chip_measured)
    broken, mixed = set(), set()
    for cell in keys:
        kernel, dtype, shape_key, variant, chip = cell
        runs, default = cell_runs[cell], defaults[kernel]
        if any((run, kernel, name) in failed for run in runs for name in (variant, default)):
            broken.add(cell)
        # A variant and its default measured in the same runs, their trials interleaved: the spread between trials
        # is the noise of the comparison (harness.stats.trials); series timed in different modes are not compared.
        if not same_mode(mode_of(runs, kernel, default, dtype, shape_key, chip) or None,
                         mode_of(runs, kernel, variant, dtype, shape_key, chip) or None) or not timing_fit(chip):
            mixed.add(cell)  # or a virtual GPU's: its timings carry no verdict
    verdicts = trials.variant_measured_grid(keys, trial_measure.concat_measured(parts), min_effect=min_effect,
                                            alpha=alpha, broken=broken, incomparable=mixed)
    cells = {key: _cell(key, defaults[key[0]], verdict, cell_runs[key], presence.shas[cell_runs[key][0]],
                        host_paced=any(SeriesKey(key[0], name, key[1], key[2], key[4]) in host_paced
                                       for name in (key[3], defaults[key[0]])))
             for key, verdict in sorted(verdicts.items())}
    per_chip: dict[tuple[str, tuple[str, str], str], dict[str, variants.VariantVerdict]] = {}
    for (kernel, dtype, shape_key, variant, chip), verdict in verdicts.items():
        per_chip.setdefault((kernel, (dtype, shape_key), variant), {})[chip] = verdict
    divergent = [
        DivergentVariant(d.kernel, d.variant, d.shape[0], d.shape[1], d.winning_chip, d.losing_chip,
                         cells[(d.kernel, *d.shape, d.variant, d.winning_chip)],
                         cells[(d.kernel, *d.shape, d.variant, d.losing_chip)])
        for d in variants.find_divergent(per_chip)
    ]
    best = []
    for kernel in sorted({key[0] for key in per_chip}):
        kernel_cells = {key: value for key, value in per_chip.items() if key[0] == kernel}
        for (_, (dtype, shape_key), chip), variant in sorted(variants.best_variants(kernel_cells, defaults[kernel])
                                                             .items()):
            evidence = cells.get((kernel, dtype, shape_key, variant, chip))
            best.append(BestVariant(kernel, dtype, shape_key, chip, variant, defaults[kernel], evidence))
    if side is not None:
        runs, shas = dict(side.runs), {chip: side.sha for chip in side.runs}
    else:
        runs, shas = {}, {}
        for chip, chip_runs in sorted(presence.chips.items()):
            chosen = [run for run in chip_runs if run in used] or chip_runs[:1]  # newest first
            runs[chip], shas[chip] = tuple(chosen), presence.shas[chosen[0]]
    gaps = _gaps(presence, cells, defaults, sorted(runs), commit)
    rows_by_chip: dict[tuple[str, str, str], set[str]] = {}
    for kernel, dtype, shape_key, _, chip in cells:
        rows_by_chip.setdefault((kernel, dtype, shape_key), set()).add(chip)
    shared = sum(1 for chips in rows_by_chip.values() if len(chips) > 1)
    return VariantMatrix(runs, shas, tuple(cells.values()), tuple(divergent), tuple(best), tuple(failures),
                         tuple(gaps), shared)


def _gaps(presence: _Presence, cells: Mapping[Cell, VariantCell], defaults: Mapping[str, str], chips: list[str],
          commit: str | None) -> list[VariantGap]:
    """Every variant of a row with a verdict somewhere that has none on one of ``chips``, with why."""
    rows = {(kernel, dtype, shape_key) for kernel, dtype, shape_key, _, _ in cells}
    variants: dict[tuple[str, str, str], set[str]] = {}
    for kernel, dtype, shape_key, variant, _ in cells:
        variants.setdefault((kernel, dtype, shape_key), set()).add(variant)
    for kernel, variant, dtype, shape_key, chip in presence.newest:
        if (kernel, dtype, shape_key) in rows and chip in chips and variant != defaults.get(kernel):
            variants[(kernel, dtype, shape_key)].add(variant)
    gaps = []
    for (kernel, dtype, shape_key), names in sorted(variants.items()):
        for variant in sorted(names):
            for chip in chips:
                if (kernel, dtype, shape_key, variant, chip) not in cells:
                    status, reason = _gap_reason(presence, (kernel, variant, dtype, shape_key, chip),
                                                 defaults[kernel], commit)
                    gaps.append(VariantGap(kernel, variant, dtype, shape_key, chip, status, reason))
    return gaps


def tuning_drift(
    store: Store,
    base_commit: str,
    head_commit: str,
    min_effect: float = policy.DEFAULT_MIN_EFFECT,
    alpha: float = policy.DEFAULT_ALPHA,
    defaults: Mapping[str, str] | None = None,
) -> list[TuningDrift]:
    """(kernel, dtype, shape, chip) whose best variant changed between two commits (chips and shapes on both)."""
    before = variant_matrix(store, base_commit, min_effect=min_effect, alpha=alpha, defaults=defaults)
    after = variant_matrix(store, head_commit, min_effect=min_effect, alpha=alpha, defaults=defaults)

    def best_map(matrix: VariantMatrix) -> dict[tuple[str, str, str, str], BestVariant]:
        return {(b.kernel, b.dtype, b.shape_key, b.chip): b for b in matrix.best}

    best_before, best_after = best_map(before), best_map(after)
    changes = variants.tuning_drift({k: b.variant for k, b in best_before.items()},
                                 {k: b.variant for k, b in best_after.items()})
    return [TuningDrift(*change.key, change.before, change.after, best_before[change.key].evidence,
                        best_after[change.key].evidence) for change in changes]
