"""The job catalogue: each chip's distinct jobs (the chip pages' units, the variant matrix's series), cached."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from harness.analysis.cache.common import code_version, digest, log
from harness.core.errors import first_line
from harness.record import analysis_cache, query
from harness.record.store import Store

# ---------------------------------------------------------------------------------------------------------------
# The jobs every run of a chip has: the chip pages' units, the variant matrix's series
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobCatalogue:
    """``query.job_units(store, kinds)`` (per chip: its units) and ``query.benchmark_series(store)`` (every
    benchmark series, and whether a job of it has a median time)."""

    units: dict[str, set[tuple[str, str]]]
    series: dict[query.SeriesKey, bool]


def job_catalogue(store: Store, chips: Sequence[str], kinds: Sequence[str], *, use_cache: bool = True,
                  states: Mapping[str, analysis_cache.ChipState] | None = None) -> JobCatalogue:
    """``JobCatalogue`` of ``chips`` (every chip with runs; ``kinds`` must include "benchmark"): two reads of the
    whole job table (seconds on a long history), or, cached, per chip its ``analysis_cache.chip_jobs`` (kind
    ``jobs``), kept while the chip's runs are the same -- the fingerprints of all its runs, dirty ones too
    (``analysis_cache.chip_state``: a run added, deleted or gaining jobs changes them; a job's kind, key and series
    are written once) -- and none of them gained samples since (a later trial appended to a stored job may give it
    its median time: ``touched_since`` above the watermark read before the jobs). A chip that only gained runs (every
    stored run still there, its fingerprint the same, no sample added to it) reads the jobs of the new runs alone
    (the distinct jobs of all runs are those stored and the new runs'); a chip whose runs changed otherwise is read
    again, alone. ``states``: as ``analyse``'s."""
    if "benchmark" not in kinds:
        raise ValueError("the job catalogue lists benchmark series: kinds must include 'benchmark'")
    if not use_cache:
        return JobCatalogue(query.job_units(store, kinds), query.benchmark_series(store))
    units: dict[str, set[tuple[str, str]]] = {}
    series: dict[query.SeriesKey, bool] = {}
    for chip in sorted(chips):
        state = (states or {}).get(chip) or analysis_cache.chip_state(store, chip, include_dirty=True)
        for kind, job_key, kernel, variant, dtype, shape_key, measured in _chip_jobs(store, chip, kinds, state):
            units.setdefault(chip, set()).add(query.unit_of(kind, job_key, kernel))
            if kind == "benchmark":
                series_key = query.SeriesKey(kernel, variant, dtype, shape_key, chip)
                series[series_key] = series.get(series_key, False) or measured
    return JobCatalogue(units, series)


JobRow = tuple[str, str, str, str, str, str, bool]  # ``analysis_cache.chip_jobs``' rows


@dataclass(frozen=True)
class _StoredJobs:
    """A chip's stored ``jobs`` row: the code version and kinds it was read for (``base``), each of its runs'
    fingerprint digest, its distinct jobs."""

    base: str
    runs: dict[str, str]
    rows: list[JobRow]

    def to_bytes(self) -> bytes:
        return json.dumps({"base": self.base, "runs": self.runs, "rows": self.rows}, separators=(",", ":")).encode()

    @classmethod
    def of(cls, payload: bytes) -> _StoredJobs | None:
        try:
            data = json.loads(payload)
            return cls(str(data["base"]), {str(run): str(d) for run, d in data["runs"].items()},
                       [(str(k), str(j), str(n), str(v), str(d), str(sh), bool(m))
                        for k, j, n, v, d, sh, m in data["rows"]])
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _chip_jobs(store: Store, chip: str, kinds: Sequence[str], state: analysis_cache.ChipState) -> list[JobRow]:
    """``analysis_cache.chip_jobs`` of the chip, from its stored row where its runs are the same (or only more: the
    new runs' jobs read alone), then stored again (see ``job_catalogue``)."""
    version = code_version()
    key = digest(version, sorted(kinds), sorted(state.runs.items()))[:40]
    base = digest(version, sorted(kinds))[:40]
    runs = {p[0]: digest(p)[:24] for prints in state.runs.values() for p in prints}
    rows: list[JobRow] | None = None
    try:
        entry = analysis_cache.read_entries(store, chip, "jobs", ["jobs"]).get("jobs")
        stored = _StoredJobs.of(entry.payload) if entry is not None and entry.watermark is not None else None
        if entry is not None and stored is not None and stored.base == base:
            touched = analysis_cache.touched_since(store, state.run_commit, entry.watermark or 0)
            if entry.key == key and not any(run in state.run_commit for run in touched):
                if state.watermark > (entry.watermark or 0):
                    analysis_cache.stamp(store, chip, "jobs", "jobs", key, state.watermark)
                return stored.rows
            if all(runs.get(run) == d for run, d in stored.runs.items()) and not any(
                    run in stored.runs for run in touched):  # runs added, none changed
                added = [run for run in runs if run not in stored.runs]
                rows = sorted({*stored.rows, *analysis_cache.chip_jobs(store, chip, kinds, runs=added)})
    except SQLAlchemyError:
        rows = None
    if rows is None:
        rows = analysis_cache.chip_jobs(store, chip, kinds)
    try:
        analysis_cache.write_entries(store, chip, "jobs", {"jobs": analysis_cache.Entry(
            key, _StoredJobs(base, runs, rows).to_bytes(), state.watermark)})
    except SQLAlchemyError as exc:  # the next report reads them again
        log.warning("analysis cache: could not store the jobs of %s: %s", chip, first_line(exc))
    return rows
