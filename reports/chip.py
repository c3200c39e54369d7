"""A chip page's pieces: its correctness tables, variant rows, test selections, scaling and roofline views."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

from markupsafe import Markup

from harness.core.status import (
    CORRECTNESS_KINDS,
    PASSES,
    drop_explained_selections,
    each_test_once,
    is_code_failure,
)
from reports import svg, xy
from reports.history import plot_hash
from reports.render import first_line, fmt_num, fmt_rate, fmt_time, fmt_when

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
    """The older runs a chip page takes jobs from (``from_run``, see ``harness.analysis.site_inputs``), newest
    first: each with its commit, how many of the shown jobs and which kernels or selections come from it."""
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
            series = [xy.XYSeries(v, lines[v], *styles[v]) for v in order if v in lines]
            title = f"{dtype} {fixed}: time against {param}"
            ticks = sorted({float(j["shape"][param]) for j in members})
            scaling.append((title, xy.xy_plot(series, xy.XYOptions(
                param, "median time per call", y_unit="s", x_ticks=ticks if len(ticks) <= 8 else (),
                label=f"{kernel} {title}", plot_id=f"scaling-{plot_hash(kernel, dtype, param + fixed)}"))))
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
        ceilings = [xy.Ceiling(f"copy bandwidth {fmt_rate(peak_bw, 'B/s')}",
                                [(lo, lo * peak_bw), (ridge, peak_flops)]),
                    xy.Ceiling(f"matmul peak {fmt_rate(peak_flops, 'FLOP/s')}",
                                [(ridge, peak_flops), (hi, peak_flops)])]
    series = [xy.XYSeries(v, marks[v], styles[v][0], line=False) for v in order if v in marks]
    return xy.xy_plot(series, xy.XYOptions(
        "arithmetic intensity (FLOP per byte moved)", "achieved FLOP/s (k, M, G, T, P)", x_unit="", y_unit="FLOP/s",
        ceilings=ceilings, label=f"{kernel} roofline", plot_id=f"roofline-{plot_hash(kernel, '', '')}"))
