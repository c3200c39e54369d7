"""The report's history and regression analysis, cached in the database so that a report after a new run recomputes
only what the run changed (``harness.record.analysis_cache`` stores the rows; ``analyse`` is the entry point).

What is kept, per chip (``analysis_cache.kind``):

- ``cells`` (``cells+dirty`` with dirty runs), one row per commit: for every series measured at the commit,
  everything the analysis reads of that cell's samples -- the history point's level, interval and sample count
  (``history.trial_levels``) and the trial and run summaries the regression screen works on
  (``regressions.cell_summaries``).  Each depends on the cell's own samples only, so a commit's row holds while its
  runs do.  Key: the code version and the fingerprints of the commit's included runs (``analysis_cache.chip_state``:
  id, dirty, start, finish, status, branch and the count/min/max/sum of their job ids -- a new, deleted, reaped,
  finished, re-dated or re-flagged run, a run gaining or losing jobs, a bundle's runs all change it).  A later trial
  appended to a stored job adds samples and no job: each row carries the highest sample id when it was checked
  (``watermark``, advanced by the ``stamps`` row), and a sample of its runs above it (``touched_since``) makes it
  stale.  A commit with a run not finished is computed every time and never stored (its samples may still come, and
  on PostgreSQL commit with ids below a watermark already read).
- ``series``: the series lists the ``cells`` rows refer to, named by their digest (content-addressed).
- ``changes``, one row per series: its change points, keyed by a digest of exactly what
  ``stats.detect_change_points`` is given (each line's levels, bit for bit, and the parameters).
- ``families``, one row per chip and window: each commit's confirmed regressions (its family: every series against
  its previous point, BH across the commit's grid), keyed per commit by a digest of the commits the family reads
  (the head and, up its chain of previous commits, as far as the bases and history floors reach) with their cells'
  identities, the kernels broken at the head and the parameters.
- ``correctness``: the chip's correctness job statuses and failures, keyed by all its runs' fingerprints (a
  correctness job is written once).
- ``compare``, one row per pair of run sets a compare page the report shows compares (``ComparePages``): the
  ``harness compare`` report, keyed by the fingerprints of everything it reads -- both sides' runs and the runs the
  base side's history floors come from (``analysis_cache.run_prints``: a run's fingerprint plus its highest sample id,
  read once per report) -- and the parameters.  A row is named by the runs, not by the refs: a regression's (base,
  head) commits reuse the chip page's compare of the same two runs, named by run ids, with the sides as resolved now.
  Rows of pairs the report no longer shows are deleted.
- ``noise``, one row per chip page's (chip, runs) (``NoiseRows``): its noise meters, keyed as a compare page is (the
  runs and their history runs with their fingerprints).
- ``variants``, one row per chip (``VariantCells``): what the variant matrix reads of the samples of its cells on
  the chip (each cell's trial log medians and counts, ``trials.measure``), keyed by the cells with their runs, the
  default variants and the runs' fingerprints; the matrix's verdicts (moderation and BH across every chip's cells)
  are computed from all chips' rows each time.
- ``chip``, one row per chip and options (dirty runs, window, change points): the chip's whole analysis -- every
  series' history points and change points, and its regression list -- keyed by the code version, the parameters,
  the history order with each commit's identity (``analysis_cache.arrangement``) and the fingerprints of all its
  included runs, with the watermark: a chip none of whose runs changed (after a new run on another chip, or a report
  with nothing new) is read from this one row instead of assembled from its commits' rows; a sample of its runs above
  the watermark (a later trial) or any other change recomputes it from the rows above.
- ``jobs``: the chip's distinct jobs (``job_catalogue``: the chip pages' units, the variant matrix's series), keyed
  by the fingerprints of all its runs, dirty ones too, with the watermark (a later trial may give a job its median);
  a chip that only gained runs reads the new runs' jobs alone.

The history order, window, commit messages and correctness events are derived afresh every time (no samples read);
histories are rebuilt from the cells.  The code version (``code_version``) hashes the analysis sources, numpy's and
scipy's versions: any change recomputes everything.  A row that is missing, unreadable or under another key is
recomputed; rows are written after the analysis (a failed write costs only time).  Results equal those of
``history.history`` and ``regressions.regressions`` bit for bit (both take the series in key order).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import struct
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
import scipy
from sqlalchemy.exc import SQLAlchemyError

from harness.analysis import compare as compare_module
from harness.analysis import history as history_module
from harness.analysis import noise as noise_module
from harness.analysis import records as records_module
from harness.analysis import regressions as regressions_module
from harness.analysis import segment_search
from harness.analysis import variants as variants_module
from harness.analysis.history import (
    Flags,
    by_series_key,
    detect_lines,
    series_histories,
    trial_levels,
    with_flags,
)
from harness.analysis.records import (
    CompareReport,
    CompareRow,
    CorrectnessFailure,
    HistoryPoints,
    NoiseRow,
    RegressionEvidence,
    SeriesHistory,
    Side,
)
from harness.analysis.regressions import (
    cell_summaries,
    correctness_regressions,
    performance_regressions,
)
from harness.core import defaults, distributions, fork, stats, trials
from harness.core.chip import timing_fit
from harness.core.errors import first_line
from harness.record import analysis_cache, ancestry, bundle, query
from harness.record.store import Store

__all__ = ["CacheStats", "ComparePages", "JobCatalogue", "NoiseRows", "analyse", "cache_log", "code_version",
           "job_catalogue", "replay_log"]

log = logging.getLogger(__name__)


@contextmanager
def cache_log() -> Iterator[list[str]]:
    """The INFO lines this module logs meanwhile (what the caches reused and computed: ``harness report --timings``
    shows them), collected into the list given and not passed on: a forked analysis sends them to the report's own
    process, which logs them again (``replay_log``)."""
    notes: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: notes.append(record.getMessage())  # type: ignore[method-assign]
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield notes
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def replay_log(notes: Sequence[str]) -> None:
    """Log the lines ``cache_log`` collected (in another process) as if logged here."""
    for note in notes:
        log.info("%s", note)

FORMAT = 1  # of the payloads below
_MAGIC = b"HARNESS-CELLS\n"
# The code whose results are cached: any change to it (or to numpy / scipy) is a new version, every key changes.
_SOURCES = (history_module, segment_search, regressions_module, records_module, compare_module, noise_module,
            variants_module, stats, distributions, trials, defaults, query, analysis_cache, ancestry)


@cache
def code_version() -> str:
    digest = hashlib.sha256(f"format {FORMAT}; numpy {np.__version__}; scipy {scipy.__version__}".encode())
    for module in (*_SOURCES, sys.modules[__name__]):
        try:
            digest.update(Path(module.__file__ or "").read_bytes())
        except OSError:  # no source to read (a frozen install): the module's name and the package version
            digest.update(f"{module.__name__} {bundle.harness_version()}".encode())
    return digest.hexdigest()[:32]


def _digest(*parts: Any) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


@dataclass
class CacheStats:
    """What the cache saved, per chip: commits whose cells were reused / computed, series whose change points were
    reused / computed, regression families reused / computed."""

    cells: dict[str, tuple[int, int]] = field(default_factory=dict)
    changes: dict[str, tuple[int, int]] = field(default_factory=dict)
    families: dict[str, tuple[int, int]] = field(default_factory=dict)
    unfinished: dict[str, int] = field(default_factory=dict)  # commits computed but not stored: a run not finished
    write_errors: int = 0
    chips_reused: int = 0  # chips whose whole analysis was reused (none of their runs changed)

    def summary(self) -> str:
        def total(d: dict[str, tuple[int, int]]) -> str:
            return f"{sum(r for r, _ in d.values())} reused, {sum(c for _, c in d.values())} computed"

        return (f"cells {total(self.cells)}; change points {total(self.changes)}; families {total(self.families)}; "
                f"chips reused whole {self.chips_reused}")


# ---------------------------------------------------------------------------------------------------------------
# One commit's cells, as stored
# ---------------------------------------------------------------------------------------------------------------

_ARRAYS = (("counts", "<i8"), ("level", "<f8"), ("low", "<f8"), ("high", "<f8"), ("trials", "<i8"),
           ("mean_log", "<f8"), ("squares", "<f8"), ("runs", "<i8"), ("run_levels", "<f8"))


@dataclass(frozen=True)
class _CommitCells:
    """One commit's cells, its series in key order: per series the arrays of ``_ARRAYS`` (``run_levels``: each
    series' runs in start order, one after the other); ``digest`` names the content (series and arrays)."""

    series: tuple[tuple[str, str, str, str], ...]
    arrays: dict[str, npt.NDArray[Any]]
    digest: str


def _series_digest(series: Sequence[tuple[str, str, str, str]]) -> tuple[str, bytes]:
    text = json.dumps([list(s) for s in series], separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest()[:40], text


def _frame(magic: bytes, header: dict[str, Any], body: bytes) -> bytes:
    """A stored payload: ``magic``, the JSON header's length and the header (with the body's checksum), the body."""
    text = json.dumps({**header, "crc": zlib.crc32(body)}, separators=(",", ":")).encode()
    return magic + struct.pack("<I", len(text)) + text + body


def _unframe(payload: bytes, magic: bytes) -> tuple[dict[str, Any], memoryview] | None:
    """``_frame``'s header and body; None when the payload is not one (another magic, truncated, corrupted)."""
    if not payload.startswith(magic):
        return None
    at = len(magic)
    (length,) = struct.unpack_from("<I", payload, at)
    header = json.loads(payload[at + 4:at + 4 + length])
    body = memoryview(payload)[at + 4 + length:]
    return (header, body) if zlib.crc32(body) == header["crc"] else None


def _encode(cells: _CommitCells, series_name: str) -> bytes:
    body = b"".join(np.ascontiguousarray(cells.arrays[name], dtype=dtype).tobytes() for name, dtype in _ARRAYS)
    return _frame(_MAGIC, {"series": series_name, "n": len(cells.series),
                           "sizes": [int(cells.arrays[name].size) for name, _ in _ARRAYS], "digest": cells.digest},
                  body)


def _decode(payload: bytes, catalogue: Callable[[str], tuple[tuple[str, str, str, str], ...] | None]
            ) -> _CommitCells | None:
    """The cells of a stored payload; None if it is not one (truncated, corrupted, another format)."""
    try:
        if (framed := _unframe(payload, _MAGIC)) is None:
            return None
        header, body = framed
        series = catalogue(header["series"])
        n = int(header["n"])
        if series is None or len(series) != n:
            return None
        arrays, offset = {}, 0
        for (name, dtype), size in zip(_ARRAYS, header["sizes"], strict=True):
            width = np.dtype(dtype).itemsize
            arrays[name] = np.frombuffer(body, dtype=dtype, count=size, offset=offset)
            offset += size * width
        if offset != len(body) or any(arrays[name].size != n for name, _ in _ARRAYS if name != "run_levels") \
                or arrays["run_levels"].size != int(arrays["runs"].sum()):
            return None
        return _CommitCells(series, arrays, str(header["digest"]))
    except (ValueError, KeyError, TypeError, struct.error):
        return None


def _commit_cells(data: query.ChipHistory, has_jobs: npt.NDArray[np.bool_]) -> dict[int, _CommitCells]:
    """Per commit id of ``data`` (as ``analysis_cache.commit_history`` loads it, with ``has_jobs``): its cells."""
    has_jobs = has_jobs[:, sorted(range(len(data.series)), key=data.series.__getitem__)]
    data = by_series_key(data)
    n_series = len(data.series)
    present = np.flatnonzero(data.counts.ravel() > 0)
    level, low, high = (np.full(data.counts.size, np.nan) for _ in range(3))
    level[present], low[present], high[present] = trial_levels(data, present)
    summaries = cell_summaries(data)
    flat = {"counts": data.counts.ravel(), "level": level, "low": low, "high": high, "trials": summaries.trials,
            "mean_log": summaries.mean_log, "squares": summaries.squares, "runs": summaries.runs}
    keys = [(s.kernel, s.variant, s.dtype, s.shape_key) for s in data.series]
    out = {}
    seen: dict[bytes, tuple[tuple[tuple[str, str, str, str], ...], bytes]] = {}  # most commits share their series
    for c, row in enumerate(data.commits):
        span = slice(c * n_series, (c + 1) * n_series)
        # the commit's series: those with a benchmark job in its runs (even one without a valid sample)
        keep = np.flatnonzero(has_jobs[c])
        arrays = {name: values[span][keep].copy() for name, values in flat.items()}
        first = int(summaries.run_offsets[span.start]) if n_series else 0
        last_cell = span.stop - 1
        stop = int(summaries.run_offsets[last_cell] + summaries.runs[last_cell]) if n_series else 0
        arrays["run_levels"] = summaries.run_levels[first:stop].copy()
        if (known := seen.get(keep.tobytes())) is None:
            series = tuple(keys[i] for i in keep.tolist())
            known = seen[keep.tobytes()] = (series, repr(series).encode())  # as _digest writes a non-bytes part
        series, written = known
        body = b"".join(np.ascontiguousarray(arrays[name], dtype=dtype).tobytes() for name, dtype in _ARRAYS)
        out[row[0]] = _CommitCells(series, arrays, _digest(written, body)[:40])
    return out


# ---------------------------------------------------------------------------------------------------------------
# A chip's cells: stored rows where still valid, the other commits' samples loaded
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Chip:
    """One chip's history reduced to its cells: ``data`` has the commits (history order, previous, window, lines),
    the series (key order) and the sample counts, no samples; per flat cell its level and interval and the
    regression screen's ``cells``; per commit index the identity of its cells (``ids``: fingerprint and content
    digest); ``raw``: the samples loaded this time (commit id -> (history, its commit index)), for the families."""

    data: query.ChipHistory
    level: npt.NDArray[np.float64]
    low: npt.NDArray[np.float64]
    high: npt.NDArray[np.float64]
    cells: Any  # regressions._Cells
    ids: list[tuple[str, str]]
    raw: dict[int, tuple[query.ChipHistory, int]]
    run_fingerprints: dict[int, tuple[tuple[Any, ...], ...]]  # every included run's fingerprint, per commit id


def _suffix(include_dirty: bool) -> str:
    return "+dirty" if include_dirty else ""


class _Writes:
    """Rows to write once the chip is analysed: (kind, entries, the other rows of kind to keep (None: all))."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, analysis_cache.Entry], list[str] | None]] = []

    def add(self, kind: str, entries: dict[str, analysis_cache.Entry], keep: list[str] | None = None) -> None:
        if entries or keep is not None:
            self.rows.append((kind, entries, keep))


def _load_cells(store: Store, chip: str, commits: list[tuple], *, include_dirty: bool, windowed: bool,
                writes: _Writes, stats_out: CacheStats, state: analysis_cache.ChipState | None = None
                ) -> tuple[dict[int, _CommitCells], dict[int, str], dict[int, tuple[query.ChipHistory, int]],
                           dict[int, tuple[tuple[Any, ...], ...]]]:
    """Per commit id of ``commits``: its cells (stored or computed now), its fingerprint; the samples loaded; the
    fingerprints of all the chip's included runs per commit id."""
    version = code_version()
    if state is None:  # the watermark: before all else
        state = analysis_cache.chip_state(store, chip, include_dirty=include_dirty)
    fingerprint = {row[0]: _digest(version, include_dirty, state.runs.get(row[0], ()))[:40] for row in commits}
    kind = f"cells{_suffix(include_dirty)}"  # the commit's included runs differ with dirty ones
    name_of = {row[0]: str(row[0]) for row in commits}
    stored = analysis_cache.read_entries(store, chip, kind, list(name_of.values()) if windowed else None)
    stamps_entry = analysis_cache.read_entries(store, chip, "stamps", [kind]).get(kind)
    stamps: dict[str, list[Any]] = {}
    if stamps_entry is not None and stamps_entry.key == version:
        try:
            stamps = dict(json.loads(stamps_entry.payload))
        except (ValueError, TypeError):
            stamps = {}
    catalogues: dict[str, tuple[tuple[str, str, str, str], ...] | None] = {}

    def catalogue(name: str) -> tuple[tuple[str, str, str, str], ...] | None:
        if name not in catalogues:
            entry = analysis_cache.read_entries(store, chip, "series", [name]).get(name)
            try:
                series = tuple(tuple(s) for s in json.loads(entry.payload)) if entry is not None else None
            except (ValueError, TypeError):
                series = None
            catalogues[name] = series if series is not None and _series_digest(series)[0] == name else None
        return catalogues[name]

    found: dict[int, _CommitCells] = {}
    valid_at: dict[int, int] = {}  # the watermark each reused commit's samples were checked up to
    for row in commits:
        entry = stored.get(name_of[row[0]])
        if entry is None or entry.key != fingerprint[row[0]] or row[0] in state.unfinished:
            continue
        cells = _decode(entry.payload, catalogue)
        if cells is None:
            continue
        stamp = stamps.get(name_of[row[0]])
        checked = max(entry.watermark or 0, int(stamp[1]) if stamp and stamp[0] == cells.digest else 0)
        found[row[0]], valid_at[row[0]] = cells, checked
    if found:  # samples written since a row's watermark (a later trial of a stored job) make it stale
        newest = analysis_cache.touched_since(store, state.run_commit, min(valid_at.values()))
        for run_id, sample_id in newest.items():
            commit_id = state.run_commit[run_id]
            if commit_id in found and sample_id > valid_at[commit_id]:
                del found[commit_id]
    missing = [row for row in commits if row[0] not in found]
    raw: dict[int, tuple[query.ChipHistory, int]] = {}
    new_rows: dict[str, analysis_cache.Entry] = {}
    new_series: dict[str, analysis_cache.Entry] = {}
    if missing:  # their trials' summaries: the families load the samples of the commits they judge
        data, has_jobs = analysis_cache.commit_history(store, chip, missing, include_dirty=include_dirty,
                                                       samples_below=history_module.MIN_TRIALS_FOR_CI)
        for commit_id, cells in _commit_cells(data, has_jobs).items():
            found[commit_id] = cells
            series_name, text = _series_digest(cells.series)
            if catalogues.get(series_name) is None:  # not stored yet, or stored unreadable
                catalogues[series_name] = cells.series
                new_series[series_name] = analysis_cache.Entry(series_name, text)
            if commit_id not in state.unfinished:  # samples may still come, some with lower ids (PostgreSQL)
                new_rows[name_of[commit_id]] = analysis_cache.Entry(fingerprint[commit_id],
                                                                    _encode(cells, series_name), state.watermark)
    stats_out.cells[chip] = (len(commits) - len(missing), len(missing))
    writes.add("series", new_series)
    # the whole history read: the rows of commits no longer there go (only if there are any)
    gone = not windowed and bool(set(stored) - set(name_of.values()))
    writes.add(kind, new_rows, list(name_of.values()) if gone else None)
    new_stamps = {**stamps, **{name_of[c]: [found[c].digest, state.watermark] for c in found
                               if c not in state.unfinished}}
    if not windowed:
        new_stamps = {name_of[c]: new_stamps[name_of[c]] for c in found if name_of[c] in new_stamps}
    stats_out.unfinished[chip] = len(state.unfinished & set(found))
    if new_stamps != stamps:
        writes.add("stamps", {kind: analysis_cache.Entry(
            version, json.dumps(new_stamps, separators=(",", ":")).encode())})
    return found, fingerprint, raw, state.runs


def _assemble(chip: str, arranged: tuple[list[tuple], list[int], list[bool], list[int]],
              per_commit: dict[int, _CommitCells], fingerprint: dict[int, str],
              raw: dict[int, tuple[query.ChipHistory, int]],
              run_fingerprints: dict[int, tuple[tuple[Any, ...], ...]]) -> _Chip:
    commits, previous, shown, line = arranged
    series = sorted({key for row in commits for key in per_commit[row[0]].series})
    position = {key: i for i, key in enumerate(series)}
    n_commits, n_series = len(commits), len(series)
    counts = np.zeros(n_commits * n_series, dtype=np.int64)
    trials_count, runs = np.zeros_like(counts), np.zeros_like(counts)
    level, low, high, mean_log = (np.full(counts.size, np.nan) for _ in range(4))
    squares = np.zeros(counts.size)
    run_levels = []
    indices: dict[tuple, npt.NDArray[np.int64]] = {}
    for c, row in enumerate(commits):
        cells = per_commit[row[0]]
        where = indices.get(cells.series)
        if where is None:
            where = indices[cells.series] = np.array([position[key] for key in cells.series], dtype=np.int64)
        flat = c * n_series + where
        arrays = cells.arrays
        counts[flat], level[flat], low[flat], high[flat] = (arrays["counts"], arrays["level"], arrays["low"],
                                                           arrays["high"])
        trials_count[flat], mean_log[flat], squares[flat], runs[flat] = (arrays["trials"], arrays["mean_log"],
                                                                       arrays["squares"], arrays["runs"])
        run_levels.append(arrays["run_levels"])  # the commit's cells follow each other in flat order
    run_offsets = np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64) if runs.size else runs
    summary = regressions_module._Cells(trials_count, mean_log, squares, runs, run_offsets,
                                        np.concatenate(run_levels) if run_levels else np.zeros(0))
    data = query.ChipHistory(chip, commits, [query.SeriesKey(*key, chip) for key in series],
                             counts.reshape(n_commits, n_series), np.zeros((n_commits, n_series), dtype=np.int64),
                             np.zeros(0), np.array(previous, dtype=np.int64), np.array(shown, dtype=bool),
                             np.array(line, dtype=np.int64))
    ids = [(fingerprint[row[0]], per_commit[row[0]].digest) for row in commits]
    return _Chip(data, level, low, high, summary, ids, raw, run_fingerprints)


# ---------------------------------------------------------------------------------------------------------------
# Change points and regression families
# ---------------------------------------------------------------------------------------------------------------


def _series_name(key: query.SeriesKey, last: int | None) -> str:
    name = json.dumps([key.kernel, key.variant, key.dtype, key.shape_key, last], separators=(",", ":"))
    return name if len(name) <= 400 else "sha256:" + _digest(name)


def _flags(payload: bytes, n_points: int) -> Flags | None:
    try:
        flags = [(str(k), int(i), int(e), float(b), float(a), float(r)) for k, i, e, b, a, r in json.loads(payload)]
    except (ValueError, TypeError):
        return None
    return flags if all(0 <= i <= e < n_points for _, i, e, *_ in flags) else None


def _change_finder(store: Store, data: query.ChipHistory, *, last: int | None, min_effect: float, alpha: float,
                   writes: _Writes, stats_out: CacheStats) -> history_module.ChangeFinder:
    """``series_histories``' change finder for ``data``'s series: stored results where their inputs are the same,
    ``detect_lines`` for the others."""
    version = code_version()

    def find(lines_of: Sequence[Sequence[npt.NDArray[np.float64]]]) -> list[Flags]:
        names = [_series_name(key, last) for key in data.series]
        stored = analysis_cache.read_entries(store, data.chip, "changes")
        keys = [_digest(version, min_effect, alpha, [len(line) for line in lines],
                        *(np.ascontiguousarray(line, dtype="<f8").tobytes() for line in lines))[:40]
                for lines in lines_of]
        out: list[Flags | None] = []
        for name, key, lines in zip(names, keys, lines_of, strict=True):
            entry = stored.get(name)
            out.append(_flags(entry.payload, sum(len(line) for line in lines))
                       if entry is not None and entry.key == key else None)
        todo = [i for i, flags in enumerate(out) if flags is None]
        computed = detect_lines([lines_of[i] for i in todo], min_effect=min_effect, alpha=alpha)
        new = {}
        for i, flags in zip(todo, computed, strict=True):
            out[i] = flags
            new[names[i]] = analysis_cache.Entry(keys[i], json.dumps(flags).encode())
        writes.add("changes", new)
        stats_out.changes[data.chip] = (len(out) - len(todo), len(todo))
        return [flags or [] for flags in out]

    return find


_EVIDENCE_FIELDS = [f.name for f in fields(RegressionEvidence)]


def _time_out(value: datetime) -> dict[str, str]:
    """A datetime as JSON, with its time zone's name when it has one (PostgreSQL's drivers give ZoneInfo)."""
    out = {"t": value.isoformat()}
    if isinstance(value.tzinfo, ZoneInfo):
        out["z"] = value.tzinfo.key
    return out


def _time_in(value: dict[str, str]) -> datetime:
    when = datetime.fromisoformat(value["t"])
    return when.astimezone(ZoneInfo(value["z"])) if "z" in value else when


def _evidence_out(evidence: RegressionEvidence) -> list[Any]:
    return [_time_out(v) if isinstance(v, datetime) else v
            for v in (getattr(evidence, name) for name in _EVIDENCE_FIELDS)]


def _evidence_in(values: list[Any]) -> RegressionEvidence:
    if len(values) != len(_EVIDENCE_FIELDS):
        raise ValueError("another evidence layout")
    return RegressionEvidence(*(_time_in(v) if isinstance(v, dict) else v for v in values))


def _family_keys(chip: _Chip, broken: set[tuple[int, str]], *, min_effect: float, alpha: float
                 ) -> dict[int, str]:
    """Per shown commit index: a digest of everything its family's verdicts read -- the commits up its chain of
    previous commits as far as every series of the head needs (its base, then the runs of ``HISTORY_RUNS`` points
    for the history floor), with their cells' identities, the kernels broken at the head and the parameters."""
    data, version = chip.data, code_version()
    present = data.counts > 0
    previous = data.previous.tolist()
    need = 1 + defaults.HISTORY_RUNS
    broken_at: dict[int, list[str]] = {}
    for commit, kernel in broken:
        broken_at.setdefault(commit, []).append(kernel)
    tokens: dict[int, str] = {}

    def token(commit: int) -> str:  # the commit (id, sha, message, branch, first start) and its cells' identity
        if commit not in tokens:
            tokens[commit] = _digest(data.commits[commit], chip.ids[commit])[:32]
        return tokens[commit]

    keys = {}
    for head in np.flatnonzero(data.shown).tolist():
        path, at = [head], previous[head]
        while at >= 0 and len(path) <= need:
            path.append(at)
            at = previous[at]
        wanted = present[head]
        if at >= 0 and not present[path[1:]][:, wanted].all():  # a series missing somewhere: walk further
            seen = present[path[1:]].sum(axis=0)
            while at >= 0 and (seen[wanted] < need).any():
                path.append(at)
                seen += present[at]
                at = previous[at]
        keys[head] = _digest(version, min_effect, alpha, sorted(broken_at.get(head, [])),
                             "".join(token(p) for p in path))[:40]
    return keys


def _trials_loader(store: Store, chip: _Chip, *, include_dirty: bool) -> regressions_module.TrialsOf:
    """The trials of flat cells of ``chip``: from the samples loaded this time, else loaded now (those commits)."""
    data = chip.data
    n_series = len(data.series)
    positions: dict[int, dict[tuple[str, str, str, str], int]] = {}

    def load(cells: Sequence[int]) -> dict[int, list[npt.NDArray[np.float64]]]:
        commits = sorted({cell // n_series for cell in cells})
        missing = [data.commits[c] for c in commits if data.commits[c][0] not in chip.raw]
        if missing:
            loaded, _ = analysis_cache.commit_history(store, data.chip, missing, include_dirty=include_dirty)
            loaded = by_series_key(loaded)
            for index, row in enumerate(loaded.commits):
                chip.raw[row[0]] = (loaded, index)
        out = {}
        for cell in cells:
            commit, series = divmod(cell, n_series)
            source, index = chip.raw[data.commits[commit][0]]
            position = positions.get(id(source))
            if position is None:
                position = positions[id(source)] = {
                    (s.kernel, s.variant, s.dtype, s.shape_key): i for i, s in enumerate(source.series)}
            key = data.series[series]
            column = position[(key.kernel, key.variant, key.dtype, key.shape_key)]
            out[cell] = source.trials(index * len(source.series) + column)
        return out

    return load


def _correctness_rows(store: Store, chip: _Chip, *, include_dirty: bool, writes: _Writes
                      ) -> tuple[list[tuple], list[tuple]]:
    """The chip's correctness job statuses and failures (``analysis_cache.correctness_rows``), stored per commit
    under the fingerprints of the commit's included runs (a correctness job is written once and never changes):
    after a new run, only its commit's rows are read. Only the order of one commit's failures matters (the first
    failure of a job at a commit is its event's evidence), and the rows of a commit keep theirs."""
    name = f"correctness{_suffix(include_dirty)}"
    prints = {str(commit): _digest(runs)[:24] for commit, runs in chip.run_fingerprints.items()}
    stored: dict[str, Any] = {}
    entry = analysis_cache.read_entries(store, chip.data.chip, "correctness", [name]).get(name)
    if entry is not None and entry.key == code_version()[:40]:
        try:
            stored = json.loads(entry.payload)
        except ValueError:
            stored = {}
    per_commit = {commit: rows[1:] for commit, rows in (stored.items() if isinstance(stored, dict) else ())
                  if isinstance(rows, list) and len(rows) == 3 and rows[0] == prints.get(commit)}
    missing = sorted(int(commit) for commit in prints if commit not in per_commit)
    if missing:
        statuses, failing = analysis_cache.correctness_rows(
            store, chip.data.chip, include_dirty=include_dirty,
            commits=None if len(missing) == len(prints) else missing)
        read: dict[str, list[list[tuple]]] = {str(commit): [[], []] for commit in missing}
        for side, rows in enumerate((statuses, failing)):
            for row in rows:
                read.setdefault(str(row[0]), [[], []])[side].append(row)
        per_commit.update(read)
    if missing or len(per_commit) != len(stored):
        payload = {commit: [prints.get(commit, ""), *rows] for commit, rows in per_commit.items()}
        writes.add("correctness", {name: analysis_cache.Entry(code_version()[:40], json.dumps(payload).encode())})
    return ([tuple(row) for rows in per_commit.values() for row in rows[0]],
            [tuple(row) for rows in per_commit.values() for row in rows[1]])


def _regressions(store: Store, chip: _Chip, *, include_dirty: bool, last: int | None, min_effect: float,
                 alpha: float, writes: _Writes, stats_out: CacheStats) -> list[RegressionEvidence]:
    data = chip.data
    events, broken = correctness_regressions(store, data, include_dirty=include_dirty, last=last,
                                             rows=_correctness_rows(store, chip, include_dirty=include_dirty,
                                                                    writes=writes))
    keys = _family_keys(chip, broken, min_effect=min_effect, alpha=alpha)
    name = f"families{_suffix(include_dirty)}:{last}"
    entry = analysis_cache.read_entries(store, data.chip, "families", [name]).get(name)
    stored: dict[str, Any] = {}
    if entry is not None and entry.key == code_version():
        try:
            stored = json.loads(entry.payload)
        except ValueError:
            stored = {}
    found: dict[int, list[RegressionEvidence]] = {}
    for commit, key in keys.items():
        if key in stored:
            try:
                found[commit] = [_evidence_in(values) for values in stored[key]]
            except (ValueError, TypeError, KeyError):
                continue
    heads = np.zeros(len(data.commits), dtype=bool)
    heads[[c for c in keys if c not in found]] = True
    if heads.any():
        computed = performance_regressions(data, broken, chip.cells, lambda cells: chip.level[cells],
                                           _trials_loader(store, chip, include_dirty=include_dirty),
                                           min_effect=min_effect, alpha=alpha, heads=heads,
                                           modes_of=regressions_module.modes_loader(store, data,
                                                                                    include_dirty=include_dirty))
        for commit in np.flatnonzero(heads).tolist():
            found[commit] = computed.get(commit, [])
    stats_out.families[data.chip] = (len(keys) - int(heads.sum()), int(heads.sum()))
    if heads.any() or set(stored) != set(keys.values()):
        payload = {keys[c]: [_evidence_out(e) for e in found[c]] for c in keys}
        writes.add("families", {name: analysis_cache.Entry(code_version(), json.dumps(payload).encode())})
    if not timing_fit(data.chip):  # a virtual GPU: its correctness counts, its timings carry no verdict
        return events
    return events + [e for commit in sorted(found) for e in found[commit]]


# ---------------------------------------------------------------------------------------------------------------
# The report's analysis
# ---------------------------------------------------------------------------------------------------------------


def _flush(store: Store, chip: str, writes: _Writes, stats_out: CacheStats) -> None:
    for kind, entries, keep in writes.rows:
        try:
            analysis_cache.write_entries(store, chip, kind, entries, keep=keep)
        except SQLAlchemyError as exc:  # a read-only database, a lock held too long: the next report recomputes
            stats_out.write_errors += 1
            log.warning("analysis cache: could not store %s rows of %s: %s", kind, chip,
                        first_line(exc))


# ---------------------------------------------------------------------------------------------------------------
# A chip's whole analysis, when none of its runs changed
# ---------------------------------------------------------------------------------------------------------------

_CHIP_MAGIC = b"HARNESS-CHIP\n"
_CHIP_ARRAYS = (("rows", "<i8"), ("median", "<f8"), ("ci_low", "<f8"), ("ci_high", "<f8"), ("n", "<i8"))


def _chip_key(chip: str, arranged: tuple[list[tuple], list[int], list[bool], list[int]],
              state: analysis_cache.ChipState, *, include_dirty: bool, last: int | None, change_points: bool,
              min_effect: float, alpha: float) -> str:
    """A digest of everything a chip's histories and regressions read: the code, the parameters, the history
    order with each commit's id, sha, message, branch and first start (``arrangement``) and the fingerprints of
    every included run (``chip_state``); samples added to its runs since are caught by the watermark."""
    return _digest(code_version(), chip, include_dirty, last, change_points, min_effect, alpha,
                   json.dumps(arranged, default=repr, separators=(",", ":")), sorted(state.runs.items()))[:40]


def _chip_out(histories: list[SeriesHistory], events: list[RegressionEvidence]) -> bytes:
    columns = {name: [getattr(h.points, name) for h in histories] for name, _ in _CHIP_ARRAYS}
    body = b"".join(np.ascontiguousarray(np.concatenate(columns[name]) if histories else np.zeros(0), dtype=dtype
                                         ).tobytes() for name, dtype in _CHIP_ARRAYS)
    return _frame(_CHIP_MAGIC, {
        "keys": [list(h.key) for h in histories], "sizes": [len(h.points) for h in histories],
        "flags": [[[c.kind, c.index, c.end_index, c.before, c.after, c.ratio] for c in h.change_points]
                  for h in histories],
        "events": [_evidence_out(e) for e in events]}, body)


def _chip_in(payload: bytes, commits: list[tuple]) -> tuple[list[SeriesHistory], list[RegressionEvidence]] | None:
    """A stored chip analysis on the chip's freshly arranged ``commits`` (the key holds them: the same), as
    ``series_histories`` builds it; None when unreadable."""
    try:
        if (framed := _unframe(payload, _CHIP_MAGIC)) is None:
            return None
        header, body = framed
        total, offset, columns = int(sum(header["sizes"])), 0, {}
        for name, dtype in _CHIP_ARRAYS:
            columns[name] = np.frombuffer(body, dtype=dtype, count=total, offset=offset)
            offset += total * np.dtype(dtype).itemsize
        if offset != len(body):
            return None
        points_of_commit = [(sha, message, branch, started) for _, sha, message, branch, started in commits]
        histories, start = [], 0
        for key, size, flags in zip(header["keys"], header["sizes"], header["flags"], strict=True):
            span = slice(start, start + size)
            start += size
            if size and int(columns["rows"][span].max()) >= len(commits):
                return None
            points = HistoryPoints(points_of_commit, *(columns[name][span] for name, _ in _CHIP_ARRAYS))
            histories.append(with_flags(query.SeriesKey(*key), points, [
                (str(kind), int(i), int(e), float(b), float(a), float(r)) for kind, i, e, b, a, r in flags]))
        return histories, [_evidence_in(values) for values in header["events"]]
    except (ValueError, KeyError, TypeError, IndexError, struct.error):
        return None


def _chip_is_stored(store: Store, chip: str, name: str, key: str, state: analysis_cache.ChipState) -> bool:
    """Whether the chip's analysis is stored under ``key`` and none of its runs gained samples since it was stored (a
    later trial of a stored job); its payload is not read."""
    if state.unfinished:
        return False
    found = analysis_cache.entry_keys(store, chip, "chip", [name]).get(name)
    return (found is not None and found[0] == key
            and not analysis_cache.touched_since(store, state.run_commit, found[1] or 0))


def _stored_chip(store: Store, chip: str, name: str, commits: list[tuple]
                 ) -> tuple[list[SeriesHistory], list[RegressionEvidence]] | None:
    """The chip's stored analysis (``_chip_is_stored``) on its freshly arranged ``commits``; None when it is gone or
    unreadable."""
    entry = analysis_cache.read_entries(store, chip, "chip", [name]).get(name)
    return _chip_in(entry.payload, commits) if entry is not None else None


def analyse(store: Store, chips: Sequence[str], *, change_points: bool = True, last: int | None = None,
            include_dirty: bool = False, min_effect: float = stats.DEFAULT_MIN_EFFECT,
            alpha: float = stats.DEFAULT_ALPHA, use_cache: bool = True, timings: dict[str, float] | None = None,
            states: Mapping[str, analysis_cache.ChipState] | None = None,
            deferred_writes: list[Callable[[], None]] | None = None,
            ) -> tuple[dict[str, list[SeriesHistory]], list[RegressionEvidence], CacheStats]:
    """Every chip's histories (``history.history``) and the regression list (``regressions.regressions``),
    reusing the stored analysis of what did not change and storing what was computed (``use_cache=False``:
    computed from the samples, nothing read or written). ``timings`` gets the seconds spent on the cells (loading),
    the histories and the regressions. ``states``: per chip ``analysis_cache.chip_state(include_dirty=True)`` when
    the caller read it (before anything else: its watermark), else read here. Chips to compute, when there are
    several and a fork is safe (``harness.core.fork``), are computed in forked processes, a core each: a full
    analysis is mostly per-chip Python work. ``deferred_writes``: the rows of the chips computed in this process
    are not stored here but appended to it, as calls for the caller to make once it has handed on the results (a
    report's forked analysis makes them after its history pages: a 1,000-commit chip's row is 16 MB); a forked
    process stores its chip's rows itself."""
    timings = timings if timings is not None else {}
    stats_out = CacheStats()
    histories: dict[str, list[SeriesHistory]] = {}
    per_chip: dict[str, list[RegressionEvidence]] = {}
    for key in ("cells", "histories", "regressions"):
        timings.setdefault(key, 0.0)
    options = {"change_points": change_points, "last": last, "include_dirty": include_dirty,
               "min_effect": min_effect, "alpha": alpha, "deferred": deferred_writes}
    todo: list[tuple[str, Any]] = []
    if change_points and not use_cache:
        segment_search.warm_up_in_background()
    reads = []
    for chip in sorted(chips):
        start = time.perf_counter()
        if not use_cache:
            histories[chip] = history_module.history(store, chip, include_dirty=include_dirty, last=last,
                                                     change_points=change_points, min_effect=min_effect, alpha=alpha)
            timings["histories"] += time.perf_counter() - start
            start = time.perf_counter()
            per_chip[chip] = regressions_module._chip_regressions(store, chip, include_dirty=include_dirty, last=last,
                                                                  min_effect=min_effect, alpha=alpha)
            timings["regressions"] += time.perf_counter() - start
            continue
        arranged = analysis_cache.arrangement(store, chip, include_dirty=include_dirty, last=last)
        state = (states or {}).get(chip)
        if state is not None and not include_dirty:
            state = analysis_cache.clean_state(state)
        if state is None:  # the watermark: before all else
            state = analysis_cache.chip_state(store, chip, include_dirty=include_dirty)
        chip_name = f"{_suffix(include_dirty)}:{last}:{change_points}"
        chip_key = _chip_key(chip, arranged, state, include_dirty=include_dirty, last=last,
                             change_points=change_points, min_effect=min_effect, alpha=alpha)
        reads.append((chip, (arranged, state, chip_name, chip_key),
                      _chip_is_stored(store, chip, chip_name, chip_key, state)))
        timings["cells"] += time.perf_counter() - start
    if change_points and not all(stored for *_, stored in reads):  # a search to come: loaded while the rest reads
        segment_search.warm_up_in_background()
    for chip, read, stored in reads:
        start = time.perf_counter()
        arranged = read[0]
        stored_chip = _stored_chip(store, chip, read[2], arranged[0]) if stored else None
        histories[chip] = []  # the chips keep their order
        if stored_chip is not None:  # none of its runs changed: its histories and regressions as stored
            histories[chip], per_chip[chip] = stored_chip
            stats_out.cells[chip] = (len(arranged[0]), 0)
            stats_out.changes[chip] = (len(histories[chip]) if change_points else 0, 0)
            stats_out.families[chip] = (int(sum(arranged[2])), 0)
            stats_out.chips_reused += 1
        else:
            todo.append((chip, read))
        timings["cells"] += time.perf_counter() - start
    for chip, (found, events, chip_stats, chip_timings) in _each_chip(store, todo, options):
        histories[chip], per_chip[chip] = found, events
        for name in ("cells", "changes", "families", "unfinished"):
            getattr(stats_out, name).update(getattr(chip_stats, name))
        stats_out.write_errors += chip_stats.write_errors
        for key, seconds in chip_timings.items():
            timings[key] += seconds
    segment_search.finish_warm_up()  # no thread of it outlives the analysis (a fork may come)
    if use_cache:
        log.info("analysis cache: %s", stats_out.summary())
    events = [e for chip in sorted(per_chip) for e in per_chip[chip]]
    correctness = [e for e in events if e.kind == "correctness"]
    performance = [e for e in events if e.kind == "performance"]
    return histories, correctness + performance, stats_out


_ChipResult = tuple[list[SeriesHistory], list[RegressionEvidence], CacheStats, dict[str, float]]


def _each_chip(store: Store, todo: list[tuple[str, Any]], options: dict[str, Any]
               ) -> Iterator[tuple[str, _ChipResult]]:
    """``_analyse_chip`` of each chip of ``todo`` (chip, what was read of it), in order: in forked processes, at
    most one a core at a time, where there are several and a fork is safe (a process that fails leaves its chip to
    this one), else here."""
    if len(todo) >= 2:  # the search loaded before the fork: the processes inherit it, and no other thread runs
        segment_search.finish_warm_up()
    if len(todo) < 2 or not fork.can_fork() or not store.shared_by_processes:
        for chip, read in todo:
            yield chip, _analyse_chip(store, chip, read, options)
        return
    width = min(os.cpu_count() or 1, len(todo))
    running: list[tuple[str, Any, fork.ForkedWork]] = []
    queue = list(todo)

    def started(chip: str, read: Any) -> fork.ForkedWork:
        def work(send: Callable[[Any], None]) -> None:
            store.forked()
            send(_analyse_chip(store, chip, read, {**options, "deferred": None}))  # it stores its own rows
        return fork.ForkedWork(work)

    try:
        while queue and len(running) < width:
            chip, read = queue.pop(0)
            running.append((chip, read, started(chip, read)))
        while running:
            chip, read, work = running.pop(0)
            ok, value = work.receive()
            work.close()
            if queue:  # the next chip takes the core this one had
                following, next_read = queue.pop(0)
                running.append((following, next_read, started(following, next_read)))
            if not ok:
                log.warning("analysis of %s: its process failed (%s); analysed here instead", chip, value)
                value = _analyse_chip(store, chip, read, options)
            yield chip, value
    finally:
        for _, _, work in running:
            work.abandon()


def _analyse_chip(store: Store, chip: str, read: Any, options: dict[str, Any]) -> _ChipResult:
    """One chip's histories and regressions from its cells, its analysis stored (its stats and timings apart)."""
    arranged, state, chip_name, chip_key = read
    change_points, last, include_dirty = options["change_points"], options["last"], options["include_dirty"]
    min_effect, alpha = options["min_effect"], options["alpha"]
    stats_out = CacheStats()
    timings = {"cells": 0.0, "histories": 0.0, "regressions": 0.0}
    writes = _Writes()
    start = time.perf_counter()
    per_commit, fingerprint, raw, run_fingerprints = _load_cells(
        store, chip, arranged[0], include_dirty=include_dirty, windowed=last is not None, writes=writes,
        stats_out=stats_out, state=state)
    summary = _assemble(chip, arranged, per_commit, fingerprint, raw, run_fingerprints)
    timings["cells"] += time.perf_counter() - start
    start = time.perf_counter()
    histories = series_histories(
        summary.data, summary.level, summary.low, summary.high, change_points=change_points,
        min_effect=min_effect, alpha=alpha,
        find=_change_finder(store, summary.data, last=last, min_effect=min_effect, alpha=alpha, writes=writes,
                            stats_out=stats_out))
    timings["histories"] += time.perf_counter() - start
    start = time.perf_counter()
    events = _regressions(store, summary, include_dirty=include_dirty, last=last, min_effect=min_effect,
                          alpha=alpha, writes=writes, stats_out=stats_out)
    timings["regressions"] += time.perf_counter() - start

    def store_rows() -> None:
        if not state.unfinished:  # a run still writing: samples may still come, some with lower ids (PostgreSQL)
            writes.add("chip", {chip_name: analysis_cache.Entry(chip_key, _chip_out(histories, events),
                                                                state.watermark)})
        _flush(store, chip, writes, stats_out)

    if options.get("deferred") is not None:
        options["deferred"].append(store_rows)
    else:
        start = time.perf_counter()
        store_rows()
        timings["cells"] += time.perf_counter() - start
    return histories, events, stats_out, timings


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
            units.setdefault(chip, set()).add(query._unit_of(kind, job_key, kernel))
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
    key = _digest(version, sorted(kinds), sorted(state.runs.items()))[:40]
    base = _digest(version, sorted(kinds))[:40]
    runs = {p[0]: _digest(p)[:24] for prints in state.runs.values() for p in prints}
    rows: list[JobRow] | None = None
    try:
        entry = analysis_cache.read_entries(store, chip, "jobs", ["jobs"]).get("jobs")
        stored = _StoredJobs.of(entry.payload) if entry is not None and entry.watermark is not None else None
        if entry is not None and stored is not None and stored.base == base:
            touched = analysis_cache.touched_since(store, state.run_commit, entry.watermark or 0)
            if entry.key == key and not any(run in state.run_commit for run in touched):
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


# ---------------------------------------------------------------------------------------------------------------
# Compare pages
# ---------------------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A compare report as JSON values, floats exact (nan and inf kept: ``json`` writes them as NaN / Infinity)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # SeriesKey (a named tuple) too: a list of its fields
        return [_plain(v) for v in value]
    return value


def _report_out(report: CompareReport) -> bytes:
    return zlib.compress(json.dumps(_plain(report), allow_nan=True, separators=(",", ":")).encode())


def _side_in(values: dict[str, Any]) -> Side:
    return Side(**{**values, "runs": {chip: tuple(ids) for chip, ids in values["runs"].items()}})


def _report_in(payload: bytes) -> CompareReport:
    values = json.loads(zlib.decompress(payload))
    return CompareReport(
        _side_in(values["base"]), _side_in(values["head"]),
        tuple(CompareRow(**{**row, "key": query.SeriesKey(*row["key"])}) for row in values["rows"]),
        tuple(CorrectnessFailure(**failure) for failure in values["correctness_failures"]),
        values["counts"], values["only_base"], values["only_head"], values["min_effect"], values["alpha"])


class RunPrints:
    """``analysis_cache.run_prints`` of the runs asked for, each run read once (the pages of a report share runs),
    their job ids summed once (``analysis_cache.job_id_summaries``, or ``jobs`` when the caller read them)."""

    def __init__(self, store: Store, jobs: analysis_cache.JobIds | None = None) -> None:
        self.store = store
        self._prints: dict[str, tuple[Any, ...] | None] = {}
        self._jobs = jobs

    def __call__(self, run_ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        missing = sorted({i for i in run_ids if i not in self._prints})
        if missing:
            if self._jobs is None:
                self._jobs = analysis_cache.job_id_summaries(self.store)
            found = analysis_cache.run_prints(self.store, missing, jobs=self._jobs)
            self._prints.update({i: found.get(i) for i in missing})
        return {i: p for i in run_ids if (p := self._prints[i]) is not None}


class ComparePages:
    """``compare.compare`` of the (base, head) pairs a report shows, each reused from the analysis cache while
    nothing it reads changed (see the module docstring, ``compare``); ``flush`` stores what was computed and drops
    the rows of pairs not shown this time. ``use_cache=False``: computed, nothing read or written."""

    def __init__(self, store: Store, *, use_cache: bool = True, min_effect: float = stats.DEFAULT_MIN_EFFECT,
                 alpha: float = stats.DEFAULT_ALPHA) -> None:
        self.store, self.use_cache, self.min_effect, self.alpha = store, use_cache, min_effect, alpha
        self.shown: dict[str, set[str]] = {}
        self.computed: dict[str, dict[str, analysis_cache.Entry]] = {}
        self.reused = 0
        self.run_prints = RunPrints(store)

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
        key = _digest(code_version(), *compared, sorted(prints.values()), self.min_effect, self.alpha)
        name = _digest(chip, *compared)[:32]
        self.shown.setdefault(chip, set()).add(name)
        entry = analysis_cache.read_entries(self.store, chip, "compare", [name]).get(name)
        if entry is not None and entry.key == key:
            try:
                report = dataclasses.replace(_report_in(entry.payload), base=base_side, head=head_side)
                self.reused += 1
                return report
            except (ValueError, TypeError, KeyError, zlib.error):  # unreadable: computed again below
                log.warning("analysis cache: compare row of %s unreadable, recomputed", chip)
        report = compare_module.compare(self.store, base, head, chip=chip, min_effect=self.min_effect,
                                        alpha=self.alpha, sides=(base_side, head_side))
        self.computed.setdefault(chip, {})[name] = analysis_cache.Entry(key, _report_out(report))
        return report

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
        key = _digest(code_version(), tuple(run_ids), runs, sorted(prints.items()))[:40]
        name = _digest(tuple(run_ids))[:32]
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


def _measured_out(keys: Sequence[variants_module.Cell], measured: trials.Measured) -> bytes:
    logs = [side for pair in measured.logs for side in pair]
    body = b"".join([*(np.ascontiguousarray(getattr(measured, name), dtype=np.int64).tobytes()
                       for name in _MEASURED_INTS),
                     *(np.ascontiguousarray(getattr(measured, name), dtype=np.float64).tobytes()
                       for name in _MEASURED_FLOATS),
                     np.ascontiguousarray(np.concatenate(logs) if logs else np.zeros(0), dtype=np.float64).tobytes()])
    return _frame(_CELLS_MAGIC, {"keys": [list(key) for key in keys]}, body)


def _measured_in(payload: bytes) -> tuple[list[variants_module.Cell], trials.Measured] | None:
    """``_measured_out``'s cells and measurements; None when unreadable."""
    try:
        if (framed := _unframe(payload, _CELLS_MAGIC)) is None:
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
        return keys, trials.Measured(**columns, logs=logs)
    except (ValueError, KeyError, TypeError, struct.error):
        return None


class VariantCells(_ShownRows):
    """``variants.measure_cells`` of each chip the variant matrix compares (``variants.MeasureCells``), reused from
    the analysis cache (kind ``variants``, a row per chip) while the chip's cells compare the same runs and those
    runs' fingerprints (``RunPrints``: their jobs and highest sample id) are the same: after a new run on one chip the
    others' samples are not read. ``flush`` stores what was measured. ``use_cache=False``: measured, nothing stored."""

    KIND, NAME = "variants", "cells"

    def __call__(self, store: Store, chip: str, cells: Mapping[variants_module.Cell, tuple[str, ...]],
                 defaults: Mapping[str, str]) -> tuple[list[variants_module.Cell], trials.Measured]:
        if not self.use_cache:
            return variants_module.measure_cells(store, chip, cells, defaults)
        prints = self.run_prints(sorted({run for runs in cells.values() for run in runs}))
        key = _digest(code_version(), sorted(cells.items()), sorted(defaults.items()), sorted(prints.items()))[:40]
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

