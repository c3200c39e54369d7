"""Change points per series and regression families per chip: their rows, keys and payloads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt

from harness.analysis import history as history_module
from harness.analysis import regressions as regressions_module
from harness.analysis.cache.common import CacheStats, ChipCells, Writes, code_version, digest, dirty_suffix
from harness.analysis.history import by_series_key
from harness.analysis.records import (
    RegressionEvidence,
)
from harness.analysis.regressions import (
    correctness_regressions,
    performance_regressions,
)
from harness.core import defaults
from harness.core.chip import timing_fit
from harness.record import analysis_cache, query
from harness.record.store import Store
from harness.stats import changepoints

# ---------------------------------------------------------------------------------------------------------------
# Change points and regression families
# ---------------------------------------------------------------------------------------------------------------


def _changes(payload: bytes, size: int) -> list[changepoints.ChangePoint] | None:
    """A stored window's changes (indices into the window); None when unreadable or not of a window of ``size``."""
    try:
        found = [changepoints.ChangePoint(int(i), k, float(b), float(a), float(r), int(e))
                 for k, i, e, b, a, r in json.loads(payload)]
    except (ValueError, TypeError):
        return None
    return found if all(0 <= c.index <= c.end_index < size and c.kind in changepoints.CHANGE_KINDS
                        for c in found) else None


def changes_kind(include_dirty: bool, last: int | None) -> str:
    """The analysis cache's kind of the change-point windows of a chip's histories with these options (each set of
    options keeps its own windows: a ``--last`` report does not delete those of the whole history)."""
    return "changes" if not include_dirty and last is None else f"changes{dirty_suffix(include_dirty)}:{last}"


def change_finder(store: Store, data: query.ChipHistory, *, include_dirty: bool, last: int | None, min_effect: float,
                  alpha: float, writes: Writes, stats_out: CacheStats) -> history_module.ChangeFinder:
    """``series_histories``' change finder for ``data``'s series: each line searched in its windows
    (``changepoints.windows``), the stored changes of a window whose values and parameters are the same,
    ``detect_windows`` for the others. A window's row is named by a digest of its values (bit for bit) and the
    parameters: all windows but the newest end at a fixed commit, so a new run searches one window a series, at
    times two. Rows of windows no longer searched with these options (``changes_kind``) are deleted.
    ``stats_out.changes``: series whose windows were all reused, series with one searched."""
    version = code_version()
    kind = changes_kind(include_dirty, last)
    searched: list[int] = []

    def search(windows: Sequence[npt.NDArray[np.float64]]) -> list[list[changepoints.ChangePoint]]:
        names = [digest(version, min_effect, alpha, np.ascontiguousarray(values, dtype="<f8").tobytes())[:40]
                 for values in windows]
        stored = analysis_cache.read_entries(store, data.chip, kind)
        out = [_changes(entry.payload, len(values)) if (entry := stored.get(name)) is not None else None
               for name, values in zip(names, windows, strict=True)]
        searched[:] = [i for i, found in enumerate(out) if found is None]
        new = {}
        computed = history_module.detect_windows([windows[i] for i in searched], min_effect=min_effect, alpha=alpha)
        for i, found in zip(searched, computed, strict=True):
            out[i] = found
            new[names[i]] = analysis_cache.Entry(names[i], json.dumps(
                [[c.kind, c.index, c.end_index, c.before, c.after, c.ratio] for c in found]).encode())
        writes.add(kind, new, keep=names)
        return [found or [] for found in out]

    def find(lines_of: Sequence[Sequence[npt.NDArray[np.float64]]]) -> list[history_module.Flags]:
        found = history_module.detect_lines(lines_of, min_effect=min_effect, alpha=alpha, search=search)
        ends = np.cumsum([sum(len(changepoints.windows(len(line))) for line in lines) for lines in lines_of])
        touched = np.unique(np.searchsorted(ends, searched, side="right")).size  # the series of searched windows
        stats_out.changes[data.chip] = (len(lines_of) - touched, touched)
        return found

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


def evidence_out(evidence: RegressionEvidence) -> list[Any]:
    return [_time_out(v) if isinstance(v, datetime) else v
            for v in (getattr(evidence, name) for name in _EVIDENCE_FIELDS)]


def evidence_in(values: list[Any]) -> RegressionEvidence:
    if len(values) != len(_EVIDENCE_FIELDS):
        raise ValueError("another evidence layout")
    return RegressionEvidence(*(_time_in(v) if isinstance(v, dict) else v for v in values))


def _family_keys(chip: ChipCells, broken: set[tuple[int, str]], *, min_effect: float, alpha: float
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
            tokens[commit] = digest(data.commits[commit], chip.ids[commit])[:32]
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
        keys[head] = digest(version, min_effect, alpha, sorted(broken_at.get(head, [])),
                             "".join(token(p) for p in path))[:40]
    return keys


def _trials_loader(store: Store, chip: ChipCells, *, include_dirty: bool) -> regressions_module.TrialsOf:
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


def _correctness_rows(store: Store, chip: ChipCells, *, include_dirty: bool, writes: Writes
                      ) -> tuple[list[tuple], list[tuple]]:
    """The chip's correctness job statuses and failures (``analysis_cache.correctness_rows``), stored per commit
    under the fingerprints of the commit's included runs (a correctness job is written once and never changes):
    after a new run, only its commit's rows are read. Only the order of one commit's failures matters (the first
    failure of a job at a commit is its event's evidence), and the rows of a commit keep theirs."""
    name = f"correctness{dirty_suffix(include_dirty)}"
    prints = {str(commit): digest(runs)[:24] for commit, runs in chip.run_fingerprints.items()}
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


def regression_list(store: Store, chip: ChipCells, *, include_dirty: bool, last: int | None, min_effect: float,
                 alpha: float, writes: Writes, stats_out: CacheStats) -> list[RegressionEvidence]:
    data = chip.data
    events, broken = correctness_regressions(store, data, include_dirty=include_dirty, last=last,
                                             rows=_correctness_rows(store, chip, include_dirty=include_dirty,
                                                                    writes=writes))
    keys = _family_keys(chip, broken, min_effect=min_effect, alpha=alpha)
    name = f"families{dirty_suffix(include_dirty)}:{last}"
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
                found[commit] = [evidence_in(values) for values in stored[key]]
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
        payload = {keys[c]: [evidence_out(e) for e in found[c]] for c in keys}
        writes.add("families", {name: analysis_cache.Entry(code_version(), json.dumps(payload).encode())})
    if not timing_fit(data.chip):  # a virtual GPU: its correctness counts, its timings carry no verdict
        return events
    return events + [e for commit in sorted(found) for e in found[commit]]
