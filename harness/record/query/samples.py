"""A chip's benchmark samples read as arrays and arranged per (commit, series) cell and per trial (SampleLayout)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import compress
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from harness.record.models import Chip, JobRecord, Run, Sample, TrialSummary
from harness.record.query.common import plain_array, plain_rows, positions_of, run_filter
from harness.record.store import TRIAL_RECORD
from harness.stats.summary import sorted_medians

_SAMPLE_ROW = np.dtype([("job", np.int64), ("seconds", np.float64), ("trial", np.int64)])


class _ChipJobs(NamedTuple):
    """The selection of a chip's benchmark jobs that ``load_samples`` and ``load_cell_trials`` read."""

    runs: Any  # the runs' SELECT
    run_commit: dict[str, int]  # run id -> commit index
    run_index: dict[str, int]  # run id -> index in start order
    kernel: str | None

    def jobs(self, statement):
        # Runs first, then their jobs by index: SQLite would otherwise scan the whole job table.
        statement = statement.where(JobRecord.run_id.in_(self.runs), JobRecord.kind == "benchmark")
        return statement.where(JobRecord.kernel == self.kernel) if self.kernel is not None else statement


def _chip_jobs(session: Session, chip: str, commit_ids: Sequence[int], *, include_dirty: bool, all_runs: bool,
               kernel: str | None) -> _ChipJobs:
    commit_index = {commit_id: i for i, commit_id in enumerate(commit_ids)}
    runs = run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
    if not all_runs:
        runs = runs.where(Run.commit_id.in_(list(commit_index)))
    run_rows = session.execute(runs.with_only_columns(Run.id, Run.commit_id)
                               .order_by(Run.started_at, Run.id)).all()
    return _ChipJobs(runs, {run_id: commit_index[commit_id] for run_id, commit_id in run_rows},
                     {run_id: i for i, (run_id, _) in enumerate(run_rows)}, kernel)


_JOB_SERIES = (JobRecord.id, JobRecord.run_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
               JobRecord.shape_key)


def load_samples(session: Session, chip: str, commit_ids: Sequence[int], *, include_dirty: bool,
                 all_runs: bool = False, kernel: str | None = None) -> SampleLayout:
    """The benchmark samples of the chip's runs of ``commit_ids`` (index i: ``commit_ids[i]``), arranged by
    ``arrange_samples``; ``all_runs``: every run of the chip (its commits are all in ``commit_ids``), without the
    commit filter; ``kernel``: that kernel's series only."""
    chip_jobs = _chip_jobs(session, chip, commit_ids, include_dirty=include_dirty, all_runs=all_runs, kernel=kernel)
    job_rows = plain_rows(session, chip_jobs.jobs(select(*_JOB_SERIES)))
    sample_rows = plain_array(session, chip_jobs.jobs(
        select(Sample.job_id, Sample.seconds, Sample.trial).join(JobRecord, Sample.job_id == JobRecord.id)),
        _SAMPLE_ROW)
    return arrange_samples(job_rows, sample_rows, chip_jobs.run_commit, chip_jobs.run_index, len(commit_ids))


_IDS_PER_READ = 500


def _job_samples(session: Session, job_ids: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """The samples of the given jobs as ``_SAMPLE_ROW`` rows."""
    ids = job_ids.tolist()
    parts = [plain_array(session, select(Sample.job_id, Sample.seconds, Sample.trial)
                          .where(Sample.job_id.in_(ids[start:start + _IDS_PER_READ])), _SAMPLE_ROW)
             for start in range(0, len(ids), _IDS_PER_READ)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=_SAMPLE_ROW)


def load_cell_trials(session: Session, chip: str, commit_ids: Sequence[int], *, include_dirty: bool,
                     samples_below: int) -> SampleLayout:
    """What ``load_samples`` gives of the chip's runs of ``commit_ids`` for their cells' levels and summaries, read
    from the trial summaries (``models.TrialSummary``) instead of every sample: ``trial_medians`` holds each
    trial's median and ``trial_sizes`` its valid sample count, equal to those ``load_samples`` gives, in the same
    order.  Samples are read (into ``values``, ``offsets`` valid for their cells) only for the cells of fewer
    than ``samples_below`` trials (their interval is their pooled samples') and for the jobs whose summaries do not
    account for their ``n_samples`` (written before the summaries existed, or by other means); the other trials
    have ``trial_starts`` -1.  With samples to read for most jobs, this is ``load_samples``."""
    chip_jobs = _chip_jobs(session, chip, commit_ids, include_dirty=include_dirty, all_runs=False, kernel=None)
    packed = session.get_bind().dialect.name == "sqlite"  # a job's series as one JSON text: 1 string a row, not 4
    series_columns = (JobRecord.id, JobRecord.run_id, func.json_array(*_JOB_SERIES[2:])) if packed else _JOB_SERIES
    job_rows = plain_rows(session, chip_jobs.jobs(
        select(*series_columns, func.coalesce(JobRecord.n_samples, 0), func.coalesce(TrialSummary.n, -1),
               TrialSummary.trials).outerjoin(TrialSummary, TrialSummary.job_id == JobRecord.id)))
    index = _job_index(job_rows, chip_jobs.run_commit, chip_jobs.run_index, len(commit_ids), packed=packed)
    job_ids, job_cell = index.job_ids, index.job_cells
    n_column = 3 if packed else 6  # the job's n_samples, then its summary's n and trials
    unread = np.fromiter((row[n_column] != row[n_column + 1] for row in job_rows), dtype=bool, count=len(job_rows))
    if unread.sum() * 2 > job_ids.size:
        return load_samples(session, chip, commit_ids, include_dirty=include_dirty)
    width = TRIAL_RECORD.itemsize
    payloads = [row[n_column + 2] or b"" for row in job_rows]
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    unread |= lengths % width != 0  # not a summary this harness wrote: read the samples
    summarised = ~unread
    summary = np.frombuffer(b"".join(compress(payloads, summarised.tolist())), dtype=TRIAL_RECORD)
    job_of = np.repeat(np.flatnonzero(summarised), lengths[summarised] // width).astype(np.int64)
    read = _job_samples(session, job_ids[unread])
    # Trials per cell: the summaries' (valid ones) and those of the jobs read
    layout = _arranged_samples(index, read)
    keep = ~unread[job_of] & (summary["valid"] > 0)
    summary, job_of = summary[keep], job_of[keep]
    trial_counts = layout.trial_counts.ravel() + np.bincount(job_cell[job_of], minlength=layout.trial_counts.size)
    few = (trial_counts > 0) & (trial_counts < samples_below)
    more = np.flatnonzero(~unread & few[job_cell])  # their pooled samples give the interval: read them too
    if (unread.sum() + more.size) * 2 > job_ids.size:  # mostly single runs of few trials: one query reads them
        return load_samples(session, chip, commit_ids, include_dirty=include_dirty)
    if more.size:
        unread[more] = True
        read = np.concatenate([read, _job_samples(session, job_ids[more])])
        layout = _arranged_samples(index, read)
        keep = ~unread[job_of]
        summary, job_of = summary[keep], job_of[keep]
    return _merged(layout, summary, job_cell[job_of], index.job_runs[job_of])


def _rank_in_groups(cells: npt.NDArray[np.int64], runs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each entry's position within its run of equal (cell, run) pairs (the arrays sorted by them)."""
    if cells.size == 0:
        return np.zeros(0, dtype=np.int64)
    index = np.arange(cells.size)
    first = np.concatenate([[True], (cells[1:] != cells[:-1]) | (runs[1:] != runs[:-1])])
    return index - np.maximum.accumulate(np.where(first, index, 0))


def _lexsorted(*keys: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """``np.lexsort(keys)`` (the last key sorts first) of integer keys, by a stable sort of one combined key where
    their ranges fit in 63 bits: ~3x faster on a chip's million trials."""
    if keys[0].size == 0:
        return np.zeros(0, dtype=np.intp)
    combined, room = np.zeros(keys[0].size, dtype=np.int64), 1
    for key in reversed(keys):  # the primary key first: each next one below it
        low, span = int(key.min()), int(key.max()) - int(key.min()) + 1
        room *= span
        if room >= 1 << 63:
            return np.lexsort(keys)
        combined = combined * span + (key.astype(np.int64) - low)
    return np.argsort(combined, kind="stable")


def _merged(layout: SampleLayout, summary: npt.NDArray[Any], cells: npt.NDArray[np.int64],
            runs: npt.NDArray[np.int64]) -> SampleLayout:
    """``layout`` (of the samples read) with the summarised trials (``summary`` rows, their flat cells and runs)
    merged in: every cell's trials ordered by (run, trial), as ``arrange_samples`` orders them."""
    read_cells = np.repeat(np.arange(layout.trial_counts.size), layout.trial_counts.ravel())
    read_runs = layout.trial_runs
    # a (cell, run) is one job: its trials, read or summarised, come in trial order
    read_rank = _rank_in_groups(read_cells, read_runs)
    order = _lexsorted(summary["trial"], runs, cells)
    summary, cells, runs = summary[order], cells[order], runs[order]
    summary_rank = _rank_in_groups(cells, runs)
    all_cells = np.concatenate([read_cells, cells])
    all_runs = np.concatenate([read_runs, runs])
    # nothing read (the usual case): the summaries' order is the merged one
    order = (_lexsorted(np.concatenate([read_rank, summary_rank]), all_runs, all_cells) if read_cells.size
             else np.arange(cells.size))
    read_medians = sorted_medians(layout.values, layout.trial_starts, layout.trial_sizes)
    medians = np.concatenate([read_medians, summary["median"]])[order]
    starts = np.concatenate([layout.trial_starts, np.full(cells.size, -1, dtype=np.int64)])[order]
    sizes = np.concatenate([layout.trial_sizes, summary["valid"]])[order]
    shape = layout.counts.shape
    trial_counts = np.bincount(all_cells, minlength=layout.counts.size).astype(np.int64)
    trial_offsets = (np.concatenate([[0], np.cumsum(trial_counts)[:-1]]).astype(np.int64) if trial_counts.size
                     else trial_counts)
    counts = layout.counts.ravel() + np.bincount(cells, summary["valid"], minlength=layout.counts.size).astype(
        np.int64)
    return layout._replace(counts=counts.reshape(shape), trial_counts=trial_counts.reshape(shape),
                           trial_offsets=trial_offsets.reshape(shape), trial_starts=starts.astype(np.int64),
                           trial_sizes=sizes.astype(np.int64), trial_runs=all_runs[order].astype(np.int64),
                           trial_medians=medians)


class SampleLayout(NamedTuple):
    """A chip's samples arranged per (commit, series) cell and per trial: the arrays of ``ChipHistory``."""

    series: list[tuple[str, str, str, str]]  # (kernel, variant, dtype, shape key) per series index
    counts: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    trial_counts: npt.NDArray[np.int64]
    trial_offsets: npt.NDArray[np.int64]
    trial_starts: npt.NDArray[np.int64]
    trial_sizes: npt.NDArray[np.int64]
    trial_runs: npt.NDArray[np.int64]
    has_jobs: npt.NDArray[np.bool_]  # (n_commits, n_series): a benchmark job of the cell exists (samples or not)
    trial_medians: npt.NDArray[np.float64] | None = None  # given where not every trial's samples were read


def arrange_samples(job_rows: Sequence[tuple], sample_rows: Sequence[tuple] | npt.NDArray[Any],
                    run_commit: dict[str, int], run_index: dict[str, int], n_commits: int) -> SampleLayout:
    """Group benchmark samples as ``ChipHistory`` holds them. ``job_rows``: (job id, run id, kernel, variant, dtype,
    shape key); ``sample_rows``: (job id, seconds, trial), tuples or a ``_SAMPLE_ROW`` array; ``run_commit``: run id
    -> commit index; ``run_index``: run id -> its index in start order. Each cell's samples are contiguous, grouped
    by (run, trial), each trial's samples sorted: everything computed from one cell depends on that cell's samples
    only."""
    return _arranged_samples(_job_index(job_rows, run_commit, run_index, n_commits), sample_rows)


class _JobIndex(NamedTuple):
    """Benchmark job rows numbered: the series (first seen first) and per job its id, flat cell and run index."""

    series: list[tuple[str, str, str, str]]
    job_ids: npt.NDArray[np.int64]
    job_cells: npt.NDArray[np.int64]  # commit index * n_series + series index
    job_runs: npt.NDArray[np.int64]
    n_runs: int
    has_jobs: npt.NDArray[np.bool_]


def _job_index(job_rows: Sequence[tuple], run_commit: dict[str, int], run_index: dict[str, int],
               n_commits: int, *, packed: bool = False) -> _JobIndex:
    """``job_rows``: (job id, run id, kernel, variant, dtype, shape key, ...); ``packed``: (job id, run id, the JSON
    array of kernel, variant, dtype and shape key, ...)."""
    series_index: dict[Any, int] = {}
    n = len(job_rows)
    runs = list(map(itemgetter(1), job_rows))
    job_ids = np.fromiter(map(itemgetter(0), job_rows), dtype=np.int64, count=n)
    job_commit = np.fromiter(map(run_commit.__getitem__, runs), dtype=np.int64, count=n)
    job_run = np.fromiter(map(run_index.__getitem__, runs), dtype=np.int64, count=n)
    keys = map(itemgetter(2) if packed else itemgetter(2, 3, 4, 5), job_rows)
    job_cells = np.fromiter((series_index.setdefault(key, len(series_index)) for key in keys), dtype=np.int64,
                            count=n)
    series = [tuple(json.loads(key)) for key in series_index] if packed else list(series_index)
    n_series = len(series_index)
    has_jobs = np.zeros((n_commits, n_series), dtype=bool)
    has_jobs[job_commit, job_cells] = True
    job_cells += job_commit * n_series
    return _JobIndex(series, job_ids, job_cells, job_run, len(run_index), has_jobs)


def _arranged_samples(index: _JobIndex, sample_rows: Sequence[tuple] | npt.NDArray[Any]) -> SampleLayout:
    job_ids, job_cells, job_run, has_jobs = index.job_ids, index.job_cells, index.job_runs, index.has_jobs
    n_commits, n_series = has_jobs.shape
    samples = (sample_rows if isinstance(sample_rows, np.ndarray)
               else np.fromiter(sample_rows, dtype=_SAMPLE_ROW, count=len(sample_rows)))
    del sample_rows
    valid = np.isfinite(samples["seconds"]) & (samples["seconds"] > 0)
    sample_jobs, seconds, trial = samples["job"][valid], samples["seconds"][valid], samples["trial"][valid]
    del samples
    job_of = positions_of(job_ids, sample_jobs)
    cells = job_cells[job_of]
    # One key per trial, (cell, run, trial) in this order: a cell's samples stay contiguous, grouped by trial.
    if trial.size and trial.min() < 0:
        trial = np.unique(trial, return_inverse=True)[1].reshape(-1)
    per_run = int(trial.max()) + 1 if trial.size else 1
    per_cell = per_run * max(index.n_runs, 1)
    keys = cells * per_cell + job_run[job_of] * per_run + trial
    by_trial = np.argsort(keys, kind="stable")  # the rows come nearly in this order: much faster than a lexsort
    keys, values = keys[by_trial], seconds[by_trial]
    del by_trial
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if keys.size else keys
    sizes = np.diff(np.append(starts, keys.size))
    for size in np.unique(sizes).tolist():  # each trial's samples sorted, trials of one size at a time
        rows = starts[sizes == size][:, None] + np.arange(size)
        values[rows] = np.sort(values[rows], axis=1)
    trial_cell = keys[starts] // per_cell
    counts = np.bincount(cells, minlength=n_commits * n_series).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts.size else counts
    trial_counts = np.bincount(trial_cell, minlength=n_commits * n_series).astype(np.int64)
    trial_offsets = (np.concatenate([[0], np.cumsum(trial_counts)[:-1]]).astype(np.int64) if trial_counts.size
                     else trial_counts)
    shape = (n_commits, n_series)
    return SampleLayout(list(index.series), counts.reshape(shape), offsets.reshape(shape), values,
                        trial_counts.reshape(shape), trial_offsets.reshape(shape), starts.astype(np.int64),
                        sizes.astype(np.int64), (keys[starts] // per_run % max(index.n_runs, 1)).astype(np.int64),
                        has_jobs)
