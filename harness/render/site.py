"""Glue between the store and the renderer: load plain data and verdicts, render the static site."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.analysis import grid as analysis
from harness.record import query
from harness.record.store import Store, mask_url
from reports.render import render_site

DEFAULT_REPORT_DIR = Path("harness-out") / "report"


def kernel_baselines() -> dict[str, str]:
    """Each kernel's default (baseline) variant, from the registry."""
    from kernels import REGISTRY

    return {name: kernel.default_variant for name, kernel in REGISTRY.items()}


@dataclass
class SiteData:
    """Everything the site shows, loaded and analysed; ``timings`` says where the time went (seconds)."""

    chips: list[dict[str, Any]]
    latest: dict[str, query.RunView | None]
    baselines: dict[str, str]
    matrix: analysis.VariantMatrix
    histories: dict[str, list[analysis.SeriesHistory]]
    regressions: list[analysis.RegressionEvidence]
    db_label: str
    last: int | None = None
    timings: dict[str, float] = field(default_factory=dict)


def load_site(store: Store, *, change_points: bool = True, last: int | None = None) -> SiteData:
    """Query and analyse: latest run per chip, the variant matrix, every chip's history and the regression list.

    ``last``: histories and regressions cover each chip's last N commits only (all when None).
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chips = query.chips(store)
    latest = {chip["key"]: query.latest_run(store, chip["key"]) for chip in chips}
    timings["latest runs"] = time.perf_counter() - start
    start = time.perf_counter()
    matrix = analysis.variant_matrix(store)
    timings["variant matrix"] = time.perf_counter() - start
    start = time.perf_counter()
    histories = {chip["key"]: analysis.history(store, chip["key"], change_points=change_points, last=last)
                 for chip in chips}
    timings["histories"] = time.perf_counter() - start
    start = time.perf_counter()
    regressions = analysis.regressions(store, last=last)
    timings["regressions"] = time.perf_counter() - start
    return SiteData(chips, latest, kernel_baselines(), matrix, histories, regressions, mask_url(store.url), last,
                    timings)


def render(data: SiteData, out_dir: str | Path = DEFAULT_REPORT_DIR) -> Path:
    start = time.perf_counter()
    index = render_site(out_dir, data.chips, data.latest, data.baselines, data.db_label, matrix=data.matrix,
                        histories=data.histories, regressions=data.regressions, last=data.last,
                        generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    data.timings["render"] = time.perf_counter() - start
    return index


def build_report(store: Store, out_dir: str | Path = DEFAULT_REPORT_DIR, *, change_points: bool = True,
                 last: int | None = None) -> Path:
    """Load, analyse and render the whole site into ``out_dir``; returns the index path."""
    return render(load_site(store, change_points=change_points, last=last), out_dir)
