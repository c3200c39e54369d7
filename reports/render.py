"""Render the static report site from plain data (no ORM, no statistics here).

Pages (all in one folder, relative links only but for commits' web pages, CSS inlined, nothing fetched; one
inline script, ``static/report.js``, sorts and filters tables and writes the hover texts of long histories, allowed
by each page's CSP through its hash only):

- ``index.html``: every chip with its latest commit and status, links to everything below;
- ``chip-<key>.html``: identity, calibrated peaks, correctness matrix, variant comparison, benchmarks;
- ``variants.html``: the cross-chip variant matrix, divergent variants first;
- ``history-<kernel>--<chip>.html``: a plot per (dtype, shape) overlaying the variants (inline SVG, its log-axis
  layer behind a checkbox) and the commit table; ``histories-<kernel>.html``: the same on every chip, a chip selector;
- ``regressions.html``: new correctness failures, then confirmed regressions, with their evidence.
- ``compare-*.html`` and ``samples-*.html``: the evidence path, a compare page per chip and per regression and the
  raw samples behind them (``reports.evidence``).

Inputs are the plain records of ``harness.record.query`` (chips, runs with jobs) and ``harness.analysis``
(``VariantMatrix``, ``SeriesHistory``, ``RegressionEvidence``); records are read by attribute, so any object
with the same fields renders. Templates autoescape everything; the only ``Markup`` is the SVG built by
``reports.svg``, which escapes every text it embeds (hover texts built here are escaped before being marked safe).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, FileSystemBytecodeCache, PackageLoader, select_autoescape
from jinja2.bccache import Bucket
from markupsafe import Markup, escape

from harness.core.status import (
    CORRECTNESS_KINDS,
    PASSES,
    drop_explained_selections,
    each_test_once,
    is_code_failure,
)
from harness.stats import noise, runshift
from reports import svg

STATIC = Path(__file__).resolve().parent / "static"
MAX_PLOT_POINTS = 120  # per plot; longer histories are downsampled into this many buckets


# --- formatting ------------------------------------------------------------------------------------------------


def fmt_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_rate(value: float | None, unit: str) -> str:
    if not value:
        return "–"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def fmt_num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"


def fmt_scaled(value: float | None, scale: float) -> str:
    """A rate in a fixed unit (TFLOP/s, GB/s) so a column compares at a glance."""
    return "–" if not value else f"{value / scale:.3g}"


def fmt_p(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def fmt_when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value or "")[:16].replace("T", " ")


def first_line(text: str | None, limit: int = 90) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def breakable(text: Any, after: str = ",") -> Markup:
    """Escaped text that may wrap only after one of ``after`` (a shape key after its commas, a variant name after
    "_" too), so a wide table shrinks to the page without cutting ``S_q=2048`` in two."""
    escaped = str(escape(str(text)))
    for char in after:
        escaped = escaped.replace(char, char + "<wbr>")
    return Markup(escaped)


def fmt_ratio_ci(ratio: float | None, low: float | None, high: float | None) -> str:
    if ratio is None or not math.isfinite(ratio):
        return "–"
    text = f"×{ratio:.3f}"
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        text += f" [{low:.3f}, {high:.3f}]"
    return text


# --- file names --------------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    """A file-name-safe form; when characters had to be replaced, a short hash keeps distinct names distinct."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text)
    if cleaned != text or not cleaned:
        cleaned = f"{cleaned[:40]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return cleaned


def chip_page_name(chip_key: str) -> str:
    return "chip-" + re.sub(r"[^A-Za-z0-9._-]", "_", chip_key) + ".html"


def history_page_name(kernel: str, chip_key: str) -> str:
    return f"history-{_slug(kernel)}--{re.sub(r'[^A-Za-z0-9._-]', '_', chip_key)}.html"


def commit_anchor(sha: str) -> str:
    return "c-" + re.sub(r"[^A-Za-z0-9]", "", sha)[:16]


class _TemplateCodeCache(FileSystemBytecodeCache):
    """The templates' compiled code kept between processes, in jinja2's per-user folder of the temporary
    directory: a report runs as a process of its own, and compiling the templates was about 0.3 s of each. jinja2
    compiles a template again when its source or jinja2 itself changed, but not when the environment's options
    did: the files are named by a digest of this module, where they are set. A folder that cannot be read or
    written costs a compile, never a page."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except OSError:
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _template_code_cache() -> _TemplateCodeCache | None:
    options = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    try:
        return _TemplateCodeCache(pattern=f"__harness_reports_{options}_%s.cache")
    except (OSError, RuntimeError):  # no safe folder of this user's (jinja2 checks its owner and mode)
        return None


def environment() -> Environment:
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True, bytecode_cache=_template_code_cache())
    env.filters.update(time=fmt_time, rate=fmt_rate, num=fmt_num, chip_page=chip_page_name, scaled=fmt_scaled,
                       p=fmt_p, when=fmt_when, first_line=first_line, ratio_ci=fmt_ratio_ci,
                       anchor=commit_anchor, iso=fmt_iso)
    env.globals.update(history_page=history_page_name)
    env.filters["breakable"] = breakable  # shape keys and variant names in wide tables
    env.globals.update(page_script())  # the tables' script and its CSP source (base.html.j2)
    return env


def page_script() -> dict[str, Any]:
    """The one inline script of every page (``static/report.js``: sortable, filterable tables, the hover texts of
    bucketed histories) and the CSP source that allows exactly it, ``'sha256-<base64 of its SHA-256>'``: nothing
    else may run, nothing is fetched."""
    text = (STATIC / "report.js").read_text(encoding="utf-8")
    if "</" in text or "<!--" in text:  # it would end the <script> element early
        raise ValueError("static/report.js must not contain '</' or '<!--'")
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return {"page_script": Markup(text), "page_script_csp": f"'sha256-{digest}'"}


# --- chip page pieces --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantRow:
    """One (kernel, dtype, shape): every variant's median and its ratio to the kernel's baseline variant."""

    kernel: str
    dtype: str
    shape_key: str
    baseline: str
    cells: dict[str, dict[str, Any]]
    sources: tuple[str, ...] = ()  # commits of the older runs some of its medians come from (a chip page)


def variant_rows(jobs: list[dict[str, Any]], baselines: dict[str, str]) -> list[VariantRow]:
    """Ratio of each variant's median time to the baseline's on the same shape (>1 means slower)."""
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] == "benchmark" and job["median_s"]:
            groups[(job["kernel"], job["dtype"], job["shape_key"])][job["variant"]] = job
    rows = []
    for (kernel, dtype, shape_key), by_variant in sorted(groups.items()):
        baseline = baselines.get(kernel, "")
        base = by_variant.get(baseline)
        cells = {}
        for variant, job in sorted(by_variant.items()):
            ratio = job["median_s"] / base["median_s"] if base else None
            cells[variant] = {"median_s": job["median_s"], "ratio": ratio, "pct_peak": job.get("pct_peak")}
        older = sorted({job["from_run"]["sha"][:8] for job in by_variant.values() if job.get("from_run")})
        rows.append(VariantRow(kernel, dtype, shape_key, baseline, cells, tuple(older)))
    return rows


MAX_VARIANT_COLUMNS = 8  # a correctness matrix wider than this is cut into tables of this many variant columns


@dataclass
class SkippedVariants:
    """Variants skipped in every case of a kernel's correctness matrix for one reason: one line, no column."""

    reason: str
    variants: list[str]


@dataclass
class CorrectnessTable:
    """One kernel's correctness matrix: rows are cases (check, dtype, shape, with the tolerance they are held to),
    columns its variants; variants skipped in every case are named once (``skipped``) instead of a column each."""

    kernel: str
    variants: list[str]
    rows: list[dict[str, Any]]  # {"check", "dtype", "shape_key", "tolerance", "cells": {variant: job}}
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[SkippedVariants] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # commits of older runs its jobs come from (chip pages)

    @property
    def column_groups(self) -> list[list[str]]:
        """The variant columns in tables of at most ``MAX_VARIANT_COLUMNS`` (a page stays as wide as the screen)."""
        n = max(1, -(-len(self.variants) // MAX_VARIANT_COLUMNS))  # as few tables as the limit allows, even sizes
        size = -(-len(self.variants) // n) if self.variants else 1
        return [self.variants[i:i + size] for i in range(0, len(self.variants), size)] or [[]]


def _skip_reason(job: Mapping[str, Any]) -> str:
    return first_line(job.get("detail"), 200).replace(f"variant {job['variant']} ", "the variant ") or "no reason given"


def _row_tolerance(cells: Iterable[Mapping[str, Any]]) -> float | None:
    """The tolerance a case is held to: the largest of its variants' (they share one per dtype)."""
    values = [job["tolerance"] for job in cells if job.get("tolerance") is not None]
    return max(values) if values else None


def correctness_tables(jobs: Iterable[Mapping[str, Any]], baselines: Mapping[str, str]) -> list[CorrectnessTable]:
    by_kernel: dict[str, dict[tuple[str, str, str], dict[str, Mapping[str, Any]]]] = defaultdict(dict)
    variants: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] != "correctness":
            continue
        case = (job["check_name"], job["dtype"], job["shape_key"])
        by_kernel[job["kernel"]].setdefault(case, {})[job["variant"]] = job
        variants[job["kernel"]].setdefault(job["variant"], []).append(job)
    tables = []
    for kernel in sorted(by_kernel):
        default = baselines.get(kernel)
        skipped: dict[str, list[str]] = defaultdict(list)
        columns = []
        for variant, variant_jobs in sorted(variants[kernel].items(), key=lambda item: (item[0] != default, item[0])):
            reasons = {_skip_reason(job) for job in variant_jobs if job["status"] == "skipped"}
            if len(reasons) == 1 and all(job["status"] == "skipped" for job in variant_jobs):
                skipped[reasons.pop()].append(variant)
            else:
                columns.append(variant)
        counts: dict[str, int] = defaultdict(int)
        rows = []
        for (check, dtype, shape_key), cells in sorted(by_kernel[kernel].items()):
            for job in cells.values():
                counts[job["status"]] += 1
            rows.append({"check": check, "dtype": dtype, "shape_key": shape_key, "cells": cells,
                         "tolerance": _row_tolerance(cells.values())})
        sources = sorted({job["from_run"]["sha"][:12] for job_list in variants[kernel].values() for job in job_list
                          if job.get("from_run")})
        tables.append(CorrectnessTable(kernel, columns, rows, dict(counts),
                                       [SkippedVariants(reason, names) for reason, names in sorted(skipped.items())],
                                       sources))
    return tables


def run_sources(jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The older runs a chip page takes jobs from (``from_run``, see ``harness.render.site``), newest first: each
    with its commit, how many of the shown jobs and which kernels or selections come from it."""
    found: dict[str, dict[str, Any]] = {}
    for job in jobs:
        source = job.get("from_run")
        if source:
            entry = found.setdefault(source["id"], {**source, "n": 0, "kernels": set()})
            entry["n"] += 1
            entry["kernels"].add(str(job["kernel"]))
    return sorted(({**entry, "kernels": sorted(entry["kernels"])} for entry in found.values()),
                  key=lambda entry: (fmt_when(entry.get("started_at")), entry["id"]), reverse=True)


def correctness_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A run's correctness evidence, each thing once: kernel checks, repository tests, and a pytest selection's own
    job only where no test of it was stored (it did not collect, crashed or timed out)."""
    return drop_explained_selections((job for job in jobs if job["kind"] in CORRECTNESS_KINDS), itemgetter("kind"),
                                     itemgetter("kernel"))


def correctness_counts(jobs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """passed / failed (failed, error, crashed, timeout) / skipped counts of a run's correctness jobs and tests
    (an expected failure, xfailed or xpassed, counts as passed), each test once however many selections ran it."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for job in each_test_once(correctness_jobs(jobs), itemgetter("kind"), itemgetter("name"), itemgetter("status")):
        status = job["status"]
        counts["failed" if is_code_failure(status) else "passed" if status in PASSES else
               "skipped" if status == "skipped" else "failed"] += 1
    return counts


@dataclass
class SkippedGroup:
    """The benchmark jobs of a run skipped for one reason, shown as one line."""

    reason: str
    jobs: list[Mapping[str, Any]]

    @property
    def variants(self) -> list[str]:
        return sorted({str(job["variant"]) for job in self.jobs})


def skipped_groups(jobs: Iterable[Mapping[str, Any]]) -> list[SkippedGroup]:
    """Skipped benchmark jobs grouped by their reason (e.g. "CUDA not available"; a reason that names the job's own
    variant is read with "the variant" in its place), largest group first."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for job in jobs:
        if job["kind"] == "benchmark" and job["status"] == "skipped":
            reason = first_line(job["detail"], 200).replace(f"variant {job['variant']} ", "the variant ")
            groups[reason or "no reason given"].append(job)
    return sorted((SkippedGroup(reason, members) for reason, members in groups.items()),
                  key=lambda group: (-len(group.jobs), group.reason))


@dataclass
class Selection:
    """One pytest selection of a run: its own job, its distinct tests' outcomes and every test (``tests``: new
    failures first, then the ones failing before too, then the other outcomes), and the older run it comes from on
    a chip page (``source``, None when from the newest run)."""

    name: str
    status: str
    detail: str
    counts: dict[str, int]
    tests: list[dict[str, Any]] = field(default_factory=list)
    source: dict[str, Any] | None = None

    @property
    def new_failures(self) -> int:
        return sum(1 for test in self.tests if test["failing"] and test["new"])


TEST_ORDER = ("failed", "error", "crashed", "timeout", "xpassed", "skipped", "xfailed", "passed")


def _test_order(test: Mapping[str, Any]) -> tuple:
    status = test["status"]
    rank = TEST_ORDER.index(status) if status in TEST_ORDER else len(TEST_ORDER)
    return (not (test["failing"] and test["new"]), not test["failing"], rank, test["name"])


def test_selections(jobs: Iterable[Mapping[str, Any]], failing_before: Set[str] = frozenset()) -> list[Selection]:
    """Each pytest selection with every one of its tests; a failing test is ``new`` unless its key failed in the
    chip's run before (``failing_before``)."""
    jobs = list(jobs)
    tests: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] == "test":
            failing = is_code_failure(job["status"])
            tests[job["kernel"]][job["key"]] = {**job, "failing": failing,
                                                "new": failing and job["key"] not in failing_before}
    selections = []
    for job in jobs:
        if job["kind"] == "pytest":
            counts: dict[str, int] = defaultdict(int)
            for test in tests[job["kernel"]].values():
                counts[test["status"]] += 1
            selections.append(Selection(job["kernel"], job["status"], job["detail"] or "", dict(counts),
                                        sorted(tests[job["kernel"]].values(), key=_test_order), job.get("from_run")))
    return sorted(selections, key=attrgetter("name"))


def failing_tests(jobs: Iterable[Mapping[str, Any]], failing_before: Set[str]) -> list[dict[str, Any]]:
    """The run's failing tests (and selections that failed without a test), newly failing first: ``new`` is true
    for one that did not fail in the chip's run before (it passed there, or did not run)."""
    failing = [{**job, "new": job["key"] not in failing_before} for job in correctness_jobs(jobs)
               if job["kind"] != "correctness" and is_code_failure(job["status"])]
    return sorted(failing, key=lambda job: (not job["new"], job["kernel"], job["name"]))


def cell_title(job: Mapping[str, Any]) -> str:
    """Hover text of a correctness cell: the error against its bound, and the detail."""
    parts = [job["status"]]
    if job.get("max_error") is not None:
        parts.append(f"max error {fmt_num(job['max_error'])}")
    if job.get("tolerance") is not None:
        parts.append(f"tolerance {fmt_num(job['tolerance'])}")
    if job.get("from_run"):
        parts.append(f"from the older run at {job['from_run']['sha'][:12]}")
    if job.get("detail"):
        parts.append(str(job["detail"])[:300])
    return " · ".join(parts)


# --- the cross-chip variant matrix --------------------------------------------------------------------------------


@dataclass
class MatrixRow:
    """One (kernel, dtype, shape): per variant and chip its verdict, or why there is none."""

    kernel: str
    dtype: str
    shape_key: str
    default: str
    cells: dict[str, list[Any]]  # chip -> VariantCell-like records, by variant name
    best: dict[str, str]  # chip -> best variant
    variants: list[str] = field(default_factory=list)  # the row's variants other than the default, sorted
    by_variant: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant -> chip -> cell
    gaps: dict[str, dict[str, str]] = field(default_factory=dict)  # chip -> variant -> why it has no verdict there
    absent: dict[str, str] = field(default_factory=dict)  # chip -> why the chip has no verdict in this row at all
    sources: dict[str, str] = field(default_factory=dict)  # chip -> which older runs its verdicts come from

    @property
    def measured_on(self) -> list[str]:
        return sorted(self.cells)

    @property
    def shared(self) -> bool:
        """Measured on two chips or more: the rows that can show which variant wins on which chip."""
        return len(self.cells) > 1


def _reason_summary(reasons: Iterable[str]) -> str:
    """One line for several variants' reasons: the reason when they agree, else each with its count."""
    counts: dict[str, int] = defaultdict(int)
    for reason in reasons:
        counts[reason] += 1
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{reason} ({n})" for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def matrix_rows(matrix: Any) -> tuple[list[str], list[MatrixRow]]:
    """Group a VariantMatrix's cells into rows (kernel, dtype, shape) × columns (chips): rows measured on two chips
    or more first, then by kernel, dtype and shape. A chip with no verdict in a row says why (``absent``, from the
    matrix's gaps); a chip whose verdicts of the row come from an older run than its newest names that commit."""
    if matrix is None:
        return [], []
    chips = sorted({cell.chip for cell in matrix.cells} | set(getattr(matrix, "shas", {}) or {}))
    newest = dict(getattr(matrix, "shas", {}) or {})
    rows: dict[tuple[str, str, str], MatrixRow] = {}
    for cell in matrix.cells:
        key = (cell.kernel, cell.dtype, cell.shape_key)
        row = rows.setdefault(key, MatrixRow(*key, cell.default_variant, {}, {}))
        row.cells.setdefault(cell.chip, []).append(cell)
        row.by_variant.setdefault(cell.variant, {})[cell.chip] = cell
    for gap in getattr(matrix, "gaps", ()):
        row = rows.get((gap.kernel, gap.dtype, gap.shape_key))
        if row is not None:
            row.gaps.setdefault(gap.chip, {})[gap.variant] = gap.reason
            row.by_variant.setdefault(gap.variant, {})
    for best in matrix.best:
        row = rows.get((best.kernel, best.dtype, best.shape_key))
        if row is not None:
            row.best[best.chip] = best.variant
    for row in rows.values():
        for chip, cells in row.cells.items():
            cells.sort(key=lambda c: c.variant)
            older = [c.sha for c in cells if getattr(c, "sha", "") and newest.get(chip) and c.sha != newest[chip]]
            if older:
                shas = ", ".join(sorted({sha[:12] for sha in older}))
                row.sources[chip] = (f"from the older run at {shas}" if len(older) == len(cells) else
                                     f"{len(older)} of {len(cells)} verdicts from the older run at {shas}")
        row.variants = sorted(v for v in row.by_variant if v != row.default)
        for chip in chips:
            if chip not in row.cells:
                row.absent[chip] = _reason_summary(row.gaps.get(chip, {}).values()) or "no verdict on this chip"
    ordered = sorted(rows, key=lambda key: (not rows[key].shared, key))
    return chips, [rows[key] for key in ordered]


@dataclass(frozen=True)
class ChipTally:
    """One variant's verdicts on one chip, over every (dtype, shape) of its kernel compared there; ``shared_*``
    over the rows measured on two chips or more; ``median_ratio``: the median of its cells' ratios (< 1: faster)."""

    chip: str
    cells: int
    wins: int
    losses: int
    ties: int
    inconclusive: int
    broken: int
    shared: int
    shared_wins: int
    shared_losses: int
    median_ratio: float


@dataclass(frozen=True)
class VariantRollup:
    """A variant of a kernel across chips: its tally per chip. ``divergent``: it wins on one chip and loses on
    another (on any of their shapes), the answer a kernel engineer looks for first."""

    kernel: str
    variant: str
    default_variant: str
    chips: tuple[ChipTally, ...]

    @property
    def divergent(self) -> bool:
        return any(a.wins and b.losses for a in self.chips for b in self.chips if a.chip != b.chip)

    @property
    def spread(self) -> float:
        """How far apart its chips' median ratios are (log scale): the roll-up's order after divergence."""
        logs = [math.log(t.median_ratio) for t in self.chips if t.median_ratio > 0]
        return max(logs) - min(logs) if logs else 0.0


def variant_rollup(matrix: Any) -> list[VariantRollup]:
    """Per (kernel, variant) of a VariantMatrix: its verdicts on each chip counted, the divergent variants first,
    then by how far apart its chips' median ratios are, then by name."""
    if matrix is None:
        return []
    rows_on: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    grouped: dict[tuple[str, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    defaults: dict[str, str] = {}
    for cell in matrix.cells:
        rows_on[(cell.kernel, cell.dtype, cell.shape_key)].add(cell.chip)
        grouped[(cell.kernel, cell.variant)][cell.chip].append(cell)
        defaults[cell.kernel] = cell.default_variant
    rollups = []
    for (kernel, variant), by_chip in grouped.items():
        tallies = []
        for chip, cells in sorted(by_chip.items()):
            shared = [c for c in cells if len(rows_on[(c.kernel, c.dtype, c.shape_key)]) > 1]
            ratios = [c.ratio for c in cells if c.ratio is not None and math.isfinite(c.ratio)]

            def count(outcome: str, among: list[Any] = cells) -> int:
                return sum(1 for c in among if c.outcome == outcome)

            tallies.append(ChipTally(chip, len(cells), count("win"), count("lose"), count("tie"),
                                     count("inconclusive"), count("broken"), len(shared), count("win", shared),
                                     count("lose", shared), statistics.median(ratios) if ratios else math.nan))
        rollups.append(VariantRollup(kernel, variant, defaults[kernel], tuple(tallies)))
    return sorted(rollups, key=lambda r: (not r.divergent, -r.spread, r.kernel, r.variant))


# --- scaling and roofline views of a chip page ----------------------------------------------------------------------

MAX_SCALING_PLOTS = 3  # per kernel: the (dtype, fixed parameters) groups with the most points


@dataclass
class KernelViews:
    """One kernel's views on a chip page: a roofline (every variant and shape under the chip's calibrated ceilings)
    and scaling plots (time against the grid parameter that varies most, one line per variant)."""

    kernel: str
    roofline: Markup | None
    scaling: list[tuple[str, Markup]]
    variants: int


def _styles(variants: Iterable[str], default: str | None) -> dict[str, tuple[str, str]]:
    ordered = sorted(set(variants), key=lambda v: (v != default, v))
    return {v: svg.style_of(i) for i, v in enumerate(ordered)}


def _measured(job: Mapping[str, Any]) -> bool:
    return job["kind"] == "benchmark" and job["status"] == "passed" and bool(job.get("median_s")) and \
        job["median_s"] > 0 and isinstance(job.get("shape"), Mapping)


def _line_length(param: str, members: list[Mapping[str, Any]]) -> int:
    """The most values of ``param`` one variant has among ``members``: the longest line of their plot."""
    values: dict[str, set[Any]] = defaultdict(set)
    for j in members:
        values[j["variant"]].add(j["shape"][param])
    return max((len(v) for v in values.values()), default=0)


def _scaling_groups(jobs: list[Mapping[str, Any]]) -> list[tuple[str, str, tuple[tuple[str, Any], ...],
                                                                  list[Mapping[str, Any]]]]:
    """(dtype, parameter, the other parameters' values, jobs) of the groups where one numeric grid parameter varies
    (a variant with two values of it or more), the parameter with the longest lines per dtype; longest first."""
    found = []
    for dtype in sorted({j["dtype"] for j in jobs}):
        of_dtype = [j for j in jobs if j["dtype"] == dtype]
        numeric = {k for j in of_dtype for k, v in j["shape"].items() if isinstance(v, int | float)
                   and not isinstance(v, bool)}
        # a log axis: a parameter with a value of 0 or below (a flag such as causal=0/1) is no grid parameter
        params = sorted(k for k in numeric if all(isinstance(j["shape"].get(k, 1), int | float)
                                                  and j["shape"].get(k, 1) > 0 for j in of_dtype))
        best: tuple[int, str, dict[tuple[tuple[str, Any], ...], list[Mapping[str, Any]]]] | None = None
        for param in params:
            groups: dict[tuple[tuple[str, Any], ...], list[Mapping[str, Any]]] = defaultdict(list)
            for j in of_dtype:
                if param in j["shape"]:
                    rest = tuple(sorted((k, v) for k, v in j["shape"].items() if k != param))
                    groups[rest].append(j)
            width = max((_line_length(param, g) for g in groups.values()), default=0)
            if width >= 2 and (best is None or width > best[0]):
                best = (width, param, groups)
        if best is not None:
            _, param, groups = best
            for rest, members in groups.items():
                if _line_length(param, members) >= 2:
                    found.append((dtype, param, rest, members))
    return sorted(found, key=lambda g: (-_line_length(g[1], g[3]), -len(g[3]), g[0], g[2]))


def chip_views(jobs: Iterable[Mapping[str, Any]], peak_flops: float | None, peak_bytes_per_s: float | None,
               baselines: Mapping[str, str]) -> list[KernelViews]:
    """Per kernel of a chip page's run: its roofline and its scaling plots, from the benchmark jobs shown (their
    medians, FLOPs and bytes: nothing read beyond the page's own jobs)."""
    by_kernel: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for job in jobs:
        if _measured(job):
            by_kernel[job["kernel"]].append(job)
    views = []
    for kernel, kernel_jobs in sorted(by_kernel.items()):
        styles = _styles((j["variant"] for j in kernel_jobs), baselines.get(kernel))
        order = list(styles)
        roofline = _roofline(kernel, kernel_jobs, styles, order, peak_flops, peak_bytes_per_s)
        scaling = []
        for dtype, param, rest, members in _scaling_groups(kernel_jobs)[:MAX_SCALING_PLOTS]:
            fixed = ",".join(f"{k}={v}" for k, v in rest)
            lines: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
            for j in sorted(members, key=lambda j: j["shape"][param]):
                lines[j["variant"]].append((float(j["shape"][param]), float(j["median_s"]),
                                            f"{j['variant']} {param}={j['shape'][param]}: {fmt_time(j['median_s'])}"))
            series = [svg.XYSeries(v, lines[v], *styles[v]) for v in order if v in lines]
            title = f"{dtype} {fixed}: time against {param}"
            ticks = sorted({float(j["shape"][param]) for j in members})
            scaling.append((title, svg.xy_plot(series, x_title=param, y_title="median time per call", y_unit="s",
                                               x_ticks=ticks if len(ticks) <= 8 else (),
                                               label=f"{kernel} {title}",
                                               plot_id=f"scaling-{_plot_id(kernel, dtype, param + fixed)}")))
        views.append(KernelViews(kernel, roofline, scaling, len(styles)))
    return views


def _roofline(kernel: str, jobs: list[Mapping[str, Any]], styles: Mapping[str, tuple[str, str]], order: list[str],
              peak_flops: float | None, peak_bw: float | None) -> Markup | None:
    marks: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for j in jobs:
        flops, moved = j.get("flops") or 0.0, j.get("bytes_moved") or 0.0
        if flops > 0 and moved > 0:
            rate = flops / j["median_s"]
            marks[j["variant"]].append((flops / moved, rate, f"{j['variant']} {j['dtype']} {j['shape_key']}: "
                                        f"{fmt_rate(rate, 'FLOP/s')} at {flops / moved:.4g} FLOP/B, "
                                        f"{fmt_time(j['median_s'])}"))
    if not marks:
        return None
    ais = [x for pts in marks.values() for x, _, _ in pts]
    ceilings = []
    if peak_flops and peak_bw and peak_flops > 0 and peak_bw > 0:
        lo, hi = min(ais) / 4, max(ais) * 4
        ridge = peak_flops / peak_bw
        lo, hi = min(lo, ridge / 2), max(hi, ridge * 2)
        ceilings = [svg.Ceiling(f"copy bandwidth {fmt_rate(peak_bw, 'B/s')}",
                                [(lo, lo * peak_bw), (ridge, peak_flops)]),
                    svg.Ceiling(f"matmul peak {fmt_rate(peak_flops, 'FLOP/s')}",
                                [(ridge, peak_flops), (hi, peak_flops)])]
    series = [svg.XYSeries(v, marks[v], styles[v][0], line=False) for v in order if v in marks]
    return svg.xy_plot(series, x_title="arithmetic intensity (FLOP per byte moved)",
                       y_title="achieved FLOP/s (k, M, G, T, P)", x_unit="", y_unit="FLOP/s", ceilings=ceilings,
                       label=f"{kernel} roofline", plot_id=f"roofline-{_plot_id(kernel, '', '')}")


# --- the regression list ------------------------------------------------------------------------------------------


def regression_id(reg: Any) -> str:
    """A regression's id, the same in every build (``harness ack ID``): 12 hex digits of a digest of its kind,
    chip, series (or check) and commits."""
    parts = (reg.kind, reg.chip, reg.kernel, reg.variant, reg.dtype, reg.shape_key, getattr(reg, "check", ""),
             reg.base_sha or "", reg.head_sha)
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:12]


@dataclass
class RegressionGroup:
    """The regressions of one kind at one commit of one chip (against one previous commit): one row of the list,
    its series inside. ``items``: (index in the list, regression, its id); ``acked``: the ids acknowledged."""

    kind: str
    chip: str
    head_sha: str
    base_sha: str | None
    items: list[tuple[int, Any, str]]
    acked: set[str]
    range_url: str | None = None

    @property
    def anchor(self) -> str:
        return f"g-{self.kind[0]}-" + hashlib.sha1("\0".join((self.chip, self.base_sha or "", self.head_sha))
                                                   .encode()).hexdigest()[:10]

    @property
    def first(self) -> Any:
        return self.items[0][1]

    @property
    def all_acked(self) -> bool:
        return all(rid in self.acked for _, _, rid in self.items)

    @property
    def worst(self) -> Any:
        """The largest slowdown (performance) or the first failure."""
        return max((r for _, r, _ in self.items), key=lambda r: r.ratio or 0.0)


def range_url(commit_url: str | None, head: str, base: str | None) -> str | None:
    """The repository host's view of the commits from ``base`` to ``head``, from ``head``'s commit page as
    ``harness.spec.weburl`` makes it (or a ``--commit-url`` of those hosts): GitHub's and GitLab's
    ``compare/BASE...HEAD``, Bitbucket's branch compare; None for any other host."""
    if not commit_url or not base or not commit_url.endswith(head) or not commit_url.startswith("https://"):
        return None
    stem = commit_url[:-len(head)]
    host = stem[len("https://"):].split("/", 1)[0]
    if host.startswith("gitlab.") and stem.endswith("/-/commit/"):
        return f"{stem[:-len('/-/commit/')]}/-/compare/{base}...{head}"
    if host.startswith("github.") and stem.endswith("/commit/"):
        return f"{stem[:-len('/commit/')]}/compare/{base}...{head}"
    if host == "bitbucket.org" and stem.endswith("/commits/"):
        return f"{stem[:-len('/commits/')]}/branches/compare/{head}%0D{base}"
    return None


def regression_groups(regressions: Sequence[Any], acks: Mapping[str, Any] | None = None,
                      commit_urls: Mapping[str, str] | None = None) -> list[RegressionGroup]:
    """The list grouped by (kind, chip, previous commit, commit), newest commit first within a kind (correctness
    first); ``commit_urls`` (sha -> its web page) give each group its range link (``range_url``)."""
    groups: dict[tuple[str, str, str | None, str], RegressionGroup] = {}
    for i, reg in enumerate(regressions):
        key = (reg.kind, reg.chip, reg.base_sha, reg.head_sha)
        group = groups.get(key)
        if group is None:
            url = range_url((commit_urls or {}).get(reg.head_sha), reg.head_sha, reg.base_sha)
            group = groups[key] = RegressionGroup(reg.kind, reg.chip, reg.head_sha, reg.base_sha, [], set(), url)
        rid = regression_id(reg)
        group.items.append((i, reg, rid))
        if acks and rid in acks:
            group.acked.add(rid)

    def when(group: RegressionGroup) -> float:
        started = group.first.head_started_at
        return started.timestamp() if started is not None else 0.0

    return sorted(groups.values(), key=lambda g: (g.kind != "correctness", -when(g)))


def regressions_context(regressions: Sequence[Any], acks: Mapping[str, Any] | None = None,
                        commit_urls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``regressions.html`` and ``regressions.atom`` read: the list (with indices), its groups, the
    acknowledgements (id -> record with ``note``, ``acked_at``, ``acked_by``), and the feed's id and time."""
    groups = regression_groups(regressions, acks, commit_urls)
    times = [r.head_started_at for r in regressions if r.head_started_at is not None]
    digest = hashlib.sha256("\0".join(sorted({r.chip for r in regressions})).encode()).hexdigest()[:16]
    return {"regressions": list(enumerate(regressions)), "groups": groups, "acks": dict(acks or {}),
            "acked_count": sum(len(g.acked) for g in groups), "feed_id": digest,
            "feed_updated": fmt_iso(max(times) if times else None)}


def fmt_iso(value: Any) -> str:
    """An Atom date: ISO 8601 with a time zone (UTC when the value has none); the epoch for None."""
    if value is None:
        return "1970-01-01T00:00:00Z"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.isoformat(timespec="seconds") + "Z"
        return value.isoformat(timespec="seconds")
    return str(value)


# --- history pages -------------------------------------------------------------------------------------------------

TIME_AXIS_TITLE = "median time per call"
COMMIT_AXIS_TITLE = "commits along the branch's first-parent line, oldest → newest (commits off it after)"
ORDER_NOT_PROVEN = "order not proven by ancestry"
COMMIT_AXIS_GUESSED = f"commits, {ORDER_NOT_PROVEN}: placed by commit time where parents are not stored"


def kernel_history_page_name(kernel: str) -> str:
    """The page of one kernel's history on every chip (a prefix no per-chip history page can have)."""
    return f"histories-{_slug(kernel)}.html"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class CommitRow:
    index: int
    sha: str
    message: str
    branch: str
    started_at: Any
    notes: list[tuple[str, str, str]] = field(default_factory=list)  # (css class, text, href)
    chips: list[str] = field(default_factory=list)  # the page's chips with a timing at this commit


@dataclass
class VariantLine:
    """One variant's line in a plot: its colour and dash (the same on every plot of the kernel)."""

    name: str
    color: str
    dash: str
    default: bool
    last_median: float | None
    n_points: int


@dataclass
class SeriesPlot:
    """One (chip, dtype, shape): every variant's history overlaid on one commit axis and one y axis, in one SVG with
    a linear and a logarithmic layer (the page's checkbox picks one); ``missing``: the variants without a timing."""

    svg_id: str
    chip: str
    chip_index: int
    dtype: str
    shape_key: str
    svg: Any
    lines: list[VariantLine]
    missing: list[str]
    n_points: int  # commits with a timing of any variant
    changes: list[tuple[str, Any]]  # (variant, ChangeFlag)
    regressions: list[tuple[int, Any]]


@dataclass
class PlotGroup:
    """The plots of one (dtype, shape), one per chip that has it (next to each other on the page)."""

    dtype: str
    shape_key: str
    plots: list[SeriesPlot]


@dataclass
class HistoryPage:
    """A kernel's history on one chip (``chip``), or on every chip (``chip`` empty: a selector picks the chips)."""

    kernel: str
    chip: str
    name: str
    commits: list[CommitRow]
    groups: list[PlotGroup]
    chips: list[str] = field(default_factory=list)  # the chips shown, in selector order
    links: list[tuple[str, str]] = field(default_factory=list)  # (label, page): the kernel's other history pages
    n_regressions: int = 0
    n_changes: int = 0
    n_series: int = 0
    log_default: bool = False  # a plot spans more than LOG_SPAN: the page opens on the logarithmic axis
    spark: Markup = Markup("")  # a one-chip page: its sparkline (the index's cell)
    proven: bool = True  # the commits' order is proven by ancestry (else: by commit time, ORDER_NOT_PROVEN)

    @property
    def plots(self) -> list[SeriesPlot]:
        return [plot for group in self.groups for plot in group.plots]

    @property
    def chip_css(self) -> Markup:
        """The selector's rules (CSS only, so it works without script and shows every chip until one is unticked):
        an unticked chip's plots are hidden. Built from indices only: nothing to escape."""
        return Markup("\n".join(f"body:has(#show-chip-{i}:not(:checked)) .chip-{i} {{ display: none; }}"
                                 for i in range(len(self.chips))))


@dataclass
class HistoryPlan:
    """One history page's inputs: the chips and series it draws, each chip's (index, regression) of the kernel, the
    variants' styles, the kernel's default variant, the page's links, its file name, and its chip ("" for the page
    of every chip)."""

    kernel: str
    chips: dict[str, list[Any]]
    regs: dict[str, list[tuple[int, Any]]]
    styles: dict[str, tuple[str, str]]
    default: str
    links: list[tuple[str, str]]
    name: str
    chip: str
    proven: bool = True  # ancestry proves the order of every chip's commits (else: commit time, and said so)

    def draw(self, drawn: DrawnPlots | None = None) -> HistoryPage:
        """The page; ``drawn`` gives the SVG of a plot already drawn (``plot_key``), else it is drawn here."""
        return _history_page(self.kernel, self.chips, self.regs, self.styles, self.default, self.links, self.name,
                             self.chip, drawn, self.proven)


DrawnPlots = Callable[[str, str, str], "Markup | None"]
"""(chip, dtype, shape key) -> the SVG of that plot of the kernel, drawn already (by the chip's own history page,
which draws it byte for byte as the page of every chip does: ``_series_plot``), or None."""


def plot_key(chip: str, dtype: str, shape_key: str) -> str:
    """The id of a plot's SVG element (``svg-`` and ``_plot_id``): unique on a page, the same on every page."""
    return f"svg-{_plot_id(chip, dtype, shape_key)}"


def history_plans(histories: Mapping[str, Sequence[Any]], regressions: Sequence[Any],
                  baselines: Mapping[str, str] | None = None, unproven: Collection[str] = ()) -> list[HistoryPlan]:
    """The pages :func:`history_pages` draws, in its order, not yet drawn. ``unproven``: the chips whose commits
    are not all ordered by ancestry (their pages say so)."""
    reg_index: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
    for i, reg in enumerate(regressions):
        reg_index[(reg.chip, reg.kernel)].append((i, reg))
    by_kernel: dict[str, dict[str, list[Any]]] = defaultdict(dict)
    for chip in sorted(histories):
        for series in histories[chip]:
            by_kernel[series.key.kernel].setdefault(chip, []).append(series)
    plans = []
    for kernel in sorted(by_kernel):
        chips = by_kernel[kernel]
        default = (baselines or {}).get(kernel, "")
        names = sorted({s.key.variant for series in chips.values() for s in series}, key=lambda v: (v != default, v))
        styles = {name: svg.style_of(k) for k, name in enumerate(names)}
        every = kernel_history_page_name(kernel) if len(chips) > 1 else ""
        links = [(chip, history_page_name(kernel, chip)) for chip in chips]
        if every:
            links.append(("every chip", every))
        for chip, series in chips.items():
            plans.append(HistoryPlan(kernel, {chip: series}, {chip: reg_index.get((chip, kernel), [])}, styles,
                                     default, links, history_page_name(kernel, chip), chip, chip not in unproven))
        if every:
            plans.append(HistoryPlan(kernel, chips, {chip: reg_index.get((chip, kernel), []) for chip in chips},
                                     styles, default, links, every, "", not set(chips) & set(unproven)))
    return plans


def history_pages(histories: Mapping[str, Sequence[Any]], regressions: Sequence[Any],
                  baselines: Mapping[str, str] | None = None) -> list[HistoryPage]:
    """Per (kernel, chip) a page (``history_page_name``), and per kernel on two chips or more a page of every chip
    (``kernel_history_page_name``, a chip selector): one plot per (chip, dtype, shape) overlaying the variants,
    each variant in the same colour everywhere, on the chip's commit axis (the commits with a timing of the kernel
    there: a plot depends on its own chip's histories only); the page's commits (of all its chips) as a table. The
    page of every chip takes its plots from the chips' own pages (the same SVGs)."""
    pages: list[HistoryPage] = []
    svgs: dict[str, Markup] = {}  # the kernel's chip pages' plots
    for plan in history_plans(histories, regressions, baselines):
        if plan.chip:
            page = plan.draw()
            svgs.update(plot_svgs(page))
        else:
            page = plan.draw(lambda chip, dtype, shape_key, svgs=svgs: svgs.get(plot_key(chip, dtype, shape_key)))
            svgs = {}  # the kernel's pages are drawn: the next kernel's come
        pages.append(page)
    return pages


def plot_svgs(page: HistoryPage) -> dict[str, Markup]:
    """A drawn page's plots' SVGs by ``plot_key``."""
    return {plot_key(plot.chip, plot.dtype, plot.shape_key): plot.svg for plot in page.plots}


def _commit_axis(series_list: list[Any]) -> tuple[list[str], dict[str, Any]]:
    """Every commit any series of the page has, in the history's order (analysis.history orders each series along
    the branch's first-parent line): the series' orders merged, ties by first appearance."""
    first_seen: dict[str, int] = {}
    info: dict[str, Any] = {}
    after: dict[str, set[str]] = defaultdict(set)
    waiting: dict[str, int] = defaultdict(int)
    merged: set[tuple[str, ...]] = set()
    for series in series_list:
        shas = tuple(series.points.shas)
        if shas in merged:  # most series of a chip have the same commits: a second time adds nothing
            continue
        merged.add(shas)
        previous = None
        for index, sha in enumerate(shas):
            if sha not in first_seen:
                first_seen[sha] = len(first_seen)
                info[sha] = series.points[index]
            if previous is not None and previous != sha and sha not in after[previous]:
                after[previous].add(sha)
                waiting[sha] += 1
            previous = sha
    ready = sorted((sha for sha in first_seen if not waiting[sha]), key=first_seen.__getitem__)
    order: list[str] = []
    while ready:
        sha = ready.pop(0)
        order.append(sha)
        for nxt in after[sha]:
            waiting[nxt] -= 1
            if not waiting[nxt]:
                ready.append(nxt)
        ready.sort(key=first_seen.__getitem__)
    if len(order) < len(first_seen):  # the series disagree (no common order): first appearance
        order = sorted(first_seen, key=first_seen.__getitem__)
    return order, info


@dataclass
class _Axis:
    """The page's commit axis and what every plot shares of it (escaped once per page)."""

    shas: list[str]
    x_of: dict[str, int]
    info: dict[str, Any]
    commits: list[CommitRow]
    text: list[str]  # per commit: the escaped "sha subject" of hover texts
    href: list[Markup]  # per commit: the link to its row
    short: list[str]  # per commit: the short sha (of bucket hover texts, which the page script writes as text)


def _axis(series_list: list[Any]) -> _Axis:
    shas, info = _commit_axis(series_list)
    return _Axis(shas, {sha: i for i, sha in enumerate(shas)}, info,
                 [CommitRow(i, sha, info[sha].message, info[sha].branch, info[sha].started_at)
                  for i, sha in enumerate(shas)],
                 [str(escape(f"{sha[:10]} {first_line(info[sha].message, 72)}")) for sha in shas],
                 [Markup(escape("#" + commit_anchor(sha))) for sha in shas],
                 [sha[:10] for sha in shas])


def _sub_axis(axis: _Axis, used: Set[str]) -> _Axis:
    """``axis`` cut to the commits of ``used`` (a plot's own: no empty stretch where its variants have no point)."""
    if len(used) == len(axis.shas):
        return axis
    keep = [i for i, sha in enumerate(axis.shas) if sha in used]
    shas = [axis.shas[i] for i in keep]
    return _Axis(shas, {sha: i for i, sha in enumerate(shas)}, axis.info, [axis.commits[i] for i in keep],
                 [axis.text[i] for i in keep], [axis.href[i] for i in keep], [axis.short[i] for i in keep])


def _history_page(kernel: str, chips: Mapping[str, list[Any]], regs_of: Mapping[str, list[tuple[int, Any]]],
                  styles: Mapping[str, tuple[str, str]], default: str, links: list[tuple[str, str]], name: str,
                  chip: str, drawn: DrawnPlots | None = None, proven: bool = True) -> HistoryPage:
    axis = _axis([s for series in chips.values() for s in series])
    every = not chip
    groups: dict[tuple[str, str], list[SeriesPlot]] = defaultdict(list)
    n_changes = n_regressions = 0
    for chip_index, (chip_key, series_list) in enumerate(chips.items()):
        regs = regs_of.get(chip_key, [])
        n_regressions += sum(1 for _, r in regs if r.kind == "performance")
        chip_shas = {sha for s in series_list for sha in s.points.shas}
        for sha in chip_shas:
            axis.commits[axis.x_of[sha]].chips.append(chip_key)
        by_case: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for series in series_list:
            by_case[(series.key.dtype, series.key.shape_key)].append(series)
        regs_by_series: dict[tuple[str, str, str], list[tuple[int, Any]]] = defaultdict(list)
        broken: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
        for i, reg in regs:
            on = f" on {chip_key}" if every else ""
            if reg.kind == "performance":
                regs_by_series[(reg.variant, reg.dtype, reg.shape_key)].append((i, reg))
                label = f"regression {fmt_ratio_ci(reg.ratio, reg.ci_low, reg.ci_high)} {reg.variant}{on}"
            else:
                broken[(reg.variant, reg.dtype)].append((i, reg))
                label = f"correctness {reg.status}: {reg.variant} {reg.check}{on}"
            if reg.head_sha in axis.x_of:
                axis.commits[axis.x_of[reg.head_sha]].notes.append(
                    ("lose" if reg.kind == "performance" else "broken", label, f"regressions.html#r-{i}"))
        chip_axis: list[_Axis] = [axis] if len(chips) == 1 else []  # the same as on the chip's own page

        def axis_of(series_list: list[Any] = series_list, chip_axis: list[_Axis] = chip_axis) -> _Axis:
            if not chip_axis:  # built only when one of the chip's plots is drawn here
                chip_axis.append(_axis(series_list))
            return chip_axis[0]

        for (dtype, shape_key), members in sorted(by_case.items(), key=lambda item: shape_order(*item[0])):
            plot = _series_plot(kernel, chip_key, chip_index, dtype, shape_key, members, axis_of, axis, chip_shas,
                                styles, default, regs_by_series, broken, every,
                                drawn(chip_key, dtype, shape_key) if drawn is not None else None,
                                COMMIT_AXIS_TITLE if proven else COMMIT_AXIS_GUESSED)
            if plot is not None:
                n_changes += len(plot.changes)
                groups[(dtype, shape_key)].append(plot)
    ordered = [PlotGroup(dtype, shape_key, plots)
               for (dtype, shape_key), plots in sorted(groups.items(), key=lambda item: shape_order(*item[0]))]
    return HistoryPage(kernel, chip, name, axis.commits, ordered, list(chips), links, n_regressions, n_changes,
                       sum(len(series) for series in chips.values()),
                       spark=sparkline(chips[chip], default) if chip in chips else Markup(""), proven=proven,
                       log_default=any(_spans_tenfold(plot_series)
                                       for series_list in chips.values()
                                       for plot_series in _by_case(series_list).values()))


def _by_case(series_list: list[Any]) -> dict[tuple[str, str], list[Any]]:
    found: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for series in series_list:
        found[(series.key.dtype, series.key.shape_key)].append(series)
    return found


SPARK_POINTS = 100  # a sparkline's last commits (it is 120 pixels wide)


def sparkline(series_list: Sequence[Any], default: str | None = None) -> Markup:
    """A kernel's recent history on one chip in a line of 120 x 22 pixels (an index cell): per commit of its last
    ``SPARK_POINTS``, the geometric mean
    over its series (the default variant's, when it has any) of the median relative to the series' own geometric
    mean, on a log scale; the last change point of those series is a red dot. Empty when under two commits."""
    chosen = [s for s in series_list if s.points and s.key.variant == default] or [s for s in series_list if s.points]
    sums: dict[str, list[float]] = {}
    order: dict[str, int] = {}
    last_change: tuple[int, str] | None = None
    for series in chosen:
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(np.asarray(series.points.median, dtype=float)[-SPARK_POINTS:])
        ok = np.isfinite(logs)
        if not ok.any():
            continue
        relative = (logs - logs[ok].mean()).tolist()
        for sha, value, good in zip(series.points.shas[-SPARK_POINTS:], relative, ok.tolist(), strict=True):
            order.setdefault(sha, len(order))
            if good:
                sums.setdefault(sha, []).append(value)
        for cp in series.change_points:
            if cp.sha in order and (last_change is None or order[cp.sha] > last_change[0]):
                last_change = (order[cp.sha], cp.sha)
    shas = sorted(sums, key=order.__getitem__)
    if len(shas) < 2:
        return Markup("")
    ys = np.array([sum(sums[sha]) / len(sums[sha]) for sha in shas])
    lo, hi = float(ys.min()), float(ys.max())
    span = max(hi - lo, 0.02)  # a flat history stays flat: 2% of range at least
    width, height, pad = 120, 22, 3
    xs = np.linspace(pad, width - pad, len(shas))
    py = height - pad - (ys - lo) / span * (height - 2 * pad)
    dot = ""
    if last_change is not None and last_change[1] in sums:
        i = shas.index(last_change[1])
        dot = f'<circle cx="{xs[i]:.1f}" cy="{py[i]:.1f}" r="2.5" fill="#dc2626"/>'
    change = f", last change at {last_change[1][:8]}" if last_change else ""
    title = (f"{len(shas)} commits, spread ×{math.exp(hi - lo):.2f} (geometric mean of "
             f"{'the default variant' if chosen and chosen[0].key.variant == default else 'its series'}){change}")
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs.tolist(), py.tolist(), strict=True))
    return Markup(f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                  f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
                  f'<polyline points="{points}" fill="none" stroke="#1d4ed8" stroke-width="1.5"/>{dot}</svg>')


LOG_SPAN = 10.0
"""A plot whose medians span more than this factor opens on its logarithmic axis (the page's default)."""


def _spans_tenfold(series_list: list[Any]) -> bool:
    lows, highs = [], []
    for s in series_list:
        values = np.asarray(s.points.median, dtype=float)
        values = values[np.isfinite(values) & (values > 0)]
        if values.size:
            lows.append(values.min())
            highs.append(values.max())
    return bool(lows) and max(highs) > LOG_SPAN * min(lows)


def shape_order(dtype: str, shape_key: str) -> tuple[Any, ...]:
    """Shapes in numeric order (D=64 before D=128, H=4 before H=32): the key's numbers compared as numbers."""
    return (dtype, tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", shape_key)))


def _series_plot(kernel: str, chip: str, chip_index: int, dtype: str, shape_key: str, members: list[Any],
                 axis: Callable[[], _Axis], page_axis: _Axis, chip_shas: Set[str],
                 styles: Mapping[str, tuple[str, str]], default: str,
                 regs_by_series: Mapping[tuple[str, str, str], list[tuple[int, Any]]],
                 broken: Mapping[tuple[str, str], list[tuple[int, Any]]], every: bool,
                 image: Markup | None = None, x_title: str = COMMIT_AXIS_TITLE) -> SeriesPlot | None:
    """The variants of one (chip, dtype, shape) as one plot on the chip's commit axis (``axis()``: the commits of
    ``chip_shas`` in history order; None when none of them has a timing); its notes go to the page's commit table
    (``page_axis``). The SVG depends on the chip's histories alone, not on ``every`` or the page's other chips
    (``image``: that SVG, drawn already: the chip's axis is not needed then)."""
    members = sorted(members, key=lambda s: (s.key.variant != default, s.key.variant))
    drawn = [s for s in members if s.points]
    if not drawn:
        return None
    plot_id = _plot_id(chip, dtype, shape_key)
    where = f" on {chip}" if every else ""  # the page's notes; the SVG's texts always name the chip
    draw = image is None
    used = {sha for s in drawn for sha in s.points.shas} | {
        reg.head_sha for s in drawn for _, reg in broken.get((s.key.variant, dtype), []) if reg.head_sha in chip_shas}
    x_axis = _sub_axis(axis(), used) if draw else None
    plot_series, lines, changes, plot_regs, markers = [], [], [], [], []
    commits_with_points: set[str] = set()
    for series in drawn:
        variant, points = series.key.variant, series.points
        color, dash = styles[variant]
        shas, medians = points.shas, points.median.tolist()
        y_at = dict(zip(shas, medians, strict=True))
        commits_with_points.update(y_at)
        series_markers = []
        for cp in series.change_points:
            changes.append((variant, cp))
            page_axis.commits[page_axis.x_of[cp.sha]].notes.append(
                ("change", f"{cp.kind} ×{cp.ratio:.3f} {variant} {dtype} {shape_key}{where}", f"#plot-{plot_id}"))
            if x_axis is not None:
                title = (f"{cp.kind} in {variant} at {cp.sha[:10]} {first_line(x_axis.info[cp.sha].message, 80)}\n"
                         f"{fmt_time(cp.before)} → {fmt_time(cp.after)} (×{cp.ratio:.3f})")
                end = x_axis.x_of.get(cp.end_sha) if cp.kind == "drift" else None
                series_markers.append(svg.Marker(x_axis.x_of[cp.sha], y_at.get(cp.sha, cp.after), cp.kind, title,
                                                 "#" + commit_anchor(cp.sha), end))
        for i, reg in regs_by_series.get((variant, dtype, shape_key), []):
            if reg.head_sha not in chip_shas:
                continue
            plot_regs.append((i, reg))
            if x_axis is not None:
                title = (f"confirmed regression of {variant} at {reg.head_sha[:10]} "
                         f"{first_line(reg.head_message, 80)}\n"
                         f"{fmt_ratio_ci(reg.ratio, reg.ci_low, reg.ci_high)} vs {(reg.base_sha or '')[:10]}, "
                         f"p(FDR)={fmt_p(reg.p_adjusted)}, n={reg.n_base}/{reg.n_head}")
                series_markers.append(svg.Marker(x_axis.x_of[reg.head_sha],
                                                 y_at.get(reg.head_sha, reg.head_median or math.nan), "regression",
                                                 title, f"regressions.html#r-{i}"))
        last = points[-1]
        is_default = variant == default
        lines.append(VariantLine(variant, color, dash, is_default, last.median, len(points)))
        if x_axis is None:
            continue
        for i, reg in broken.get((variant, dtype), []):
            if reg.head_sha in chip_shas:
                title = (f"correctness {reg.status} of {variant} at {reg.head_sha[:10]} "
                         f"{first_line(reg.head_message, 80)}\n{reg.check} {reg.shape_key}: "
                         f"{first_line(reg.detail, 120)}")
                markers.append(svg.Marker(x_axis.x_of[reg.head_sha], math.nan, "broken", title,
                                          f"regressions.html#r-{i}"))
        plot_series.append(_svg_series(series, x_axis, styles, is_default, chip, series_markers))
    if x_axis is not None:
        label = f"{kernel} {dtype} {shape_key} on {chip}: {_plural(len(drawn), 'variant')}"
        x_labels = [sha[:8] for sha in x_axis.shas]
        image = svg.overlay_plot(plot_series, n_x=len(x_axis.shas), y_title=TIME_AXIS_TITLE, log=None,
                                 markers=markers, x_labels=x_labels, x_title=x_title, label=label,
                                 max_points=MAX_PLOT_POINTS, plot_id=f"svg-{plot_id}")
    return SeriesPlot(plot_id, chip, chip_index, dtype, shape_key, image, lines,
                      [s.key.variant for s in members if not s.points], len(commits_with_points), changes,
                      plot_regs)


def _svg_series(series: Any, axis: _Axis, styles: Mapping[str, tuple[str, str]], is_default: bool, chip: str,
                markers: list[svg.Marker]) -> svg.Series:
    """One variant's line of a plot on the chip's commit axis, with its hover texts and links."""
    variant, points = series.key.variant, series.points
    color, dash = styles[variant]
    xs = [axis.x_of[sha] for sha in points.shas]
    who = str(escape(f"{variant} on {chip}"))

    def point_title(i: int) -> Markup:
        p = points[i]
        return Markup(f"{axis.text[xs[i]]}\n{who}: median {fmt_time(p.median)}, 95% interval "
                      f"[{fmt_time(p.ci_low)}, {fmt_time(p.ci_high)}], {p.n} samples")

    def point_href(i: int) -> Markup:
        return axis.href[xs[i]]

    def point_name(i: int) -> str:  # a bucket's ends, in the hover text the page's script writes
        return axis.short[xs[i]]

    last = points[-1]
    legend_title = (f"{variant}{' (the default variant)' if is_default else ''}: latest {fmt_time(last.median)} "
                    f"at {last.sha[:10]}, {_plural(len(points), 'commit')}")
    band = threshold_band(series)
    threshold = None
    if band is not None:
        start, low, high, level, detectable = band
        threshold = (xs[start], low, high, f"{variant}: level {fmt_time(level)} since {points.shas[start][:10]} "
                     f"({_plural(len(points) - start, 'commit')}); a comparison detects ±{100 * detectable:.1f}% "
                     f"(the noise meter on its between-commit spread): outside the band is a detectable change")
    return svg.Series(variant, xs, points.median.tolist(), points.ci_low.tolist(), points.ci_high.tolist(),
                      point_title, point_href, point_name, f"{variant} on {chip}", color, dash, tuple(markers),
                      legend_title, is_default, threshold)


@cache
def _detect_per_sd(runs: int) -> float:
    """The noise meter's detectable log change per unit of floor sd, for a floor of ``runs`` runs (its quantiles
    depend on the run count alone: ``noise_meter`` is exp(k * sd) - 1; one call per run count, not per series)."""
    return float(np.log1p(noise.noise_meter([], runshift.Floor(1.0, runs)).detectable))


def threshold_band(series: Any) -> tuple[int, float, float, float, float] | None:
    """A series' detectable-change band around its last decided level: the points since its last change point
    (all of them without one), their median (the level) and the smallest change a comparison could detect
    against it (``noise.noise_meter`` with the between-commit spread of those points as its history floor);
    (first point's index, low, high, level, detectable), None under the floor's minimum of points."""
    start = 0
    for cp in series.change_points:
        start = max(start, cp.end_index if cp.kind == "drift" else cp.index)
    medians = np.asarray(series.points.median, dtype=float)[start:]
    floor = runshift.history_floor(medians)
    if floor is None:
        return None
    detectable = float(np.expm1(_detect_per_sd(floor.runs) * floor.sd))
    level = float(np.median(medians[np.isfinite(medians) & (medians > 0)]))
    if not (math.isfinite(detectable) and detectable > 0 and level > 0):
        return None
    return start, level / (1.0 + detectable), level * (1.0 + detectable), level, detectable


def _plot_id(chip: str, dtype: str, shape_key: str) -> str:
    return hashlib.sha1("\0".join((chip, dtype, shape_key)).encode()).hexdigest()[:10]
