"""A chip's whole analysis in one row, and ``analyse``: the report's history and regression analysis, per chip."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.analysis import history as history_module
from harness.analysis import regressions as regressions_module
from harness.analysis import segment_search
from harness.analysis.cache.cells import assemble, load_cells
from harness.analysis.cache.common import (
    CacheStats,
    Writes,
    code_version,
    digest,
    dirty_suffix,
    flush,
    frame,
    log,
    unframe,
)
from harness.analysis.cache.families import change_finder, evidence_in, evidence_out, regression_list
from harness.analysis.history import (
    series_histories,
    with_flags,
)
from harness.analysis.records import (
    HistoryPoints,
    RegressionEvidence,
    SeriesHistory,
)
from harness.core import fork
from harness.record import analysis_cache, query
from harness.record.store import Store
from harness.stats import policy

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
    return digest(code_version(), chip, include_dirty, last, change_points, min_effect, alpha,
                   json.dumps(arranged, default=repr, separators=(",", ":")), sorted(state.runs.items()))[:40]


def _chip_out(histories: list[SeriesHistory], events: list[RegressionEvidence]) -> tuple[bytes, str]:
    """The chip's analysis as one payload, and a SHA-256 of all of it, which the payload holds (``digest``:
    everything its histories are made of but the commits, which its key holds -- a report fingerprints a chip's
    history pages by the two: ``CacheStats.whole``)."""
    sizes = [len(h.points) for h in histories]
    total = sum(sizes)
    body = bytearray(total * sum(np.dtype(dtype).itemsize for _, dtype in _CHIP_ARRAYS))  # each column in place
    offset = 0
    for name, dtype in _CHIP_ARRAYS if total else ():
        column = np.frombuffer(body, dtype=dtype, count=total, offset=offset)
        np.concatenate([getattr(h.points, name) for h in histories], out=column)
        offset += column.nbytes
    header = {
        "keys": [list(h.key) for h in histories], "sizes": sizes,
        "flags": [[[c.kind, c.index, c.end_index, c.before, c.after, c.ratio] for c in h.change_points]
                  for h in histories],
        "events": [evidence_out(e) for e in events]}
    hasher = hashlib.sha256(json.dumps(header, separators=(",", ":")).encode() + b"\0")
    hasher.update(body)
    contents = hasher.hexdigest()
    return frame(_CHIP_MAGIC, {**header, "digest": contents}, body), contents


def _chip_in(payload: bytes, commits: list[tuple]
             ) -> tuple[list[SeriesHistory], list[RegressionEvidence], str] | None:
    """A stored chip analysis on the chip's freshly arranged ``commits`` (the key holds them: the same), as
    ``series_histories`` builds it, and its payload's ``digest``; None when unreadable."""
    try:
        if (framed := unframe(payload, _CHIP_MAGIC)) is None:
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
        return histories, [evidence_in(values) for values in header["events"]], str(header["digest"])
    except (ValueError, KeyError, TypeError, IndexError, struct.error):
        return None


def _chip_is_stored(store: Store, chip: str, name: str, key: str, state: analysis_cache.ChipState,
                    deferred_writes: list[ChipRows] | None = None) -> bool | None:
    """Whether the chip's analysis is stored under ``key`` and none of its runs gained samples since it was stored (a
    later trial of a stored job); its payload is not read. None: none of it is stored (under any key). Found so, its
    watermark is raised to ``state``'s (``analysis_cache.stamp``): here, or by the caller of ``analyse`` with its
    ``deferred_writes``."""
    found = analysis_cache.entry_keys(store, chip, "chip", [name]).get(name)
    if found is None:
        return None
    if state.unfinished or found[0] != key or analysis_cache.touched_since(store, state.run_commit, found[1] or 0):
        return False
    if state.watermark > (found[1] or 0):
        stamp = ("chip", name, key, state.watermark)
        if deferred_writes is None:
            analysis_cache.stamp(store, chip, *stamp)
        else:
            deferred_writes.append(ChipRows(chip, Writes(), CacheStats(), [stamp]))
    return True


def _stored_chip(store: Store, chip: str, name: str, commits: list[tuple]
                 ) -> tuple[list[SeriesHistory], list[RegressionEvidence], str] | None:
    """The chip's stored analysis (``_chip_is_stored``) on its freshly arranged ``commits``; None when it is gone or
    unreadable."""
    entry = analysis_cache.read_entries(store, chip, "chip", [name]).get(name)
    return _chip_in(entry.payload, commits) if entry is not None else None


def analyse(store: Store, chips: Sequence[str], *, change_points: bool = True, last: int | None = None,
            include_dirty: bool = False, min_effect: float = policy.DEFAULT_MIN_EFFECT,
            alpha: float = policy.DEFAULT_ALPHA, use_cache: bool = True, timings: dict[str, float] | None = None,
            states: Mapping[str, analysis_cache.ChipState] | None = None,
            deferred_writes: list[ChipRows] | None = None,
            ) -> tuple[dict[str, list[SeriesHistory]], list[RegressionEvidence], CacheStats]:
    """Every chip's histories (``history.history``) and the regression list (``regressions.regressions``),
    reusing the stored analysis of what did not change and storing what was computed (``use_cache=False``:
    computed from the samples, nothing read or written). ``timings`` gets the seconds spent on the cells (loading),
    the histories and the regressions. ``states``: per chip ``analysis_cache.chip_state(include_dirty=True)`` when
    the caller read it (before anything else: its watermark), else read here. Chips to compute, when there are
    several and a fork is safe (``harness.core.fork``), are computed in forked processes, a core each: a full
    analysis is mostly per-chip Python work. ``deferred_writes``: the rows of the chips computed in this process
    are not stored here but appended to it (``ChipRows``), for the caller to store once it has handed on the
    results (a report's forked analysis hands them to the report's process, which stores them while this one draws
    the history pages: a 1,000-commit chip's row is 16 MB); a forked process stores its chip's rows itself."""
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
        chip_name = f"{dirty_suffix(include_dirty)}:{last}:{change_points}"
        chip_key = _chip_key(chip, arranged, state, include_dirty=include_dirty, last=last,
                             change_points=change_points, min_effect=min_effect, alpha=alpha)
        reads.append((chip, (arranged, state, chip_name, chip_key),
                      _chip_is_stored(store, chip, chip_name, chip_key, state, deferred_writes)))
        timings["cells"] += time.perf_counter() - start
    if change_points and any(stored is None for *_, stored in reads):  # a chip never analysed: every window of
        segment_search.warm_up_in_background()  # every series to search, compiled (loaded while the rest reads)
    for chip, read, stored in reads:
        start = time.perf_counter()
        arranged = read[0]
        stored_chip = _stored_chip(store, chip, read[2], arranged[0]) if stored else None
        histories[chip] = []  # the chips keep their order
        if stored_chip is not None:  # none of its runs changed: its histories and regressions as stored
            histories[chip], per_chip[chip], contents = stored_chip
            stats_out.whole[chip] = digest(contents, read[3])  # its stored analysis and its commits
            stats_out.cells[chip] = (len(arranged[0]), 0)
            stats_out.changes[chip] = (len(histories[chip]) if change_points else 0, 0)
            stats_out.families[chip] = (int(sum(arranged[2])), 0)
            stats_out.chips_reused += 1
        else:
            todo.append((chip, read))
        timings["cells"] += time.perf_counter() - start
    for chip, (found, events, chip_stats, chip_timings) in _each_chip(store, todo, options):
        histories[chip], per_chip[chip] = found, events
        for name in ("cells", "changes", "families", "unfinished", "whole"):
            getattr(stats_out, name).update(getattr(chip_stats, name))
        stats_out.write_errors += chip_stats.write_errors
        for key, seconds in chip_timings.items():
            timings[key] += seconds
    segment_search.finish_warm_up()  # no thread of it outlives the analysis (a fork may come)
    if use_cache:
        log.info("analysis cache: %s", stats_out.summary())
    for chip, read, _ in reads:  # a slowdown across a commit placed by commit time: "unproven", not confirmed
        commits, previous = read[0][0], read[0][1]
        per_chip[chip] = regressions_module.order_checked(
            commits, previous, per_chip[chip],
            lambda chip=chip: query.guessed_commits(store, chip, include_dirty))
    events = [e for chip in sorted(per_chip) for e in per_chip[chip]]
    correctness = [e for e in events if e.kind == "correctness"]
    performance = [e for e in events if e.kind == "performance"]
    unproven = [e for e in events if e.kind == "unproven"]
    return histories, correctness + performance + unproven, stats_out


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
    writes = Writes()
    start = time.perf_counter()
    per_commit, fingerprint, raw, run_fingerprints = load_cells(
        store, chip, arranged[0], include_dirty=include_dirty, windowed=last is not None, writes=writes,
        stats_out=stats_out, state=state)
    summary = assemble(chip, arranged, per_commit, fingerprint, raw, run_fingerprints)
    timings["cells"] += time.perf_counter() - start
    start = time.perf_counter()
    histories = series_histories(
        summary.data, summary.level, summary.low, summary.high, change_points=change_points,
        min_effect=min_effect, alpha=alpha,
        find=change_finder(store, summary.data, include_dirty=include_dirty, last=last, min_effect=min_effect,
                           alpha=alpha, writes=writes, stats_out=stats_out))
    timings["histories"] += time.perf_counter() - start
    start = time.perf_counter()
    events = regression_list(store, summary, include_dirty=include_dirty, last=last, min_effect=min_effect,
                          alpha=alpha, writes=writes, stats_out=stats_out)
    timings["regressions"] += time.perf_counter() - start

    if not state.unfinished:  # a run still writing: samples may still come, some with lower ids (PostgreSQL)
        payload, contents = _chip_out(histories, events)
        writes.add("chip", {chip_name: analysis_cache.Entry(chip_key, payload, state.watermark)})
        stats_out.whole[chip] = digest(contents, chip_key)  # as when it is reused
    rows = ChipRows(chip, writes, stats_out)
    if options.get("deferred") is not None:
        options["deferred"].append(rows)
    else:
        start = time.perf_counter()
        rows.store(store)
        timings["cells"] += time.perf_counter() - start
    return histories, events, stats_out, timings


@dataclass
class ChipRows:
    """A chip's analysis cache rows, stored once its analysis is handed on (``analyse``'s ``deferred_writes``): the
    rows of its cells, change points and families and its whole analysis as one row (``writes``), and the
    watermarks to raise of rows reused as they are (``stamps``: (kind, name, key, watermark), as
    ``analysis_cache.stamp`` takes them). Picklable: the process that stores them may be another (a report's,
    while its forked analysis draws the history pages)."""

    chip: str
    writes: Writes
    stats_out: CacheStats
    stamps: list[tuple[str, str, str, int]] = field(default_factory=list)

    def store(self, store: Store) -> None:
        flush(store, self.chip, self.writes, self.stats_out)
        for kind, name, key, watermark in self.stamps:
            analysis_cache.stamp(store, self.chip, kind, name, key, watermark)
