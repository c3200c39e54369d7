"""The rows behind pages a report shows: compare reports, noise meters and the variant matrix's measured cells."""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from harness.analysis import compare as compare_module
from harness.analysis import noise as noise_module
from harness.analysis import variants as variants_module
from harness.analysis.cache.common import code_version, digest, frame, log, unframe
from harness.analysis.records import (
    CompareReport,
    CompareRow,
    CorrectnessFailure,
    NoiseRow,
    Side,
)
from harness.core.errors import first_line
from harness.record import analysis_cache, query
from harness.record.store import Store
from harness.stats import measure, policy

# ---------------------------------------------------------------------------------------------------------------
# Compare pages
# ---------------------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A compare report as JSON values, floats exact (nan and inf kept: ``json`` writes them as NaN / Infinity)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    names = _FIELD_NAMES.get(kind)
    if names is None and is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(value))
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # SeriesKey (a named tuple) too: a list of its fields
        return [_plain(v) for v in value]
    return value


_SCALARS = frozenset({float, int, str, bool, type(None)})  # returned as they are (not their subclasses: numpy's)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass type's field names, in order


_ROW_FIELDS = tuple(f.name for f in fields(CompareRow))  # a stored row's values, in this order (its key first)


def _report_out(report: CompareReport) -> bytes:
    """The report as JSON (``_plain``), its rows as lists of their fields' values: hundreds of rows a page, read
    back at every report (lists decode twice as fast as objects, and make rows positionally)."""
    values = _plain(report)
    values["rows"] = [[row[name] for name in _ROW_FIELDS] for row in values["rows"]]
    return zlib.compress(json.dumps(values, allow_nan=True, separators=(",", ":")).encode())


def _side_in(values: dict[str, Any]) -> Side:
    return Side(**{**values, "runs": {chip: tuple(ids) for chip, ids in values["runs"].items()}})


def _report_in(payload: bytes) -> CompareReport:
    values = json.loads(zlib.decompress(payload))
    return CompareReport(
        _side_in(values["base"]), _side_in(values["head"]),
        tuple(CompareRow(query.SeriesKey(*row[0]), *row[1:]) for row in values["rows"]),
        tuple(CorrectnessFailure(**failure) for failure in values["correctness_failures"]),
        values["counts"], values["only_base"], values["only_head"], values["min_effect"], values["alpha"])


class RunPrints:
    """``analysis_cache.run_prints`` of the runs asked for, each run read once (the pages of a report share runs:
    within ``store.memoised`` every ``RunPrints`` shares what was read), their job ids summed once
    (``analysis_cache.job_id_summaries``, or ``jobs`` when the caller read them)."""

    def __init__(self, store: Store, jobs: analysis_cache.JobIds | None = None) -> None:
        self.store = store
        self._prints: dict[str, tuple[Any, ...] | None] = store.memo(("run prints",), dict)
        self._jobs = jobs

    def __call__(self, run_ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        missing = sorted({i for i in run_ids if i not in self._prints})
        if missing:
            if self._jobs is None:
                self._jobs = job_ids(self.store)
            found = analysis_cache.run_prints(self.store, missing, jobs=self._jobs)
            self._prints.update({i: found.get(i) for i in missing})
        return {i: p for i in run_ids if (p := self._prints[i]) is not None}


def job_ids(store: Store) -> analysis_cache.JobIds:
    """``analysis_cache.job_id_summaries``, summed once within ``store.memoised``."""
    return store.memo(("job id summaries",), lambda: analysis_cache.job_id_summaries(store))


class ComparePages:
    """``compare.compare`` of the (base, head) pairs a report shows, each reused from the analysis cache while
    nothing it reads changed (see the module docstring, ``compare``); ``flush`` stores what was computed and drops
    the rows of pairs not shown this time. ``use_cache=False``: computed, nothing read or written."""

    def __init__(self, store: Store, *, use_cache: bool = True, min_effect: float = policy.DEFAULT_MIN_EFFECT,
                 alpha: float = policy.DEFAULT_ALPHA) -> None:
        self.store, self.use_cache, self.min_effect, self.alpha = store, use_cache, min_effect, alpha
        self.shown: dict[str, set[str]] = {}
        self.computed: dict[str, dict[str, analysis_cache.Entry]] = {}
        self.reused = 0
        self.run_prints = RunPrints(store)
        self._stored: dict[str, dict[str, analysis_cache.Entry]] = {}  # each chip's compare rows, read once
        self._payloads: dict[int, tuple[CompareReport, str]] = {}  # id(report) -> (report, its payload's digest)

    def prefetch(self, pairs: Sequence[tuple[str, str, str]]) -> None:
        """Before ``compare`` of each (base, head, chip): their refs resolved in one go (``query.prefetch_refs``) and
        each chip's stored compare rows read in one query, not one a page (the rows of the pages shown last time)."""
        if not self.use_cache:
            return
        query.prefetch_refs(self.store, [(ref, chip) for base, head, chip in pairs for ref in (base, head)])
        for chip in sorted({chip for _, _, chip in pairs} - set(self._stored)):
            self._stored[chip] = analysis_cache.read_entries(self.store, chip, "compare")

    def compare(self, base: str, head: str, chip: str) -> CompareReport:
        if not self.use_cache:
            return compare_module.compare(self.store, base, head, chip=chip, min_effect=self.min_effect,
                                          alpha=self.alpha)
        base_side = compare_module.resolve_side(self.store, base, chip)
        head_side = compare_module.resolve_side(self.store, head, chip)
        runs = [*base_side.run_ids, *head_side.run_ids, *query.history_run_ids(self.store, base_side.run_ids)]
        prints = self.run_prints(runs)
        # compare reads the sides' runs only: its report on other refs to the same runs differs in the sides alone
        compared = (tuple(base_side.run_ids), tuple(head_side.run_ids))
        key = digest(code_version(), *compared, sorted(prints.values()), self.min_effect, self.alpha)
        name = digest(chip, *compared)[:32]
        self.shown.setdefault(chip, set()).add(name)
        stored = self._stored.get(chip)
        entry = (stored if stored is not None else analysis_cache.read_entries(self.store, chip, "compare", [name])
                 ).get(name)
        if entry is not None and entry.key == key:
            try:
                report = dataclasses.replace(_report_in(entry.payload), base=base_side, head=head_side)
                self.reused += 1
                self._payloads[id(report)] = (report, digest(entry.payload))
                return report
            except (ValueError, TypeError, KeyError, zlib.error):  # unreadable: computed again below
                log.warning("analysis cache: compare row of %s unreadable, recomputed", chip)
        report = compare_module.compare(self.store, base, head, chip=chip, min_effect=self.min_effect,
                                        alpha=self.alpha, sides=(base_side, head_side))
        payload = _report_out(report)
        self.computed.setdefault(chip, {})[name] = analysis_cache.Entry(key, payload)
        self._payloads[id(report)] = (report, digest(payload))
        return report

    def content(self, report: CompareReport, proven: bool) -> str:
        """A digest that stands for the rows of ``compare``'s ``report`` as ``compare.for_order(report, proven)``
        gives them -- what its stored payload holds, the analysis code that decodes it and ``proven`` -- so that a
        page showing them is fingerprinted by it, not by the text of hundreds of rows (``CompareView.content``);
        "" where it has none (computed without the cache, or not by ``compare``)."""
        found = self._payloads.get(id(report))
        if found is None or found[0] is not report:
            return ""
        return digest(code_version(), found[1], proven)

    def flush(self) -> None:
        if self.use_cache:
            _store_shown(self.store, "compare", self.shown, self.computed)


def _store_shown(store: Store, kind: str, shown: dict[str, set[str]],
                 computed: dict[str, dict[str, analysis_cache.Entry]]) -> None:
    """Store each chip's rows of ``kind`` computed in this report and drop those not shown this time; a failure only
    costs the next report the work again."""
    for chip, names in shown.items():
        try:
            analysis_cache.write_entries(store, chip, kind, computed.get(chip, {}), keep=names)
        except SQLAlchemyError as exc:
            log.warning("analysis cache: could not store %s rows of %s: %s", kind, chip,
                        first_line(exc))


# ---------------------------------------------------------------------------------------------------------------
# The chip pages' noise meters
# ---------------------------------------------------------------------------------------------------------------


class _ShownRows:
    """The rows of one kind a report shows, per chip: what it computed (``computed``), stored by ``flush``, which
    drops the chip's rows of that kind it did not show (``shown``); the runs' fingerprints read once (``RunPrints``,
    from ``jobs`` when the caller read the job-id summaries)."""

    KIND = ""

    def __init__(self, store: Store, *, use_cache: bool = True, jobs: analysis_cache.JobIds | None = None) -> None:
        self.store, self.use_cache = store, use_cache
        self.shown: dict[str, set[str]] = {}
        self.computed: dict[str, dict[str, analysis_cache.Entry]] = {}
        self.reused = 0
        self.run_prints = RunPrints(store, jobs)

    def flush(self) -> None:
        if self.use_cache:
            _store_shown(self.store, self.KIND, self.shown, self.computed)


class NoiseRows(_ShownRows):
    """``noise.chip_noise_rows`` of the (chip, runs) the report shows (``noise.noise_report``'s ``rows_of``), each
    reused from the analysis cache (kind ``noise``) while nothing it reads changed: the runs and their history runs
    (``query.history_run_ids``, chosen afresh) with their fingerprints (``analysis_cache.run_prints``: a run's jobs
    and its highest sample id), as ``ComparePages`` keys a compare page. ``flush`` stores what was computed and drops
    the rows of runs not shown this time. ``use_cache=False``: computed, nothing read or written."""

    KIND = "noise"

    def __call__(self, chip: str, run_ids: Sequence[str]) -> list[NoiseRow]:
        if not self.use_cache:
            return noise_module.chip_noise_rows(self.store, run_ids)
        runs = [*run_ids, *query.history_run_ids(self.store, list(run_ids))]
        prints = self.run_prints(runs)
        key = digest(code_version(), tuple(run_ids), runs, sorted(prints.items()))[:40]
        name = digest(tuple(run_ids))[:32]
        self.shown.setdefault(chip, set()).add(name)
        try:
            entry = analysis_cache.read_entries(self.store, chip, self.KIND, [name]).get(name)
            if entry is not None and entry.key == key:
                rows = [NoiseRow(query.SeriesKey(*values[:5]), *values[5:]) for values in json.loads(entry.payload)]
                self.reused += 1
                return rows
        except (ValueError, TypeError, SQLAlchemyError):  # unreadable: computed again below
            pass
        rows = noise_module.chip_noise_rows(self.store, run_ids)
        payload = json.dumps([[*row.key, *(getattr(row, f.name) for f in fields(row)[1:])] for row in rows],
                             separators=(",", ":"))
        self.computed.setdefault(chip, {})[name] = analysis_cache.Entry(key, payload.encode())
        return rows



# ---------------------------------------------------------------------------------------------------------------
# The variant matrix's cells
# ---------------------------------------------------------------------------------------------------------------

_CELLS_MAGIC = b"HARNESS-VARIANT-CELLS\n"
_MEASURED_INTS = ("trials_base", "trials_head", "samples_base", "samples_head", "df")
_MEASURED_FLOATS = ("effect", "variance")


def _measured_out(keys: Sequence[variants_module.Cell], measured: measure.Measured) -> bytes:
    logs = [side for pair in measured.logs for side in pair]
    body = b"".join([*(np.ascontiguousarray(getattr(measured, name), dtype=np.int64).tobytes()
                       for name in _MEASURED_INTS),
                     *(np.ascontiguousarray(getattr(measured, name), dtype=np.float64).tobytes()
                       for name in _MEASURED_FLOATS),
                     np.ascontiguousarray(np.concatenate(logs) if logs else np.zeros(0), dtype=np.float64).tobytes()])
    return frame(_CELLS_MAGIC, {"keys": [list(key) for key in keys]}, body)


def _measured_in(payload: bytes) -> tuple[list[variants_module.Cell], measure.Measured] | None:
    """``_measured_out``'s cells and measurements; None when unreadable."""
    try:
        if (framed := unframe(payload, _CELLS_MAGIC)) is None:
            return None
        header, body = framed
        keys = [tuple(str(part) for part in key) for key in header["keys"]]
        n, offset, columns = len(keys), 0, {}
        for name in (*_MEASURED_INTS, *_MEASURED_FLOATS):
            dtype = np.int64 if name in _MEASURED_INTS else np.float64
            columns[name] = np.frombuffer(body, dtype=dtype, count=n, offset=offset).copy()
            offset += n * 8
        logs_flat = np.frombuffer(body, dtype=np.float64, offset=offset).copy()
        sizes = [int(size) for pair in zip(columns["trials_base"], columns["trials_head"], strict=True)
                 for size in pair]
        if sum(sizes) != logs_flat.size or any(len(key) != 5 for key in keys):
            return None
        sides = np.split(logs_flat, np.cumsum(sizes)[:-1]) if sizes else []
        logs = list(zip(sides[0::2], sides[1::2], strict=True))
        return keys, measure.Measured(**columns, logs=logs)
    except (ValueError, KeyError, TypeError, struct.error):
        return None


class VariantCells(_ShownRows):
    """``variants.measure_cells`` of each chip the variant matrix compares (``variants.MeasureCells``), reused from
    the analysis cache (kind ``variants``, a row per chip) while the chip's cells compare the same runs and those
    runs' fingerprints (``RunPrints``: their jobs and highest sample id) are the same: after a new run on one chip the
    others' samples are not read. ``flush`` stores what was measured. ``use_cache=False``: measured, nothing stored."""

    KIND, NAME = "variants", "cells"

    def __call__(self, store: Store, chip: str, cells: Mapping[variants_module.Cell, tuple[str, ...]],
                 defaults: Mapping[str, str]) -> tuple[list[variants_module.Cell], measure.Measured]:
        if not self.use_cache:
            return variants_module.measure_cells(store, chip, cells, defaults)
        prints = self.run_prints(sorted({run for runs in cells.values() for run in runs}))
        key = digest(code_version(), sorted(cells.items()), sorted(defaults.items()), sorted(prints.items()))[:40]
        self.shown.setdefault(chip, set()).add(self.NAME)
        try:
            entry = analysis_cache.read_entries(store, chip, self.KIND, [self.NAME]).get(self.NAME)
        except SQLAlchemyError:
            entry = None
        if entry is not None and entry.key == key and (found := _measured_in(entry.payload)) is not None:
            self.reused += 1
            return found
        keys, measured = variants_module.measure_cells(store, chip, cells, defaults)
        self.computed.setdefault(chip, {})[self.NAME] = analysis_cache.Entry(key, _measured_out(keys, measured))
        return keys, measured
