"""Render the static report site: an index and one page per chip, from plain data (no ORM here)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

STATIC = Path(__file__).resolve().parent / "static"


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_rate(value: float | None, unit: str) -> str:
    if not value:
        return "–"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def fmt_num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def chip_page_name(chip_key: str) -> str:
    return "chip-" + re.sub(r"[^A-Za-z0-9._-]", "_", chip_key) + ".html"


def environment() -> Environment:
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(time=fmt_time, rate=fmt_rate, num=fmt_num, chip_page=chip_page_name)
    return env


@dataclass(frozen=True)
class VariantRow:
    """One (kernel, dtype, shape): every variant's median and its ratio to the kernel's baseline variant."""

    kernel: str
    dtype: str
    shape_key: str
    baseline: str
    cells: dict[str, dict[str, Any]]


def variant_rows(jobs: list[dict[str, Any]], baselines: dict[str, str]) -> list[VariantRow]:
    """Ratio of each variant's median time to the baseline's on the same shape (>1 means slower)."""
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] == "benchmark" and job["median_s"]:
            groups[(job["kernel"], job["dtype"], job["shape_key"])][job["variant"]] = job
    rows = []
    for (kernel, dtype, shape_key), by_variant in sorted(groups.items()):
        baseline = baselines.get(kernel, "")
        base = by_variant.get(baseline)
        cells = {}
        for variant, job in sorted(by_variant.items()):
            ratio = job["median_s"] / base["median_s"] if base else None
            cells[variant] = {"median_s": job["median_s"], "ratio": ratio, "pct_peak": job["pct_peak"]}
        rows.append(VariantRow(kernel, dtype, shape_key, baseline, cells))
    return rows


def render_site(out_dir: str | Path, chips: list[dict[str, Any]], latest: dict[str, Any],
                baselines: dict[str, str], db_label: str) -> Path:
    """Write index.html and a page per chip into ``out_dir``; returns the index path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    css = (STATIC / "report.css").read_text(encoding="utf-8")
    for chip in chips:
        run = latest.get(chip["key"])
        jobs = run.jobs if run else []
        page = env.get_template("chip.html.j2").render(
            chip=chip, run=run, css=css, db_label=db_label,
            correctness=[j for j in jobs if j["kind"] == "correctness"],
            benchmarks=[j for j in jobs if j["kind"] == "benchmark"],
            calibration=[j for j in jobs if j["kind"] == "calibration"],
            variant_rows=variant_rows(jobs, baselines))
        (out / chip_page_name(chip["key"])).write_text(page, encoding="utf-8")
    index = out / "index.html"
    index.write_text(env.get_template("index.html.j2").render(chips=chips, latest=latest, css=css,
                                                                db_label=db_label), encoding="utf-8")
    return index
