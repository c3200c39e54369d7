"""The noise meter: per chip and series, the spread inside a job process, between the processes (trials) of a run,
and between runs (the series' recent history on the base branch), and the smallest change a comparison could
detect (``harness.stats.trials.noise_meter``). Read by `harness noise`, the chip pages of the report and compare."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from harness.analysis.compare import resolve_side, series_floors
from harness.analysis.records import ChipNoise, NoiseReport, NoiseRow
from harness.record import query
from harness.record.store import Store
from harness.stats import noise

__all__ = ["LEVELS", "chip_noise_rows", "noise_report"]

LEVELS = ("within", "between_trial", "between_run", "detectable")


def _runs(store: Store, ref: str | None, chip: str | None) -> dict[str, tuple[str, ...]]:
    if ref is not None:
        return resolve_side(store, ref, chip).runs
    latest, _ = query.latest_runs(store)
    return {key: ids for key, ids in latest.items() if chip in (None, key)}


def _percentiles(values: list[float]) -> tuple[float, float]:
    kept = [v for v in values if math.isfinite(v)]
    if not kept:
        return (math.nan, math.nan)
    return (float(np.median(kept)), float(np.percentile(kept, 90)))


def chip_noise_rows(store: Store, run_ids: Sequence[str]) -> list[NoiseRow]:
    """The noise of every series of the given runs of one chip (pooled), in key order: what ``noise_report`` shows
    of a chip. Reads the runs' samples and job rows, and the medians of their history runs (``series_floors``)."""
    measured = query.series_trials(store, list(run_ids))
    floors = series_floors(store, list(run_ids))
    modes = query.timing_modes(store, list(run_ids))
    rows = []
    for key, series in sorted(measured.items()):
        floor = floors.get(key)
        meter = noise.noise_meter(series.trials, floor)
        rows.append(NoiseRow(key, float(np.median(np.concatenate(series.trials))), meter.trials, meter.within,
                             meter.between_trial, meter.between_run, floor.runs if floor else 0, meter.detectable,
                             modes.get(key, "")))
    return rows


def noise_report(store: Store, ref: str | None = None, chip: str | None = None,
                 rows_of: Callable[[str, Sequence[str]], list[NoiseRow]] | None = None) -> NoiseReport:
    """The noise of every series of ``ref`` (a commit: its runs pooled; a run id) on each chip, by default each
    chip's latest run; the between-run level comes from the runs of ``ref``'s commit and its first-parent ancestors.
    ``rows_of`` (chip, run ids) -> ``chip_noise_rows`` of them (the report's cache passes one that reuses them)."""
    query.check_chip(store, chip)
    chips, rows = [], []
    for chip_key, run_ids in sorted(_runs(store, ref, chip).items()):
        chip_rows = rows_of(chip_key, run_ids) if rows_of is not None else chip_noise_rows(store, run_ids)
        levels = {level: _percentiles([getattr(row, level) for row in chip_rows]) for level in LEVELS}
        paced = query.host_paced_series(store, run_ids)
        chips.append(ChipNoise(chip_key, tuple(run_ids), len(chip_rows),
                               sum(1 for row in chip_rows if row.history_runs), levels,
                               sum(1 for row in chip_rows if row.key in paced)))
        rows.extend(chip_rows)
    return NoiseReport(tuple(chips), tuple(rows))
