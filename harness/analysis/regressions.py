"""The regression list: new correctness failures (the first commit of each failing stretch) and confirmed
slowdowns, each commit judged against its previous commit on its chip (its nearest ancestor with runs there:
``harness.record.query.ChipHistory.previous``) as ``harness compare`` judges two commits: at trial level
(``harness.stats.trials.compare_trials``: the spread between job processes, moderated across the commit's grid and
floored by the series' between-run noise on the chip's history before the base), Benjamini-Hochberg across the
commit's whole grid.  An exact vectorised screen computes every series' p-value as ``compare_trials`` would, so that
only the commits with a series that can be confirmed go through it.  Histories and correctness rows come from
``harness.record.query``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.analysis.history import by_series_key, trial_levels
from harness.analysis.records import RegressionEvidence
from harness.core import defaults
from harness.core.chip import timing_fit
from harness.core.status import is_code_failure
from harness.record import query
from harness.record.store import Store
from harness.stats import decide, distributions, measure, moderation, policy, runshift, samples, trials
from harness.stats.modes import same_mode

__all__ = ["cell_summaries", "correctness_regressions", "modes_loader", "order_checked", "performance_regressions",
           "regressions"]

# The screen's p-values and intervals are compare_trials' own computation on the same numbers, up to the order of
# floating-point sums: a family is only skipped when none of its series comes within this relative slack of a flag.
_SCREEN_SLACK = 1e-6


def _correctness_events(store: Store, data: query.ChipHistory, include_dirty: bool,
                        rows: tuple[list[tuple], list[tuple]] | None = None
                        ) -> tuple[list[RegressionEvidence], set[tuple[int, str]]]:
    """New correctness failures (first failing commit of each failing stretch along ancestry) and the broken
    (commit, kernel)s. ``rows``: the chip's ``query.correctness_statuses`` and ``query.failing_correctness_jobs``
    when already read."""
    statuses, failing_jobs = rows if rows is not None else (
        query.correctness_statuses(store, data.chip, include_dirty=include_dirty),
        query.failing_correctness_jobs(store, data.chip, include_dirty=include_dirty))
    commit_index = {row[0]: i for i, row in enumerate(data.commits)}
    key_index: dict[str, int] = {}
    cells: list[tuple[int, int, bool]] = []
    for commit_id, key, status in statuses:
        index = commit_index.get(commit_id)
        if index is None:  # outside the ``last`` window
            continue
        cells.append((index, key_index.setdefault(key, len(key_index)), is_code_failure(status)))
    ran = np.zeros((len(data.commits), len(key_index)), dtype=bool)
    failing = np.zeros_like(ran)
    for index, k, failed in cells:
        ran[index, k] = True
        failing[index, k] |= failed
    # Each job against the nearest ancestor that ran it: a failure is new there if it passed (or never ran) there.
    before = data.nearest_with(ran)
    failed_before = np.take_along_axis(failing, np.maximum(before, 0), axis=0) & (before >= 0)
    keys = list(key_index)
    new: set[tuple[str, int]] = set()
    previous_of: dict[tuple[str, int], int | None] = {}
    for index, k in zip(*np.nonzero(failing & ~failed_before & data.shown[:, None]), strict=True):
        new.add((keys[k], int(index)))
        previous_of[(keys[k], int(index))] = int(before[index, k]) if before[index, k] >= 0 else None
    broken = set()
    events: dict[tuple[str, int], RegressionEvidence] = {}
    for commit_id, key, kern, variant, dtype, shape_key, check, status, detail in failing_jobs:
        index = commit_index.get(commit_id)
        if index is None:
            continue
        broken.add((index, kern))
        if (key, index) in new and (key, index) not in events:
            _, sha, message, _, started = data.commits[index]
            before = previous_of[(key, index)]
            events[(key, index)] = RegressionEvidence(
                "correctness", data.chip, kern, variant, dtype, shape_key, sha, message, started,
                data.commits[before][1] if before is not None else None, check=check, status=status, detail=detail)
    ordered = sorted(events.items(), key=lambda item: (item[0][1], item[1].kernel, item[1].variant, item[1].check,
                                                       item[1].dtype, item[1].shape_key))
    return [event for _, event in ordered], broken


# ---------------------------------------------------------------------------------------------------------------
# Per cell: trial and run summaries
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cells:
    """Per flat cell index of a ``ChipHistory``: what ``compare_trials`` measures of one side, and its runs' levels."""

    trials: npt.NDArray[np.int64]  # trials (job processes)
    mean_log: npt.NDArray[np.float64]  # mean log trial median (nan without trials)
    squares: npt.NDArray[np.float64]  # sum of squared deviations of the log trial medians about that mean
    runs: npt.NDArray[np.int64]  # distinct runs
    run_offsets: npt.NDArray[np.int64]  # start of the cell's runs in ``run_levels`` (oldest first)
    run_levels: npt.NDArray[np.float64]  # per (cell, run): mean log trial median of the run's trials


def cell_summaries(data: query.ChipHistory) -> _Cells:
    """Every flat cell's ``_Cells`` entries; each cell's depend on its own samples only."""
    logs = np.log(data.trial_medians())
    cell_of = data.trial_cells()
    n_cells = data.trial_counts.size
    count = data.trial_counts.ravel()
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_log = np.bincount(cell_of, logs, minlength=n_cells) / count
    squares = np.bincount(cell_of, (logs - mean_log[cell_of]) ** 2, minlength=n_cells)
    n_runs = int(data.trial_runs.max()) + 1 if data.trial_runs.size else 1
    run_key = cell_of * n_runs + data.trial_runs  # ascending: a cell's trials come run by run
    first = np.concatenate([[True], run_key[1:] != run_key[:-1]]) if run_key.size else np.zeros(0, dtype=bool)
    segment = np.cumsum(first) - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        run_levels = np.bincount(segment, logs) / np.bincount(segment) if segment.size else np.zeros(0)
    runs = np.bincount(cell_of[first], minlength=n_cells).astype(np.int64)
    run_offsets = np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64)
    return _Cells(count.astype(np.int64), mean_log, squares, runs, run_offsets, run_levels)


# ---------------------------------------------------------------------------------------------------------------
# History floors: each base's earlier runs of the series
# ---------------------------------------------------------------------------------------------------------------


def _floor_runs(cells: _Cells, base_of: npt.NDArray[np.int64], base_commit: npt.NDArray[np.int64],
                series: npt.NDArray[np.int64], n_series: int, limit: int = defaults.HISTORY_RUNS,
                order: npt.NDArray[np.intp] | None = None) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per pair: the log levels of the series' newest ``limit`` runs before its base commit, up the series' chain
    of previous points (each point's runs newest first), and how many there are; rows padded with nan.
    ``order``: the commits, each after its ancestors (``ChipHistory.ancestors_first``); given, and with pairs for
    most commits, every commit's runs before it are built once from its previous point's (``_floors_of_commits``)
    instead of walking each pair's chain: the same numbers."""
    n_commits = base_of.shape[0]
    if order is not None and series.size > _WALK_PAIRS_PER_COMMIT * n_commits:
        before, count = _floors_of_commits(cells, base_of, n_series, limit, order)
        cell = base_commit * n_series + series
        return before[cell], count[cell]
    levels = np.full((series.size, limit), np.nan)
    filled = np.zeros(series.size, dtype=np.int64)
    at = base_of[base_commit, series]  # the point before the base
    for _ in range(limit):  # every point has a run: ``limit`` points give ``limit`` runs
        active = np.flatnonzero(at >= 0)
        if active.size == 0:
            break
        cell = at[active] * n_series + series[active]
        runs, offset = cells.runs[cell], cells.run_offsets[cell]
        for j in range(int(runs.max())):
            take = (j < runs) & (filled[active] < limit)
            if not take.any():
                break
            who = active[take]
            levels[who, filled[who]] = cells.run_levels[offset[take] + runs[take] - 1 - j]
            filled[who] += 1
        at[active] = np.where(filled[active] < limit, base_of[at[active], series[active]], -1)
    return levels, filled


_WALK_PAIRS_PER_COMMIT = 4  # fewer pairs than this per commit (a few families judged): each pair's chain walked


def _floors_of_commits(cells: _Cells, base_of: npt.NDArray[np.int64], n_series: int, limit: int,
                       order: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per flat cell (commit, series): the log levels of the series' newest ``limit`` runs before the commit, up its
    chain of previous points (each point's runs newest first; nan-padded), and how many -- the previous point's
    runs, newest first, then what the previous point has before it. ``order``: every commit after its ancestors."""
    before = np.full((base_of.shape[0] * n_series, limit), np.nan)
    count = np.zeros(base_of.shape[0] * n_series, dtype=np.int64)
    column = np.arange(limit)
    for commit in order.tolist():
        point = base_of[commit]
        columns = np.flatnonzero(point >= 0)
        if columns.size == 0:
            continue
        source = point[columns] * n_series + columns
        target = commit * n_series + columns
        runs, offset = cells.runs[source], cells.run_offsets[source]
        if (runs == 1).all():  # the usual: one run a point
            rows = np.empty((columns.size, limit))
            rows[:, 0] = cells.run_levels[offset]
            rows[:, 1:] = before[source, :limit - 1]
        else:
            own = column < runs[:, None]  # the point's own runs first, newest first, then those before it
            run_index = np.where(own, offset[:, None] + runs[:, None] - 1 - column, 0)
            earlier = np.where(own, 0, column - runs[:, None])
            rows = np.where(own, cells.run_levels[run_index] if cells.run_levels.size else np.nan,
                            before[source[:, None], earlier])
        before[target] = rows
        count[target] = np.minimum(limit, runs + count[source])
    return before, count


def _floor_sd(levels: npt.NDArray[np.float64], filled: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """``runshift.history_floor``'s sd of each row's first ``filled`` log levels, vectorised per count; nan below its
    minimum of runs."""
    sd = np.full(filled.size, np.nan)
    for n in np.unique(filled[filled >= policy.FLOOR_MIN_RUNS]).tolist():
        of_n = np.flatnonzero(filled == n)
        for start in range(0, of_n.size, _FLOOR_ROWS):  # in blocks: their scratch arrays stay in the cache
            where = of_n[start:start + _FLOOR_ROWS]
            rows = levels[where, :n]
            middle = _sorted_row_medians(np.sort(rows, axis=1))
            if (lost := np.isnan(rows).any(axis=1)).any():  # np.median's nan: nan in, nan out
                middle[lost] = np.nan
            mad = _sorted_row_medians(np.sort(np.abs(rows - middle[:, None]), axis=1))
            sd[where] = np.maximum(policy.MAD_TO_SIGMA * mad * samples.mad_correction(n), policy.NOISE_FLOOR)
    return sd


_FLOOR_ROWS = 16384


def _sorted_row_medians(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``np.median(rows, axis=1)`` of rows sorted ascending, bit for bit: the mean of the two middle values
    (``(a + b) / 2``; an odd row's middle value, ``(a + a) / 2``, is itself), a sort of short rows being cheaper than
    np.median's partition (a row's nan, sorted last, is the caller's to carry)."""
    n = rows.shape[1]
    return (rows[:, (n - 1) // 2] + rows[:, n // 2]) / 2


# ---------------------------------------------------------------------------------------------------------------
# The pairs of a chip: each point of each series against the series' previous point
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pairs:
    """Every (head commit, series) of the window with a previous point, ordered by head commit (the families)."""

    head_commit: npt.NDArray[np.int64]
    base_commit: npt.NDArray[np.int64]
    series: npt.NDArray[np.int64]
    base_cell: npt.NDArray[np.int64]
    head_cell: npt.NDArray[np.int64]
    broken: npt.NDArray[np.bool_]
    bounds: npt.NDArray[np.intp]  # family of commit c: pairs bounds[c]:bounds[c + 1]


def _pairs(data: query.ChipHistory, broken: set[tuple[int, str]], heads: npt.NDArray[np.bool_] | None = None
           ) -> tuple[_Pairs, npt.NDArray[np.int64]]:
    n_series = len(data.series)
    present = data.counts > 0
    base_of = data.nearest_with(present)
    judged = data.shown if heads is None else data.shown & heads
    head_commit, series = np.nonzero(present & (base_of >= 0) & judged[:, None])  # commit-major
    base_commit = base_of[head_commit, series]
    kernel_ids = {name: i for i, name in enumerate(sorted({key.kernel for key in data.series}))}
    series_kernel = np.array([kernel_ids[key.kernel] for key in data.series], dtype=np.int64)
    broken_codes = [commit * len(kernel_ids) + kernel_ids[name] for commit, name in broken if name in kernel_ids]
    is_broken = np.isin(head_commit * len(kernel_ids) + series_kernel[series], broken_codes)
    bounds = np.searchsorted(head_commit, np.arange(len(data.commits) + 1))
    return _Pairs(head_commit, base_commit, series, base_commit * n_series + series, head_commit * n_series + series,
                  is_broken, bounds), base_of


# ---------------------------------------------------------------------------------------------------------------
# The screen: compare_trials' p-values and intervals for every pair, vectorised
# ---------------------------------------------------------------------------------------------------------------


def _measured(cells: _Cells, counts: npt.NDArray[np.int64], pairs: _Pairs) -> measure.Measured:
    """``compare_trials``' per-series measurements of every pair, from the cell summaries."""
    trials_base, trials_head = cells.trials[pairs.base_cell], cells.trials[pairs.head_cell]
    df = np.maximum(trials_base - 1, 0) + np.maximum(trials_head - 1, 0)
    squares = cells.squares[pairs.base_cell] + cells.squares[pairs.head_cell]
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = np.where(df > 0, squares / np.maximum(df, 1), math.nan)
    return measure.Measured(trials_base=trials_base, trials_head=trials_head, samples_base=counts[pairs.base_cell],
                            samples_head=counts[pairs.head_cell],
                            effect=cells.mean_log[pairs.head_cell] - cells.mean_log[pairs.base_cell],
                            variance=variance, df=df)


def _slice(measured: measure.Measured, span: slice) -> measure.Measured:
    return measure.Measured(measured.trials_base[span], measured.trials_head[span], measured.samples_base[span],
                            measured.samples_head[span], measured.effect[span], measured.variance[span],
                            measured.df[span])


def _bh_per_family(p_values: npt.NDArray[np.float64], in_family: npt.NDArray[np.bool_],
                   bounds: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
    """Benjamini-Hochberg within each family ``bounds[k]:bounds[k + 1]`` over the pairs ``in_family``."""
    adjusted = np.full(p_values.shape, math.nan)
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        members = start + np.flatnonzero(in_family[start:stop])
        if members.size:
            adjusted[members] = distributions.bh(p_values[members])
    return adjusted


@dataclass(frozen=True)
class _Screened:
    """Per pair, as ``compare_trials`` of its family computes them: the BH-adjusted p-value (nan out of the family)
    and the interval's lower end."""

    p_adjusted: npt.NDArray[np.float64]
    ci_low: npt.NDArray[np.float64]

    def candidates(self, min_effect: float, alpha: float) -> npt.NDArray[np.bool_]:
        """Whether ``compare_trials`` may call the pair regressed: p(FDR) < alpha and the interval above
        1 + min_effect (``harness.stats.decide.decide``), each met within ``_SCREEN_SLACK``."""
        with np.errstate(invalid="ignore"):
            return (self.p_adjusted < alpha * (1 + _SCREEN_SLACK)) & (
                self.ci_low > (1.0 + min_effect) * (1 - _SCREEN_SLACK))


def _screen(measured: measure.Measured, pairs: _Pairs, floor_sd: npt.NDArray[np.float64],
            floor_runs: npt.NDArray[np.int64], runs: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]], *,
            alpha: float) -> _Screened:
    """The same steps on the same numbers as ``compare_trials`` of each family: the moderation prior per family
    (broken series left out), the history floor (``runs`` distinct runs behind each side), the t test, BH per
    family over the tested, healthy series."""
    variance = np.full(pairs.series.size, math.nan)
    total_df = np.zeros(pairs.series.size)
    healthy_df = np.where(pairs.broken, 0, measured.df)
    for start, stop in zip(pairs.bounds[:-1].tolist(), pairs.bounds[1:].tolist(), strict=True):
        if stop > start:
            span = slice(start, stop)
            prior = moderation.fit_prior(measured.variance[span], healthy_df[span])
            variance[span], total_df[span] = moderation.moderate(_slice(measured, span), prior)
    has_floor = np.isfinite(floor_sd)
    with np.errstate(invalid="ignore"):
        floor_term = np.where(has_floor, floor_sd**2 * (1.0 / np.maximum(runs[0], 1) + 1.0 / np.maximum(runs[1], 1)),
                              0.0)
    floor_df = np.where(has_floor, np.maximum(1.0, floor_runs - 1.0), 0.0)
    spread = measure.spread_of(measured, variance, total_df, floor_term, floor_df, floor_sd)
    tested = measure.t_test(measured.effect, spread, alpha)
    in_family = (np.array(spread.basis) != "none") & np.isfinite(tested.p_value) & ~pairs.broken
    return _Screened(_bh_per_family(tested.p_value, in_family, pairs.bounds), tested.ci_low)


# ---------------------------------------------------------------------------------------------------------------
# The list
# ---------------------------------------------------------------------------------------------------------------


# Per flat cell: its trials' samples, each sorted (``ChipHistory.trials``), for the cells asked for at once.
TrialsOf = Callable[[Sequence[int]], dict[int, list[npt.NDArray[np.float64]]]]
# Per flat cell: its level, the median of its trial medians (``trial_levels``).
LevelsOf = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]
# The timing mode of flat cells ("" when not recorded): cells timed differently are never compared
ModesOf = Callable[[Sequence[int]], dict[int, str]]


@dataclass(frozen=True)
class _Judged:
    """One chip's pairs, with what their decisions need and the screen's verdict on them."""

    data: query.ChipHistory
    pairs: _Pairs
    history_levels: npt.NDArray[np.float64]  # per pair: the log levels of the runs behind the base (nan-padded)
    history_runs: npt.NDArray[np.int64]  # per pair: how many
    runs: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]  # per pair: distinct runs of base and head
    screened: _Screened

    def family(self, commit: int, trials_of: dict[int, list[npt.NDArray[np.float64]]] | None = None, *,
               min_effect: float, alpha: float, modes: dict[int, str] | None = None
               ) -> dict[int, decide.TrialComparison]:
        """``compare_trials`` of the commit's whole grid (pair index -> comparison); ``trials_of``: the trials of
        every cell of its pairs (``family_cells``; default: from ``data``'s samples); ``modes``: their timing modes
        (pairs timed differently are ``incomparable``, as in ``harness compare``)."""
        members = range(int(self.pairs.bounds[commit]), int(self.pairs.bounds[commit + 1]))
        modes = modes or {}
        incomparable = {i for i in members if not same_mode(modes.get(int(self.pairs.base_cell[i])),
                                                             modes.get(int(self.pairs.head_cell[i])))}
        if trials_of is None:
            trials_of = {cell: self.data.trials(cell) for cell in self.family_cells(commit)}
        floors = {i: floor for i in members
                  if (floor := runshift.history_floor(np.exp(self.history_levels[i, :self.history_runs[i]])))}
        return trials.compare_trials(
            {i: (trials_of[int(self.pairs.base_cell[i])], trials_of[int(self.pairs.head_cell[i])]) for i in members},
            floors=floors, runs={i: (int(self.runs[0][i]), int(self.runs[1][i])) for i in members},
            min_effect=min_effect, alpha=alpha, broken={i for i in members if self.pairs.broken[i]},
            incomparable=incomparable, separate_runs=True,
            history_runs={i: int(self.history_runs[i]) for i in members})

    def family_cells(self, commit: int) -> list[int]:
        span = slice(int(self.pairs.bounds[commit]), int(self.pairs.bounds[commit + 1]))
        return sorted({*self.pairs.base_cell[span].tolist(), *self.pairs.head_cell[span].tolist()})


def _judge(data: query.ChipHistory, broken: set[tuple[int, str]], cells: _Cells | None = None, *, alpha: float,
           heads: npt.NDArray[np.bool_] | None = None) -> _Judged | None:
    """Screen the families of ``data``'s commits (only those where ``heads`` holds, when given: each family is
    screened on its own numbers, so a subset gives each of its families the same verdicts). ``cells``:
    ``cell_summaries(data)``, computed here when not given."""
    n_series = len(data.series)
    if n_series == 0:
        return None
    pairs, base_of = _pairs(data, broken, heads)
    if pairs.series.size == 0:
        return None
    if cells is None:
        cells = cell_summaries(data)
    history_levels, history_runs = _floor_runs(cells, base_of, pairs.base_commit, pairs.series, n_series,
                                               order=data.ancestors_first())
    runs = (cells.runs[pairs.base_cell], cells.runs[pairs.head_cell])
    screened = _screen(_measured(cells, data.counts.ravel(), pairs), pairs, _floor_sd(history_levels, history_runs),
                       history_runs, runs, alpha=alpha)
    return _Judged(data, pairs, history_levels, history_runs, runs, screened)


def performance_regressions(data: query.ChipHistory, broken: set[tuple[int, str]], cells: _Cells,
                            levels_of: LevelsOf, trials_for: TrialsOf, *, min_effect: float, alpha: float,
                            heads: npt.NDArray[np.bool_] | None = None, modes_of: ModesOf | None = None
                            ) -> dict[int, list[RegressionEvidence]]:
    """Per commit index whose family has a confirmed regression (of the commits where ``heads`` holds, all when
    None): its regressions, largest slowdown first. ``cells``: ``cell_summaries`` of ``data``; ``levels_of`` and
    ``trials_for`` give the levels and the trials of the cells asked for (only those of confirmed pairs and of the
    families the screen cannot rule out are asked for)."""
    judged = _judge(data, broken, cells, alpha=alpha, heads=heads)
    if judged is None:
        return {}
    pairs = judged.pairs
    found: dict[int, list[RegressionEvidence]] = {}
    for commit in np.unique(pairs.head_commit[judged.screened.candidates(min_effect, alpha)]).tolist():
        cells = judged.family_cells(commit)
        decided = judged.family(commit, trials_for(cells), min_effect=min_effect, alpha=alpha,
                                modes=modes_of(cells) if modes_of else None)
        confirmed = [i for i, c in decided.items() if c.verdict == "regressed"]
        if not confirmed:
            continue
        _, sha, message, _, started = data.commits[commit]
        cells_of = np.array([(pairs.base_cell[i], pairs.head_cell[i]) for i in confirmed], dtype=np.int64)
        medians = dict(zip(confirmed, levels_of(cells_of.ravel()).reshape(-1, 2).tolist(), strict=True))
        chip = data.chip
        for i in sorted(confirmed, key=lambda i: (-decided[i].ratio, data.series[pairs.series[i]])):
            c, key = decided[i], data.series[pairs.series[i]]
            found.setdefault(commit, []).append(RegressionEvidence(
                "performance", chip, key.kernel, key.variant, key.dtype, key.shape_key, sha, message, started,
                data.commits[pairs.base_commit[i]][1], c.ratio, c.ci_low, c.ci_high, c.p_value, c.p_adjusted,
                c.n_base, c.n_head, *medians[i], trials_base=c.trials_base, trials_head=c.trials_head,
                basis=c.basis, noise=c.noise, detectable=c.detectable))
    return found


def order_checked(commits: Sequence[tuple], previous: Sequence[int], found: Sequence[RegressionEvidence],
                  guessed: Callable[[], Collection[int]]) -> list[RegressionEvidence]:
    """``found`` with each slowdown whose order ancestry does not prove made kind "unproven" (and each proven one
    "performance"): one whose walk from its commit up the chip's previous commits to its base passes a commit of
    ``guessed()`` (``query.guessed_commits``: placed by commit time; asked only when there is a slowdown).
    ``commits`` and ``previous``: the chip's commits in history order and their previous commits
    (``query.ChipHistory``'s). Such a slowdown is not confirmed (its base may not be before it): the report lists
    it as "order not proven by ancestry", apart from the confirmed ones."""
    if not any(event.kind in ("performance", "unproven") for event in found):
        return list(found)
    index = {row[1]: i for i, row in enumerate(commits)}
    ids = set(guessed())
    guessed_at = {i for i, row in enumerate(commits) if row[0] in ids}
    out = []
    for event in found:
        if event.kind in ("performance", "unproven"):
            at, base = index.get(event.head_sha, -1), index.get(event.base_sha or "", -1)
            proven = True
            while at >= 0 and at != base:
                proven = proven and at not in guessed_at
                at = int(previous[at])
            kind = "performance" if proven and at == base else "unproven"
            if kind != event.kind:
                event = dataclasses.replace(event, kind=kind)
        out.append(event)
    return out


def correctness_regressions(store: Store, data: query.ChipHistory, *, include_dirty: bool, last: int | None,
                            rows: tuple[list[tuple], list[tuple]] | None = None
                            ) -> tuple[list[RegressionEvidence], set[tuple[int, str]]]:
    """The chip's new correctness failures (within the ``last`` window: only those with a base there) and the
    broken (commit index, kernel)s; ``rows`` as ``_correctness_events`` takes them."""
    events, broken = _correctness_events(store, data, include_dirty, rows)
    if last is not None:  # a failure whose job did not run at the window's bases may be old
        events = [e for e in events if e.base_sha is not None]
    return events, broken


def modes_loader(store: Store, data: query.ChipHistory, *, include_dirty: bool) -> ModesOf:
    """``ModesOf`` for the flat cells of ``data`` (one query per call, for the commits of the cells asked for)."""
    n_series = len(data.series)

    def modes_of(cells: Sequence[int]) -> dict[int, str]:
        commit_ids = sorted({data.commits[cell // n_series][0] for cell in cells})
        found = query.commit_timing_modes(store, data.chip, commit_ids, include_dirty=include_dirty)
        out = {}
        for cell in cells:
            commit, series = divmod(cell, n_series)
            key = data.series[series]
            out[cell] = found.get((data.commits[commit][0], key.kernel, key.variant, key.dtype, key.shape_key), "")
        return out

    return modes_of


def _chip_regressions(store: Store, chip: str, *, include_dirty: bool, last: int | None, min_effect: float,
                      alpha: float) -> list[RegressionEvidence]:
    data = by_series_key(query.chip_history(store, chip, None, include_dirty=include_dirty, last=last))
    events, broken = correctness_regressions(store, data, include_dirty=include_dirty, last=last)
    found = performance_regressions(
        data, broken, cell_summaries(data), lambda cells: trial_levels(data, cells)[0],
        lambda cells: {cell: data.trials(cell) for cell in cells}, min_effect=min_effect, alpha=alpha,
        modes_of=modes_loader(store, data, include_dirty=include_dirty))
    if not timing_fit(chip):  # a virtual GPU: its correctness counts, its timings carry no verdict
        return events
    return events + order_checked(data.commits, data.previous.tolist(),
                                  [e for commit in sorted(found) for e in found[commit]],
                                  lambda: query.guessed_commits(store, chip, include_dirty))


def regressions(
    store: Store,
    chip: str | None = None,
    *,
    include_dirty: bool = False,
    last: int | None = None,
    min_effect: float = policy.DEFAULT_MIN_EFFECT,
    alpha: float = policy.DEFAULT_ALPHA,
) -> list[RegressionEvidence]:
    """New correctness failures first, then confirmed regressions, then the slowdowns whose order ancestry does not
    prove (kind "unproven": ``order_checked``), per chip in history order.

    Each commit is compared with its previous commit on the chip, its nearest ancestor with runs there (first
    parents, then the other parents; the commit run just before it when its parents are unknown): every series
    with its own previous point (the nearest such ancestor that has samples of it), as ``harness compare`` compares
    two commits -- ``trials.compare_trials`` on each side's trials (one per run and job process), BH across the
    commit's whole grid, series of a kernel that failed correctness at the commit ``broken`` and out of the family.
    A series' history floor is ``runshift.history_floor`` of its newest ``defaults.HISTORY_RUNS`` runs before the
    base commit, up the series' previous points (each run's level: the mean log median of its trials, as a side
    is measured), so that a series with a history is judged against its between-run noise even when each side
    has a single trial.  Only commits where an exact screen (the same p-values and intervals, vectorised) finds a
    possible regression go through ``compare_trials``.  A correctness failure is listed at the first commit of each
    stretch of ancestry where that job fails.  ``last`` judges only the window of ``query.chip_history`` (the main
    line's last N commits, each against its previous commit, with the history behind it for the floors).  Within a
    commit, the largest slowdown comes first.  ``base_median`` / ``head_median`` are the two points' levels on the
    history page (the median of their trial medians).
    """
    if chip is not None:
        query.check_chip(store, chip)
        chips = [chip]
    else:
        chips = query.chip_keys(store)
    per_chip = [_chip_regressions(store, key, include_dirty=include_dirty, last=last, min_effect=min_effect,
                                  alpha=alpha) for key in chips]
    correctness = [e for events in per_chip for e in events if e.kind == "correctness"]
    performance = [e for events in per_chip for e in events if e.kind == "performance"]
    unproven = [e for events in per_chip for e in events if e.kind == "unproven"]
    return correctness + performance + unproven
