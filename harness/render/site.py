"""Glue between the store and the renderer: load plain data and verdicts, render the static site."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.analysis.history import history
from harness.analysis.noise import noise_report
from harness.analysis.records import NoiseRow, RegressionEvidence, SeriesHistory, VariantMatrix
from harness.analysis.regressions import regressions as find_regressions
from harness.analysis.variants import default_variants, variant_matrix
from harness.core.errors import HarnessError
from harness.record import query
from harness.record.store import Store, mask_url
from reports.render import render_site

DEFAULT_REPORT_DIR = Path("harness-out") / "report"


@dataclass
class SiteData:
    """Everything the site shows, loaded and analysed; ``timings`` says where the time went (seconds)."""

    chips: list[dict[str, Any]]
    latest: dict[str, query.RunView | None]
    failing_before: dict[str, set[str]]  # per chip: job keys failing correctness in the run before the latest
    baselines: dict[str, str]
    matrix: VariantMatrix
    histories: dict[str, list[SeriesHistory]]
    regressions: list[RegressionEvidence]
    db_label: str
    noise: dict[str, dict[tuple[str, str, str, str], NoiseRow]] = field(default_factory=dict)
    last: int | None = None
    timings: dict[str, float] = field(default_factory=dict)


def _shown_runs(store: Store, chips: list[dict[str, Any]], commit: str | None) -> dict[str, query.RunView | None]:
    """Per chip: its latest run, or with ``commit`` the newest run of that commit there (None where it has none)."""
    if commit is None:
        return {chip["key"]: query.latest_run(store, chip["key"]) for chip in chips}
    resolved = query.resolve_ref(store, commit)
    if resolved.kind != "commit":
        raise HarnessError(f"--commit {commit}: that is a run id; give its commit ({resolved.sha[:12]})")
    return {chip["key"]: query.get_run(store, resolved.runs[chip["key"]][-1]) if chip["key"] in resolved.runs
            else None for chip in chips}


def load_site(store: Store, *, change_points: bool = True, last: int | None = None,
              commit: str | None = None) -> SiteData:
    """Query and analyse: latest run per chip, the variant matrix, every chip's history and the regression list.

    ``last``: histories and regressions cover each chip's last N commits only (all when None). ``commit``: the chip
    pages, the variant matrix and the noise show that commit's runs instead of each chip's latest run.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chips = query.chips(store)
    latest = _shown_runs(store, chips, commit)
    failing_before = {key: _failing_before(store, run) for key, run in latest.items()}
    timings["latest runs"] = time.perf_counter() - start
    start = time.perf_counter()
    matrix = variant_matrix(store, commit)
    timings["variant matrix"] = time.perf_counter() - start
    start = time.perf_counter()
    histories = {chip["key"]: history(store, chip["key"], change_points=change_points, last=last)
                 for chip in chips}
    timings["histories"] = time.perf_counter() - start
    start = time.perf_counter()
    regressions = find_regressions(store, last=last)
    timings["regressions"] = time.perf_counter() - start
    start = time.perf_counter()
    noise: dict[str, dict[tuple[str, str, str, str], NoiseRow]] = {}
    for row in noise_report(store, commit).rows:  # the runs the chip pages show
        noise.setdefault(row.key.chip, {})[(row.key.kernel, row.key.variant, row.key.dtype, row.key.shape_key)] = row
    timings["noise"] = time.perf_counter() - start
    return SiteData(chips, latest, failing_before, default_variants(), matrix, histories, regressions,
                    mask_url(store.url), noise, last, timings)


def _failing_before(store: Store, run: query.RunView | None) -> set[str]:
    previous = query.previous_run_id(store, run.id) if run else None
    return {row.key for row in query.correctness_failures(store, [previous])} if previous else set()


def check_descriptions() -> dict[str, str]:
    """Each registered correctness check's name -> the first sentence of its docstring (what it verifies)."""
    from kernels import REGISTRY  # loads mlx: only when a report is rendered

    found: dict[str, str] = {}
    for kernel in REGISTRY.values():
        for name, check in kernel.checks.items():
            doc = " ".join((check.__doc__ or "").strip().split("\n\n")[0].split())
            found.setdefault(name, doc)
    return found


def render(data: SiteData, out_dir: str | Path = DEFAULT_REPORT_DIR) -> Path:
    start = time.perf_counter()
    index = render_site(out_dir, data.chips, data.latest, data.baselines, data.db_label, matrix=data.matrix,
                        checks=check_descriptions(),
                        failing_before=data.failing_before,
                        histories=data.histories, regressions=data.regressions, last=data.last, noise=data.noise,
                        generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    data.timings["render"] = time.perf_counter() - start
    return index


def build_report(store: Store, out_dir: str | Path = DEFAULT_REPORT_DIR, *, change_points: bool = True,
                 last: int | None = None, commit: str | None = None) -> Path:
    """Load, analyse and render the whole site into ``out_dir``; returns the index path."""
    return render(load_site(store, change_points=change_points, last=last, commit=commit), out_dir)
