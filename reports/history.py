"""The history pages: per kernel and chip a plot per (dtype, shape) of every variant, on one commit axis."""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np
from markupsafe import Markup, escape

from harness.stats import noise, runshift
from reports import svg
from reports.render import (
    MAX_PLOT_POINTS,
    commit_anchor,
    first_line,
    fmt_p,
    fmt_ratio_ci,
    fmt_time,
    fmt_when,
    history_page_name,
    slug,
)
from reports.sparkline import sparkline

# --- history pages -------------------------------------------------------------------------------------------------

TIME_AXIS_TITLE = "median time per call"
COMMIT_AXIS_TITLE = "commits along the branch's first-parent line, oldest → newest (commits off it after)"
ORDER_NOT_PROVEN = "order not proven by ancestry"
COMMIT_AXIS_GUESSED = f"commits, {ORDER_NOT_PROVEN}: placed by commit time where parents are not stored"


def kernel_history_page_name(kernel: str) -> str:
    """The page of one kernel's history on every chip (a prefix no per-chip history page can have)."""
    return f"histories-{slug(kernel)}.html"


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

    def commit_rows(self, commit_ref: Callable[[str], Markup]) -> Markup:
        """The commit table's rows (``commit_ref``: the template's), every text escaped: made here rather than in
        ``history.html.j2``, as a page has a row per commit and a template row costs several times more."""
        every = not self.chip
        rows = []
        for c in self.commits:
            flagged = ' class="flagged"' if c.notes else ""
            chips = f"<td>{escape(', '.join(sorted(c.chips, key=str.lower)))}</td>" if every else ""
            notes = "".join(f'<a class="badge {escape(cls)}" href="{escape(href)}">{escape(text)}</a>'
                            for cls, text, href in c.notes)
            anchor, cells = _commit_cells(c.sha, commit_ref(c.sha), c.started_at, c.branch, c.message)
            rows.append(f'<tr id="{anchor}"{flagged}><td class="num">{c.index}</td>{cells}{chips}<td>{notes}</td>'
                        "</tr>\n")
        return Markup("".join(rows))

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
        return _history_page(self, drawn)


DrawnPlots = Callable[[str, str, str], "Markup | None"]
"""(chip, dtype, shape key) -> the SVG of that plot of the kernel, drawn already (by the chip's own history page,
which draws it byte for byte as the page of every chip does: ``_series_plot``), or None."""


def plot_key(chip: str, dtype: str, shape_key: str) -> str:
    """The id of a plot's SVG element (``svg-`` and ``plot_id``): unique on a page, the same on every page."""
    return f"svg-{plot_hash(chip, dtype, shape_key)}"


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
    distinct: dict[tuple[str, ...], Any] = {}  # most series of a chip have the same commits: merged once
    orders: set[tuple[int, bytes]] = set()  # the same commits by the same table: the shas not read again
    for series in series_list:
        if (order := series.points.order_key()) not in orders:
            orders.add(order)
            distinct.setdefault(tuple(series.points.shas), series.points)
    return _holding_all(distinct) or _merged(distinct)


def _holding_all(distinct: dict[tuple[str, ...], Any]) -> tuple[list[str], dict[str, Any]] | None:
    """``_merged``'s answer without merging, where the longest order names no commit twice and holds every other as
    a subsequence (a chip's page, whose series mostly share one order; a page of every chip: the chips share their
    commits, one with a newer run has more): its consecutive pairs alone force that order. None otherwise."""
    longest = max(distinct, key=len)
    position = {sha: i for i, sha in enumerate(longest)}
    if len(position) != len(longest):
        return None
    for shas in distinct:
        last = -1
        for sha in shas:
            at = position.get(sha, -1)
            if at <= last:
                return None
            last = at
    info: dict[str, Any] = {}
    for shas, points in distinct.items():  # each commit's point from the first order that has it, as merged
        if len(info) == len(longest):
            break
        for sha, point in zip(shas, points, strict=True):
            info.setdefault(sha, point)
    return list(longest), info


def _merged(distinct: dict[tuple[str, ...], Any]) -> tuple[list[str], dict[str, Any]]:
    """The orders of ``distinct`` (each with its points) merged, ties by first appearance."""
    first_seen: dict[str, int] = {}
    info: dict[str, Any] = {}
    after: dict[str, set[str]] = defaultdict(set)
    waiting: dict[str, int] = defaultdict(int)
    for shas, points in distinct.items():
        previous = None
        for index, sha in enumerate(shas):
            if sha not in first_seen:
                first_seen[sha] = len(first_seen)
                info[sha] = points[index]
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
    placed: dict[tuple[int, bytes], tuple[list[int], np.ndarray]] = field(default_factory=dict, repr=False)

    def positions(self, points: Any) -> tuple[list[int], np.ndarray]:
        """The axis positions of ``points``' commits, as a list and an array (a chip's series share a few orders of
        points, ``HistoryPoints.order_key``: each placed once)."""
        order = points.order_key()
        if order not in self.placed:
            xs = list(map(self.x_of.__getitem__, points.shas))
            self.placed[order] = xs, np.array(xs, dtype=float)
        return self.placed[order]


def _axis(series_list: list[Any]) -> _Axis:
    shas, info = _commit_axis(series_list)
    records = [info[sha] for sha in shas]
    texts = list(map(_commit_texts, shas, [r.message for r in records]))
    rows = [CommitRow(i, sha, r.message, r.branch, r.started_at)
            for i, (sha, r) in enumerate(zip(shas, records, strict=True))]
    return _Axis(shas, {sha: i for i, sha in enumerate(shas)}, info, rows, [text for text, _ in texts],
                 [href for _, href in texts], [sha[:10] for sha in shas])


@lru_cache(maxsize=1 << 14)
def _commit_cells(sha: str, ref: str, started_at: Any, branch: str, message: str) -> tuple[str, str]:
    """A commit row's anchor and its cells from the sha to the subject, escaped (every history page of a build lists
    the same commits: each made once)."""
    return str(escape(commit_anchor(sha))), (
        f"<td>{ref}</td><td>{escape(fmt_when(started_at))}</td><td>{escape(branch)}</td>"
        f'<td title="{escape(message)}">{escape(first_line(message, 100))}</td>\n')


@lru_cache(maxsize=1 << 14)
def _commit_texts(sha: str, message: str) -> tuple[str, Markup]:
    """A commit's escaped "sha subject" of hover texts and its row's link (each page of a build names the same
    commits)."""
    return str(escape(f"{sha[:10]} {first_line(message, 72)}")), Markup(escape("#" + commit_anchor(sha)))


def _sub_axis(axis: _Axis, used: Set[str]) -> _Axis:
    """``axis`` cut to the commits of ``used`` (a plot's own: no empty stretch where its variants have no point)."""
    if len(used) == len(axis.shas):
        return axis
    keep = [i for i, sha in enumerate(axis.shas) if sha in used]
    shas = [axis.shas[i] for i in keep]
    return _Axis(shas, {sha: i for i, sha in enumerate(shas)}, axis.info, [axis.commits[i] for i in keep],
                 [axis.text[i] for i in keep], [axis.href[i] for i in keep], [axis.short[i] for i in keep])


def _history_page(plan: HistoryPlan, drawn: DrawnPlots | None = None) -> HistoryPage:
    kernel, chips, regs_of, styles, default = plan.kernel, plan.chips, plan.regs, plan.styles, plan.default
    links, name, chip, proven = plan.links, plan.name, plan.chip, plan.proven
    axis = _axis([s for series in chips.values() for s in series])
    every = not chip
    groups: dict[tuple[str, str], list[SeriesPlot]] = defaultdict(list)
    n_changes = n_regressions = 0
    for chip_index, (chip_key, series_list) in enumerate(chips.items()):
        regs = regs_of.get(chip_key, [])
        n_regressions += sum(1 for _, r in regs if r.kind == "performance")
        chip_shas = commits_of(series_list)
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
            elif reg.kind == "unproven":  # not confirmed: its previous point may not be before it
                label = (f"slowdown {fmt_ratio_ci(reg.ratio, reg.ci_low, reg.ci_high)} {reg.variant}{on}, "
                         f"{ORDER_NOT_PROVEN} (unconfirmed)")
            else:
                broken[(reg.variant, reg.dtype)].append((i, reg))
                label = f"correctness {reg.status}: {reg.variant} {reg.check}{on}"
            if reg.head_sha in axis.x_of:
                axis.commits[axis.x_of[reg.head_sha]].notes.append(
                    ({"performance": "lose", "unproven": "inconclusive"}.get(reg.kind, "broken"), label,
                     f"regressions.html#r-{i}"))
        chip_axis: list[_Axis] = [axis] if len(chips) == 1 else []  # the same as on the chip's own page

        def axis_of(series_list: list[Any] = series_list, chip_axis: list[_Axis] = chip_axis) -> _Axis:
            if not chip_axis:  # built only when one of the chip's plots is drawn here
                chip_axis.append(_axis(series_list))
            return chip_axis[0]

        on_chip = _OnChip(kernel, chip_key, chip_index, axis_of, axis, chip_shas, styles, default, regs_by_series,
                          broken, every, COMMIT_AXIS_TITLE if proven else COMMIT_AXIS_GUESSED)
        for (dtype, shape_key), members in sorted(by_case.items(), key=lambda item: shape_order(*item[0])):
            plot = _series_plot(on_chip, dtype, shape_key, members,
                                drawn(chip_key, dtype, shape_key) if drawn is not None else None)
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


def commits_of(series_list: Iterable[Any]) -> set[str]:
    """The commits of the series' points, each distinct order of points read once (a chip's series share a few:
    ``HistoryPoints.order_key``)."""
    distinct = {series.points.order_key(): series.points for series in series_list}
    return set().union(*(points.shas for points in distinct.values()))


def _by_case(series_list: list[Any]) -> dict[tuple[str, str], list[Any]]:
    found: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for series in series_list:
        found[(series.key.dtype, series.key.shape_key)].append(series)
    return found


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


@dataclass(frozen=True)
class _OnChip:
    """What the plots of one chip on a history page share: the kernel, the chip and its place on the page, its
    commit axis (``axis()``: the commits of ``chip_shas`` in history order, built when first needed) and the page's
    (``page_axis``), the variants' styles and default, the chip's regressions by series and correctness failures by
    (variant, dtype), whether the page is every chip's, and the x axis' title."""

    kernel: str
    chip: str
    chip_index: int
    axis: Callable[[], _Axis]
    page_axis: _Axis
    chip_shas: Set[str]
    styles: Mapping[str, tuple[str, str]]
    default: str
    regs_by_series: Mapping[tuple[str, str, str], list[tuple[int, Any]]]
    broken: Mapping[tuple[str, str], list[tuple[int, Any]]]
    every: bool
    x_title: str = COMMIT_AXIS_TITLE


def _series_plot(on_chip: _OnChip, dtype: str, shape_key: str, members: list[Any], image: Markup | None = None
                 ) -> SeriesPlot | None:
    """The variants of one (chip, dtype, shape) as one plot on the chip's commit axis (``axis()``: the commits of
    ``chip_shas`` in history order; None when none of them has a timing); its notes go to the page's commit table
    (``page_axis``). The SVG depends on the chip's histories alone, not on ``every`` or the page's other chips
    (``image``: that SVG, drawn already: the chip's axis is not needed then)."""
    kernel, chip, chip_index, axis, page_axis, chip_shas = (on_chip.kernel, on_chip.chip, on_chip.chip_index,
                                                            on_chip.axis, on_chip.page_axis, on_chip.chip_shas)
    styles, default, regs_by_series, broken, every, x_title = (on_chip.styles, on_chip.default,
                                                               on_chip.regs_by_series, on_chip.broken,
                                                               on_chip.every, on_chip.x_title)
    members = sorted(members, key=lambda s: (s.key.variant != default, s.key.variant))
    drawn = [s for s in members if s.points]
    if not drawn:
        return None
    plot_id = plot_hash(chip, dtype, shape_key)
    where = f" on {chip}" if every else ""  # the page's notes; the SVG's texts always name the chip
    draw = image is None
    commits_with_points = commits_of(drawn)
    used = commits_with_points | {
        reg.head_sha for s in drawn for _, reg in broken.get((s.key.variant, dtype), []) if reg.head_sha in chip_shas}
    x_axis = _sub_axis(axis(), used) if draw else None
    plot_series, lines, changes, plot_regs, markers = [], [], [], [], []
    for series in drawn:
        variant, points = series.key.variant, series.points
        color, dash = styles[variant]
        series_regs = regs_by_series.get((variant, dtype, shape_key), [])
        marked = series.change_points or series_regs  # the medians by commit are the markers' heights
        y_at = dict(zip(points.shas, points.median.tolist(), strict=True)) if marked else {}
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
        for i, reg in series_regs:
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
        image = svg.overlay_plot(plot_series, svg.PlotOptions(
            n_x=len(x_axis.shas), y_title=TIME_AXIS_TITLE, log=None, markers=markers, x_labels=x_labels,
            x_title=x_title, label=label, max_points=MAX_PLOT_POINTS, plot_id=f"svg-{plot_id}"))
    return SeriesPlot(plot_id, chip, chip_index, dtype, shape_key, image, lines,
                      [s.key.variant for s in members if not s.points], len(commits_with_points), changes,
                      plot_regs)


def _svg_series(series: Any, axis: _Axis, styles: Mapping[str, tuple[str, str]], is_default: bool, chip: str,
                markers: list[svg.Marker]) -> svg.Series:
    """One variant's line of a plot on the chip's commit axis, with its hover texts and links."""
    variant, points = series.key.variant, series.points
    color, dash = styles[variant]
    xs, placed = axis.positions(points)
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
    return svg.Series(variant, placed, points.median, points.ci_low, points.ci_high,
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
    ordered = np.sort(medians[np.isfinite(medians) & (medians > 0)])  # what the floor reads, sorted once for both
    floor = runshift.history_floor(ordered)
    if floor is None:
        return None
    detectable = float(np.expm1(_detect_per_sd(floor.runs) * floor.sd))
    level = float(runshift.sorted_median(ordered))
    if not (math.isfinite(detectable) and detectable > 0 and level > 0):
        return None
    return start, level / (1.0 + detectable), level * (1.0 + detectable), level, detectable


def plot_hash(chip: str, dtype: str, shape_key: str) -> str:
    return hashlib.sha1("\0".join((chip, dtype, shape_key)).encode()).hexdigest()[:10]
