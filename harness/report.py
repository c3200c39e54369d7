"""Glue between the store and the renderer: load plain data, render the static site."""

from __future__ import annotations

from pathlib import Path

from harness import query
from harness.store import Store, mask_url
from reports.render import render_site

DEFAULT_REPORT_DIR = Path("harness-out") / "report"


def kernel_baselines() -> dict[str, str]:
    """Each kernel's default (baseline) variant, from the registry."""
    from kernels import REGISTRY

    return {name: kernel.default_variant for name, kernel in REGISTRY.items()}


def build_report(store: Store, out_dir: str | Path = DEFAULT_REPORT_DIR) -> Path:
    chips = query.chips(store)
    latest = {chip["key"]: query.latest_run(store, chip["key"]) for chip in chips}
    return render_site(out_dir, chips, latest, kernel_baselines(), mask_url(store.url))
