"""The comparison reads (compare, variants, noise): samples, history medians, timing modes, failures of given runs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from harness.core import defaults
from harness.core.status import CODE_FAILURES, CORRECTNESS_KINDS, drop_explained_selections
from harness.record import ancestry
from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.query.common import (
    SeriesKey,
    commit_graph,
    joined_modes,
    plain_array,
    plain_rows,
    positions_of,
)
from harness.record.store import Store
from harness.stats import pacing


class FailureRow(NamedTuple):
    """A failing correctness job of a run: a kernel check, or a repository test (kind "test"; ``name`` its node id),
    or a pytest selection that failed without a failing test to show for it (collection error, crash, timeout)."""

    chip: str
    kernel: str
    variant: str
    check: str
    dtype: str
    shape_key: str
    status: str
    detail: str
    run_id: str
    sha: str
    kind: str
    key: str
    name: str


class SeriesTrials(NamedTuple):
    """One series' raw samples on one side of a comparison, grouped by trial: one array per (run, trial)."""

    trials: list[npt.NDArray[np.float64]]
    runs: int  # the distinct runs they came from
    labels: tuple[tuple[str, int], ...] = ()  # (run id, trial number) of each array of ``trials``

    def by_label(self) -> dict[tuple[str, int], npt.NDArray[np.float64]]:
        """Each trial's samples by (run id, trial number)."""
        return dict(zip(self.labels, self.trials, strict=True))


def series_trials(store: Store, run_ids: Sequence[str]) -> dict[SeriesKey, SeriesTrials]:
    """Raw benchmark samples of the given runs per series (chip included), one array per trial (a run's job
    process; rows stored before trials were recorded are one trial each); only finite positive samples. Read once
    per ``run_ids`` within ``Store.memoised`` (the arrays are shared: not to be changed)."""
    if not run_ids:
        return {}
    return dict(store.memo(("series trials", *run_ids), lambda: _series_trials(store, run_ids)))


def _series_trials(store: Store, run_ids: Sequence[str]) -> dict[SeriesKey, SeriesTrials]:
    """Two reads: the runs' benchmark jobs (their series and run), then their samples as numbers alone, grouped by
    (series, run, trial) with numpy: a Python step per sample cost more than the query (a compare page reads ~10^4
    per side)."""
    with store.session() as session:
        jobs = plain_rows(session, select(JobRecord.id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
                                          JobRecord.shape_key, Chip.key, JobRecord.run_id)
                          .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id)
                          .join(Chip, Run.chip_id == Chip.id)
                          .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark"))
        rows = plain_array(session, select(Sample.job_id, Sample.trial, Sample.seconds)
                           .join(JobRecord, Sample.job_id == JobRecord.id)
                           .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark")
                           .order_by(Sample.job_id, Sample.idx), _TRIAL_SAMPLE)
    return _grouped_trials(jobs, rows)


_TRIAL_SAMPLE = np.dtype([("job", np.int64), ("trial", np.int64), ("seconds", np.float64)])


def _grouped_trials(jobs: Sequence[tuple], rows: npt.NDArray[Any]) -> dict[SeriesKey, SeriesTrials]:
    """``jobs``: (id, kernel, variant, dtype, shape key, chip, run id); ``rows``: their samples in (job, index)
    order. Per series (first seen first), its trials (first seen first), each the finite positive samples of one
    (run, trial) in row order; trials with none are left out, and series with none."""
    if rows.size == 0:
        return {}
    job_of = positions_of(np.array([job[0] for job in jobs], dtype=np.int64), rows["job"])
    series_index: dict[SeriesKey, int] = {}
    run_index: dict[str, int] = {}
    job_series = np.array([series_index.setdefault(SeriesKey(*job[1:6]), len(series_index)) for job in jobs],
                          dtype=np.int64)
    job_run = np.array([run_index.setdefault(job[6], len(run_index)) for job in jobs], dtype=np.int64)
    trial = rows["trial"] - rows["trial"].min()
    span = int(trial.max()) + 1
    group = (job_series[job_of] * len(run_index) + job_run[job_of]) * span + trial
    keys, first, inverse = np.unique(group, return_index=True, return_inverse=True)
    rank = np.empty(keys.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(keys.size)  # groups in the order they are first seen
    group_of = rank[inverse.reshape(-1)]
    order = np.argsort(group_of, kind="stable")
    seconds, group_of = rows["seconds"][order], group_of[order]
    valid = np.isfinite(seconds) & (seconds > 0)
    kept_ends = np.cumsum(np.bincount(group_of[valid], minlength=keys.size))
    arrays = np.split(seconds[valid], kept_ends[:-1])
    first_sorted = np.sort(first)
    labels = rows["trial"][first_sorted].tolist()
    group_series = job_series[job_of[first_sorted]].tolist()
    group_run = job_run[job_of[first_sorted]].tolist()
    runs = list(run_index)
    series_keys = list(series_index)
    by_series: dict[int, tuple[list[npt.NDArray[np.float64]], set[int], list[tuple[str, int]]]] = {}
    for series, run, label, array in zip(group_series, group_run, labels, arrays, strict=True):
        kept, seen, named = by_series.setdefault(series, ([], set(), []))
        seen.add(run)
        if array.size:
            kept.append(array)
            named.append((runs[run], int(label)))
    return {series_keys[series]: SeriesTrials(kept, len(seen), tuple(named))  # in the order first seen
            for series, (kept, seen, named) in by_series.items() if kept}


def _first_parents(graph: ancestry.Graph, start: ancestry.Key, limit: int) -> list[str] | None:
    """``start``'s sha and those of its first-parent ancestors, newest first; None when a commit's parents are
    unknown on the way (stored before parents were recorded, or not seen in git)."""
    shas, key = [], start
    while key in graph and len(shas) < limit:
        shas.append(key[1])
        parents = graph[key]
        if parents is None:
            return None
        if not parents:
            break
        key = (key[0], parents[0])
    return shas


def _history_runs(session: Session, graph: ancestry.Graph, runs: Sequence[Run], limit: int) -> list[str]:
    """The newest ``limit`` finished clean runs on the runs' chip at their commits or first-parent ancestors; where
    the ancestry is unknown, the chip's runs of the repository started up to the newest given run (time order, as
    :func:`previous_run_id` falls back to)."""
    repo, chip_id = runs[0].commit.repo, runs[0].chip_id
    walks = [_first_parents(graph, (repo, run.commit.sha), 10 * limit) for run in runs]
    finished = (select(Run.id, Commit.sha, Run.started_at).join(Commit, Run.commit_id == Commit.id)
                .where(Run.chip_id == chip_id, Commit.repo == repo, Run.finished_at.is_not(None),
                       Run.dirty.is_(False), Run.settling.is_(False)))
    if any(walk is None for walk in walks):
        newest = max(run.started_at for run in runs)
        rows = session.execute(finished.where(Run.started_at <= newest).order_by(Run.started_at.desc())
                               .limit(limit)).all()
        return [run_id for run_id, _, _ in rows]
    order = {sha: rank for walk in walks for rank, sha in enumerate(walk or [])}
    rows = session.execute(finished.where(Commit.sha.in_(list(order))).order_by(Run.started_at.desc())).all()
    return [run_id for run_id, _, _ in sorted(rows, key=lambda row: order[row[1]])][:limit]


def _history_groups(store: Store, session: Session, run_ids: Sequence[str], limit: int
                    ) -> Iterator[tuple[str, list[str]]]:
    """Per (repository, chip) of the given runs: the chip's key and its history runs (:func:`_history_runs`)."""
    given = session.scalars(select(Run).where(Run.id.in_(list(run_ids)))).all()
    repos = sorted({run.commit.repo for run in given})
    graph = commit_graph(store, session, repos)
    for (_, _, chip_key), runs in groupby(sorted(given, key=lambda r: (r.commit.repo, r.chip_id)),
                                          key=lambda r: (r.commit.repo, r.chip_id, r.chip.key)):
        yield chip_key, _history_runs(session, graph, list(runs), limit)


def history_run_ids(store: Store, run_ids: Sequence[str], limit: int = defaults.HISTORY_RUNS) -> list[str]:
    """The runs :func:`history_medians` reads for the given runs (what their series' history floors come from); read
    once per runs within ``store.memoised``."""
    if not run_ids:
        return []

    def read() -> list[str]:
        with store.session() as session:
            return [run_id for _, chosen in _history_groups(store, session, run_ids, limit) for run_id in chosen]

    return list(store.memo(("history run ids", tuple(run_ids), limit), read))


def history_medians(store: Store, run_ids: Sequence[str], limit: int = defaults.HISTORY_RUNS
                    ) -> dict[SeriesKey, list[float]]:
    """Each series' medians over the newest ``limit`` finished, clean runs on the given runs' chips at their commits
    or the commits' first-parent ancestors (the base branch; :func:`_history_runs`): the between-run noise of a
    series (``harness.stats.runshift.history_floor``). The given runs themselves count; runs of other branches do
    not."""
    if not run_ids:
        return {}
    medians: dict[SeriesKey, list[float]] = {}
    with store.session() as session:
        for chip_key, chosen in _history_groups(store, session, run_ids, limit):
            rows = plain_rows(session,  # tuples, not SQLAlchemy's Row objects: a compare page reads ~10^4
                select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, JobRecord.median_s)
                .where(JobRecord.run_id.in_(chosen), JobRecord.kind == "benchmark", JobRecord.median_s.is_not(None)))
            for kernel, variant, dtype, shape_key, median in rows:
                medians.setdefault(SeriesKey(kernel, variant, dtype, shape_key, chip_key), []).append(median)
    return medians


def _series_select(run_ids: Sequence[str], column):
    """Each benchmark job of the given runs: its series key's fields (kernel, variant, dtype, shape key, chip) and
    ``column``."""
    return (select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, Chip.key, column)
            .join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id)
            .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark"))


def timing_modes(store: Store, run_ids: Sequence[str]) -> dict[SeriesKey, str]:
    """How each benchmark series of the given runs was timed ("pipelined", "per-call"; "" if not recorded), joined
    with "+" where its runs differ."""
    modes: dict[SeriesKey, set[str]] = {}
    with store.session() as session:
        for kernel, variant, dtype, shape_key, chip, mode in session.execute(
                _series_select(run_ids, JobRecord.timing_mode)):
            modes.setdefault(SeriesKey(kernel, variant, dtype, shape_key, chip), set()).add(mode or "")
    return joined_modes(modes)


def trial_seconds(store: Store, run_ids: Sequence[str]) -> float | None:
    """Wall seconds a benchmark job's trial took in the given finished runs, everything of a run included (start-up
    of its job processes, its correctness jobs): their time from start to finish over their benchmark jobs' trials.
    None where no finished run has a benchmark job."""
    with store.session() as session:
        runs = session.execute(select(Run.id, Run.started_at, Run.finished_at)
                               .where(Run.id.in_(list(run_ids)), Run.finished_at.is_not(None))).all()
        trials = dict(session.execute(select(JobRecord.run_id, func.sum(JobRecord.trials))
                                      .where(JobRecord.run_id.in_([run.id for run in runs]),
                                             JobRecord.kind == "benchmark").group_by(JobRecord.run_id)).all())
    seconds = sum((run.finished_at - run.started_at).total_seconds() for run in runs if trials.get(run.id))
    count = sum(int(trials.get(run.id) or 0) for run in runs)
    return seconds / count if count and seconds > 0 else None


def host_paced_series(store: Store, run_ids: Sequence[str]) -> set[SeriesKey]:
    """The benchmark series of the given runs that were host-paced in any of their jobs (``harness.stats.pacing``:
    the device waited for the host's calls, so the time per call is the host's pace, not the kernel's)."""
    with store.session() as session:
        rows = session.execute(_series_select(run_ids, JobRecord.backlog_calls)
                               .where(JobRecord.backlog_calls.is_not(None)))
        return {SeriesKey(*row[:5]) for row in rows if pacing.host_paced(row[5])}


def correctness_failures(store: Store, run_ids: Sequence[str]) -> list[FailureRow]:
    """Failing correctness jobs (``CODE_FAILURES``, kinds ``CORRECTNESS_KINDS``) of the given runs, by chip, kernel,
    variant, check, test.

    A pytest selection's own row fails whenever one of its tests does; it is listed only when none of its tests is
    (a collection error, a crash, a timeout), so each failure is named once, by the test that failed.
    """
    if not run_ids:
        return []
    with store.session() as session:
        rows = [FailureRow(*row) for row in session.execute(
            select(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.check_name, JobRecord.dtype,
                   JobRecord.shape_key, JobRecord.status, JobRecord.detail, JobRecord.run_id, Commit.sha,
                   JobRecord.kind, JobRecord.key, JobRecord.name)
            .select_from(JobRecord)
            .join(Run, JobRecord.run_id == Run.id)
            .join(Chip, Run.chip_id == Chip.id)
            .join(Commit, Run.commit_id == Commit.id)
            .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind.in_(CORRECTNESS_KINDS),
                   JobRecord.status.in_(CODE_FAILURES))
            .order_by(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.check_name, JobRecord.dtype,
                      JobRecord.shape_key, JobRecord.name, JobRecord.run_id)
        )]
    return drop_explained_selections(rows, attrgetter("kind"), attrgetter("run_id", "kernel"))
