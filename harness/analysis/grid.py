"""Analyse: turn stored runs into harness.core.stats inputs and verdicts (joins the ORM with the stats)."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from harness.core import stats
from harness.core.errors import HarnessError
from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.store import Store

__all__ = [
    "FAILING_STATUSES",
    "OUTCOME_ORDER",
    "VERDICT_ORDER",
    "BestVariant",
    "ChangeFlag",
    "CompareReport",
    "CompareRow",
    "CorrectnessFailure",
    "DivergentVariant",
    "HistoryPoint",
    "RegressionEvidence",
    "SeriesHistory",
    "SeriesKey",
    "Side",
    "TuningDrift",
    "VariantCell",
    "VariantMatrix",
    "clear_cache",
    "compare",
    "history",
    "regressions",
    "resolve_side",
    "tuning_drift",
    "variant_matrix",
]

FAILING_STATUSES = ("failed", "crashed", "timeout")
"""Correctness statuses that gate a kernel's timings on a chip (``skipped`` and ``lost`` say nothing)."""

VERDICT_ORDER = ("broken", "regressed", "improved", "inconclusive", "unchanged")
"""Display order of compare rows: what needs attention first."""

OUTCOME_ORDER = ("broken", "lose", "win", "inconclusive", "tie")
"""Display order of variant cells."""
MIN_PREFIX = 4  # shortest commit / run id prefix accepted (as git)


class SeriesKey(NamedTuple):
    """One benchmark series: a kernel variant at one dtype and shape, on one chip."""

    kernel: str
    variant: str
    dtype: str
    shape_key: str
    chip: str


# ---------------------------------------------------------------------------------------------------------------
# Plain records
# ---------------------------------------------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """JSON-safe copy: dataclasses and named tuples become dicts, datetimes ISO strings, nan/inf None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "to_dict"):
            return value.to_dict()
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: json_safe(v) for k, v in value._asdict().items()}
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


class _Plain:
    """``to_dict()`` for the frozen records below: every field, JSON-serialisable."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: json_safe(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class Side(_Plain):
    """One side of a comparison: a commit (all its runs on each chip, pooled) or a single run."""

    ref: str
    kind: Literal["commit", "run"]
    sha: str
    message: str
    branch: str
    runs: dict[str, tuple[str, ...]]  # chip key -> run ids
    dirty_runs: int

    @property
    def run_ids(self) -> list[str]:
        return [run_id for ids in self.runs.values() for run_id in ids]

    @property
    def label(self) -> str:
        return f"run {self.ref}" if self.kind == "run" else self.sha[:12]


@dataclass(frozen=True)
class CorrectnessFailure(_Plain):
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


@dataclass(frozen=True)
class CompareRow(_Plain):
    """One series, head vs base; ``ratio`` = median(head) / median(base), > 1 is slower."""

    key: SeriesKey
    verdict: str
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_base: int
    n_head: int
    more_samples_needed: int
    base_median: float
    head_median: float


@dataclass(frozen=True)
class CompareReport(_Plain):
    base: Side
    head: Side
    rows: tuple[CompareRow, ...]
    correctness_failures: tuple[CorrectnessFailure, ...]
    counts: dict[str, int]
    only_base: int  # series with samples on the base side only (per chip)
    only_head: int
    min_effect: float
    alpha: float

    @property
    def exit_code(self) -> int:
        """1 on any confirmed regression or any correctness failure on the head side, else 0."""
        return 1 if self.correctness_failures or self.counts.get("regressed", 0) else 0

    @property
    def changed(self) -> tuple[CompareRow, ...]:
        return tuple(row for row in self.rows if row.verdict != "unchanged")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "exit_code": self.exit_code}


@dataclass(frozen=True)
class VariantCell(_Plain):
    """A variant vs its kernel's default variant on one chip; ``ratio`` = variant / default time (< 1 wins)."""

    kernel: str
    variant: str
    dtype: str
    shape_key: str
    chip: str
    default_variant: str
    outcome: str
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_default: int
    n_variant: int
    more_samples_needed: int


@dataclass(frozen=True)
class DivergentVariant(_Plain):
    """A variant that wins on one chip and loses on another, with both cells' evidence."""

    kernel: str
    variant: str
    dtype: str
    shape_key: str
    winning_chip: str
    losing_chip: str
    win: VariantCell
    lose: VariantCell


@dataclass(frozen=True)
class BestVariant(_Plain):
    """The best variant of one (kernel, dtype, shape, chip); the default unless a variant wins outright."""

    kernel: str
    dtype: str
    shape_key: str
    chip: str
    variant: str
    default_variant: str
    evidence: VariantCell | None  # the winning cell, None when the default is best


@dataclass(frozen=True)
class VariantMatrix(_Plain):
    runs: dict[str, tuple[str, ...]]  # chip -> the run ids analysed
    shas: dict[str, str]  # chip -> commit sha of those runs
    cells: tuple[VariantCell, ...]
    divergent: tuple[DivergentVariant, ...]
    best: tuple[BestVariant, ...]
    correctness_failures: tuple[CorrectnessFailure, ...]

    def best_for(self, kernel: str, dtype: str, shape_key: str, chip: str) -> str | None:
        for best in self.best:
            if (best.kernel, best.dtype, best.shape_key, best.chip) == (kernel, dtype, shape_key, chip):
                return best.variant
        return None


@dataclass(frozen=True)
class TuningDrift(_Plain):
    """The best variant of (kernel, dtype, shape, chip) changed between two commits."""

    kernel: str
    dtype: str
    shape_key: str
    chip: str
    before: str
    after: str
    before_evidence: VariantCell | None  # ``before``'s cell at the base commit (None: the default)
    after_evidence: VariantCell | None  # ``after``'s cell at the head commit (None: the default)


@dataclass(frozen=True)
class HistoryPoint(_Plain):
    sha: str
    message: str
    branch: str
    started_at: datetime | None  # start of the commit's first run on the chip
    median: float
    ci_low: float
    ci_high: float
    n: int


@dataclass(frozen=True)
class ChangeFlag(_Plain):
    """A step or drift found in a history; indices refer to ``SeriesHistory.points``."""

    kind: str
    index: int
    end_index: int
    sha: str
    end_sha: str
    before: float
    after: float
    ratio: float


@dataclass(frozen=True)
class SeriesHistory(_Plain):
    key: SeriesKey
    points: tuple[HistoryPoint, ...]
    change_points: tuple[ChangeFlag, ...]


@dataclass(frozen=True)
class RegressionEvidence(_Plain):
    """An entry of the regression list: a new correctness failure, or a confirmed slowdown vs the previous point."""

    kind: Literal["correctness", "performance"]
    chip: str
    kernel: str
    variant: str
    dtype: str
    shape_key: str
    head_sha: str
    head_message: str
    head_started_at: datetime | None
    base_sha: str | None  # previous commit (performance: the series' previous point; correctness: None if first)
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    n_base: int | None = None
    n_head: int | None = None
    base_median: float | None = None
    head_median: float | None = None
    check: str = ""
    status: str = ""
    detail: str = ""

    @property
    def key(self) -> SeriesKey:
        return SeriesKey(self.kernel, self.variant, self.dtype, self.shape_key, self.chip)


# ---------------------------------------------------------------------------------------------------------------
# Resolving BASE / HEAD
# ---------------------------------------------------------------------------------------------------------------


def _check_chip(session: Session, chip: str | None) -> None:
    if chip is not None and session.scalar(select(Chip.id).where(Chip.key == chip)) is None:
        known = ", ".join(session.scalars(select(Chip.key).order_by(Chip.key))) or "none"
        raise HarnessError(f"unknown chip {chip!r} (known: {known})")


def _side_from_runs(ref: str, kind: Literal["commit", "run"], commit: Commit, runs: Sequence[Run]) -> Side:
    per_chip: dict[str, list[str]] = {}
    for run in sorted(runs, key=lambda r: (r.started_at, r.id)):
        per_chip.setdefault(run.chip.key, []).append(run.id)
    return Side(ref, kind, commit.sha, commit.message, commit.branch,
                {chip: tuple(ids) for chip, ids in sorted(per_chip.items())}, sum(bool(r.dirty) for r in runs))


def resolve_side(store: Store, ref: str, chip: str | None = None) -> Side:
    """A commit sha (full or unique prefix: all its runs, pooled per chip) or a run id (full or unique prefix)."""
    ref = ref.strip()
    if not ref:
        raise HarnessError("empty commit or run id")
    with store.session() as session:
        _check_chip(session, chip)
        exact_run = session.get(Run, ref)
        exact_commits = session.scalars(select(Commit).where(Commit.sha == ref)).all()
        if exact_run is not None and not exact_commits:
            runs, kind, commits = [exact_run], "run", [exact_run.commit]
        elif exact_commits:
            runs, kind, commits = _commit_runs(session, exact_commits), "commit", exact_commits
        else:
            if len(ref) < MIN_PREFIX:
                raise HarnessError(f"no commit or run {ref!r} (prefixes need at least {MIN_PREFIX} characters)")
            commits = session.scalars(select(Commit).where(Commit.sha.startswith(ref, autoescape=True))).all()
            prefix_runs = session.scalars(select(Run).where(Run.id.startswith(ref, autoescape=True))).all()
            shas = sorted({c.sha for c in commits})
            if len(shas) + len(prefix_runs) > 1:
                listed = [f"commit {s[:12]}" for s in shas] + [f"run {r.id[:12]}" for r in prefix_runs]
                more = f", ... ({len(listed)} in all)" if len(listed) > 3 else ""
                raise HarnessError(f"{ref!r} is ambiguous: {', '.join(listed[:3])}{more}")
            if not shas and not prefix_runs:
                raise HarnessError(f"no commit or run {ref!r} in the database")
            if prefix_runs:
                runs, kind, commits = list(prefix_runs), "run", [prefix_runs[0].commit]
            else:
                runs, kind = _commit_runs(session, commits), "commit"
        if chip is not None:
            if kind == "run" and runs[0].chip.key != chip:
                raise HarnessError(f"run {runs[0].id} ran on chip {runs[0].chip.key!r}, not {chip!r}")
            runs = [r for r in runs if r.chip.key == chip]
        if not runs:
            where = f" on chip {chip!r}" if chip else ""
            raise HarnessError(f"commit {commits[0].sha[:12]} has no runs{where}")
        return _side_from_runs(ref, kind, commits[0], runs)


def _commit_runs(session: Session, commits: Sequence[Commit]) -> list[Run]:
    ids = [c.id for c in commits]
    return list(session.scalars(select(Run).where(Run.commit_id.in_(ids))))


# ---------------------------------------------------------------------------------------------------------------
# Loading (one query per side)
# ---------------------------------------------------------------------------------------------------------------


def _positive(values: Iterable[float]) -> npt.NDArray[np.float64]:
    array = np.fromiter(values, dtype=np.float64)
    return array[np.isfinite(array) & (array > 0)]


def _side_samples(session: Session, run_ids: Sequence[str]) -> dict[SeriesKey, npt.NDArray[np.float64]]:
    """Raw benchmark samples of the given runs, pooled per series (chip included)."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, Chip.key, Sample.seconds)
        .select_from(Sample)
        .join(JobRecord, Sample.job_id == JobRecord.id)
        .join(Run, JobRecord.run_id == Run.id)
        .join(Chip, Run.chip_id == Chip.id)
        .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "benchmark")
        .order_by(JobRecord.id, Sample.idx)
    )
    pooled: dict[SeriesKey, list[float]] = {}
    for kernel, variant, dtype, shape_key, chip, seconds in rows:
        pooled.setdefault(SeriesKey(kernel, variant, dtype, shape_key, chip), []).append(seconds)
    return {key: _positive(values) for key, values in pooled.items()}


def _failures(session: Session, run_ids: Sequence[str]) -> list[CorrectnessFailure]:
    if not run_ids:
        return []
    rows = session.execute(
        select(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.check_name, JobRecord.dtype,
               JobRecord.shape_key, JobRecord.status, JobRecord.detail, JobRecord.run_id, Commit.sha)
        .select_from(JobRecord)
        .join(Run, JobRecord.run_id == Run.id)
        .join(Chip, Run.chip_id == Chip.id)
        .join(Commit, Run.commit_id == Commit.id)
        .where(JobRecord.run_id.in_(list(run_ids)), JobRecord.kind == "correctness",
               JobRecord.status.in_(FAILING_STATUSES))
        .order_by(Chip.key, JobRecord.kernel, JobRecord.variant, JobRecord.check_name, JobRecord.dtype,
                  JobRecord.shape_key, JobRecord.run_id)
    )
    return [CorrectnessFailure(*row) for row in rows]


def _median(values: npt.NDArray[np.float64]) -> float:
    return stats.median_ci(values)[0] if values.size else math.nan


# ---------------------------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------------------------


def _row_order(row: CompareRow) -> tuple:
    return (VERDICT_ORDER.index(row.verdict), row.key.chip, row.key.kernel, row.key.variant, row.key.dtype,
            row.key.shape_key)


def compare(
    store: Store,
    base: str,
    head: str,
    chip: str | None = None,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
) -> CompareReport:
    """Every benchmark series present on both sides (per chip): pooled samples, BH across the whole grid, gated.

    A kernel whose correctness failed (failed / crashed / timeout) on the head side on a chip has every series on
    that chip ``broken``.  Comparing a commit with itself pools the same runs on both sides (trivially unchanged):
    compare two run ids to compare runs.
    """
    base_side, head_side = resolve_side(store, base, chip), resolve_side(store, head, chip)
    with store.session() as session:
        base_samples = _side_samples(session, base_side.run_ids)
        head_samples = _side_samples(session, head_side.run_ids)
        failures = _failures(session, head_side.run_ids)
    broken_kernels = {(f.chip, f.kernel) for f in failures}
    common = sorted(base_samples.keys() & head_samples.keys())
    pairs = {key: (base_samples[key], head_samples[key]) for key in common}
    broken = {key for key in common if (key.chip, key.kernel) in broken_kernels}
    verdicts = stats.compare_grid(pairs, min_effect=min_effect, alpha=alpha, broken=broken)
    rows = sorted((CompareRow(key, c.verdict, c.ratio, c.ci_low, c.ci_high, c.p_value, c.p_adjusted, c.n_base,
                              c.n_head, c.more_samples_needed, _median(pairs[key][0]), _median(pairs[key][1]))
                   for key, c in verdicts.items()), key=_row_order)
    counts = {verdict: 0 for verdict in stats.VERDICTS}
    for row in rows:
        counts[row.verdict] += 1
    return CompareReport(base_side, head_side, tuple(rows), tuple(failures), counts,
                         len(base_samples.keys() - head_samples.keys()), len(head_samples.keys() - base_samples.keys()),
                         min_effect, alpha)


# ---------------------------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------------------------


def _default_variants() -> dict[str, str]:
    from kernels import REGISTRY

    return {name: kernel.default_variant for name, kernel in REGISTRY.items()}


def _matrix_runs(store: Store, commit: str | None) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Per chip: the runs to analyse and their commit sha (the latest run, or every run of ``commit``)."""
    if commit is not None:
        side = resolve_side(store, commit)
        return side.runs, {chip: side.sha for chip in side.runs}
    runs: dict[str, tuple[str, ...]] = {}
    shas: dict[str, str] = {}
    with store.session() as session:
        for chip_key in list(session.scalars(select(Chip.key).order_by(Chip.key))):
            latest = session.execute(
                select(Run.id, Commit.sha).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
                .where(Chip.key == chip_key).order_by(Run.started_at.desc(), Run.id.desc()).limit(1)
            ).first()
            if latest is not None:
                runs[chip_key], shas[chip_key] = (latest[0],), latest[1]
    return runs, shas


def _cell(key: tuple[str, str, str, str, str], default: str, verdict: stats.VariantVerdict) -> VariantCell:
    kernel, dtype, shape_key, variant, chip = key
    return VariantCell(kernel=kernel, variant=variant, dtype=dtype, shape_key=shape_key, chip=chip,
                       default_variant=default, **dataclasses.asdict(verdict))


def variant_matrix(
    store: Store,
    commit: str | None = None,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
    defaults: Mapping[str, str] | None = None,
) -> VariantMatrix:
    """Each variant vs its kernel's default variant, per (kernel, dtype, shape, chip), BH across the whole matrix.

    Runs: each chip's latest run, or all runs of ``commit`` on each chip (pooled).  A cell is ``broken`` when the
    variant or the default failed a correctness job of that kernel on that chip in those runs.  ``defaults``
    (kernel -> default variant) overrides ``kernels.REGISTRY``; kernels known to neither are left out.
    """
    defaults = {**_default_variants(), **(defaults or {})}
    runs, shas = _matrix_runs(store, commit)
    with store.session() as session:
        run_ids = [run_id for ids in runs.values() for run_id in ids]
        samples = _side_samples(session, run_ids)
        failures = _failures(session, run_ids)
    failed = {(f.chip, f.kernel, f.variant) for f in failures}
    grid: dict[tuple[str, str, str, str, str], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = {}
    broken = set()
    for key, values in samples.items():
        default = defaults.get(key.kernel)
        if default is None or key.variant == default:
            continue
        baseline = samples.get(SeriesKey(key.kernel, default, key.dtype, key.shape_key, key.chip))
        if baseline is None:
            continue
        cell_key = (key.kernel, key.dtype, key.shape_key, key.variant, key.chip)
        grid[cell_key] = (baseline, values)
        if (key.chip, key.kernel, key.variant) in failed or (key.chip, key.kernel, default) in failed:
            broken.add(cell_key)
    verdicts = stats.variant_verdict_grid(grid, min_effect=min_effect, alpha=alpha, broken=broken)
    cells = {key: _cell(key, defaults[key[0]], verdict) for key, verdict in sorted(verdicts.items())}
    per_chip: dict[tuple[str, tuple[str, str], str], dict[str, stats.VariantVerdict]] = {}
    for (kernel, dtype, shape_key, variant, chip), verdict in verdicts.items():
        per_chip.setdefault((kernel, (dtype, shape_key), variant), {})[chip] = verdict
    divergent = [
        DivergentVariant(d.kernel, d.variant, d.shape[0], d.shape[1], d.winning_chip, d.losing_chip,
                         cells[(d.kernel, *d.shape, d.variant, d.winning_chip)],
                         cells[(d.kernel, *d.shape, d.variant, d.losing_chip)])
        for d in stats.find_divergent(per_chip)
    ]
    best = []
    for kernel in sorted({key[0] for key in per_chip}):
        kernel_cells = {key: value for key, value in per_chip.items() if key[0] == kernel}
        for (_, (dtype, shape_key), chip), variant in sorted(stats.best_variants(kernel_cells, defaults[kernel])
                                                             .items()):
            evidence = cells.get((kernel, dtype, shape_key, variant, chip))
            best.append(BestVariant(kernel, dtype, shape_key, chip, variant, defaults[kernel], evidence))
    return VariantMatrix(runs, shas, tuple(cells.values()), tuple(divergent), tuple(best), tuple(failures))


def tuning_drift(
    store: Store,
    base_commit: str,
    head_commit: str,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
    defaults: Mapping[str, str] | None = None,
) -> list[TuningDrift]:
    """(kernel, dtype, shape, chip) whose best variant changed between two commits (chips and shapes on both)."""
    before = variant_matrix(store, base_commit, min_effect=min_effect, alpha=alpha, defaults=defaults)
    after = variant_matrix(store, head_commit, min_effect=min_effect, alpha=alpha, defaults=defaults)

    def best_map(matrix: VariantMatrix) -> dict[tuple[str, str, str, str], BestVariant]:
        return {(b.kernel, b.dtype, b.shape_key, b.chip): b for b in matrix.best}

    best_before, best_after = best_map(before), best_map(after)
    changes = stats.tuning_drift({k: b.variant for k, b in best_before.items()},
                                 {k: b.variant for k, b in best_after.items()})
    return [TuningDrift(*change.key, change.before, change.after, best_before[change.key].evidence,
                        best_after[change.key].evidence) for change in changes]


# ---------------------------------------------------------------------------------------------------------------
# One chip's whole history, vectorised: history() and regressions()
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _ChipHistory:
    """All clean runs of one chip, pooled per (commit, series) cell; samples sorted within each cell."""

    chip: str
    commits: list[tuple[int, str, str, str, datetime | None]]  # (commit id, sha, message, branch, first start)
    series: list[SeriesKey]
    counts: npt.NDArray[np.int64]  # (n_commits, n_series): valid samples per cell
    offsets: npt.NDArray[np.int64]  # (n_commits, n_series): start of each cell in ``values``
    values: npt.NDArray[np.float64]  # samples sorted by (cell, seconds)

    def cell_rows(self, cells: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.float64]:
        """Sorted samples of flat cell indices that all have n samples: shape (len(cells), n)."""
        return self.values[self.offsets.ravel()[cells][:, None] + np.arange(n)]


def _run_filter(query, chip: str, include_dirty: bool):
    query = query.where(Chip.key == chip)
    return query if include_dirty else query.where(Run.dirty.is_(False))


def _plain_rows(session: Session, statement) -> list[tuple]:
    """DBAPI tuples of a SELECT, skipping SQLAlchemy's Row objects (seconds on millions of samples)."""
    connection = session.connection()
    compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup)
    cursor = connection.connection.cursor()
    try:
        cursor.execute(str(compiled), params)
        return cursor.fetchall()
    finally:
        cursor.close()


_CACHE: OrderedDict[tuple, _ChipHistory] = OrderedDict()
_CACHE_SIZE = 8  # chip histories; ~20 MB each at 1000 commits x 200 series x 10 samples


def clear_cache() -> None:
    """Forget the loaded chip histories (they are also dropped whenever the database gains runs or jobs)."""
    _CACHE.clear()


def _fingerprint(session: Session) -> tuple:
    """Changes whenever a run or job is added or removed, or a run's start time moves."""
    runs = session.execute(select(func.count(Run.id), func.max(Run.started_at))).one()
    jobs = session.execute(select(func.count(JobRecord.id), func.max(JobRecord.id))).one()
    return (*runs, *jobs)


def _load_chip(store: Store, session: Session, chip: str, kernel: str | None, include_dirty: bool,
               last: int | None) -> _ChipHistory:
    """The chip's history, from a small cache keyed on the database's state (history() then regressions() of
    the same chip, as the report does, load it once)."""
    key = (store.url, chip, kernel, include_dirty, last, _fingerprint(session))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    data = _query_chip(session, chip, kernel, include_dirty, last)
    _CACHE[key] = data
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return data


def _query_chip(session: Session, chip: str, kernel: str | None, include_dirty: bool,
                last: int | None) -> _ChipHistory:
    first_start = func.min(Run.started_at)
    commit_rows = session.execute(_run_filter(
        select(Commit.id, Commit.sha, Commit.message, Commit.branch, first_start)
        .select_from(Run).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id),
        chip, include_dirty).group_by(Commit.id, Commit.sha, Commit.message, Commit.branch)
        .order_by(first_start, Commit.id)).all()
    commits = [tuple(row) for row in commit_rows]
    if last is not None:
        commits = commits[-last:] if last > 0 else []
    commit_index = {row[0]: i for i, row in enumerate(commits)}
    runs = _run_filter(select(Run.id).join(Chip, Run.chip_id == Chip.id), chip, include_dirty)
    if last is not None:
        runs = runs.where(Run.commit_id.in_(list(commit_index)))
    run_commit = {run_id: commit_index[commit_id] for run_id, commit_id in session.execute(
        runs.with_only_columns(Run.id, Run.commit_id))}

    def benchmark_jobs(query):
        # Runs first, then their jobs by index: SQLite would otherwise scan the whole job table.
        query = query.where(JobRecord.run_id.in_(runs), JobRecord.kind == "benchmark")
        return query.where(JobRecord.kernel == kernel) if kernel is not None else query

    job_rows = _plain_rows(session, benchmark_jobs(
        select(JobRecord.id, JobRecord.run_id, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
               JobRecord.shape_key)))
    series_index: dict[tuple[str, str, str, str], int] = {}
    job_ids = np.empty(len(job_rows), dtype=np.int64)
    job_cells = np.empty(len(job_rows), dtype=np.int64)
    job_commit = np.empty(len(job_rows), dtype=np.int64)
    for i, (job_id, run_id, *series) in enumerate(job_rows):
        job_ids[i] = job_id
        job_commit[i] = run_commit[run_id]
        job_cells[i] = series_index.setdefault(tuple(series), len(series_index))
    n_commits, n_series = len(commits), len(series_index)
    job_cells += job_commit * n_series
    sample_rows = _plain_rows(session, benchmark_jobs(
        select(Sample.job_id, Sample.seconds).join(JobRecord, Sample.job_id == JobRecord.id)))
    sample_jobs = np.fromiter((row[0] for row in sample_rows), dtype=np.int64, count=len(sample_rows))
    seconds = np.fromiter((row[1] for row in sample_rows), dtype=np.float64, count=len(sample_rows))
    del sample_rows
    valid = np.isfinite(seconds) & (seconds > 0)
    sample_jobs, seconds = sample_jobs[valid], seconds[valid]
    order = np.argsort(job_ids)
    cells = job_cells[order][np.searchsorted(job_ids[order], sample_jobs)] if job_ids.size else sample_jobs[:0]
    by_cell = np.lexsort((seconds, cells))
    counts = np.bincount(cells, minlength=n_commits * n_series).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts.size else counts
    return _ChipHistory(chip, commits, [SeriesKey(*series, chip) for series in series_index],
                        counts.reshape(n_commits, n_series), offsets.reshape(n_commits, n_series), seconds[by_cell])


def _medians_and_ci(data: _ChipHistory, cells: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.float64], ...]:
    """stats.median_ci of every cell, vectorised per sample count (the order-statistic ranks depend on n only)."""
    counts = data.counts.ravel()[cells]
    median = np.full(cells.size, np.nan)
    low, high = np.full(cells.size, np.nan), np.full(cells.size, np.nan)
    for n in np.unique(counts):
        n = int(n)
        if n == 0:
            continue
        where = np.flatnonzero(counts == n)
        rows = data.cell_rows(cells[where], n)
        lower, upper = rows[:, (n - 1) // 2], rows[:, n // 2]
        median[where] = lower + 0.5 * (upper - lower)
        _, low_rank, high_rank = stats.median_ci(np.arange(1.0, n + 1.0))  # ranks, as stats picks them
        if math.isfinite(low_rank):
            low[where], high[where] = rows[:, int(low_rank) - 1], rows[:, int(high_rank) - 1]
    return median, low, high


def history(
    store: Store,
    chip: str,
    kernel: str | None = None,
    *,
    include_dirty: bool = False,
    last: int | None = None,
    change_points: bool = True,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
) -> list[SeriesHistory]:
    """Per series on ``chip``: its commits in run order (first run's start), median + CI, and change points.

    All clean runs of a commit on the chip pool their samples (``include_dirty`` adds runs of dirty trees);
    ``last`` keeps the chip's last N commits only.  ``change_points=False`` skips
    ``stats.detect_change_points``, which costs O(n^2) per series (~0.1 s per series at 1000 commits).
    """
    with store.session() as session:
        _check_chip(session, chip)
        data = _load_chip(store, session, chip, kernel, include_dirty, last)
    n_series = len(data.series)
    present_series, present_commit = np.nonzero(data.counts.T > 0)  # series-major, commit order within a series
    flat = present_commit * n_series + present_series
    median, low, high = _medians_and_ci(data, flat)
    counts = data.counts.ravel()[flat]
    bounds = np.searchsorted(present_series, np.arange(n_series + 1))
    points_of_commit = [(sha, message, branch, started) for _, sha, message, branch, started in data.commits]
    out = []
    for s, key in enumerate(data.series):
        span = slice(bounds[s], bounds[s + 1])
        commit_ids = present_commit[span].tolist()
        points = tuple(HistoryPoint(*points_of_commit[c], m, lo, hi, n) for c, m, lo, hi, n in zip(
            commit_ids, median[span].tolist(), low[span].tolist(), high[span].tolist(), counts[span].tolist(),
            strict=True))
        flags: tuple[ChangeFlag, ...] = ()
        if change_points:
            found = stats.detect_change_points(median[span], min_effect=min_effect, alpha=alpha)
            flags = tuple(ChangeFlag(cp.kind, cp.index, cp.end_index, points[cp.index].sha, points[cp.end_index].sha,
                                     cp.before, cp.after, cp.ratio) for cp in found)
        out.append(SeriesHistory(key, points, flags))
    return sorted(out, key=lambda h: h.key)


def _bh_per_group(p_values: npt.NDArray[np.float64], groups: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Benjamini-Hochberg within each group, as ``scipy.stats.false_discovery_control(method="bh")`` computes it."""
    adjusted = np.empty_like(p_values)
    if p_values.size == 0:
        return adjusted
    order = np.lexsort((p_values, groups))
    g = groups[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    stops = np.r_[starts[1:], g.size]
    sizes = (stops - starts).astype(np.float64)
    group_of = np.repeat(np.arange(starts.size), stops - starts)
    rank = (np.arange(g.size) - starts[group_of] + 1).astype(np.float64)
    scaled = p_values[order] * (sizes[group_of] / rank)
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        chunk = scaled[start:stop][::-1]
        np.minimum.accumulate(chunk, out=chunk)
    adjusted[order] = np.clip(scaled, 0.0, 1.0)
    return adjusted


def _correctness_events(session: Session, data: _ChipHistory, include_dirty: bool
                        ) -> tuple[list[RegressionEvidence], set[tuple[int, str]]]:
    """New correctness failures (first failing commit of each failing stretch) and the broken (commit, kernel)s."""
    commit_index = {row[0]: i for i, row in enumerate(data.commits)}
    statuses = _plain_rows(session, _run_filter(
        select(Run.commit_id, JobRecord.key, JobRecord.status).select_from(JobRecord)
        .join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id), data.chip, include_dirty)
        .where(JobRecord.kind == "correctness"))
    failing_at: dict[str, set[int]] = {}
    ran_at: dict[str, set[int]] = {}
    for commit_id, key, status in statuses:
        index = commit_index.get(commit_id)
        if index is None:  # outside the ``last`` window
            continue
        ran_at.setdefault(key, set()).add(index)
        if status in FAILING_STATUSES:
            failing_at.setdefault(key, set()).add(index)
    new: set[tuple[str, int]] = set()
    previous_of: dict[tuple[str, int], int | None] = {}
    for key, failing in failing_at.items():
        ran = sorted(ran_at[key])
        for before, index in zip([None, *ran[:-1]], ran, strict=True):
            if index in failing and (before is None or before not in failing):
                new.add((key, index))
                previous_of[(key, index)] = before
    details = session.execute(_run_filter(
        select(Run.commit_id, JobRecord.key, JobRecord.kernel, JobRecord.variant, JobRecord.dtype,
               JobRecord.shape_key, JobRecord.check_name, JobRecord.status, JobRecord.detail)
        .select_from(JobRecord).join(Run, JobRecord.run_id == Run.id).join(Chip, Run.chip_id == Chip.id),
        data.chip, include_dirty)
        .where(JobRecord.kind == "correctness", JobRecord.status.in_(FAILING_STATUSES))
        .order_by(Run.started_at, JobRecord.id)).all()
    broken = set()
    events: dict[tuple[str, int], RegressionEvidence] = {}
    for commit_id, key, kern, variant, dtype, shape_key, check, status, detail in details:
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


def _chip_regressions(store: Store, session: Session, chip: str, *, include_dirty: bool, last: int | None,
                      min_effect: float, alpha: float, min_samples: int) -> list[RegressionEvidence]:
    data = _load_chip(store, session, chip, None, include_dirty, None if last is None else last + 1)
    events, broken = _correctness_events(session, data, include_dirty)
    if last is not None:  # the window's first commit is only a base: its failures may be old
        events = [e for e in events if e.base_sha is not None]
    n_series = len(data.series)
    if n_series == 0:
        return events
    # Each point of each series against the series' previous point (present_commit is commit order per series).
    present_series, present_commit = np.nonzero(data.counts.T > 0)
    same = present_series[1:] == present_series[:-1]
    base_commit, head_commit = present_commit[:-1][same], present_commit[1:][same]
    series = present_series[1:][same]
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
    adjusted = _bh_per_group(p_values[tested_pairs], head_commit[tested_pairs])
    candidates = tested_pairs[adjusted < alpha]
    if candidates.size == 0:
        return events

    def samples(cell: int) -> npt.NDArray[np.float64]:
        start = data.offsets.ravel()[cell]
        return data.values[start:start + counts[cell]]

    full = stats.compare_each({int(i): (samples(base_cell[i]), samples(head_cell[i])) for i in candidates},
                              min_effect=min_effect, alpha=alpha, min_samples=min_samples)
    family_bounds = np.searchsorted(head_commit[tested_pairs], np.arange(len(data.commits) + 1))
    found: list[RegressionEvidence] = []
    for commit in np.unique(head_commit[candidates]).tolist():
        members = tested_pairs[family_bounds[commit]:family_bounds[commit + 1]].tolist()
        family = {i: full.get(i) or stats.Comparison("unchanged", 1.0, 1.0, 1.0, float(p_values[i]),
                                                     float(p_values[i]), int(n_base[i]), int(n_head[i]), 0)
                  for i in members}
        decided = stats.apply_fdr(family, min_effect=min_effect, alpha=alpha)
        _, sha, message, _, started = data.commits[commit]
        confirmed = [i for i in members if i in full and decided[i].verdict == "regressed"]
        for i in sorted(confirmed, key=lambda i: (-decided[i].ratio, data.series[series[i]])):
            c, key = decided[i], data.series[series[i]]
            found.append(RegressionEvidence(
                "performance", chip, key.kernel, key.variant, key.dtype, key.shape_key, sha, message, started,
                data.commits[base_commit[i]][1], c.ratio, c.ci_low, c.ci_high, c.p_value, c.p_adjusted, c.n_base,
                c.n_head, _median(samples(base_cell[i])), _median(samples(head_cell[i]))))
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
    """New correctness failures first, then confirmed regressions, per chip in commit order.

    Each commit is compared with the previous commit on the chip: every series with its own previous point (the
    previous commit that has samples of it), BH across the commit's whole grid, exactly as ``stats.compare_grid``
    (series of a kernel that failed correctness at the commit are ``broken`` and leave the family).  The bootstrap
    runs only for series whose Mann-Whitney p-value survives BH, as only they can be confirmed.  A correctness
    failure is listed at the first commit of each stretch of commits where that job fails.  ``last`` judges only
    the chip's last N commits (each against its predecessor).  Within a commit, the largest slowdown comes first.
    """
    with store.session() as session:
        if chip is not None:
            _check_chip(session, chip)
            chips = [chip]
        else:
            chips = list(session.scalars(select(Chip.key).order_by(Chip.key)))
        per_chip = [_chip_regressions(store, session, key, include_dirty=include_dirty, last=last,
                                      min_effect=min_effect, alpha=alpha, min_samples=min_samples) for key in chips]
    correctness = [e for events in per_chip for e in events if e.kind == "correctness"]
    performance = [e for events in per_chip for e in events if e.kind == "performance"]
    return correctness + performance
