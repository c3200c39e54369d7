"""The compare and samples pages: their links, inputs and fingerprints, and those rendered before the rest."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Set
from pathlib import Path
from typing import Any

from harness.analysis.site_manifests import Manifest, SiteManifests
from harness.render.fingerprint import Fingerprint, commit_links, render_version
from harness.render.pageset import ForkedPages, PageSet, common_context, page_environment
from reports import evidence as evidence_pages

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


def compare_input(compare: Any) -> tuple[Any, ...]:
    """What a compare page shows (``evidence_pages.ComparePage``): its name, side labels, view (the report, its
    runs, ...) and rows. A row's link holds the report's row of the same place (``evidence_links``): that is not
    digested twice -- each is a few hundred rows' text -- but where a link's row is another object. Where the view
    has a ``content`` digest (``ComparePages.content``: the report's stored payload, the code that decodes it and
    its order), that stands for the report's rows, and the rest of the report is digested without them."""
    view = compare.view
    rows = view.report.rows
    same = len(compare.rows) == len(rows) and all(link.row is row for link, row in zip(compare.rows, rows, strict=True))
    links = [(link.anchor, link.samples, link.runs) for link in compare.rows] if same else compare.rows
    if view.content:
        view = dataclasses.replace(view, report=dataclasses.replace(view.report, rows=()))
    return (compare.name, compare.base_label, compare.head_label, view, links)


class _SamplesPrints:
    """The fingerprints of one build's samples pages. The pages of one pair of runs share all but their series and
    compare row: what they share (the runs, their fingerprints, the compare page they link to and the commits'
    links) is digested once per pair (by identity: the evidence gives every page of a pair the same ``runs`` and
    ``prints``), where the runs have fingerprints (``SeriesSamples.prints``); else each page's samples are."""

    def __init__(self, found: evidence_pages.Links, shared: str) -> None:
        self.found, self.shared = found, shared
        self._pairs: dict[tuple[int, int, int], tuple[Any, bytes]] = {}

    def __call__(self, name: str, data: Any, compare: Any) -> Fingerprint:
        prints = getattr(data, "prints", ())
        if not prints:
            return Fingerprint(self.shared, "samples", name, _samples_input(data, compare),
                               commit_links(self.found, (run.sha for run in _sample_runs(data))))
        key = (id(data.runs), id(prints), id(compare))
        pair = self._pairs.get(key)
        if pair is None:  # the objects are kept alive with their digest: their ids are not taken again meanwhile
            linked = None if compare is None else (compare.name, compare.base_label, compare.head_label)
            pair = self._pairs[key] = ((data.runs, prints, compare), Fingerprint(
                tuple(data.base_runs), tuple(data.head_runs), data.runs, prints, linked,
                commit_links(self.found, (run.sha for run in data.runs))).digest())
        return Fingerprint(self.shared, "samples", name, data.key, pair[1], data.row)


def _sample_runs(data: Any) -> Iterable[Any]:
    runs = getattr(data, "runs", ())
    return runs if getattr(data, "prints", ()) else (run for _, run, _ in data.jobs)


def evidence_fingerprint(db_label: str, last: int | None) -> str:
    """What every compare and samples page's fingerprint starts with. They name no history page, so unlike the
    other pages (``HistoryFrame.shared``) not which history pages there are: they can be rendered before the
    analysis that decides that ends (``EvidencePages``)."""
    return Fingerprint(render_version(), db_label, last).hexdigest()


def write_evidence(site: PageSet, found: evidence_pages.Links, samples: list[tuple[str, Any, Any]], shared: str,
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
             lambda compare=compare, shas=shas: Fingerprint(shared, "compare", *compare_input(compare),
                                                            commit_links(found, shas)),
             lambda compare=compare: write(compare.name, "compare.html.j2", page=compare,
                                           hours_apart=evidence_pages._hours))
    samples_print = _SamplesPrints(found, shared)
    for name, data, compare in samples:
        if name in skip:
            continue
        page("samples", name,
             lambda name=name, data=data, compare=compare: samples_print(name, data, compare),
             lambda name=name, data=data, compare=compare: write(
                 name, "samples.html.j2", page=evidence_pages._samples_page(data, compare)))


class EvidencePages:
    """The compare and samples pages of the evidence loaded so far, rendered before the rest of the site
    (``render``): ``harness.pipeline.report.build_report`` renders the chip pages' pairs while the analysis runs in its
    own process, as those pages do not depend on it; ``write_site`` then renders the others and adds these
    (``merge_into``). The files are those ``write_site`` would write.

    With ``forked`` (where ``can_fork``), they are rendered in a forked process of their own, which calls it first
    (the store's ``forked``: connections of its own), while the report goes on: after one new run on a long
    history, its 400 samples pages are about a tenth of the report's CPU, and the analysis' process is done with its
    own before the report is done with the rest. A samples page to be drawn reads its samples there
    (``SeriesSamples.jobs``), on a connection of that process. Where the process fails, ``merge_into`` renders
    them here."""

    def __init__(self, out_dir: str | Path, manifests: SiteManifests | None, db_label: str, *, last: int | None,
                 generated_at: str, incremental: bool, forked: Callable[[], None] | None = None) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.site = PageSet(out, manifests.read(out) if manifests is not None else Manifest(),
                            incremental and manifests is not None, None, common_context(db_label, generated_at, last))
        self.shared = evidence_fingerprint(db_label, last)
        self.seconds = 0.0
        self._forked = forked
        self._pages: ForkedPages | None = None
        self._handed: set[str] = set()  # the pages the forked process renders

    @property
    def done(self) -> set[str]:
        """The pages rendered or kept so far, or being rendered by the forked process."""
        return set(self.site.manifest.pages) | self.site.stats.names | self._handed

    def render(self, evidence: Any) -> None:
        began = time.perf_counter()
        found, samples = evidence_links(evidence)
        self.site.env = page_environment(found)
        self.site.common["evidence"] = found
        skip = self.done
        self._pages = ForkedPages(self.site, lambda into: write_evidence(into, found, samples, self.shared, skip),
                                  "evidence", fork=self._forked is not None, before=self._forked)
        if self._pages.forked:
            self._handed = ({compare.name for compare in found.compares} | {name for name, _, _ in samples}) - skip
        self.seconds += time.perf_counter() - began

    def merge_into(self, site: PageSet) -> None:
        """Add these pages to ``site``, once the forked process (if any) has written them."""
        if self._pages is not None and self._pages.forked:
            self._pages.finish()
            self.seconds += self._pages.seconds
            self._handed = set()
        self._pages = None
        stats = self.site.stats
        site.merge(self.site.manifest.pages, stats.rendered, stats.kept, stats.names)

    def abandon(self) -> None:
        """Stop the forked process (the build failed before ``merge_into``)."""
        if self._pages is not None:
            self._pages.abandon()
