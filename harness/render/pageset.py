"""One build's pages: the manifest bookkeeping (render, keep or delete a page), the templates and shared context."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis.site_manifests import Manifest, SiteManifests
from harness.core.fork import ForkedWork, can_fork
from harness.render.fingerprint import Fingerprint
from reports import evidence as evidence_pages
from reports import render as site_render

log = logging.getLogger(__name__)


@dataclass
class Build:
    """How one build writes its pages: its time stamp; ``manifests``: the folder's last build is known (None: every
    page is rendered, nothing read or stored); ``incremental``: only the pages whose fingerprint changed are rendered
    and the new manifest is stored, else every page is and the manifest is removed (either way the pages the last
    build wrote and this one does not make are deleted); ``stats`` counts the pages."""

    generated_at: str = ""
    manifests: SiteManifests | None = None
    incremental: bool = True
    stats: WriteStats | None = None


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


# --- one build's pages --------------------------------------------------------------------------------------------


@dataclass
class PageSet:
    """What the pages of one build into ``out`` share: the last build's manifest (``previous``), this one's and its
    counts, the templates (``env``) and the context every page gets (``common``). ``page`` decides and writes."""

    out: Path
    previous: Manifest
    incremental: bool
    env: Any
    common: dict[str, Any]
    manifest: Manifest = field(default_factory=Manifest)
    stats: WriteStats = field(default_factory=WriteStats)

    def write(self, name: str, template: str, *, splice: Callable[[str], Iterable[bytes | memoryview]] | None = None,
              **context: Any) -> Path:
        """The page ``name`` from ``template``, as UTF-8; ``splice``: its text to the bytes written (e.g. parts of
        kept files put in for tokens: ``harness.render.history``)."""
        path = self.out / name
        text = self.env.get_template(template).render(**self.common, **context)
        with path.open("wb") as file:
            for part in splice(text) if splice is not None else (text.encode("utf-8"),):
                file.write(part)
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
        """Add what another ``PageSet`` of this build wrote (``HistoryPages``, maybe in another process)."""
        self.manifest.pages.update(pages)
        for kind, count in rendered.items():
            self.stats.rendered[kind] += count
        for kind, count in kept.items():
            self.stats.kept[kind] += count
        self.stats.names |= names


class ForkedPages:
    """Pages that ``draw(into)`` writes into a ``PageSet``, drawn by a forked process (``fork`` and where
    ``can_fork``; it calls ``before`` first, e.g. the store's ``forked`` where a page reads the database) while the
    build goes on, else here at once. ``finish`` adds what the process wrote to ``site``, or draws the pages here
    where it failed (``label`` names them in the warning). ``seconds``: how long drawing took, wherever it ran. The
    files are the same either way."""

    def __init__(self, site: PageSet, draw: Callable[[PageSet], None], label: str, *, fork: bool = True,
                 before: Callable[[], None] | None = None) -> None:
        self.site, self.draw, self.label, self.before = site, draw, label, before
        self.seconds = 0.0
        self.forked = fork and can_fork()
        self._work: ForkedWork | None = ForkedWork(self._in_child) if self.forked else None
        if not self.forked:
            self._render(site)

    def _render(self, into: PageSet) -> None:
        began = time.perf_counter()
        self.draw(into)
        self.seconds += time.perf_counter() - began

    def _in_child(self, send: Callable[[Any], None]) -> None:
        if self.before is not None:
            self.before()
        own = PageSet(self.site.out, self.site.previous, self.site.incremental, self.site.env, self.site.common)
        self._render(own)
        send((own.manifest.pages, dict(own.stats.rendered), dict(own.stats.kept), own.stats.names, self.seconds))

    def finish(self) -> None:
        if self._work is None:
            return
        ok, result = self._work.receive()
        self._work.close()
        self._work = None
        if ok:
            *parts, self.seconds = result
            self.site.merge(*parts)
        else:
            log.warning("%s pages: their process failed (%s); rendered here instead", self.label, result)
            self._render(self.site)

    def abandon(self) -> None:
        """Stop the forked process (the build failed before ``finish``)."""
        if self._work is not None:
            self._work.abandon()
            self._work = None


def page_environment(links: evidence_pages.Links) -> Any:
    """The templates, with ``links``' commit links and run ids."""
    env = site_render.environment()
    env.globals.update(commit_ref=links.commit_ref, web_link=links.web_link, run_ids=links.run_ids)
    env.filters.update(pct_change=evidence_pages.change, pct=evidence_pages.percent,
                       noise_text=evidence_pages.noise_text)
    return env


def common_context(db_label: str, generated_at: str, last: int | None) -> dict[str, Any]:
    """What every page's template gets: the stylesheet, the database label, the build's stamp and ``last``."""
    return {"css": (site_render.STATIC / "report.css").read_text(encoding="utf-8"), "db_label": db_label,
            "generated_at": generated_at, "last": last}


def finish_build(out: Path, previous: Manifest, manifest: Manifest, manifests: SiteManifests | None, incremental: bool,
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
