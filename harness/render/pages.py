"""The report site written page by page: a page whose inputs did not change since the last build into the same
folder is not drawn or written again.

``write_site`` is the one site writer: it decides per page whether it must be rendered:

- always rendered: ``index.html``, ``variants.html`` and ``regressions.html`` (three pages, each reading most of
  the site's data);
- rendered when their fingerprint changed: the chip pages, the history pages (per kernel and chip, and per kernel
  on every chip), the compare pages and the samples pages -- on a large history nearly all of the site's pages and
  of its drawing. After one new run on one chip, the other chips' pages keep their fingerprints (a chip page shows
  the outcome of its variant verdicts, not their p-values adjusted across every chip: ``_chip_links`` and the
  inputs in ``_write_site`` are what it reads); the pages of every chip (``histories-<kernel>.html``) are written
  again, but a plot there is drawn on its own chip's commit axis, byte for byte as on the chip's page, so it is
  taken from that page (drawn in this build, or its kept file: ``_ChipPlots``) and only the new run's chip is
  drawn.

The history pages depend on nothing but the histories, the regression list and the commit links, so
``build_report`` starts them (``HistoryPages``) before it loads the evidence, in a forked process where that is safe
(``can_fork``), and the rest of the site is built meanwhile; where the process fails they are rendered in the
report's own. So are the chip pages' compare and samples pages (``EvidencePages``: they do not wait for the
analysis), and the chip pages that changed, while the report writes the variant matrix, the regression list and the
index (``ForkedPages``). The files are the same either way.

A page's fingerprint is a SHA-256 of everything its template reads: its own records (a history page's series,
bit for bit, with the commits of their points, its regressions with their places in the regression list, its
variants' styles and links; a compare page's report -- its rows by their stored payload's digest where it has one,
``ComparePages.content`` --, runs and row links; a samples page's runs with their
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

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.analysis.site_inputs import SiteData
from harness.core.status import is_code_failure
from harness.render.evidence import EvidencePages, compare_input, evidence_fingerprint, evidence_links, write_evidence
from harness.render.fingerprint import Fingerprint, commit_links
from harness.render.history import DeliveredHistoryPages, HistoryPages
from harness.render.pageset import Build, ForkedPages, PageSet, WriteStats, finish_build, page_environment
from reports import chip as chip_page
from reports import evidence as evidence_pages
from reports import regressions as regressions_page
from reports import render as site_render
from reports import variants as variants_page

log = logging.getLogger(__name__)


# --- the site --------------------------------------------------------------------------------------------------------


def write_site(out_dir: str | Path, data: SiteData, build: Build | None = None, *,
               history: HistoryPages | DeliveredHistoryPages | None = None, early: EvidencePages | None = None
               ) -> Path:
    """Write every page of ``data`` into ``out_dir``; returns the index path. ``data.repos``: per chip, the
    repository its page shows (the index groups by repository when there are several); ``data.others``: per chip,
    its other (repository, suite)s at their tips (``OtherSuite``), listed on its page and in their repository's
    index section. ``build``: how the pages are written (``Build``: the time stamp, the folder's manifests, whether
    incremental, the counts). ``history``: the history pages, made (and maybe started) by the caller from the same
    data (who started them stops them if this fails: ``abandon``); else they are made and rendered here. ``early``:
    compare and samples pages of ``data.evidence`` rendered already (``EvidencePages``), not rendered again."""
    build = build if build is not None else Build()
    found, samples = evidence_links(data.evidence)
    if history is None:  # not started: rendered here, when the other pages are
        history = HistoryPages(out_dir, data, build, found.commit_urls)
    return _write_site(history, found, samples, data, build, early)


def _write_site(history: HistoryPages | DeliveredHistoryPages, found: evidence_pages.Links,
                samples: list[tuple[str, Any, Any]], data: SiteData, build: Build, early: EvidencePages | None
                ) -> Path:
    chips, latest, baselines, matrix, regressions = data.chips, data.latest, data.baselines, data.matrix, \
        list(data.regressions)
    failing_before, noise, checks = data.failing_before, data.noise, data.checks
    others, manifests, stats = data.others, build.manifests, build.stats
    frame = history.frame
    out = frame.out
    site = PageSet(out, frame.previous, frame.incremental, page_environment(found), {**frame.common, "evidence": found},
                   stats=stats if stats is not None else WriteStats())
    write = site.write
    regs_of_chip: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for i, reg in enumerate(regressions):
        regs_of_chip[reg.chip].append((i, reg))

    # what the other pages read of the history pages is known before those are written: they are rendered while
    # the history pages' process still writes (``finish``, below, waits for it)
    pages = history.frame.summaries
    pages_of_chip: dict[str, list[Any]] = defaultdict(list)
    for summary_of_page in pages:
        pages_of_chip[summary_of_page.chip].append(summary_of_page)

    summary = {}
    chip_pages: list[tuple[str, str, Any]] = []
    for chip in chips:
        run = latest.get(chip["key"])
        jobs = run.jobs if run else []
        chip_regs = regs_of_chip.get(chip["key"], [])
        at_latest = [(i, r) for i, r in chip_regs if run and r.head_sha == run.sha]
        summary[chip["key"]] = {"correctness": chip_page.correctness_counts(jobs), "regressions": at_latest,
                                "all_regressions": chip_regs}
        # the outcome of each of the chip's variant verdicts, all its page shows of them: a cell's other values (its
        # p-value, adjusted across every chip) change with other chips' runs, and the page would be drawn again
        verdicts = {(c.kernel, c.dtype, c.shape_key, c.variant): c.outcome for c in (matrix.cells if matrix else ())
                    if c.chip == chip["key"]}
        winners = {(b.kernel, b.dtype, b.shape_key): b.variant for b in (matrix.best if matrix else ())
                   if b.chip == chip["key"] and b.evidence is not None}
        name = site_render.chip_page_name(chip["key"])
        inputs = {"chip": chip, "run": run, "summary": summary[chip["key"]],
                  "others": (others or {}).get(chip["key"], []), "verdicts": verdicts, "winners": winners,
                  "checks": checks or {}, "noise": (noise or {}).get(chip["key"], {}),
                  "history_pages": pages_of_chip.get(chip["key"], []),
                  "failing_before": (failing_before or {}).get(chip["key"], set())}
        chip_pages.append(("chip", name,
                           lambda name=name, inputs=inputs: Fingerprint(
                               frame.shared, "chip", name, inputs, baselines, _chip_links(found, inputs)),
                           lambda name=name, inputs=inputs: _write_chip_page(write, name, inputs, baselines)))
    # the chip pages whose inputs changed, in a process of their own while the rest is written
    in_chip_pages = ForkedPages(site, lambda into: _draw(into, chip_pages), "chip", fork=len(chip_pages) > 1)
    try:
        _write_the_rest(site, history, found, samples, data, early, matrix, summary)
    except BaseException:
        in_chip_pages.abandon()
        raise
    in_chip_pages.finish()
    if early is not None:  # its process wrote them meanwhile
        early.merge_into(site)
    history.finish(site)
    finish_build(out, site.previous, site.manifest, manifests, site.incremental, site.stats)
    log.info("pages: %s", site.stats.summary())
    return out / "index.html"


def _draw(into: PageSet, pages: list[tuple[str, str, Any, Any]]) -> None:
    """Pages as (kind, name, fingerprint, render)."""
    for kind, name, fingerprint, render in pages:
        into.page(kind, name, fingerprint, render)


def _write_chip_page(write: Any, name: str, inputs: dict[str, Any], baselines: Mapping[str, str]) -> Path:
    """A chip's page: its latest run's jobs in tables, its regressions, noise, variants and history pages."""
    run, failing_before = inputs["run"], inputs["failing_before"]
    jobs = run.jobs if run else []
    return write(name, "chip.html.j2", chip=inputs["chip"], run=run, summary=inputs["summary"],
                 others=inputs["others"], verdicts=inputs["verdicts"], winners=inputs["winners"],
                 checks=inputs["checks"], correctness_tables=chip_page.correctness_tables(jobs, baselines),
                 cell_title=chip_page.cell_title,
                 correctness=[j for j in jobs if j["kind"] == "correctness"],
                 failures=[j for j in jobs if j["kind"] == "correctness" and is_code_failure(j["status"])],
                 benchmarks=[j for j in jobs if j["kind"] == "benchmark" and j["status"] != "skipped"],
                 skipped_benchmarks=chip_page.skipped_groups(jobs), noise=inputs["noise"],
                 calibration=[j for j in jobs if j["kind"] == "calibration"],
                 variant_rows=chip_page.variant_rows(jobs, baselines),
                 views=chip_page.chip_views(jobs, run.peak_flops if run else None,
                                              run.peak_bytes_per_s if run else None, baselines),
                 history_pages=inputs["history_pages"],
                 selections=chip_page.test_selections(jobs, failing_before),
                 sources=chip_page.run_sources(jobs), failing_tests=chip_page.failing_tests(jobs, failing_before))


def _chip_links(found: evidence_pages.Links, inputs: dict[str, Any]) -> tuple[Any, ...]:
    """What a chip page reads of the site's links (``chip.html.j2``): its run's compare page (``shown``), the samples
    pages of its jobs' runs (``job_samples``) and the web links of the commits it names (``commit_ref``)."""
    chip, run = inputs["chip"]["key"], inputs["run"]
    compare = found.shown.get(chip)
    runs = sorted({run.id, *(job.get("run_id") or run.id for job in run.jobs)}) if run else []
    shas = [run.sha] if run else []
    shas += [other.run.sha for other in inputs["others"]]
    if compare is not None:
        report = compare.view.report
        shas += [report.base.sha, report.head.sha]
    return (compare_input(compare) if compare is not None else None,
            [(run_id, found.chip_samples.get((chip, run_id), {})) for run_id in runs], commit_links(found, shas))


def _write_the_rest(site: PageSet, history: HistoryPages | DeliveredHistoryPages, found: evidence_pages.Links,
                    samples: list[tuple[str, Any, Any]], data: SiteData, early: EvidencePages | None, matrix: Any,
                    summary: dict[str, Any]) -> None:
    """The site's pages but the chip pages and the history pages: the compare and samples pages not rendered
    early, the variant matrix, the regression list and its feed, the index."""
    page, write, frame = site.page, site.write, history.frame
    chips, latest, regressions, acks = data.chips, data.latest, list(data.regressions), data.acks
    repos, others = data.repos, data.others
    # --- the evidence path (reports.evidence): commit links and run ids on every page, compare and samples pages
    write_evidence(site, found, samples, evidence_fingerprint(frame.common["db_label"], frame.common["last"]),
                   early.done if early is not None else frozenset())
    matrix_chips, rows = variants_page.matrix_rows(matrix)
    pages = frame.summaries
    page("variants", "variants.html", None,
         lambda: write("variants.html", "variants.html.j2", matrix=matrix, chips=matrix_chips, rows=rows,
                       rollup=variants_page.variant_rollup(matrix)))
    context = regressions_page.regressions_context(regressions, acks, found.commit_urls)
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
