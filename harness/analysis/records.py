"""Plain records of the analysis views (compare, variants, history, regressions) and their JSON form.

Frozen dataclasses with ``to_dict()`` (via ``json_safe``: dataclasses and named tuples become dicts, datetimes ISO
strings, nan/inf None), built by ``harness.analysis.compare``, ``.variants``, ``.history`` and ``.regressions`` and
read by the CLI, the report and bisect; no logic beyond a few derived properties.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np

from harness.record.query import SeriesKey

__all__ = [
    "BestVariant",
    "ChangeFlag",
    "CompareReport",
    "CompareRow",
    "ChipNoise",
    "CorrectnessFailure",
    "DivergentVariant",
    "HistoryPoint",
    "HistoryPoints",
    "NoiseReport",
    "NoiseRow",
    "RegressionEvidence",
    "SeriesHistory",
    "Side",
    "TuningDrift",
    "VariantCell",
    "VariantGap",
    "VariantMatrix",
    "json_safe",
]


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
    if isinstance(value, list | tuple | HistoryPoints):
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
    """A failing correctness job of a run (its run and commit named): a kernel check (kind "correctness"), a
    repository test (kind "test", ``name`` its node id, ``kernel`` its selection), or a pytest selection that failed
    without a failing test (kind "pytest"). ``new``: it did not fail on the base side of a comparison."""

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
    kind: str = "correctness"
    key: str = ""
    name: str = ""
    new: bool = True

    @property
    def what(self) -> str:
        """What failed, in a few words: ``kernel/variant check`` or ``selection: test node id``."""
        if self.kind == "test":
            return f"{self.kernel}: {self.name}"
        if self.kind == "pytest":
            return f"{self.kernel} (pytest selection)"
        return f"{self.kernel}/{self.variant} {self.check}"


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
    trials_base: int = 0  # independent trials (job processes, over every run of the side) behind each side
    trials_head: int = 0
    more_trials_needed: int = 0  # per side, to settle an inconclusive verdict
    basis: str = ""  # the spread that decided: "trials" (between processes), "history" (between runs), "none"
    noise: float = float("nan")  # that spread, as a log sd per trial or run
    detectable: float = float("nan")  # the smallest relative change this comparison could detect
    host_paced: bool = False  # either side's device waited for its host (harness.stats.pacing): a kernel-only
    # change may not show, and the time follows the host's pace
    more_runs_needed: int = 0  # of the base, for a history floor, where trials cannot settle it
    run_shift: float | None = None  # a flag held: the common shift of its run's other series (ratio; None: none)


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
    order_proven: bool = True  # False: ancestry does not show base before head (``compare.for_order``)

    @property
    def exit_code(self) -> int:
        """1 on any confirmed regression or any correctness failure on the head side (kernel checks and repository
        tests alike, newly failing or already failing at base), else 0."""
        return 1 if self.correctness_failures or self.counts.get("regressed", 0) else 0

    @property
    def newly_failing(self) -> tuple[CorrectnessFailure, ...]:
        return tuple(f for f in self.correctness_failures if f.new)

    @property
    def already_failing(self) -> tuple[CorrectnessFailure, ...]:
        return tuple(f for f in self.correctness_failures if not f.new)

    @property
    def changed(self) -> tuple[CompareRow, ...]:
        return tuple(row for row in self.rows if row.verdict != "unchanged")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "exit_code": self.exit_code, "newly_failing": len(self.newly_failing),
                "already_failing": len(self.already_failing)}


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
    run_ids: tuple[str, ...] = ()  # the runs compared: the newest that measured both series, or every run of --commit
    sha: str = ""  # their commit
    host_paced: bool = False  # the variant or its default was host-paced (harness.stats.pacing)


@dataclass(frozen=True)
class VariantGap(_Plain):
    """A variant of a (kernel, dtype, shape) row that the matrix compares on another chip (or that ran here and
    has no verdict) but not on ``chip``; ``reason`` says why when the chip's runs tell ("skipped: CUDA not
    available", "crashed: ...", "default sdpa not measured"), else that the chip never ran it."""

    kernel: str
    variant: str
    dtype: str
    shape_key: str
    chip: str
    status: str  # the variant's newest job status on that chip ("" when the chip never ran it)
    reason: str


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
    gaps: tuple[VariantGap, ...] = ()  # variants compared on some chip but not on another, with why
    shared: int = 0  # (kernel, dtype, shape) rows with a verdict on two chips or more

    @property
    def compared_chips(self) -> list[str]:
        """The chips with at least one verdict."""
        return sorted({cell.chip for cell in self.cells})

    @property
    def divergence_note(self) -> str:
        """Why the divergent list is what it is: what could be compared across chips."""
        chips = self.compared_chips
        if self.divergent:
            return (f"{len(self.divergent)} divergent variant(s) on {self.shared} (kernel, dtype, shape) row(s) "
                    "measured on two chips or more")
        if not chips:
            return "no variant was compared with its default on any chip yet"
        if len(chips) == 1:
            return f"only one chip ({chips[0]}) has variant verdicts: a divergence needs two"
        if not self.shared:
            return (f"no (kernel, dtype, shape) was measured on two chips: the grids of {', '.join(chips)} share no "
                    "shape, so no variant can win on one and lose on another")
        return (f"measured on {self.shared} shared (kernel, dtype, shape) row(s), no variant diverges (wins on one "
                "chip and loses on another)")

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "divergence_note": self.divergence_note}

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


CommitInfo = tuple[str, str, str, datetime | None]  # sha, message, branch, started_at of a history point's commit


_SHA_COLUMNS: dict[int, tuple[Sequence[Any], np.ndarray]] = {}  # id(commits) -> (commits, their shas)


def _sha_column(commits: Sequence[Any]) -> np.ndarray:
    """The shas of a chip's commit table (``HistoryPoints._commits``, shared by its series) as an object array, made
    once per table: a series' shas are then one take of it. An entry holds its table, so that no other table can
    have its id meanwhile; a few are kept."""
    found = _SHA_COLUMNS.get(id(commits))
    if found is not None and found[0] is commits:
        return found[1]
    column = np.empty(len(commits), dtype=object)
    column[:] = [commit[0] for commit in commits]
    if len(_SHA_COLUMNS) >= 16:
        _SHA_COLUMNS.clear()
    _SHA_COLUMNS[id(commits)] = (commits, column)
    return column


class HistoryPoints(Sequence[HistoryPoint]):
    """A series' points in history order, kept as columns and made into ``HistoryPoint`` records on access.

    A report holds millions of points (1,000 commits x 1,600 series) and reads nearly all of them only as numbers
    (plots, the commit axis): ``shas``, ``median``, ``ci_low``, ``ci_high`` and ``n`` give the columns, indexing
    and iteration the records. Equal when the records are.
    """

    __slots__ = ("_commits", "_shas", "rows", "median", "ci_low", "ci_high", "n")

    def __init__(self, commits: Sequence[CommitInfo], rows: Sequence[int], median: Sequence[float],
                 ci_low: Sequence[float], ci_high: Sequence[float], n: Sequence[int]) -> None:
        self._commits = commits  # shared by every series of a chip; ``rows`` index it
        self._shas: list[str] | None = None
        self.rows = np.asarray(rows, dtype=np.int64)
        self.median, self.ci_low, self.ci_high = (np.asarray(v, dtype=np.float64) for v in (median, ci_low, ci_high))
        self.n = np.asarray(n, dtype=np.int64)

    @classmethod
    def of(cls, points: Iterable[HistoryPoint]) -> HistoryPoints:
        listed = list(points)
        return cls([(p.sha, p.message, p.branch, p.started_at) for p in listed], range(len(listed)),
                   [p.median for p in listed], [p.ci_low for p in listed], [p.ci_high for p in listed],
                   [p.n for p in listed])

    @property
    def shas(self) -> list[str]:
        """Each point's commit sha (made once; do not modify the list)."""
        if self._shas is None:
            self._shas = _sha_column(self._commits)[self.rows].tolist()
        return self._shas

    def __len__(self) -> int:
        return int(self.rows.size)

    def order_key(self) -> tuple[int, bytes]:
        """Equal for two histories whose points are the same commits in the same order, by the same commit table
        (a chip's series share one): their orders compared without reading the shas, while both are alive."""
        return id(self._commits), self.rows.tobytes()

    def _point(self, i: int) -> HistoryPoint:
        return HistoryPoint(*self._commits[int(self.rows[i])], float(self.median[i]), float(self.ci_low[i]),
                            float(self.ci_high[i]), int(self.n[i]))

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return HistoryPoints(self._commits, self.rows[index], self.median[index], self.ci_low[index],
                                 self.ci_high[index], self.n[index])
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self._point(index % len(self) if index < 0 else index)

    def __iter__(self) -> Iterator[HistoryPoint]:
        commits = self._commits
        for row, median, low, high, n in zip(self.rows.tolist(), self.median.tolist(), self.ci_low.tolist(),
                                             self.ci_high.tolist(), self.n.tolist(), strict=True):
            yield HistoryPoint(*commits[row], median, low, high, n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HistoryPoints | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"HistoryPoints({list(self)!r})"


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
    points: HistoryPoints  # records given as a sequence are kept as columns
    change_points: tuple[ChangeFlag, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.points, HistoryPoints):
            object.__setattr__(self, "points", HistoryPoints.of(self.points))


@dataclass(frozen=True)
class RegressionEvidence(_Plain):
    """An entry of the regression list: a new correctness failure, or a confirmed slowdown vs the previous point
    ("performance"; "unproven" where ancestry does not prove the previous point came first: not confirmed)."""

    kind: Literal["correctness", "performance", "unproven"]
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
    trials_base: int | None = None  # performance: independent trials (job processes, over the point's runs) per side
    trials_head: int | None = None
    basis: str = ""  # performance: the spread that decided, "trials" (between processes) or "history" (between runs)
    noise: float | None = None  # performance: that spread, as a log sd per trial or run
    detectable: float | None = None  # performance: the smallest relative change the comparison could detect

    @property
    def key(self) -> SeriesKey:
        return SeriesKey(self.kernel, self.variant, self.dtype, self.shape_key, self.chip)


@dataclass(frozen=True)
class NoiseRow(_Plain):
    """One series' noise on one chip, each level a log sd (~ relative sd): inside a process, between the
    processes (trials) of one run, between runs (its recent base-branch history); ``detectable`` is the smallest
    change a comparison with as many trials per side would detect."""

    key: SeriesKey
    median_s: float
    trials: int
    within: float
    between_trial: float
    between_run: float
    history_runs: int
    detectable: float
    mode: str  # how the samples were timed ("pipelined", "per-call"; "" when not recorded)


@dataclass(frozen=True)
class ChipNoise(_Plain):
    """A chip's noise in one figure per level: the median and 90th percentile over its series."""

    chip: str
    run_ids: tuple[str, ...]
    series: int
    with_history: int
    levels: dict[str, tuple[float, float]]  # level -> (median, p90) over series (nan when no series has it)
    host_paced: int = 0  # series whose device waited for the host (harness.stats.pacing)


@dataclass(frozen=True)
class NoiseReport(_Plain):
    chips: tuple[ChipNoise, ...]
    rows: tuple[NoiseRow, ...]
