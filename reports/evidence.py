"""The evidence path of the report site: commit links, run ids, compare pages and samples pages.

- ``compare-<chip>--<base>--<head>.html``: ``harness compare`` of one chip's two sides as a page: each chip's shown
  run against its previous run (the run ``harness run`` compares it with), and each pair of commits of the regression
  list; series rows in ``harness compare``'s order (broken, regressed, improved, inconclusive, unchanged) with ratio,
  interval, p (BH), trials and runs per side, the noise that decided and its basis, the smallest detectable change,
  and a marker where a side is a single run measured hours apart from the other;
- ``samples-<kernel>-<hash>.html``: the raw samples of one series behind one comparison (or of the shown run alone),
  a strip plot grouped by side, run and trial (``reports.strip``) and a table per trial.

Inputs are plain records read by attribute (``harness.analysis.site_evidence.Evidence``: ``CompareView``,
``SeriesSamples``), so this module imports nothing from the analysis. ``Links`` is what every page's template sees
as ``evidence`` (and ``commit_ref`` / ``web_link``): which page a chip, a regression or a benchmark row links to.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup, escape

from reports import strip
from reports.render import fmt_time, fmt_when

SIDE_COLORS = {"base": "#64748b", "head": "#2563eb"}


# --- names -----------------------------------------------------------------------------------------------------------


def _clean(text: str, limit: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:limit]


def _digest(*parts: Iterable[str] | str) -> str:
    flat = [p if isinstance(p, str) else "\x1f".join(p) for p in parts]
    return hashlib.sha1("\x1e".join(flat).encode()).hexdigest()[:12]


def side_label(side: Any) -> str:
    """A side in a few characters: the run id of a one-run side, the commit of a commit side."""
    return f"run {side.run_ids[0][:8]}" if side.kind == "run" else f"commit {side.sha[:8]}"


def compare_page_name(chip: str, base_runs: Iterable[str], head_runs: Iterable[str]) -> str:
    base_runs, head_runs = tuple(base_runs), tuple(head_runs)
    return (f"compare-{_clean(chip, 40)}--{_clean(base_runs[0], 8)}--{_clean(head_runs[0], 8)}-"
            f"{_digest(chip, base_runs, head_runs)[:6]}.html")


def samples_page_name(key: Any, base_runs: Iterable[str], head_runs: Iterable[str]) -> str:
    """One series (kernel, variant, dtype, shape, chip) behind one pair of run sets."""
    digest = _digest(key.chip, key.kernel, key.variant, key.dtype, key.shape_key, tuple(base_runs), tuple(head_runs))
    return f"samples-{_clean(key.kernel, 24)}-{digest}.html"


def series_anchor(key: Any) -> str:
    return _series_anchor(key.kernel, key.variant, key.dtype, key.shape_key)


@functools.lru_cache(maxsize=1 << 16)
def _series_anchor(kernel: str, variant: str, dtype: str, shape_key: str) -> str:
    """A series' anchor (a page names each of its series several times: its rows, its links)."""
    return "s-" + _digest(kernel, variant, dtype, shape_key)


def job_anchor(run_id: str, job_key: str) -> str:
    return "j-" + _digest(run_id, job_key)


# --- pages -----------------------------------------------------------------------------------------------------------


@dataclass
class CompareRowLink:
    row: Any  # a CompareRow
    anchor: str
    samples: str  # the samples page, "" when none was made
    runs: tuple[int, int]  # runs with samples of the series per side


@dataclass
class ComparePage:
    name: str
    view: Any  # a CompareView
    rows: list[CompareRowLink]
    base_label: str
    head_label: str

    @property
    def changed(self) -> list[CompareRowLink]:
        return [r for r in self.rows if r.row.verdict != "unchanged"]

    @property
    def unchanged(self) -> list[CompareRowLink]:
        return [r for r in self.rows if r.row.verdict == "unchanged"]

    @property
    def status(self) -> str:
        return "FAIL" if self.view.report.exit_code else "OK"


@dataclass
class TrialRow:
    side: str
    run: Any  # a RunBrief
    job_key: str
    anchor: str
    trial: int
    stored: int
    drawn: int
    median: float | None
    low: float | None
    high: float | None


@dataclass
class SamplesPage:
    name: str
    data: Any  # a SeriesSamples
    compare: ComparePage | None
    svg: Markup
    trials: list[TrialRow]
    stored: int
    drawn: int

    @property
    def key(self) -> Any:
        return self.data.key

    @property
    def anchor(self) -> str:
        """The series' row on its compare page."""
        return series_anchor(self.data.key)

    def trial_rows(self, commit_ref: Callable[[str], Markup]) -> Markup:
        """The trials table's rows (``commit_ref``: the template's), every text escaped: made here rather than in
        ``samples.html.j2``, as a full build writes thousands of them and a template row costs several times more."""
        rows = []
        for t in self.trials:
            run = t.run
            dirty = ' <span class="badge">dirty</span>' if run.dirty else ""
            of = f' <span class="muted">of {t.stored}</span>' if t.drawn != t.stored else ""
            rows.append(f'<tr id="{escape(t.anchor)}-t{t.trial}" class="{escape(t.side)}"><td>{escape(t.side)}</td>'
                        f'<td><code title="{escape(run.id)}">{escape(run.id[:12])}</code>{dirty}</td>'
                        f"<td>{commit_ref(run.sha)}</td><td>{escape(fmt_when(run.started_at))}</td>\n"
                        f'<td class="num">{t.trial}</td><td class="num">{t.drawn}{of}</td>\n'
                        f'<td class="num">{escape(fmt_time(t.median))}</td><td class="num">{escape(fmt_time(t.low))}'
                        f'</td><td class="num">{escape(fmt_time(t.high))}</td></tr>\n')
        return Markup("".join(rows))


@dataclass
class Links:
    """What the templates link to; empty (no links, plain shas) when the site is rendered without evidence."""

    commit_urls: Mapping[str, str] = field(default_factory=dict)
    runs_of: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    compares: list[ComparePage] = field(default_factory=list)
    samples: list[SamplesPage] = field(default_factory=list)
    shown: dict[str, ComparePage] = field(default_factory=dict)  # chip -> its shown run's compare page
    by_runs: dict[tuple[str, tuple[str, ...], tuple[str, ...]], ComparePage] = field(default_factory=dict)
    chip_samples: dict[tuple[str, str], dict[tuple[str, str, str, str], str]] = field(default_factory=dict)
    skipped_compares: int = 0
    _refs: dict[tuple[str, int], Markup] = field(default_factory=dict, init=False, repr=False, compare=False)

    def commit_ref(self, sha: str | None, length: int = 12) -> Markup:
        """A sha as ``<code>``, inside a link to its web page when one is known (made once per sha and length: a
        history page names each of a thousand commits, and ``Markup.format`` costs ~0.1 ms a call)."""
        if not sha:
            return Markup("")
        found = self._refs.get((sha, length))
        if found is None:
            code = f'<code title="{escape(sha)}">{escape(sha[:length])}</code>'
            url = self.commit_urls.get(sha)
            found = self._refs[(sha, length)] = Markup(
                f'<a class="commit-link" href="{escape(url)}" rel="noreferrer">{code}</a>' if url else code)
        return found

    def web_link(self, sha: str | None) -> Markup:
        """A small extra link to a sha's web page (for a sha that already links inside the site)."""
        url = self.commit_urls.get(sha or "")
        return (Markup(' <a class="commit-link web" href="{}" rel="noreferrer" title="{} on the web">web</a>')
                .format(url, sha) if url else Markup(""))

    def runs(self, chip: str, sha: str | None) -> tuple[str, ...]:
        return self.runs_of.get((chip, sha or ""), ())

    def run_ids(self, chip: str, sha: str | None, shown: int = 3) -> Markup:
        """`` · run <id>`` (the runs of ``sha`` on ``chip``, the first ``shown`` of them) or nothing."""
        ids = self.runs(chip, sha)
        if not ids:
            return Markup("")
        codes = Markup(", ").join(Markup('<code title="{}">{}</code>').format(i, i[:8]) for i in ids[:shown])
        more = Markup(" +{}").format(len(ids) - shown) if len(ids) > shown else Markup("")
        return Markup(' <span class="run-ids muted">· run{} {}{}</span>').format("s" if len(ids) > 1 else "", codes,
                                                                                 more)

    def _regression_row(self, reg: Any) -> tuple[ComparePage, CompareRowLink] | None:
        page = self.by_runs.get((reg.chip, self.runs(reg.chip, reg.base_sha), self.runs(reg.chip, reg.head_sha)))
        anchor = series_anchor(reg)
        return next(((page, row) for row in page.rows if row.anchor == anchor), None) if page else None

    def regression_compare(self, reg: Any) -> str:
        """``page#row`` of a performance regression's evidence, "" when no compare page covers its commits."""
        found = self._regression_row(reg)
        return f"{found[0].name}#{found[1].anchor}" if found else ""

    def regression_samples(self, reg: Any) -> str:
        """The samples page behind a performance regression, "" when none was made."""
        found = self._regression_row(reg)
        return found[1].samples if found else ""

    def job_samples(self, chip: str, run_id: str, job: Mapping[str, Any]) -> str:
        """The samples page of a chip page's benchmark row (of run ``run_id``), "" when none was made."""
        return self.chip_samples.get((chip, job.get("run_id") or run_id), {}).get(
            (job["kernel"], job["variant"], job["dtype"], job["shape_key"]), "")


def _fmt_time(seconds: float) -> str:
    unit, scale = strip.time_unit(seconds)
    return f"{seconds / scale:.4g} {unit}"


def _samples_page(data: Any, compare: ComparePage | None) -> SamplesPage:
    columns, trials = [], []
    stored = drawn = 0
    for side, run, job in data.jobs:
        by_trial: dict[int, list[float]] = {}
        for trial, _, seconds in job.samples:
            by_trial.setdefault(trial, []).append(seconds)
        group, color, anchor = f"{side} · run {run.id[:8]}", SIDE_COLORS[side], job_anchor(run.id, job.key)
        for trial, values in sorted(by_trial.items()):
            kept = strip.finite_positive(values)
            stored += len(values)
            drawn += len(kept)
            median = strip.median(kept) if kept else None
            columns.append(strip.Column(group, trial, kept, color,
                                        f"{side} run {run.id[:8]} trial {trial}: median "
                                        f"{_fmt_time(median) if median else '–'} of {len(kept)} samples", median))
            trials.append(TrialRow(side, run, job.key, anchor, trial, len(values), len(kept),
                                   median, min(kept) if kept else None, max(kept) if kept else None))
    key = data.key
    label = f"samples of {key.kernel} {key.variant} {key.dtype} {key.shape_key} on {key.chip}, by trial"
    name = samples_page_name(key, data.base_runs, data.head_runs)
    return SamplesPage(name, data, compare, strip.strip_plot(columns, label=label, plot_id="strip"), trials, stored,
                       drawn)


def links(evidence: Any | None) -> Links:
    """Name every compare and samples page of ``evidence`` (a ``harness.analysis.site_evidence.Evidence``) and
    index them."""
    if evidence is None:
        return Links()
    found = Links(dict(evidence.commit_urls), dict(evidence.runs_of), skipped_compares=evidence.skipped_compares)
    for view in evidence.compares:
        report = view.report
        base_ids = tuple(report.base.runs.get(view.chip, ()))
        head_ids = tuple(report.head.runs.get(view.chip, ()))
        page = ComparePage(compare_page_name(view.chip, base_ids, head_ids), view,
                           [CompareRowLink(row, series_anchor(row.key), "", view.runs.get(row.key, (0, 0)))
                            for row in report.rows],
                           side_label(report.base), side_label(report.head))
        found.compares.append(page)
        found.by_runs[(view.chip, base_ids, head_ids)] = page
        if view.shown:
            found.shown[view.chip] = page
    row_index: dict[int, dict[Any, CompareRowLink]] = {}  # per compare page: its rows by series key
    for data in evidence.samples:
        compare = found.by_runs.get((data.key.chip, tuple(data.base_runs), tuple(data.head_runs)))
        page = _samples_page(data, compare)
        found.samples.append(page)
        if compare is not None:
            rows = row_index.get(id(compare))
            if rows is None:
                rows = row_index[id(compare)] = {row.row.key: row for row in compare.rows}
            if data.key in rows:
                rows[data.key].samples = page.name
        if compare is None or compare.view.shown:  # what the chip page's benchmark rows link to
            for run_id in data.head_runs:
                found.chip_samples.setdefault((data.key.chip, run_id), {})[
                    (data.key.kernel, data.key.variant, data.key.dtype, data.key.shape_key)] = page.name
    return found


def write_pages(write: Callable[..., Any], found: Links) -> list[str]:
    """Write every compare and samples page with ``write(name, template, **context)``; their names."""
    for page in found.compares:
        write(page.name, "compare.html.j2", page=page, hours_apart=_hours)
    for page in found.samples:
        write(page.name, "samples.html.j2", page=page)
    return [page.name for page in found.compares] + [page.name for page in found.samples]


def _hours(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return ""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def noise_text(row: Any) -> str:
    """The spread the verdict used and where it came from, as ``harness compare`` prints it."""
    if row.basis in ("none", "") or row.noise != row.noise:
        return "unknown"
    return f"{100 * math.expm1(row.noise):.1f}% ({row.basis})"


def percent(value: float | None) -> str:
    return "" if value is None or value != value else f"{100 * value:.1f}%"


def change(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100.0 * (value - 1.0):+.1f} %"
