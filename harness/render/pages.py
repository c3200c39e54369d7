"""The report site written page by page: a page whose inputs did not change since the last build into the same
folder is not drawn or written again.

``write_site`` is the one site writer: it decides per page whether it must be rendered:

- always rendered: ``index.html``, the chip pages, ``variants.html`` and ``regressions.html`` (a handful of pages,
  each reading most of the site's data);
- rendered when their fingerprint changed: the history pages (per kernel and chip, and per kernel on every chip),
  the compare pages and the samples pages -- on a large history nearly all of the site's pages and of its drawing.
  After one new run on one chip, the other chips' history, compare and samples pages keep their fingerprints; the
  pages of every chip (``histories-<kernel>.html``) are written again, but a plot there is drawn on its own chip's
  commit axis, byte for byte as on the chip's page, so it is taken from that page (drawn in this build, or its
  kept file: ``_ChipPlots``) and only the new run's chip is drawn.

The history pages depend on nothing but the histories, the regression list and the commit links, so
``build_report`` starts them (``HistoryPages``) before it loads the evidence, in a forked process where that is safe
(``can_fork``), and the rest of the site is built meanwhile; where the process fails they are rendered in the
report's own. The files are the same either way.

A page's fingerprint is a SHA-256 of everything its template reads: its own records (a history page's series,
bit for bit, with the commits of their points, its regressions with their places in the regression list, its
variants' styles and links; a compare page's report, runs and row links; a samples page's runs with their
fingerprints -- ``harness.analysis.cache``'s trust in a run's jobs and highest sample id, so that a kept page's
samples are never read -- its compare row and the names it links to), the web links of the commits it names, the
site-wide values every page shows but the time stamp (the database label, ``last``, the history page names), and
the renderer's version (``render_version``: the sources of ``reports`` and ``harness.render``, the templates, the
CSS and script, jinja2's, markupsafe's and numpy's versions). ``generated_at`` is left out: a page's footer says
when that page was rendered, so a page kept from an earlier build keeps its own time; with the same stamp, an
incremental build equals a full one byte for byte. A template made to read something new must have it added to
its page's fingerprint here (the tests build a site incrementally and fresh and compare every file).

The fingerprints are kept in the database's analysis cache, one manifest per output folder (``SiteManifests``:
the folder holds pages only), with each file's size and modification time (ns): a page is skipped only when its
fingerprint is the one recorded and its file is still the file written then (a page changed or removed by hand,
or rewritten by a build that did not finish or by ``--no-cache``, is rendered again). The manifest is stored at the
end of a build; a page the previous build wrote that this build does not make (the compare and samples pages of a
chip's previous run, a history page of a kernel no longer measured) is deleted, so nothing stale lingers; files no
manifest listed (a build from before manifests, anything else in the folder) are left alone. ``incremental=False``
(``harness report --no-cache``) renders every page, deletes the pages the manifest listed and not made again, and
removes the manifest: nothing is stored, and the next build renders everything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, fields
from datetime import date, datetime
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from markupsafe import Markup
from sqlalchemy.exc import SQLAlchemyError

from harness.analysis import records
from harness.analysis.records import HistoryPoints
from harness.core.errors import first_line
from harness.core.fork import ForkedWork, can_fork
from harness.core.status import is_code_failure
from harness.record import analysis_cache, query
from harness.record.store import Store
from reports import evidence as evidence_pages
from reports import render as site_render
from reports import svg

__all__ = ["DeliveredHistoryPages", "EvidencePages", "Fingerprint", "FingerprintMemo", "ForkedWork", "HistoryFrame",
           "HistoryPages", "HistorySummary", "Manifest", "SiteManifests", "WriteStats", "can_fork",
           "evidence_fingerprint", "render_version", "write_site"]

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1


# --- fingerprints ----------------------------------------------------------------------------------------------------


@cache
def render_version() -> str:
    """A digest of everything that turns records into pages: the renderer's sources, templates and static files."""
    digest = hashlib.sha256(f"format {MANIFEST_FORMAT}".encode())
    for package in ("jinja2", "markupsafe", "numpy"):
        try:
            digest.update(f"{package} {metadata.version(package)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} ?\n".encode())
    folders = [Path(site_render.__file__).resolve().parent, Path(__file__).resolve().parent]
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".py", ".j2", ".css", ".js")):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    for module in (svg, evidence_pages, site_render):  # in case they are loaded from elsewhere than the folders above
        digest.update(module.__name__.encode() + (module.__file__ or "").encode())
    return digest.hexdigest()


_SCALARS = frozenset({str, int, float, bool, type(None), datetime})
# Records made of plain values only (strings, numbers, None, datetimes, and tuples, dicts and records of them), whose
# generated repr shows every field exactly (a float's repr is exact): fingerprinted by their text, in one call.
_BY_REPR = frozenset({records.CompareRow, records.CompareReport, records.Side, records.CorrectnessFailure,
                      records.ChangeFlag, records.RegressionEvidence, query.SeriesKey, query.RunBrief,
                      query.JobSamples, evidence_pages.CompareRowLink})


def _exact(value: Any) -> bool:
    """Whether ``repr(value)`` shows every part of it exactly: a plain value, a record of ``_BY_REPR``, or a list,
    tuple or dict of such (a compare page's rows and its runs per series: hundreds of them, in one call)."""
    kind = type(value)
    if kind in _SCALARS or kind in _BY_REPR:
        return True
    if kind is list or kind is tuple:
        return all(_exact(item) for item in value)
    if kind is dict:
        return all(_exact(key) and _exact(item) for key, item in value.items())
    return False


class Fingerprint:
    """A SHA-256 over plain values, records and arrays, exact: floats by their repr, arrays by their bytes, sets in
    sorted order, dataclasses and named tuples field by field with their type's name. Anything else is an error
    (a value whose text could change between processes, e.g. an object's id, must not reach a fingerprint)."""

    def __init__(self, *parts: Any, memo: FingerprintMemo | None = None) -> None:
        self._digest = hashlib.sha256()
        self._memo = memo
        self._commits: dict[tuple[int, bytes], bytes] = memo.commits if memo is not None else {}
        self._keep: list[Any] = memo.keep if memo is not None else []  # the commit tables memoised by id stay alive
        for part in parts:
            self.feed(part)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def _put(self, tag: bytes, payload: bytes = b"") -> None:
        self._digest.update(tag + len(payload).to_bytes(8, "little") + payload)

    def feed(self, value: Any) -> None:
        put = self._put
        kind = type(value)
        if kind in _BY_REPR or (kind in (list, tuple, dict) and _exact(value)):
            put(b"r", kind.__qualname__.encode() + repr(value).encode("utf-8", "surrogatepass"))
        elif value is None or isinstance(value, bool | int | float):
            put(b"v", repr(value).encode())
        elif isinstance(value, str):  # Markup too: its text is what is rendered
            put(b"s", value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, bytes):
            put(b"b", value)
        elif isinstance(value, datetime | date):
            put(b"t", repr(value).encode())
        elif isinstance(value, np.ndarray):
            put(b"a", f"{value.dtype.str}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
        elif isinstance(value, np.generic):
            put(b"g", f"{value.dtype.str}".encode() + value.tobytes())
        elif isinstance(value, HistoryPoints):
            self._points(value)
        elif kind is records.SeriesHistory and self._memo is not None:  # a history is on two pages: digested once
            found = self._memo.records.get(id(value))
            if found is None:
                inner = Fingerprint(memo=self._memo)
                inner._record(value)
                found = self._memo.records[id(value)] = (value, inner._digest.digest())
            put(b"H", found[1])
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            self._record(value)
        elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            put(b"n", type(value).__qualname__.encode())
            self._items(value)
        elif isinstance(value, list | tuple):
            put(b"l" if isinstance(value, list) else b"u")
            self._items(value)
        elif isinstance(value, Mapping):
            put(b"m", str(len(value)).encode())
            for key, item in value.items():  # in order: the order a page shows them in
                self.feed(key)
                self.feed(item)
        elif isinstance(value, set | frozenset):
            put(b"e", str(len(value)).encode())
            for item in sorted(Fingerprint(item).hexdigest() for item in value):
                put(b"h", item.encode())
        else:
            raise TypeError(f"no fingerprint for a {type(value).__qualname__}")

    def _record(self, value: Any) -> None:
        self._put(b"d", type(value).__qualname__.encode())
        for f in dataclasses.fields(value):
            self._put(b"f", f.name.encode())
            self.feed(getattr(value, f.name))

    def _items(self, values: Iterable[Any]) -> None:
        values = list(values)
        self._put(b"#", str(len(values)).encode())
        for item in values:
            self.feed(item)

    def _points(self, points: HistoryPoints) -> None:
        """A history's points: each commit's (sha, message, branch, start) and the columns, whatever table of the
        chip's commits the rows index (only the commits the points use count)."""
        rows = points.rows
        if rows.size < 2 or bool(np.all(rows[1:] > rows[:-1])):  # each point its own commit, in table order
            used, where = rows, np.arange(rows.size, dtype=np.int64)
        else:
            used, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # the commits in the order the points first use them
            used = used[order]
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            where = rank[inverse.reshape(-1)]
        key = (id(points._commits), used.tobytes())
        commits = self._commits.get(key)
        if commits is None:
            table = points._commits
            self._keep.append(table)
            commits = self._commits[key] = hashlib.sha256(
                repr([tuple(table[row]) for row in used.tolist()]).encode()).digest()
        self._put(b"p", commits)
        for column in (where.astype(np.int64), points.median, points.ci_low, points.ci_high, points.n):
            self.feed(np.asarray(column))


@dataclass
class FingerprintMemo:
    """What the fingerprints of one build share: each history's digest (by identity: the record is kept alive
    with it, a history is on its chip's page and on the page of every chip) and the commit tables' digests."""

    records: dict[int, tuple[Any, bytes]] = field(default_factory=dict)
    commits: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)


def commit_links(links: evidence_pages.Links, shas: Iterable[str]) -> list[tuple[str, str | None]]:
    """The web pages of ``shas`` as a page shows them (``commit_ref``, ``web_link``), in sorted order."""
    return [(sha, links.commit_urls.get(sha)) for sha in sorted(set(shas))]


# --- the manifest ----------------------------------------------------------------------------------------------------


@dataclass
class Manifest:
    """What a build wrote into its folder: page name -> (fingerprint, size, mtime_ns) of its file."""

    pages: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return zlib.compress(json.dumps({"format": MANIFEST_FORMAT, "pages": self.pages}, sort_keys=True,
                                        separators=(",", ":")).encode())

    @classmethod
    def from_bytes(cls, payload: bytes) -> Manifest:
        """The manifest, or an empty one when unreadable or of another format (every page is rendered)."""
        try:
            data = json.loads(zlib.decompress(payload))
            if data.get("format") != MANIFEST_FORMAT:
                return cls()
            return cls({str(name): (str(fp), int(size), int(mtime))
                        for name, (fp, size, mtime) in data["pages"].items()})
        except (ValueError, TypeError, KeyError, AttributeError, zlib.error):
            return cls()

    def fresh(self, folder: Path, name: str, fingerprint: str) -> bool:
        """Whether ``name`` was written with ``fingerprint`` and its file is untouched since."""
        entry = self.pages.get(name)
        if entry is None or entry[0] != fingerprint:
            return False
        try:
            stat = (folder / name).stat()
        except OSError:
            return False
        return (stat.st_size, stat.st_mtime_ns) == entry[1:]


class SiteManifests:
    """The manifests of the folders a database's sites were built into, kept in its analysis cache (``chip`` "",
    ``kind`` "site", one row per folder, named by a digest of its resolved path): the output folder holds pages
    only. Like every cached row, one may be deleted at any time (the next build renders every page)."""

    CHIP, KIND = "", "site"

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _name(folder: Path) -> str:
        return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:32]

    def read(self, folder: Path) -> Manifest:
        try:
            entry = analysis_cache.read_entries(self.store, self.CHIP, self.KIND, [self._name(folder)]).get(
                self._name(folder))
        except SQLAlchemyError as exc:
            log.warning("site manifest unreadable, every page rendered: %s", first_line(exc))
            return Manifest()
        return Manifest() if entry is None else Manifest.from_bytes(entry.payload)

    def write(self, folder: Path, manifest: Manifest) -> None:
        try:
            analysis_cache.write_entries(self.store, self.CHIP, self.KIND, {
                self._name(folder): analysis_cache.Entry(render_version()[:32], manifest.to_bytes())})
        except SQLAlchemyError as exc:  # the next build renders every page
            log.warning("site manifest not stored: %s", first_line(exc))

    def forget(self, folder: Path) -> None:
        try:
            others = set(analysis_cache.read_entries(self.store, self.CHIP, self.KIND)) - {self._name(folder)}
            analysis_cache.write_entries(self.store, self.CHIP, self.KIND, {}, keep=others)
        except SQLAlchemyError as exc:
            log.warning("site manifest not removed: %s", first_line(exc))


@dataclass
class WriteStats:
    """Pages rendered and pages kept (fingerprint unchanged) by kind, and stale pages deleted."""

    rendered: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    kept: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    deleted: int = 0
    names: set[str] = field(default_factory=set)  # the pages rendered

    def summary(self) -> str:
        kinds = sorted(set(self.rendered) | set(self.kept))
        return ", ".join(f"{kind} {self.rendered.get(kind, 0)} rendered / {self.kept.get(kind, 0)} kept"
                         for kind in kinds) + f"; {self.deleted} stale deleted"


# --- history pages, lazily -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistorySummary:
    """What the index and chip pages read of a history page not rendered again (``reports.render.HistoryPage``'s
    fields of the same names; ``commits`` only has a length)."""

    kernel: str
    chip: str
    name: str
    commits: range
    n_regressions: int
    n_changes: int
    n_series: int
    spark: Markup = Markup("")


class _HistorySpec(site_render.HistoryPlan):
    """One history page's inputs (``reports.render.HistoryPlan``), with what an incremental build asks of them."""

    def shas(self) -> set[str]:
        found: set[str] = set()
        for series_list in self.chips.values():
            tables: dict[int, tuple[Any, list[np.ndarray]]] = {}
            for series in series_list:
                points = series.points
                tables.setdefault(id(points._commits), (points._commits, []))[1].append(points.rows)
            for table, rows in tables.values():
                if rows:
                    found.update(table[row][0] for row in np.unique(np.concatenate(rows)).tolist())
        return found

    def summary(self, n_commits: int) -> HistorySummary:
        n_regressions = sum(1 for regs in self.regs.values() for _, r in regs if r.kind == "performance")
        n_changes = sum(len(s.change_points) for series in self.chips.values() for s in series if s.points)
        return HistorySummary(self.kernel, self.chip, self.name, range(n_commits), n_regressions, n_changes,
                              sum(len(series) for series in self.chips.values()),
                              site_render.sparkline(self.chips[self.chip], self.default) if self.chip in self.chips
                              else Markup(""))


def history_specs(histories: Mapping[str, Sequence[Any]], regressions: Sequence[Any],
                  baselines: Mapping[str, str] | None = None, unproven: Collection[str] = ()) -> list[_HistorySpec]:
    """``reports.render.history_pages``'s pages, in its order, as inputs not yet drawn."""
    return [_HistorySpec(**{f.name: getattr(plan, f.name) for f in fields(plan)})
            for plan in site_render.history_plans(histories, regressions, baselines, unproven)]


class _ChipPlots:
    """A kernel's page of every chip takes each chip's plots from that chip's page (``reports.render.DrawnPlots``:
    the same SVG, byte for byte): from the page drawn in this build, else from its file, which this build keeps --
    its fingerprint holds everything its plots are drawn from, so the file holds the SVGs drawing would make. A plot
    found in neither is drawn. After a new run on one chip, the page of every chip draws that chip's plots only."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.kernel: str | None = None
        self.drawn: dict[str, Markup] = {}
        self.kept: dict[str, str] = {}  # chip -> its page's file name (kept from the last build)
        self.read: dict[str, dict[str, Markup]] = {}

    def start(self, kernel: str) -> None:
        if kernel != self.kernel:
            self.kernel, self.drawn, self.kept, self.read = kernel, {}, {}, {}

    def add(self, chip: str, page: site_render.HistoryPage | None, name: str) -> None:
        """The chip's page of the kernel: drawn (``page``), or kept in file ``name``."""
        if page is not None:
            self.drawn.update(site_render.plot_svgs(page))
        else:
            self.kept[chip] = name

    def __call__(self, chip: str, dtype: str, shape_key: str) -> Markup | None:
        key = site_render.plot_key(chip, dtype, shape_key)
        if key in self.drawn:
            return self.drawn[key]
        name = self.kept.get(chip)
        if name is None:
            return None
        if chip not in self.read:
            try:
                self.read[chip] = page_plots((self.folder / name).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                self.read[chip] = {}
        return self.read[chip].get(key)


_PLOT_START = re.compile(r'<svg class="plot" [^>]*? id="(svg-[0-9a-f]{10})">')


def page_plots(html: str) -> dict[str, Markup]:
    """The plots' SVGs in a history page's text, by ``reports.render.plot_key`` (a plot's texts are escaped: no
    ``</svg>`` inside one)."""
    found = {}
    for match in _PLOT_START.finditer(html):
        end = html.find("</svg>", match.end())
        if end >= 0:
            found[match.group(1)] = Markup(html[match.start():end + len("</svg>")])
    return found


# --- evidence pages, lazily ------------------------------------------------------------------------------------------


def evidence_links(evidence: Any | None) -> tuple[evidence_pages.Links, list[tuple[str, Any, Any]]]:
    """``reports.evidence.links`` without drawing the samples pages: the links (``samples`` left empty) and each
    samples page as (name, ``SeriesSamples``, its compare page or None), in ``links``' order."""
    if evidence is None:
        return evidence_pages.Links(), []
    found = evidence_pages.Links(dict(evidence.commit_urls), dict(evidence.runs_of),
                                 skipped_compares=evidence.skipped_compares)
    for view in evidence.compares:
        report = view.report
        base_ids = tuple(report.base.runs.get(view.chip, ()))
        head_ids = tuple(report.head.runs.get(view.chip, ()))
        page = evidence_pages.ComparePage(
            evidence_pages.compare_page_name(view.chip, base_ids, head_ids), view,
            [evidence_pages.CompareRowLink(row, evidence_pages.series_anchor(row.key), "",
                                           view.runs.get(row.key, (0, 0))) for row in report.rows],
            evidence_pages.side_label(report.base), evidence_pages.side_label(report.head))
        found.compares.append(page)
        found.by_runs[(view.chip, base_ids, head_ids)] = page
        if view.shown:
            found.shown[view.chip] = page
    samples = []
    row_index: dict[int, dict[Any, evidence_pages.CompareRowLink]] = {}
    for data in evidence.samples:
        compare = found.by_runs.get((data.key.chip, tuple(data.base_runs), tuple(data.head_runs)))
        name = evidence_pages.samples_page_name(data.key, data.base_runs, data.head_runs)
        samples.append((name, data, compare))
        if compare is not None:
            rows = row_index.get(id(compare))
            if rows is None:
                rows = row_index[id(compare)] = {row.row.key: row for row in compare.rows}
            if data.key in rows:
                rows[data.key].samples = name
        if compare is None or compare.view.shown:
            for run_id in data.head_runs:
                found.chip_samples.setdefault((data.key.chip, run_id), {})[
                    (data.key.kernel, data.key.variant, data.key.dtype, data.key.shape_key)] = name
    return found, samples


def _samples_input(data: Any, compare: Any) -> tuple[Any, ...]:
    """What a samples page shows: its series, runs and samples, its compare row, and of its compare page the name
    and side labels it links with (the page is drawn from these alone, ``reports.evidence._samples_page``). The
    samples are named by their runs' fingerprints where the evidence has them (``SeriesSamples.prints``: a run's
    jobs and its highest sample id, as the analysis cache trusts them), so a kept page's samples are never read."""
    prints = getattr(data, "prints", ())
    if prints:
        samples: Any = (data.runs, prints)
    else:
        samples = [(side, run, job.run_id, job.key, job.series, repr(job.samples)) for side, run, job in data.jobs]
    linked = None if compare is None else (compare.name, compare.base_label, compare.head_label)
    return (data.key, tuple(data.base_runs), tuple(data.head_runs), samples, data.row, linked)


def _sample_runs(data: Any) -> Iterable[Any]:
    runs = getattr(data, "runs", ())
    return runs if getattr(data, "prints", ()) else (run for _, run, _ in data.jobs)


# --- one build's pages --------------------------------------------------------------------------------------------


@dataclass
class _Pages:
    """What the pages of one build into ``out`` share: the last build's manifest (``previous``), this one's and its
    counts, the templates (``env``) and the context every page gets (``common``). ``page`` decides and writes."""

    out: Path
    previous: Manifest
    incremental: bool
    env: Any
    common: dict[str, Any]
    manifest: Manifest = field(default_factory=Manifest)
    stats: WriteStats = field(default_factory=WriteStats)

    def write(self, name: str, template: str, **context: Any) -> Path:
        path = self.out / name
        path.write_text(self.env.get_template(template).render(**self.common, **context), encoding="utf-8")
        return path

    def page(self, kind: str, name: str, fingerprint: Callable[[], Fingerprint] | None, render: Callable[[], Path]
             ) -> bool:
        """Render ``name`` unless its fingerprint is the manifest's and its file untouched (no ``fingerprint``:
        always, listed in the manifest without one); whether it rendered."""
        digest = fingerprint().hexdigest() if self.incremental and fingerprint is not None else ""
        if digest and self.previous.fresh(self.out, name, digest):
            self.manifest.pages[name] = self.previous.pages[name]
            self.stats.kept[kind] += 1
            return False
        path = render()
        self.stats.rendered[kind] += 1
        self.stats.names.add(name)
        if self.incremental:
            stat = path.stat()
            self.manifest.pages[name] = (digest, stat.st_size, stat.st_mtime_ns)
        return True

    def merge(self, pages: dict[str, tuple[str, int, int]], rendered: dict[str, int], kept: dict[str, int],
              names: set[str]) -> None:
        """Add what another ``_Pages`` of this build wrote (``HistoryPages``, maybe in another process)."""
        self.manifest.pages.update(pages)
        for kind, count in rendered.items():
            self.stats.rendered[kind] += count
        for kind, count in kept.items():
            self.stats.kept[kind] += count
        self.stats.names |= names


def _environment(links: evidence_pages.Links) -> Any:
    """The templates, with ``links``' commit links and run ids."""
    env = site_render.environment()
    env.globals.update(commit_ref=links.commit_ref, web_link=links.web_link, run_ids=links.run_ids)
    env.filters.update(pct_change=evidence_pages.change, pct=evidence_pages.percent,
                       noise_text=evidence_pages.noise_text)
    return env


# --- the history pages, maybe in a process of their own ------------------------------------------------------------


@dataclass(frozen=True)
class HistoryFrame:
    """What the rest of a build takes of its history pages before they are written: the folder, the last build's
    manifest, whether the build is incremental, the context every page gets, the fingerprint part every page has
    and what the index and chip pages read of each history page."""

    out: Path
    previous: Manifest
    incremental: bool
    common: dict[str, Any]
    shared: str
    summaries: list[HistorySummary]


PagesResult = tuple[dict[str, tuple[str, int, int]], dict[str, int], dict[str, int], set[str], float]
"""What rendering some pages gave: their manifest entries, the counts rendered and kept by kind, the names rendered
and the seconds it took (``_Pages.merge`` takes all but the last)."""


class HistoryPages:
    """The history pages of one build (``history_specs``: per kernel and chip, and per kernel on every chip) -- on
    a long history most of the site's drawing, and independent of everything else but the commit links. ``start``
    renders them in a forked process (``can_fork``) while the caller builds the rest of the site; ``finish`` waits
    and returns what the index and chip pages read of them. Without ``start``, or where the child fails, ``finish``
    renders them here: the files are the same either way."""

    def __init__(self, out_dir: str | Path, histories: Mapping[str, Sequence[Any]], regressions: Sequence[Any],
                 baselines: Mapping[str, str], db_label: str, *, last: int | None, generated_at: str,
                 commit_urls: Mapping[str, str], manifests: SiteManifests | None, incremental: bool,
                 unproven: Collection[str] = ()) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.specs = history_specs(histories, regressions, baselines, unproven)
        self.shas = [spec.shas() for spec in self.specs]
        common = {**_common_context(db_label, generated_at, last), "history_names": {spec.name for spec in self.specs}}
        self.frame = HistoryFrame(
            out, manifests.read(out) if manifests is not None else Manifest(), incremental and manifests is not None,
            common, Fingerprint(render_version(), db_label, last, sorted(common["history_names"])).hexdigest(),
            [spec.summary(len(shas)) for spec, shas in zip(self.specs, self.shas, strict=True)])
        self.links = evidence_pages.Links(dict(commit_urls))
        self.seconds: float | None = None  # how long rendering them took (in whichever process), once finished
        self._child: ForkedWork | None = None

    def render(self) -> PagesResult:
        """Render the pages that changed, here."""
        began = time.perf_counter()
        frame = self.frame
        pages = _Pages(frame.out, frame.previous, frame.incremental, _environment(self.links), dict(frame.common))
        plots = _ChipPlots(frame.out)
        memo = FingerprintMemo()
        for spec, shas in zip(self.specs, self.shas, strict=True):
            drawn: list[site_render.HistoryPage] = []
            plots.start(spec.kernel)

            def draw(spec: _HistorySpec = spec, drawn: list = drawn) -> Path:
                built = spec.draw(None if spec.chip else plots)
                drawn.append(built)
                return pages.write(built.name, "history.html.j2", page=built, legend=svg.legend(),
                                   max_points=site_render.MAX_PLOT_POINTS)

            pages.page("history" if spec.chip else "histories", spec.name,
                       lambda spec=spec, shas=shas: Fingerprint(
                           frame.shared, "history", spec.kernel, spec.chip, spec.name, spec.chips, spec.regs,
                           spec.styles, spec.default, spec.links, spec.proven, commit_links(self.links, shas),
                           memo=memo),
                       draw)
            if spec.chip:
                plots.add(spec.chip, drawn[0] if drawn else None, spec.name)
        stats = pages.stats
        return pages.manifest.pages, dict(stats.rendered), dict(stats.kept), stats.names, time.perf_counter() - began

    def start(self) -> None:
        """Render the pages in a forked process (where ``can_fork``); ``finish`` collects them."""
        if self.specs and can_fork():
            self._child = ForkedWork(lambda send: send(self.render()))

    def finish(self, into: _Pages) -> list[HistorySummary]:
        """Wait for the pages (rendered here when ``start`` did not fork, or its process failed) and add them to
        ``into``; what the index and chip pages read of them."""
        if self._child is None:
            outcome: tuple[bool, Any] = (True, self.render())
        else:
            outcome = self._child.receive()
            self._child.close()
            self._child = None
        self.seconds = _merge_pages(into, outcome, self.render)
        return self.frame.summaries

    def abandon(self) -> None:
        """Stop a started child (the build failed before ``finish``)."""
        if self._child is not None:
            self._child.abandon()
            self._child = None


def _merge_pages(into: _Pages, outcome: tuple[bool, Any], render_here: Callable[[], PagesResult]) -> float:
    """Add the history pages' ``outcome`` ((True, a ``PagesResult``) or (False, why their process failed), in which
    case they are rendered here by ``render_here``) to ``into``; the seconds their rendering took."""
    ok, result = outcome
    if not ok:
        log.warning("history pages: their process failed (%s); rendered here instead", result)
        result = render_here()
    *parts, seconds = result
    into.merge(*parts)
    return seconds


class DeliveredHistoryPages:
    """History pages rendered by another process (``harness.render.site``'s forked analysis), which sent their
    ``frame`` first and sends their ``HistoryPages.render`` result later (``receive``: (True, result), or (False,
    why) when it failed); ``fallback`` makes a ``HistoryPages`` of the same build to render them here instead."""

    def __init__(self, frame: HistoryFrame, receive: Callable[[], tuple[bool, Any]],
                 fallback: Callable[[], HistoryPages], abandon: Callable[[], None]) -> None:
        self.frame = frame
        self.seconds: float | None = None
        self._receive, self._fallback, self._abandon = receive, fallback, abandon

    def finish(self, into: _Pages) -> list[HistorySummary]:
        self.seconds = _merge_pages(into, self._receive(), lambda: self._fallback().render())
        return self.frame.summaries

    def abandon(self) -> None:
        self._abandon()


# --- the site --------------------------------------------------------------------------------------------------------


def write_site(out_dir: str | Path, chips: list[dict[str, Any]], latest: dict[str, Any],
               baselines: dict[str, str], db_label: str, *, matrix: Any = None,
               histories: Mapping[str, Sequence[Any]] | None = None, regressions: Sequence[Any] = (),
               last: int | None = None, generated_at: str = "",
               failing_before: Mapping[str, set[str]] | None = None,
               noise: Mapping[str, Mapping[tuple[str, str, str, str], Any]] | None = None,
               checks: Mapping[str, str] | None = None, evidence: Any = None,
               manifests: SiteManifests | None = None, incremental: bool = True,
               stats: WriteStats | None = None, history: HistoryPages | DeliveredHistoryPages | None = None,
               early: EvidencePages | None = None, acks: Mapping[str, Any] | None = None,
               unproven: Collection[str] = (), repos: Mapping[str, str] | None = None,
               others: Mapping[str, Sequence[Any]] | None = None) -> Path:
    """Write every page into ``out_dir``; returns the index path. ``repos``: per chip, the repository its page shows
    (the index groups by repository when there are several); ``others``: per chip, its other (repository, suite)s at
    their tips (``site.OtherSuite``), listed on its page and in their repository's index section. With
    ``manifests``, the folder's last build is known: ``incremental``, only the pages whose fingerprint changed are
    rendered and the new manifest is stored; else every page is, and the manifest is removed; either way the pages
    the last build wrote and this one does not make are deleted. Without, every page is rendered and nothing read or
    stored. ``stats`` counts the pages. ``history``: the history pages, made (and maybe started) by the caller from
    the same arguments (who started them stops them if this fails: ``abandon``); else they are made and rendered
    here. ``early``: compare and samples pages of ``evidence`` rendered already (``EvidencePages``), not rendered
    again."""
    regressions = list(regressions)
    found, samples = evidence_links(evidence)
    if history is None:  # not started: rendered here, when the other pages are
        history = HistoryPages(out_dir, histories or {}, regressions, baselines, db_label, last=last,
                               generated_at=generated_at, commit_urls=found.commit_urls, manifests=manifests,
                               incremental=incremental, unproven=unproven)
    return _write_site(history, found, samples, chips, latest, baselines, matrix=matrix, regressions=regressions,
                       failing_before=failing_before, noise=noise, checks=checks, manifests=manifests, stats=stats,
                       early=early, acks=acks, repos=repos or {}, others=others or {})


def _common_context(db_label: str, generated_at: str, last: int | None) -> dict[str, Any]:
    """What every page's template gets: the stylesheet, the database label, the build's stamp and ``last``."""
    return {"css": (site_render.STATIC / "report.css").read_text(encoding="utf-8"), "db_label": db_label,
            "generated_at": generated_at, "last": last}


def evidence_fingerprint(db_label: str, last: int | None) -> str:
    """What every compare and samples page's fingerprint starts with. They name no history page, so unlike the
    other pages (``HistoryFrame.shared``) not which history pages there are: they can be rendered before the
    analysis that decides that ends (``EvidencePages``)."""
    return Fingerprint(render_version(), db_label, last).hexdigest()


def _write_evidence(site: _Pages, found: evidence_pages.Links, samples: list[tuple[str, Any, Any]], shared: str,
                    skip: Set[str]) -> None:
    """The compare and samples pages of ``found`` and ``samples`` (``evidence_links``), but those named in
    ``skip``."""
    page, write = site.page, site.write
    for compare in found.compares:
        if compare.name in skip:
            continue
        view, report = compare.view, compare.view.report
        shas = [report.base.sha, report.head.sha, *(run.sha for run in (*view.base_runs, *view.head_runs))]
        page("compare", compare.name,
             lambda compare=compare, shas=shas: Fingerprint(shared, "compare", compare,
                                                            commit_links(found, shas)),
             lambda compare=compare: write(compare.name, "compare.html.j2", page=compare,
                                           hours_apart=evidence_pages._hours))
    for name, data, compare in samples:
        if name in skip:
            continue
        page("samples", name,
             lambda name=name, data=data, compare=compare: Fingerprint(
                 shared, "samples", name, _samples_input(data, compare),
                 commit_links(found, (run.sha for run in _sample_runs(data)))),
             lambda name=name, data=data, compare=compare: write(
                 name, "samples.html.j2", page=evidence_pages._samples_page(data, compare)))


class EvidencePages:
    """The compare and samples pages of the evidence loaded so far, rendered before the rest of the site
    (``render``): ``harness.render.site.build_report`` renders the chip pages' pairs while the analysis runs in its
    own process, as those pages do not depend on it; ``write_site`` then renders the others and adds these
    (``merge_into``). The files are those ``write_site`` would write."""

    def __init__(self, out_dir: str | Path, store: Store | None, db_label: str, *, last: int | None,
                 generated_at: str, incremental: bool) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        manifests = SiteManifests(store) if store is not None else None
        self.site = _Pages(out, manifests.read(out) if manifests is not None else Manifest(),
                           incremental and manifests is not None, None, _common_context(db_label, generated_at, last))
        self.shared = evidence_fingerprint(db_label, last)
        self.seconds = 0.0

    @property
    def done(self) -> set[str]:
        """The pages rendered or kept so far."""
        return set(self.site.manifest.pages) | self.site.stats.names

    def render(self, evidence: Any) -> None:
        began = time.perf_counter()
        found, samples = evidence_links(evidence)
        self.site.env = _environment(found)
        self.site.common["evidence"] = found
        _write_evidence(self.site, found, samples, self.shared, self.done)
        self.seconds += time.perf_counter() - began

    def merge_into(self, site: _Pages) -> None:
        stats = self.site.stats
        site.merge(self.site.manifest.pages, stats.rendered, stats.kept, stats.names)


def _write_site(history: HistoryPages | DeliveredHistoryPages, found: evidence_pages.Links,
                samples: list[tuple[str, Any, Any]], chips: list[dict[str, Any]], latest: dict[str, Any],
                baselines: dict[str, str], *, matrix: Any,
                regressions: list[Any], failing_before: Mapping[str, set[str]] | None,
                noise: Mapping[str, Mapping[tuple[str, str, str, str], Any]] | None,
                checks: Mapping[str, str] | None, manifests: SiteManifests | None, stats: WriteStats | None,
                early: EvidencePages | None, acks: Mapping[str, Any] | None = None,
                repos: Mapping[str, str] | None = None, others: Mapping[str, Sequence[Any]] | None = None) -> Path:
    frame = history.frame
    out = frame.out
    site = _Pages(out, frame.previous, frame.incremental, _environment(found), {**frame.common, "evidence": found},
                  stats=stats if stats is not None else WriteStats())
    page, write = site.page, site.write
    regs_of_chip: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for i, reg in enumerate(regressions):
        regs_of_chip[reg.chip].append((i, reg))
    matrix_chips, rows = site_render.matrix_rows(matrix)

    # --- the evidence path (reports.evidence): commit links and run ids on every page, compare and samples pages
    _write_evidence(site, found, samples, evidence_fingerprint(frame.common["db_label"], frame.common["last"]),
                    early.done if early is not None else frozenset())
    if early is not None:
        early.merge_into(site)

    # what the other pages read of the history pages is known before those are written: they are rendered while
    # the history pages' process still writes (``finish``, below, waits for it)
    pages = history.frame.summaries
    pages_of_chip: dict[str, list[Any]] = defaultdict(list)
    for summary_of_page in pages:
        pages_of_chip[summary_of_page.chip].append(summary_of_page)

    summary = {}
    for chip in chips:
        run = latest.get(chip["key"])
        jobs = run.jobs if run else []
        chip_regs = regs_of_chip.get(chip["key"], [])
        at_latest = [(i, r) for i, r in chip_regs if run and r.head_sha == run.sha]
        summary[chip["key"]] = {"correctness": site_render.correctness_counts(jobs), "regressions": at_latest,
                                "all_regressions": chip_regs}
        verdicts = {(c.kernel, c.dtype, c.shape_key, c.variant): c for c in (matrix.cells if matrix else ())
                    if c.chip == chip["key"]}
        winners = {(b.kernel, b.dtype, b.shape_key): b.variant for b in (matrix.best if matrix else ())
                   if b.chip == chip["key"] and b.evidence is not None}
        name = site_render.chip_page_name(chip["key"])
        page("chip", name, None, lambda name=name, chip=chip, run=run, jobs=jobs, verdicts=verdicts,
             winners=winners: write(
                 name, "chip.html.j2", chip=chip, run=run, summary=summary[chip["key"]],
                 others=(others or {}).get(chip["key"], []),
                 verdicts=verdicts, winners=winners, checks=checks or {},
                 correctness_tables=site_render.correctness_tables(jobs, baselines), cell_title=site_render.cell_title,
                 correctness=[j for j in jobs if j["kind"] == "correctness"],
                 failures=[j for j in jobs if j["kind"] == "correctness" and is_code_failure(j["status"])],
                 benchmarks=[j for j in jobs if j["kind"] == "benchmark" and j["status"] != "skipped"],
                 skipped_benchmarks=site_render.skipped_groups(jobs),
                 noise=(noise or {}).get(chip["key"], {}),
                 calibration=[j for j in jobs if j["kind"] == "calibration"],
                 variant_rows=site_render.variant_rows(jobs, baselines),
                 views=site_render.chip_views(jobs, run.peak_flops if run else None,
                                              run.peak_bytes_per_s if run else None, baselines),
                 history_pages=pages_of_chip.get(chip["key"], []),
                 selections=site_render.test_selections(jobs, (failing_before or {}).get(chip["key"], set())),
                 sources=site_render.run_sources(jobs),
                 failing_tests=site_render.failing_tests(jobs, (failing_before or {}).get(chip["key"], set()))))
    page("variants", "variants.html", None,
         lambda: write("variants.html", "variants.html.j2", matrix=matrix, chips=matrix_chips, rows=rows,
                       rollup=site_render.variant_rollup(matrix)))
    context = site_render.regressions_context(regressions, acks, found.commit_urls)
    page("regressions", "regressions.html", None, lambda: write("regressions.html", "regressions.html.j2", **context))
    page("regressions", "regressions.atom", None, lambda: write("regressions.atom", "regressions.atom.j2", **context))
    kernels = sorted({summary_of_page.kernel for summary_of_page in pages})
    page_names = {(summary_of_page.kernel, summary_of_page.chip): summary_of_page for summary_of_page in pages}
    page("index", "index.html", None,
         lambda: write("index.html", "index.html.j2", chips=chips, latest=latest, summary=summary, kernels=kernels,
                       groups=index_groups(chips, repos or {}, others or {}),
                       history=page_names, n_regressions=len(regressions),
                       n_correctness=sum(1 for r in regressions if r.kind == "correctness"),
                       n_unproven=sum(1 for r in regressions if r.kind == "unproven"),
                       n_divergent=len(matrix.divergent) if matrix is not None else 0, matrix_rows=len(rows)))
    history.finish(site)
    _finish(out, site.previous, site.manifest, manifests, site.incremental, site.stats)
    log.info("pages: %s", site.stats.summary())
    return out / "index.html"


def index_groups(chips: list[dict[str, Any]], repos: Mapping[str, str], others: Mapping[str, Sequence[Any]]
                 ) -> list[tuple[str | None, list[tuple[dict[str, Any], Any]]]]:
    """The index's sections: one per repository, in the order met, each with its chips as (chip, None) where the
    chip's page shows that repository, else (chip, its tip ``OtherSuite`` there: the one with the most jobs); one
    section without a name when there is a single repository (or none is known). A chip without a run of any
    goes in the first."""
    names = list(dict.fromkeys([repos[chip["key"]] for chip in chips if chip["key"] in repos]
                               + [other.repo for chip in chips for other in others.get(chip["key"], ())]))
    if len(names) <= 1:
        return [(None, [(chip, None) for chip in chips])]
    groups: list[tuple[str | None, list[tuple[dict[str, Any], Any]]]] = []
    for name in names:
        rows: list[tuple[dict[str, Any], Any]] = []
        for chip in chips:
            if repos.get(chip["key"]) == name:
                rows.append((chip, None))
                continue
            there = [other for other in others.get(chip["key"], ()) if other.repo == name]
            if there:
                rows.append((chip, max(there, key=lambda other: len(other.run.jobs))))
        groups.append((name, rows))
    placed = {chip["key"] for _, rows in groups for chip, _ in rows}
    groups[0][1].extend((chip, None) for chip in chips if chip["key"] not in placed)  # no run: "no run", first
    return groups


def _finish(out: Path, previous: Manifest, manifest: Manifest, manifests: SiteManifests | None, incremental: bool,
            stats: WriteStats) -> None:
    """Delete the pages the previous build wrote and this one did not make; store the manifest (or, not
    ``incremental``, remove it)."""
    made = set(manifest.pages) | stats.names
    for name in sorted(set(previous.pages) - made):
        if "/" in name or "\\" in name or name.startswith("."):  # only the site's own page names are deleted
            continue
        try:
            (out / name).unlink()
            stats.deleted += 1
        except FileNotFoundError:
            pass
    if manifests is None:
        return
    if incremental:
        manifests.write(out, manifest)
    else:
        manifests.forget(out)
