"""The history pages of one build, drawn lazily, maybe in a forked process of their own."""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from markupsafe import Markup

from harness.analysis.site_inputs import SiteData
from harness.analysis.site_manifests import Manifest
from harness.core.fork import ForkedWork, can_fork
from harness.render.fingerprint import Fingerprint, FingerprintMemo, commit_links, render_version
from harness.render.pageset import Build, PageSet, common_context, page_environment
from reports import evidence as evidence_pages
from reports import history as history_page
from reports import render as site_render
from reports import svg
from reports.sparkline import sparkline

log = logging.getLogger(__name__)


# --- history pages, lazily -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistorySummary:
    """What the index and chip pages read of a history page not rendered again (``reports.history.HistoryPage``'s
    fields of the same names; ``commits`` only has a length)."""

    kernel: str
    chip: str
    name: str
    commits: range
    n_regressions: int
    n_changes: int
    n_series: int
    spark: Markup = Markup("")


class _HistorySpec(history_page.HistoryPlan):
    """One history page's inputs (``reports.history.HistoryPlan``), with what an incremental build asks of them."""

    def shas(self, known: dict[tuple[str, str], set[str]]) -> set[str]:
        """The commits of the page's points. ``known``: per (kernel, chip), its commits as found so far (a chip's
        page and the kernel's page of every chip draw the same series of it): read from it, and added to it."""
        found: set[str] = set()
        for chip, series_list in self.chips.items():
            key = (self.kernel, chip)
            if key not in known:
                known[key] = history_page.commits_of(series_list)
            found |= known[key]
        return found

    def summary(self, n_commits: int) -> HistorySummary:
        n_regressions = sum(1 for regs in self.regs.values() for _, r in regs if r.kind == "performance")
        n_changes = sum(len(s.change_points) for series in self.chips.values() for s in series if s.points)
        return HistorySummary(self.kernel, self.chip, self.name, range(n_commits), n_regressions, n_changes,
                              sum(len(series) for series in self.chips.values()),
                              sparkline(self.chips[self.chip], self.default) if self.chip in self.chips
                              else Markup(""))


def history_specs(histories: Mapping[str, Sequence[Any]], regressions: Sequence[Any],
                  baselines: Mapping[str, str] | None = None, unproven: Collection[str] = ()) -> list[_HistorySpec]:
    """``reports.history.history_pages``'s pages, in its order, as inputs not yet drawn."""
    return [_HistorySpec(**{f.name: getattr(plan, f.name) for f in fields(plan)})
            for plan in history_page.history_plans(histories, regressions, baselines, unproven)]


class _ChipPlots:
    """A kernel's page of every chip takes each chip's plots from that chip's page (``reports.history.DrawnPlots``:
    the same SVG, byte for byte): from the page drawn in this build, else from its file, which this build keeps --
    its fingerprint holds everything its plots are drawn from, so the file holds the SVGs drawing would make. A plot
    found in neither is drawn. After a new run on one chip, the page of every chip draws that chip's plots only.

    A kept file's plot goes into the page as a token (``__call__``) that ``splice`` replaces with the plot's bytes in
    the file when the page is written: the plots of the kept chips (on the 1,000-commit benchmark, 33 MB of the 36 MB
    of the kernels' pages of every chip) are neither decoded nor templated nor encoded again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.kernel: str | None = None
        self.drawn: dict[str, Markup] = {}
        self.kept: dict[str, str] = {}  # chip -> its page's file name (kept from the last build)
        self.read: dict[str, dict[str, memoryview]] = {}
        self.tokens: dict[str, memoryview] = {}  # a token in the page's text -> the plot's bytes
        self._nonce = secrets.token_hex(8)  # no page text holds it by chance
        self._token = re.compile(f"\x00plot-{self._nonce}-(\\d+)\x00")

    def start(self, kernel: str) -> None:
        if kernel != self.kernel:
            self.kernel, self.drawn, self.kept, self.read, self.tokens = kernel, {}, {}, {}, {}

    def add(self, chip: str, page: history_page.HistoryPage | None, name: str) -> None:
        """The chip's page of the kernel: drawn (``page``), or kept in file ``name``."""
        if page is not None:
            self.drawn.update(history_page.plot_svgs(page))
        else:
            self.kept[chip] = name

    def __call__(self, chip: str, dtype: str, shape_key: str) -> Markup | None:
        key = history_page.plot_key(chip, dtype, shape_key)
        if key in self.drawn:
            return self.drawn[key]
        name = self.kept.get(chip)
        if name is None:
            return None
        if chip not in self.read:
            try:
                self.read[chip] = page_plots((self.folder / name).read_bytes())
            except OSError:
                self.read[chip] = {}
        found = self.read[chip].get(key)
        if found is None:
            return None
        token = str(len(self.tokens))
        self.tokens[token] = found
        return Markup(f"\x00plot-{self._nonce}-{token}\x00")

    def splice(self, text: str) -> Iterator[bytes | memoryview]:
        """A page's text as UTF-8, each token replaced by its plot's bytes."""
        for i, piece in enumerate(self._token.split(text)):
            yield piece.encode("utf-8") if i % 2 == 0 else self.tokens[piece]


_PLOT_HEAD = b'<svg class="plot" '
_PLOT_ID = re.compile(rb' id="(svg-[0-9a-f]{10})">')


def page_plots(html: bytes) -> dict[str, memoryview]:
    """The plots' SVGs in a history page's file (UTF-8), by ``reports.history.plot_key`` (a plot's texts are
    escaped: no ``</svg>`` inside one, and its start tag ends with its id). Found with ``bytes.find``, not one
    regular expression over the page: a page of 1,000 commits is 5 MB; views of ``html``, not copies."""
    found = {}
    whole = memoryview(html)
    start = html.find(_PLOT_HEAD)
    while start >= 0:
        head_end = html.find(b">", start)
        end = html.find(b"</svg>", head_end) if head_end >= 0 else -1
        if end < 0:
            break
        at = html.rfind(b' id="', start, head_end)
        named = _PLOT_ID.match(html, at, head_end + 1) if at >= 0 else None
        if named is not None:
            found[named.group(1).decode()] = whole[start:end + len(b"</svg>")]
        start = html.find(_PLOT_HEAD, end)
    return found


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
and the seconds it took (``PageSet.merge`` takes all but the last)."""


class HistoryPages:
    """The history pages of one build (``history_specs``: per kernel and chip, and per kernel on every chip) -- on
    a long history most of the site's drawing, and independent of everything else but the commit links. ``start``
    renders them in a forked process (``can_fork``) while the caller builds the rest of the site; ``finish`` waits
    and returns what the index and chip pages read of them. Without ``start``, or where the child fails, ``finish``
    renders them here: the files are the same either way."""

    def __init__(self, out_dir: str | Path, data: SiteData, build: Build, commit_urls: Mapping[str, str], *,
                 whole_analyses: Mapping[str, str] | None = None) -> None:
        """The pages of ``data``'s histories, regressions, baselines, db_label, last and unproven chips.
        ``whole_analyses``: per chip whose whole analysis the cache holds, a digest of it (``CacheStats.whole``):
        its histories are fingerprinted by it and their place, not digested point by point (1,600 histories of
        1,000 commits: most of a report's fingerprinting)."""
        histories, regressions, baselines, unproven = data.histories, data.regressions, data.baselines, data.unproven
        self._known = [(histories.get(chip, []), known) for chip, known in (whole_analyses or {}).items()]
        db_label, last, generated_at = data.db_label, data.last, build.generated_at
        manifests, incremental = build.manifests, build.incremental
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.specs = history_specs(histories, regressions, baselines, unproven)
        known: dict[tuple[str, str], set[str]] = {}
        self.shas = [spec.shas(known) for spec in self.specs]
        common = {**common_context(db_label, generated_at, last), "history_names": {spec.name for spec in self.specs}}
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
        pages = PageSet(frame.out, frame.previous, frame.incremental, page_environment(self.links), dict(frame.common))
        plots = _ChipPlots(frame.out)
        memo = FingerprintMemo()
        for of_chip, known in self._known:
            memo.known(of_chip, known)
        for spec, shas in zip(self.specs, self.shas, strict=True):
            drawn: list[history_page.HistoryPage] = []
            plots.start(spec.kernel)

            def draw(spec: _HistorySpec = spec, drawn: list = drawn) -> Path:
                built = spec.draw(None if spec.chip else plots)
                drawn.append(built)
                return pages.write(built.name, "history.html.j2", splice=None if spec.chip else plots.splice,
                                   page=built, legend=svg.legend(), max_points=site_render.MAX_PLOT_POINTS)

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

    def finish(self, into: PageSet) -> list[HistorySummary]:
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


def _merge_pages(into: PageSet, outcome: tuple[bool, Any], render_here: Callable[[], PagesResult]) -> float:
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
    """History pages rendered by another process (``harness.pipeline.report``'s forked analysis), which sent their
    ``frame`` first and sends their ``HistoryPages.render`` result later (``receive``: (True, result), or (False,
    why) when it failed); ``fallback`` makes a ``HistoryPages`` of the same build to render them here instead."""

    def __init__(self, frame: HistoryFrame, receive: Callable[[], tuple[bool, Any]],
                 fallback: Callable[[], HistoryPages], abandon: Callable[[], None]) -> None:
        self.frame = frame
        self.seconds: float | None = None
        self._receive, self._fallback, self._abandon = receive, fallback, abandon

    def finish(self, into: PageSet) -> list[HistorySummary]:
        self.seconds = _merge_pages(into, self._receive(), lambda: self._fallback().render())
        return self.frame.summaries

    def abandon(self) -> None:
        self._abandon()
