"""Render the static report site from plain data (no ORM, no statistics here).

Pages (all in one folder, relative links only, CSS inlined, no script, nothing fetched):

- ``index.html``: every chip with its latest commit and status, links to everything below;
- ``chip-<key>.html``: identity, calibrated peaks, correctness matrix, variant comparison, benchmarks;
- ``variants.html``: the cross-chip variant matrix, divergent variants first;
- ``history-<kernel>--<chip>.html``: per-series history plots (inline SVG) and the commit table;
- ``regressions.html``: new correctness failures, then confirmed regressions, with their evidence.

Inputs are the plain records of ``harness.record.query`` (chips, runs with jobs) and ``harness.analysis``
(``VariantMatrix``, ``SeriesHistory``, ``RegressionEvidence``); records are read by attribute, so any object
with the same fields renders. Templates autoescape everything; the only ``Markup`` is the SVG built by
``reports.svg``, which escapes every text it embeds (hover texts built here are escaped before being marked safe).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from harness.core.status import CORRECTNESS_KINDS, PASSES, drop_explained_selections, is_code_failure
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


def environment() -> Environment:
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(time=fmt_time, rate=fmt_rate, num=fmt_num, chip_page=chip_page_name, scaled=fmt_scaled,
                       p=fmt_p, when=fmt_when, first_line=first_line, ratio_ci=fmt_ratio_ci,
                       anchor=commit_anchor)
    env.globals.update(history_page=history_page_name)
    return env


# --- chip page pieces --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantRow:
    """One (kernel, dtype, shape): every variant's median and its ratio to the kernel's baseline variant."""

    kernel: str
    dtype: str
    shape_key: str
    baseline: str
    cells: dict[str, dict[str, Any]]


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
        rows.append(VariantRow(kernel, dtype, shape_key, baseline, cells))
    return rows


@dataclass
class CorrectnessTable:
    """One kernel's correctness matrix: rows are cases (check, dtype, shape), columns its variants."""

    kernel: str
    variants: list[str]
    rows: list[dict[str, Any]]  # {"check", "dtype", "shape_key", "cells": {variant: job}}
    counts: dict[str, int] = field(default_factory=dict)


def correctness_tables(jobs: Iterable[Mapping[str, Any]], baselines: Mapping[str, str]) -> list[CorrectnessTable]:
    by_kernel: dict[str, dict[tuple[str, str, str], dict[str, Mapping[str, Any]]]] = defaultdict(dict)
    variants: dict[str, set[str]] = defaultdict(set)
    for job in jobs:
        if job["kind"] != "correctness":
            continue
        case = (job["check_name"], job["dtype"], job["shape_key"])
        by_kernel[job["kernel"]].setdefault(case, {})[job["variant"]] = job
        variants[job["kernel"]].add(job["variant"])
    tables = []
    for kernel in sorted(by_kernel):
        default = baselines.get(kernel)
        ordered = sorted(variants[kernel], key=lambda v: (v != default, v))
        counts: dict[str, int] = defaultdict(int)
        rows = []
        for (check, dtype, shape_key), cells in sorted(by_kernel[kernel].items()):
            for job in cells.values():
                counts[job["status"]] += 1
            rows.append({"check": check, "dtype": dtype, "shape_key": shape_key, "cells": cells})
        tables.append(CorrectnessTable(kernel, ordered, rows, dict(counts)))
    return tables


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
    """One pytest selection of a run: its own job and its distinct tests' outcomes."""

    name: str
    status: str
    detail: str
    counts: dict[str, int]


def test_selections(jobs: Iterable[Mapping[str, Any]]) -> list[Selection]:
    jobs = list(jobs)
    outcomes: dict[str, dict[str, str]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] == "test":
            outcomes[job["kernel"]][job["key"]] = job["status"]
    selections = []
    for job in jobs:
        if job["kind"] == "pytest":
            counts: dict[str, int] = defaultdict(int)
            for status in outcomes[job["kernel"]].values():
                counts[status] += 1
            selections.append(Selection(job["kernel"], job["status"], job["detail"] or "", dict(counts)))
    return sorted(selections, key=attrgetter("name"))


def failing_tests(jobs: Iterable[Mapping[str, Any]], failing_before: set[str]) -> list[dict[str, Any]]:
    """The run's failing tests (and selections that failed without a test), newly failing first: ``new`` is true
    for one that did not fail in the chip's run before."""
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
    if job.get("detail"):
        parts.append(str(job["detail"])[:300])
    return " · ".join(parts)


# --- the cross-chip variant matrix --------------------------------------------------------------------------------


@dataclass
class MatrixRow:
    kernel: str
    dtype: str
    shape_key: str
    default: str
    cells: dict[str, list[Any]]  # chip -> VariantCell-like records, by variant name
    best: dict[str, str]  # chip -> best variant


def matrix_rows(matrix: Any) -> tuple[list[str], list[MatrixRow]]:
    """Group a VariantMatrix's cells into rows (kernel, dtype, shape) × columns (chips)."""
    if matrix is None:
        return [], []
    chips = sorted({cell.chip for cell in matrix.cells} | set(getattr(matrix, "shas", {}) or {}))
    rows: dict[tuple[str, str, str], MatrixRow] = {}
    for cell in matrix.cells:
        key = (cell.kernel, cell.dtype, cell.shape_key)
        row = rows.setdefault(key, MatrixRow(*key, cell.default_variant, {}, {}))
        row.cells.setdefault(cell.chip, []).append(cell)
    for best in matrix.best:
        row = rows.get((best.kernel, best.dtype, best.shape_key))
        if row is not None:
            row.best[best.chip] = best.variant
    for row in rows.values():
        for cells in row.cells.values():
            cells.sort(key=lambda c: c.variant)
    return chips, [rows[key] for key in sorted(rows)]


# --- history pages -------------------------------------------------------------------------------------------------


@dataclass
class CommitRow:
    index: int
    sha: str
    message: str
    branch: str
    started_at: Any
    notes: list[tuple[str, str, str]] = field(default_factory=list)  # (css class, text, href)


@dataclass
class SeriesPlot:
    svg_id: str
    variant: str
    dtype: str
    shape_key: str
    svg: Any
    last_median: float | None
    n_points: int
    changes: list[Any]
    regressions: list[tuple[int, Any]]


@dataclass
class HistoryPage:
    kernel: str
    chip: str
    name: str
    commits: list[CommitRow]
    plots: list[SeriesPlot]
    n_regressions: int = 0
    n_changes: int = 0


def history_pages(histories: Mapping[str, Sequence[Any]], regressions: Sequence[Any]) -> list[HistoryPage]:
    """One page per (kernel, chip): a plot per series on the page's commit axis, and that axis as a table."""
    reg_index: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
    for i, reg in enumerate(regressions):
        reg_index[(reg.chip, reg.kernel)].append((i, reg))
    pages = []
    for chip in sorted(histories):
        by_kernel: dict[str, list[Any]] = defaultdict(list)
        for series in histories[chip]:
            by_kernel[series.key.kernel].append(series)
        for kernel in sorted(by_kernel):
            pages.append(_history_page(chip, kernel, by_kernel[kernel], reg_index.get((chip, kernel), [])))
    return pages


def _commit_axis(series_list: list[Any]) -> tuple[list[str], dict[str, Any]]:
    """Every commit any series of the page has, in the history's order (analysis.history orders each series along
    the branch's first-parent line): the series' orders merged, ties by first appearance."""
    first_seen: dict[str, int] = {}
    info: dict[str, Any] = {}
    after: dict[str, set[str]] = defaultdict(set)
    waiting: dict[str, int] = defaultdict(int)
    for series in series_list:
        previous = None
        for point in series.points:
            if point.sha not in first_seen:
                first_seen[point.sha] = len(first_seen)
                info[point.sha] = point
            if previous is not None and previous != point.sha and point.sha not in after[previous]:
                after[previous].add(point.sha)
                waiting[point.sha] += 1
            previous = point.sha
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


def _history_page(chip: str, kernel: str, series_list: list[Any], regs: list[tuple[int, Any]]) -> HistoryPage:
    shas, info = _commit_axis(series_list)
    x_of = {sha: i for i, sha in enumerate(shas)}
    commits = [CommitRow(i, sha, info[sha].message, info[sha].branch, info[sha].started_at)
               for i, sha in enumerate(shas)]
    x_labels = [sha[:8] for sha in shas]
    # Per commit, once per page: the escaped hover text and the link to its row (shared by every plot).
    commit_text = [str(escape(f"{sha[:12]} {first_line(info[sha].message, 72)}")) for sha in shas]
    commit_href = [Markup(escape("#" + commit_anchor(sha))) for sha in shas]
    short_sha = [str(escape(sha[:10])) for sha in shas]
    regs_by_series: dict[tuple[str, str, str], list[tuple[int, Any]]] = defaultdict(list)
    broken_by_variant: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
    for i, reg in regs:
        if reg.kind == "performance":
            regs_by_series[(reg.variant, reg.dtype, reg.shape_key)].append((i, reg))
            label = f"regression {fmt_ratio_ci(reg.ratio, reg.ci_low, reg.ci_high)} {reg.variant}"
        else:
            broken_by_variant[(reg.variant, reg.dtype)].append((i, reg))
            label = f"correctness {reg.status}: {reg.variant} {reg.check}"
        if reg.head_sha in x_of:
            commits[x_of[reg.head_sha]].notes.append(("lose" if reg.kind == "performance" else "broken", label,
                                                      f"regressions.html#r-{i}"))
    get_sha, get_median = attrgetter("sha"), attrgetter("median")
    get_low, get_high = attrgetter("ci_low"), attrgetter("ci_high")

    def key_has_events(key: Any) -> bool:
        return bool(regs_by_series.get((key.variant, key.dtype, key.shape_key))
                    or broken_by_variant.get((key.variant, key.dtype)))

    plots = []
    n_changes = 0
    for series in sorted(series_list, key=lambda s: (s.key.dtype, s.key.shape_key, s.key.variant)):
        key, points = series.key, series.points
        plot_id = _plot_id(key)
        xs = [x_of[sha] for sha in map(get_sha, points)]
        ys = list(map(get_median, points))
        y_at = {p.sha: p.median for p in points} if series.change_points or key_has_events(key) else {}
        markers = []
        for cp in series.change_points:
            n_changes += 1
            title = (f"{cp.kind} at {cp.sha[:12]} {first_line(info[cp.sha].message, 80)}\n"
                     f"{fmt_time(cp.before)} → {fmt_time(cp.after)} (×{cp.ratio:.3f})")
            end = x_of.get(cp.end_sha) if cp.kind == "drift" else None
            markers.append(svg.Marker(x_of[cp.sha], y_at.get(cp.sha, cp.after), cp.kind, title,
                                      "#" + commit_anchor(cp.sha), end))
            commits[x_of[cp.sha]].notes.append(("change", f"{cp.kind} ×{cp.ratio:.3f} {key.variant} {key.dtype} "
                                                          f"{key.shape_key}", f"#plot-{plot_id}"))
        series_regs = [(i, r) for i, r in regs_by_series.get((key.variant, key.dtype, key.shape_key), [])
                       if r.head_sha in x_of]
        for i, reg in series_regs:
            title = (f"confirmed regression at {reg.head_sha[:12]} {first_line(reg.head_message, 80)}\n"
                     f"{fmt_ratio_ci(reg.ratio, reg.ci_low, reg.ci_high)} vs {(reg.base_sha or '')[:12]}, "
                     f"p(FDR)={fmt_p(reg.p_adjusted)}, n={reg.n_base}/{reg.n_head}")
            markers.append(svg.Marker(x_of[reg.head_sha], y_at.get(reg.head_sha, reg.head_median or math.nan),
                                      "regression", title, f"regressions.html#r-{i}"))
        for i, reg in broken_by_variant.get((key.variant, key.dtype), []):
            if reg.head_sha in x_of:
                title = (f"correctness {reg.status} at {reg.head_sha[:12]} {first_line(reg.head_message, 80)}\n"
                         f"{reg.check} {reg.shape_key}: {first_line(reg.detail, 120)}")
                markers.append(svg.Marker(x_of[reg.head_sha], math.nan, "broken", title, f"regressions.html#r-{i}"))

        def point_title(i: int, points=points, xs=xs) -> Markup:
            p = points[i]
            return Markup(f"{commit_text[xs[i]]}\nmedian {fmt_time(p.median)} "
                          f"[{fmt_time(p.ci_low)}, {fmt_time(p.ci_high)}] n={p.n}")

        def bucket_title(first: int, last: int, lowest: float, highest: float, xs=xs) -> Markup:
            return Markup(f"{last - first + 1} commits {short_sha[xs[first]]} … {short_sha[xs[last]]}\n"
                          f"median {fmt_time(lowest)} – {fmt_time(highest)}")

        def point_href(i: int, xs=xs) -> Markup:
            return commit_href[xs[i]]

        image = svg.history_plot(xs, ys, list(map(get_low, points)), list(map(get_high, points)), n_x=len(shas),
                                 y_format=fmt_time, point_title=point_title, point_href=point_href,
                                 bucket_title=bucket_title, markers=markers, x_labels=x_labels,
                                 label=f"{kernel} {key.variant} {key.dtype} {key.shape_key} on {chip}",
                                 max_points=MAX_PLOT_POINTS, plot_id=f"svg-{plot_id}")
        plots.append(SeriesPlot(plot_id, key.variant, key.dtype, key.shape_key, image, ys[-1] if ys else None,
                                len(points), list(series.change_points), series_regs))
    return HistoryPage(kernel, chip, history_page_name(kernel, chip), commits, plots,
                       sum(1 for _, r in regs if r.kind == "performance"), n_changes)


def _plot_id(key: Any) -> str:
    return hashlib.sha1("\0".join((key.variant, key.dtype, key.shape_key)).encode()).hexdigest()[:10]


# --- the site ------------------------------------------------------------------------------------------------------


def render_site(out_dir: str | Path, chips: list[dict[str, Any]], latest: dict[str, Any],
                baselines: dict[str, str], db_label: str, *, matrix: Any = None,
                histories: Mapping[str, Sequence[Any]] | None = None, regressions: Sequence[Any] = (),
                last: int | None = None, generated_at: str = "",
                failing_before: Mapping[str, set[str]] | None = None,
                noise: Mapping[str, Mapping[tuple[str, str, str, str], Any]] | None = None,
                checks: Mapping[str, str] | None = None) -> Path:
    """Write every page into ``out_dir``; returns the index path.

    ``latest``: chip key -> the latest ``RunView`` (with jobs) or None; ``matrix``: a ``VariantMatrix``;
    ``histories``: chip key -> its ``SeriesHistory`` list; ``regressions``: ``RegressionEvidence`` records,
    correctness failures first; ``last``: the histories and regressions cover each chip's last N commits only;
    ``failing_before``: chip key -> the job keys that failed correctness in the run before its latest (a failing
    test not among them is shown as new); ``noise``: chip key -> (kernel, variant, dtype, shape_key) -> that
    series' noise meter (``NoiseRow``: between trials, between runs, detectable change); ``checks``: correctness
    check name -> what it verifies, in one line.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    css = (STATIC / "report.css").read_text(encoding="utf-8")
    regressions = list(regressions)
    pages = history_pages(histories or {}, regressions)
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
              selections=test_selections(jobs),
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
