"""The regression list: new correctness failures (the first commit of each failing stretch) and confirmed
slowdowns, each commit judged against its previous commit on its chip (its nearest ancestor with runs there:
``harness.record.query.ChipHistory.previous``) exactly as ``stats.compare_grid`` would judge it (BH across the
commit's whole grid), with a cheap Mann-Whitney + BH screen so that only series that can be confirmed are
bootstrapped.  Histories and correctness rows come from ``harness.record.query``."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.stats import false_discovery_control

from harness.analysis.records import RegressionEvidence
from harness.core import stats
from harness.core.status import is_code_failure
from harness.record import query
from harness.record.store import Store

__all__ = ["regressions"]


def _correctness_events(store: Store, data: query.ChipHistory, include_dirty: bool
                        ) -> tuple[list[RegressionEvidence], set[tuple[int, str]]]:
    """New correctness failures (first failing commit of each failing stretch along ancestry) and the broken
    (commit, kernel)s."""
    commit_index = {row[0]: i for i, row in enumerate(data.commits)}
    key_index: dict[str, int] = {}
    cells: list[tuple[int, int, bool]] = []
    for commit_id, key, status in query.correctness_statuses(store, data.chip, include_dirty=include_dirty):
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
    for commit_id, key, kern, variant, dtype, shape_key, check, status, detail in query.failing_correctness_jobs(
            store, data.chip, include_dirty=include_dirty):
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


def _bh_per_family(p_values: npt.NDArray[np.float64], bounds: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
    """Benjamini-Hochberg within each family ``p_values[bounds[k]:bounds[k + 1]]``."""
    # The BH of stats.apply_fdr (scipy's false_discovery_control), per commit; apply_fdr itself would build and
    # re-decide a Comparison per pair (~1 s per 200 000 pairs) where only the adjusted p-values are needed here.
    adjusted = np.empty_like(p_values)
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if stop > start:
            adjusted[start:stop] = false_discovery_control(p_values[start:stop], method="bh")
    return adjusted


def _screened_only(p_value: float, n_base: int, n_head: int) -> stats.Comparison:
    # A pair left out of the bootstrap (its screened p-value failed BH): it only counts in its commit's BH family,
    # which stats.apply_fdr reads from the raw p-values; its verdict is never read.
    return stats.Comparison("unchanged", 1.0, 1.0, 1.0, p_value, p_value, n_base, n_head, 0)


def _chip_regressions(store: Store, chip: str, *, include_dirty: bool, last: int | None, min_effect: float,
                      alpha: float, min_samples: int) -> list[RegressionEvidence]:
    data = query.chip_history(store, chip, None, include_dirty=include_dirty, last=last)
    events, broken = _correctness_events(store, data, include_dirty)
    if last is not None:  # a failure whose job did not run at the window's bases may be old
        events = [e for e in events if e.base_sha is not None]
    n_series = len(data.series)
    if n_series == 0:
        return events
    # Each point of each series (of the window) against the series' previous point: its nearest ancestor with it.
    present = data.counts > 0
    base_of = data.nearest_with(present)
    head_commit, series = np.nonzero(present & (base_of >= 0) & data.shown[:, None])
    base_commit = base_of[head_commit, series]
    base_cell, head_cell = base_commit * n_series + series, head_commit * n_series + series
    counts = data.counts.ravel()
    n_base, n_head = counts[base_cell], counts[head_cell]
    kernel_ids = {name: i for i, name in enumerate(sorted({key.kernel for key in data.series}))}
    series_kernel = np.array([kernel_ids[key.kernel] for key in data.series], dtype=np.int64)
    broken_codes = [commit * len(kernel_ids) + kernel_ids[name] for commit, name in broken if name in kernel_ids]
    is_broken = np.isin(head_commit * len(kernel_ids) + series_kernel[series], broken_codes)
    tested = (np.minimum(n_base, n_head) >= min_samples) & ~is_broken
    p_values = np.full(series.size, np.nan)
    sizes = np.stack([n_base, n_head], axis=1)
    for nb, nh in np.unique(sizes[tested], axis=0).tolist():
        where = np.flatnonzero(tested & (n_base == nb) & (n_head == nh))
        # The very test stats.compare_each runs, on the same sorted rows: a cheap screen before the bootstrap.
        p_values[where] = stats.mann_whitney_pvalues(data.cell_rows(base_cell[where], nb),
                                                      data.cell_rows(head_cell[where], nh))
    tested_pairs = np.flatnonzero(tested)
    tested_pairs = tested_pairs[np.argsort(head_commit[tested_pairs], kind="stable")]
    family_bounds = np.searchsorted(head_commit[tested_pairs], np.arange(len(data.commits) + 1))
    adjusted = _bh_per_family(p_values[tested_pairs], family_bounds)
    candidates = tested_pairs[adjusted < alpha]
    if candidates.size == 0:
        return events
    full = stats.compare_each({int(i): (data.samples(base_cell[i]), data.samples(head_cell[i])) for i in candidates},
                              min_effect=min_effect, alpha=alpha, min_samples=min_samples)
    found: list[RegressionEvidence] = []
    for commit in np.unique(head_commit[candidates]).tolist():
        members = tested_pairs[family_bounds[commit]:family_bounds[commit + 1]].tolist()
        family = {i: full.get(i) or _screened_only(float(p_values[i]), int(n_base[i]), int(n_head[i]))
                  for i in members}
        decided = stats.apply_fdr(family, min_effect=min_effect, alpha=alpha)
        _, sha, message, _, started = data.commits[commit]
        confirmed = [i for i in members if i in full and decided[i].verdict == "regressed"]
        for i in sorted(confirmed, key=lambda i: (-decided[i].ratio, data.series[series[i]])):
            c, key = decided[i], data.series[series[i]]
            found.append(RegressionEvidence(
                "performance", chip, key.kernel, key.variant, key.dtype, key.shape_key, sha, message, started,
                data.commits[base_commit[i]][1], c.ratio, c.ci_low, c.ci_high, c.p_value, c.p_adjusted, c.n_base,
                c.n_head, stats.median_ci(data.samples(base_cell[i]))[0],
                stats.median_ci(data.samples(head_cell[i]))[0]))
    return events + found


def regressions(
    store: Store,
    chip: str | None = None,
    *,
    include_dirty: bool = False,
    last: int | None = None,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
    min_samples: int = stats.DEFAULT_MIN_SAMPLES,
) -> list[RegressionEvidence]:
    """New correctness failures first, then confirmed regressions, per chip in history order.

    Each commit is compared with its previous commit on the chip, its nearest ancestor with runs there (first
    parents, then the other parents; the commit run just before it when its parents are unknown): every series
    with its own previous point (the nearest such ancestor that has samples of it), BH across the commit's whole
    grid, exactly as ``stats.compare_grid`` (series of a kernel that failed correctness at the commit are
    ``broken`` and leave the family).  The bootstrap runs only for series whose Mann-Whitney p-value survives BH,
    as only they can be confirmed.  A correctness failure is listed at the first commit of each stretch of
    ancestry where that job fails.  ``last`` judges only the window of ``query.chip_history`` (the main line's last
    N commits, each against its previous commit).  Within a commit, the largest slowdown comes first.
    """
    if chip is not None:
        query.check_chip(store, chip)
        chips = [chip]
    else:
        chips = query.chip_keys(store)
    per_chip = [_chip_regressions(store, key, include_dirty=include_dirty, last=last, min_effect=min_effect,
                                  alpha=alpha, min_samples=min_samples) for key in chips]
    correctness = [e for events in per_chip for e in events if e.kind == "correctness"]
    performance = [e for events in per_chip for e in events if e.kind == "performance"]
    return correctness + performance
