"""One chip's history (history, regressions): its commits in order, samples as arrays (cached), modes, correctness."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from harness.core import defaults
from harness.core.status import CODE_FAILURES
from harness.record import ancestry
from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.query.common import SeriesKey, joined_modes, plain_rows, run_filter, utc
from harness.record.query.samples import load_samples
from harness.record.store import Store
from harness.stats.summary import sorted_medians


@dataclass
class ChipHistory:
    """All clean runs of one chip, pooled per (commit, series) cell and grouped per trial within each cell.

    ``commits`` are in history order (``harness.record.ancestry.arrange``): the branch's first-parent line, oldest
    first (``line`` 0), then the commits off it as lines of their own (1, 2, ...); without parents, time order.
    ``previous``: per commit, the index of its previous commit (its nearest ancestor with runs on the chip), -1
    when it has none here. ``shown``: the commits of the window (all without ``last``); the others are only loaded
    behind shown ones: their previous commits (the bases they are judged against) and the history before those.

    Samples: each cell's are contiguous in ``values`` (``offsets``, ``counts``) and grouped there by trial, one
    trial per (run, trial) -- a job process -- with the runs in start order; each trial's samples are sorted.
    A cell's trials are ``trial_counts`` entries of the per-trial arrays from ``trial_offsets``: where the trial's
    samples start in ``values`` (``trial_starts``), how many (``trial_sizes``) and its run (``trial_runs``: an index
    in the chip's runs in start order, so a cell's runs are ascending and its newest run last).
    """

    chip: str
    commits: list[tuple[int, str, str, str, datetime | None]]  # (commit id, sha, message, branch, first start)
    series: list[SeriesKey]
    counts: npt.NDArray[np.int64]  # (n_commits, n_series): valid samples per cell
    offsets: npt.NDArray[np.int64]  # (n_commits, n_series): start of each cell in ``values``
    values: npt.NDArray[np.float64]  # samples sorted by (cell, run, trial, seconds)
    previous: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    shown: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    line: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trial_counts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    trial_offsets: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    trial_starts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trial_sizes: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trial_runs: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _trial_medians: npt.NDArray[np.float64] | None = field(default=None, repr=False, compare=False)

    def nearest_with(self, present: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
        """Per commit and column of ``present`` (n_commits, k): the nearest commit up the commit's ``previous``
        chain (its ancestors with runs, nearest first) where ``present`` holds; -1 where none does."""
        out = np.full(present.shape, -1, dtype=np.int64)
        for commit in self.ancestors_first().tolist():
            before = int(self.previous[commit])
            if before >= 0:
                out[commit] = np.where(present[before], before, out[before])
        return out

    def ancestors_first(self) -> npt.NDArray[np.intp]:
        """The commit indices by their depth up the ``previous`` chains (stably): each after its ancestors."""
        n = len(self.commits)
        depth = np.zeros(n, dtype=np.int64)
        for start in range(n):
            path = []
            i = start
            while i >= 0 and depth[i] == 0:
                path.append(i)
                i = int(self.previous[i])
            level = int(depth[i]) if i >= 0 else 0
            for j in reversed(path):
                level += 1
                depth[j] = level
        return np.argsort(depth, kind="stable")

    def cell_rows(self, cells: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.float64]:
        """Pooled samples (every trial's) of flat cell indices that all have n samples, each row sorted:
        shape (len(cells), n)."""
        return np.sort(self.values[self.offsets.ravel()[cells][:, None] + np.arange(n)], axis=1)

    def samples(self, cell: int) -> npt.NDArray[np.float64]:
        """Pooled samples (every trial's) of one flat cell index, sorted."""
        start = self.offsets.flat[cell]
        return np.sort(self.values[start:start + self.counts.flat[cell]])

    def trials(self, cell: int) -> list[npt.NDArray[np.float64]]:
        """The samples of one flat cell index per trial (runs in start order), each sorted."""
        first = int(self.trial_offsets.flat[cell])
        span = slice(first, first + int(self.trial_counts.flat[cell]))
        if span.stop > span.start and int(self.trial_starts[span].min()) < 0:
            raise ValueError(f"cell {cell}: its trials' samples were not loaded (load_cell_trials)")
        return [self.values[start:start + size]
                for start, size in zip(self.trial_starts[span].tolist(), self.trial_sizes[span].tolist(), strict=True)]

    def trial_medians(self) -> npt.NDArray[np.float64]:
        """The median of every trial (as ``np.median`` computes it), in the order of the per-trial arrays."""
        if self._trial_medians is None:
            if self.trial_starts.size and int(self.trial_starts.min()) < 0:
                raise ValueError("trials without their samples need their medians given (load_cell_trials)")
            self._trial_medians = sorted_medians(self.values, self.trial_starts, self.trial_sizes)
        return self._trial_medians

    def trial_cells(self) -> npt.NDArray[np.int64]:
        """The flat cell index of every trial."""
        return np.repeat(np.arange(self.trial_counts.size), self.trial_counts.ravel())


_CACHE: OrderedDict[tuple, ChipHistory] = OrderedDict()
_CACHE_SIZE = 8  # chip histories; ~20 MB each at 1000 commits x 200 series x 10 samples


def _fingerprint(session: Session) -> tuple:
    """Changes whenever a run or job is added or removed, a trial is appended to a stored job (new samples), a
    run's start time moves, or commits or parents are recorded."""
    runs = session.execute(select(func.count(Run.id), func.max(Run.started_at))).one()
    jobs = session.execute(select(func.count(JobRecord.id), func.max(JobRecord.id))).one()
    samples = session.execute(select(func.max(Sample.id))).one()
    commits = session.execute(select(func.count(Commit.id), func.count(Commit.parents))).one()
    return (*runs, *jobs, *samples, *commits)


def chip_history(store: Store, chip: str, kernel: str | None = None, *, include_dirty: bool = False,
                 last: int | None = None) -> ChipHistory:
    """The chip's benchmark history, its commits in history order (see ``ChipHistory``), from a small cache keyed
    on the database's state (history then regressions of the same chip, as the report does, load it once).

    ``last``: the window is the last N commits of the main line, and the commits off it whose first run is not
    older than the oldest first run among those N; the previous commits of the window come along as bases.
    """
    with store.session() as session:
        key = (store.url, chip, kernel, include_dirty, last, _fingerprint(session))
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        data = _query_chip(session, chip, kernel, include_dirty, last)
    _CACHE[key] = data
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return data


def _arrangement_of(session: Session, chip: str, include_dirty: bool
                    ) -> tuple[list[Any], dict[int, list[str]], ancestry.Arrangement]:
    """The chip's commits (in time order of first runs), the branches of their runs, and their arrangement."""
    first_start = func.min(Run.started_at)
    rows = session.execute(run_filter(
        select(Commit.id, Commit.sha, Commit.message, Commit.branch, first_start, Commit.repo, Commit.committed_at)
        .select_from(Run).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id),
        chip, include_dirty).group_by(Commit.id, Commit.sha, Commit.message, Commit.branch, Commit.repo,
                                      Commit.committed_at)
        .order_by(first_start, Commit.id)).all()
    run_branches: dict[int, list[str]] = {}
    for commit_id, branch in session.execute(run_filter(
            select(Run.commit_id, Run.branch).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
            .order_by(Run.started_at, Run.id)):
        if branch:
            run_branches.setdefault(commit_id, []).append(branch)
    graph = ancestry.load_graph(session, {row[5] for row in rows})
    arranged = ancestry.arrange([(row[5], row[1]) for row in rows], graph,
                                [{*run_branches.get(row[0], ()), row[3]} for row in rows],
                                [utc(row[6]) for row in rows])
    return rows, run_branches, arranged


def _memoised_arrangement(store: Store, chip: str, include_dirty: bool
                          ) -> tuple[list[Any], dict[int, list[str]], ancestry.Arrangement]:
    """``_arrangement_of``, read once per chip within ``Store.memoised`` (a report asks it of every chip several
    times: its chip keys, the history pages' and chip pages' proven order, the unproven regressions)."""
    def read() -> tuple[list[Any], dict[int, list[str]], ancestry.Arrangement]:
        with store.session() as session:
            return _arrangement_of(session, chip, include_dirty)

    return store.memo(("chip arrangement", chip, include_dirty), read)


def arranged_in(store: Store, chip: str, include_dirty: bool,
                last: int | None) -> tuple[list[tuple], list[int], list[bool], list[int]]:
    """``arranged``, its arrangement read once per chip within ``Store.memoised``."""
    return _windowed(*_memoised_arrangement(store, chip, include_dirty), last)


def arranged(session: Session, chip: str, include_dirty: bool,
              last: int | None) -> tuple[list[tuple], list[int], list[bool], list[int]]:
    """The chip's commits in history order, and per commit: previous commit index, shown, line."""
    return _windowed(*_arrangement_of(session, chip, include_dirty), last)


def _windowed(rows: list[Any], run_branches: dict[int, list[str]], arranged: ancestry.Arrangement,
              last: int | None) -> tuple[list[tuple], list[int], list[bool], list[int]]:
    shown = set(range(len(rows)))
    if last is not None:
        window = [i for i, line in zip(arranged.order, arranged.line, strict=True) if line == 0]
        window = window[-last:] if last > 0 else []
        since = min(window, default=len(rows))  # rows are in time order
        shown = {*window, *(i for i, line in zip(arranged.order, arranged.line, strict=True)
                            if line > 0 and i >= since)}
    # The previous commits of the window (its bases) and the history behind them (the bases' history floors)
    kept, frontier = set(shown), set(shown)
    for _ in range(1 + defaults.HISTORY_RUNS):
        frontier = {arranged.previous[i] for i in frontier if arranged.previous[i] >= 0} - kept
        kept |= frontier
    positions = [i for i in arranged.order if i in kept]
    position = {i: k for k, i in enumerate(positions)}
    line_of = dict(zip(arranged.order, arranged.line, strict=True))
    commits = [(rows[i][0], rows[i][1], rows[i][2], (run_branches.get(rows[i][0]) or [rows[i][3]])[-1], rows[i][4])
               for i in positions]
    previous = [position.get(arranged.previous[i], -1) for i in positions]
    return commits, previous, [i in shown for i in positions], [line_of[i] for i in positions]


def chip_order_proven(store: Store, chip: str, include_dirty: bool = False) -> bool:
    """Whether ancestry proves the order of every commit of the chip's history (else some are placed by commit
    time: pages say "order not proven by ancestry")."""
    return not guessed_commits(store, chip, include_dirty)


def guessed_commits(store: Store, chip: str, include_dirty: bool = False) -> set[int]:
    """The ids of the chip's commits whose previous commit (or place on their line) is a guess by commit time, not
    proven by ancestry: a verdict against a previous point across one of them is "order not proven by ancestry"."""
    rows, _, arranged = _memoised_arrangement(store, chip, include_dirty)
    return {rows[i][0] for i, proven in enumerate(arranged.proven) if not proven}


def _query_chip(session: Session, chip: str, kernel: str | None, include_dirty: bool,
                last: int | None) -> ChipHistory:
    commits, previous, shown, line = arranged(session, chip, include_dirty, last)
    layout = load_samples(session, chip, [row[0] for row in commits], include_dirty=include_dirty,
                          all_runs=last is None, kernel=kernel)
    return ChipHistory(chip, commits, [SeriesKey(*series, chip) for series in layout.series], layout.counts,
                       layout.offsets, layout.values, np.array(previous, dtype=np.int64),
                       np.array(shown, dtype=bool), np.array(line, dtype=np.int64), layout.trial_counts,
                       layout.trial_offsets, layout.trial_starts, layout.trial_sizes, layout.trial_runs)


def commit_timing_modes(store: Store, chip: str, commit_ids: Sequence[int], *, include_dirty: bool = False
                        ) -> dict[tuple[int, str, str, str, str], str]:
    """How each benchmark series was timed in the chip's runs (those ``chip_history`` includes) of the given
    commits: (commit id, kernel, variant, dtype, shape key) -> the mode, "+"-joined where its runs differ."""
    modes: dict[tuple[int, str, str, str, str], set[str]] = {}
    # The runs first, then their jobs by index: joined the other way, SQLite scans the whole job table.
    runs = run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty).where(
        Run.commit_id.in_(list(commit_ids)))
    with store.session() as session:
        for commit_id, kernel, variant, dtype, shape_key, mode in session.execute(
                select(Run.commit_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key,
                       JobRecord.timing_mode)
                .join(Run, JobRecord.run_id == Run.id)
                .where(JobRecord.run_id.in_(runs), JobRecord.kind == "benchmark")):
            modes.setdefault((commit_id, kernel, variant, dtype, shape_key), set()).add(mode or "")
    return joined_modes(modes)


# fails with any of its tests, so its tests speak for it).
EVENT_KINDS = ("correctness", "test")


def correctness_statuses(store: Store, chip: str, *, include_dirty: bool = False,
                         commits: Collection[int] | None = None) -> list[tuple[int, str, str]]:
    """``(commit id, job key, status)`` of every correctness job of the chip's clean runs (all with
    ``include_dirty``; of ``commits`` only, when given), unordered."""
    with store.session() as session:
        return plain_rows(session, select(Run.commit_id, JobRecord.key, JobRecord.status).select_from(JobRecord)
                           .join(Run, JobRecord.run_id == Run.id)
                           .where(JobRecord.run_id.in_(_chip_runs(chip, include_dirty, commits)),
                                  JobRecord.kind.in_(EVENT_KINDS)))


def _chip_runs(chip: str, include_dirty: bool, commits: Collection[int] | None = None):
    """The chip's (clean) run ids (of ``commits``, when given) as a subquery: SQLite then reads their jobs by index
    instead of the job table."""
    runs = run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
    return runs if commits is None else runs.where(Run.commit_id.in_(sorted(commits)))


def failing_correctness_jobs(store: Store, chip: str, *, include_dirty: bool = False,
                             commits: Collection[int] | None = None) -> list[tuple]:
    """``(commit id, job key, kernel, variant, dtype, shape_key, check, status, detail)`` of every failing
    correctness job and repository test (``CODE_FAILURES``) of the chip's clean runs (all with ``include_dirty``;
    of ``commits`` only, when given), in run start order, then job order. A test's ``kernel`` is its selection and
    its ``check`` its node id."""
    with store.session() as session:
        rows = session.execute(
            select(Run.commit_id, JobRecord.key, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                   JobRecord.shape_key, JobRecord.check_name, JobRecord.status, JobRecord.detail, JobRecord.kind,
                   JobRecord.name)
            .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id)
            .where(JobRecord.run_id.in_(_chip_runs(chip, include_dirty, commits)), JobRecord.kind.in_(EVENT_KINDS),
                   JobRecord.status.in_(CODE_FAILURES))
            .order_by(Run.started_at, JobRecord.id))
        return [(*row[:6], row.name if row.kind == "test" else row.check_name, *row[7:9]) for row in rows]
