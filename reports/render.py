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
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemBytecodeCache, PackageLoader, select_autoescape
from jinja2.bccache import Bucket
from markupsafe import Markup, escape

from harness.core.status import CORRECTNESS_KINDS, PASSES, drop_explained_selections, is_code_failure
from reports import evidence as evidence_pages
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
                       anchor=commit_anchor)
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
    (an expected failure, xfailed or xpassed, counts as passed)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for job in correctness_jobs(jobs):
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

        for (dtype, shape_key), members in sorted(by_case.items()):
            plot = _series_plot(kernel, chip_key, chip_index, dtype, shape_key, members, axis_of, axis, chip_shas,
                                styles, default, regs_by_series, broken, every,
                                drawn(chip_key, dtype, shape_key) if drawn is not None else None,
                                COMMIT_AXIS_TITLE if proven else COMMIT_AXIS_GUESSED)
            if plot is not None:
                n_changes += len(plot.changes)
                groups[(dtype, shape_key)].append(plot)
    ordered = [PlotGroup(dtype, shape_key, plots) for (dtype, shape_key), plots in sorted(groups.items())]
    return HistoryPage(kernel, chip, name, axis.commits, ordered, list(chips), links, n_regressions, n_changes,
                       sum(len(series) for series in chips.values()), proven)


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
    x_axis = axis() if draw else None
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
    return svg.Series(variant, xs, points.median.tolist(), points.ci_low.tolist(), points.ci_high.tolist(),
                      point_title, point_href, point_name, f"{variant} on {chip}", color, dash, tuple(markers),
                      legend_title, is_default)


def _plot_id(chip: str, dtype: str, shape_key: str) -> str:
    return hashlib.sha1("\0".join((chip, dtype, shape_key)).encode()).hexdigest()[:10]


# --- the site ------------------------------------------------------------------------------------------------------


def render_site(out_dir: str | Path, chips: list[dict[str, Any]], latest: dict[str, Any],
                baselines: dict[str, str], db_label: str, *, matrix: Any = None,
                histories: Mapping[str, Sequence[Any]] | None = None, regressions: Sequence[Any] = (),
                last: int | None = None, generated_at: str = "",
                failing_before: Mapping[str, set[str]] | None = None,
                noise: Mapping[str, Mapping[tuple[str, str, str, str], Any]] | None = None,
                checks: Mapping[str, str] | None = None, evidence: Any = None) -> Path:
    """Write every page into ``out_dir``; returns the index path.

    ``latest``: chip key -> the shown ``RunView`` (with jobs) or None: the chip's newest run, its jobs completed
    from older runs (each such job's ``from_run`` names its run; ``harness.render.site``); ``matrix``: a
    ``VariantMatrix``;
    ``histories``: chip key -> its ``SeriesHistory`` list; ``regressions``: ``RegressionEvidence`` records,
    correctness failures first; ``last``: the histories and regressions cover each chip's last N commits only;
    ``failing_before``: chip key -> the job keys that failed correctness in the run before its latest (a failing
    test not among them is shown as new); ``noise``: chip key -> (kernel, variant, dtype, shape_key) -> that
    series' noise meter (``NoiseRow``: between trials, between runs, detectable change); ``checks``: correctness
    check name -> what it verifies, in one line; ``evidence``: commit links, run ids, compare and samples pages
    (``harness.render.site.Evidence``, see ``reports.evidence``; None: plain shas, no such pages).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    css = (STATIC / "report.css").read_text(encoding="utf-8")
    regressions = list(regressions)
    pages = history_pages(histories or {}, regressions, baselines)  # per (kernel, chip), and per kernel
    common = {"css": css, "db_label": db_label, "generated_at": generated_at, "last": last,
              "history_names": {page.name for page in pages}}
    pages_of_chip: dict[str, list[HistoryPage]] = defaultdict(list)
    for page in pages:
        pages_of_chip[page.chip].append(page)
    regs_of_chip: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for i, reg in enumerate(regressions):
        regs_of_chip[reg.chip].append((i, reg))
    matrix_chips, rows = matrix_rows(matrix)

    def write(name: str, template: str, **context: Any) -> Path:
        path = out / name
        path.write_text(env.get_template(template).render(**common, **context), encoding="utf-8")
        return path

    # --- the evidence path (reports.evidence): commit links and run ids on every page, compare and samples pages
    found = evidence_pages.links(evidence)
    env.globals.update(commit_ref=found.commit_ref, web_link=found.web_link, run_ids=found.run_ids)
    env.filters.update(pct_change=evidence_pages.change, pct=evidence_pages.percent,
                       noise_text=evidence_pages.noise_text)
    common["evidence"] = found
    evidence_pages.write_pages(write, found)
    # --- end of the evidence path

    summary = {}
    for chip in chips:
        run = latest.get(chip["key"])
        jobs = run.jobs if run else []
        chip_regs = regs_of_chip.get(chip["key"], [])
        at_latest = [(i, r) for i, r in chip_regs if run and r.head_sha == run.sha]
        summary[chip["key"]] = {"correctness": correctness_counts(jobs), "regressions": at_latest,
                                "all_regressions": chip_regs}
        verdicts = {(c.kernel, c.dtype, c.shape_key, c.variant): c for c in (matrix.cells if matrix else ())
                    if c.chip == chip["key"]}
        winners = {(b.kernel, b.dtype, b.shape_key): b.variant for b in (matrix.best if matrix else ())
                   if b.chip == chip["key"] and b.evidence is not None}
        write(chip_page_name(chip["key"]), "chip.html.j2", chip=chip, run=run, summary=summary[chip["key"]],
              verdicts=verdicts, winners=winners, checks=checks or {},
              correctness_tables=correctness_tables(jobs, baselines), cell_title=cell_title,
              correctness=[j for j in jobs if j["kind"] == "correctness"],
              failures=[j for j in jobs if j["kind"] == "correctness" and is_code_failure(j["status"])],
              benchmarks=[j for j in jobs if j["kind"] == "benchmark" and j["status"] != "skipped"],
              skipped_benchmarks=skipped_groups(jobs),
              noise=(noise or {}).get(chip["key"], {}),
              calibration=[j for j in jobs if j["kind"] == "calibration"],
              variant_rows=variant_rows(jobs, baselines), history_pages=pages_of_chip.get(chip["key"], []),
              selections=test_selections(jobs, (failing_before or {}).get(chip["key"], set())),
              sources=run_sources(jobs),
              failing_tests=failing_tests(jobs, (failing_before or {}).get(chip["key"], set())))
    for page in pages:
        write(page.name, "history.html.j2", page=page, legend=svg.legend(), max_points=MAX_PLOT_POINTS)
    write("variants.html", "variants.html.j2", matrix=matrix, chips=matrix_chips, rows=rows)
    write("regressions.html", "regressions.html.j2", regressions=list(enumerate(regressions)))
    kernels = sorted({page.kernel for page in pages})
    page_names = {(page.kernel, page.chip): page for page in pages}
    return write("index.html", "index.html.j2", chips=chips, latest=latest, summary=summary, kernels=kernels,
                 history=page_names, n_regressions=len(regressions),
                 n_correctness=sum(1 for r in regressions if r.kind == "correctness"),
                 n_divergent=len(matrix.divergent) if matrix is not None else 0, matrix_rows=len(rows))
