"""One commit's cells (a row per commit): encoded, stored, loaded where still valid and assembled into a chip's
histories."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.analysis import history as history_module
from harness.analysis import regressions as regressions_module
from harness.analysis.cache.common import (
    CacheStats,
    ChipCells,
    Writes,
    code_version,
    digest,
    dirty_suffix,
    frame,
    unframe,
)
from harness.analysis.history import (
    by_series_key,
    trial_levels,
)
from harness.analysis.regressions import (
    cell_summaries,
)
from harness.record import analysis_cache, query
from harness.record.store import Store

# ---------------------------------------------------------------------------------------------------------------
# One commit's cells, as stored
# ---------------------------------------------------------------------------------------------------------------

_MAGIC = b"HARNESS-CELLS\n"
_ARRAYS = (("counts", "<i8"), ("level", "<f8"), ("low", "<f8"), ("high", "<f8"), ("trials", "<i8"),
           ("mean_log", "<f8"), ("squares", "<f8"), ("runs", "<i8"), ("run_levels", "<f8"))


@dataclass(frozen=True)
class CommitCells:
    """One commit's cells, its series in key order: per series the arrays of ``_ARRAYS`` (``run_levels``: each
    series' runs in start order, one after the other); ``digest`` names the content (series and arrays)."""

    series: tuple[tuple[str, str, str, str], ...]
    arrays: dict[str, npt.NDArray[Any]]
    digest: str


def _series_digest(series: Sequence[tuple[str, str, str, str]]) -> tuple[str, bytes]:
    text = json.dumps([list(s) for s in series], separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest()[:40], text


def _encode(cells: CommitCells, series_name: str) -> bytes:
    body = b"".join(np.ascontiguousarray(cells.arrays[name], dtype=dtype).tobytes() for name, dtype in _ARRAYS)
    return frame(_MAGIC, {"series": series_name, "n": len(cells.series),
                           "sizes": [int(cells.arrays[name].size) for name, _ in _ARRAYS], "digest": cells.digest},
                  body)


def _decode(payload: bytes, catalogue: Callable[[str], tuple[tuple[str, str, str, str], ...] | None]
            ) -> CommitCells | None:
    """The cells of a stored payload; None if it is not one (truncated, corrupted, another format)."""
    try:
        if (framed := unframe(payload, _MAGIC)) is None:
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
        return CommitCells(series, arrays, str(header["digest"]))
    except (ValueError, KeyError, TypeError, struct.error):
        return None


def commit_cells(data: query.ChipHistory, has_jobs: npt.NDArray[np.bool_]) -> dict[int, CommitCells]:
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
            known = seen[keep.tobytes()] = (series, repr(series).encode())  # as digest writes a non-bytes part
        series, written = known
        body = b"".join(np.ascontiguousarray(arrays[name], dtype=dtype).tobytes() for name, dtype in _ARRAYS)
        out[row[0]] = CommitCells(series, arrays, digest(written, body)[:40])
    return out


# ---------------------------------------------------------------------------------------------------------------
# A chip's cells: stored rows where still valid, the other commits' samples loaded
# ---------------------------------------------------------------------------------------------------------------


def load_cells(store: Store, chip: str, commits: list[tuple], *, include_dirty: bool, windowed: bool,
                writes: Writes, stats_out: CacheStats, state: analysis_cache.ChipState | None = None
                ) -> tuple[dict[int, CommitCells], dict[int, str], dict[int, tuple[query.ChipHistory, int]],
                           dict[int, tuple[tuple[Any, ...], ...]]]:
    """Per commit id of ``commits``: its cells (stored or computed now), its fingerprint; the samples loaded; the
    fingerprints of all the chip's included runs per commit id."""
    version = code_version()
    if state is None:  # the watermark: before all else
        state = analysis_cache.chip_state(store, chip, include_dirty=include_dirty)
    fingerprint = {row[0]: digest(version, include_dirty, state.runs.get(row[0], ()))[:40] for row in commits}
    kind = f"cells{dirty_suffix(include_dirty)}"  # the commit's included runs differ with dirty ones
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

    found: dict[int, CommitCells] = {}
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
        named: dict[int, tuple[str, bytes]] = {}  # most commits share one series tuple (``commit_cells``)
        for commit_id, cells in commit_cells(data, has_jobs).items():
            found[commit_id] = cells
            if (known := named.get(id(cells.series))) is None:
                known = named[id(cells.series)] = _series_digest(cells.series)
            series_name, text = known
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


def assemble(chip: str, arranged: tuple[list[tuple], list[int], list[bool], list[int]],
              per_commit: dict[int, CommitCells], fingerprint: dict[int, str],
              raw: dict[int, tuple[query.ChipHistory, int]],
              run_fingerprints: dict[int, tuple[tuple[Any, ...], ...]]) -> ChipCells:
    commits, previous, shown, line = arranged
    cells_of = [per_commit[row[0]] for row in commits]
    groups: dict[int, tuple[tuple, list[int]]] = {}  # per distinct series tuple (shared: ``_decode``'s catalogue)
    for c, cells in enumerate(cells_of):  # its commits
        groups.setdefault(id(cells.series), (cells.series, []))[1].append(c)
    series = sorted(set().union(*(of_group for of_group, _ in groups.values())))
    position = {key: i for i, key in enumerate(series)}
    n_commits, n_series = len(commits), len(series)
    counts = np.zeros(n_commits * n_series, dtype=np.int64)
    trials_count, runs = np.zeros_like(counts), np.zeros_like(counts)
    level, low, high, mean_log = (np.full(counts.size, np.nan) for _ in range(4))
    squares = np.zeros(counts.size)
    columns = {"counts": counts, "level": level, "low": low, "high": high, "trials": trials_count,
               "mean_log": mean_log, "squares": squares, "runs": runs}
    for of_group, members in groups.values():  # each group's commits' cells in one assignment per column
        where = np.array([position[key] for key in of_group], dtype=np.int64)
        flat = (np.array(members, dtype=np.int64)[:, None] * n_series + where).ravel()
        for name, column in columns.items():
            column[flat] = np.concatenate([cells_of[c].arrays[name] for c in members])
    run_levels = [cells.arrays["run_levels"] for cells in cells_of]  # the commits' cells one after the other
    run_offsets = np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64) if runs.size else runs
    summary = regressions_module._Cells(trials_count, mean_log, squares, runs, run_offsets,
                                        np.concatenate(run_levels) if run_levels else np.zeros(0))
    data = query.ChipHistory(chip, commits, [query.SeriesKey(*key, chip) for key in series],
                             counts.reshape(n_commits, n_series), np.zeros((n_commits, n_series), dtype=np.int64),
                             np.zeros(0), np.array(previous, dtype=np.int64), np.array(shown, dtype=bool),
                             np.array(line, dtype=np.int64))
    ids = [(fingerprint[row[0]], per_commit[row[0]].digest) for row in commits]
    return ChipCells(data, level, low, high, summary, ids, raw, run_fingerprints)
