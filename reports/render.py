"""The site's formatting filters, page file names and templates; each page's pieces live in a module of their own.

Pages (all in one folder, relative links only but for commits' web pages, CSS inlined, nothing fetched; one
inline script, ``static/report.js``, sorts and filters tables and writes the hover texts of long histories, allowed
by each page's CSP through its hash only):

- ``index.html``: every chip with its latest commit and status, links to everything below;
- ``chip-<key>.html``: identity, calibrated peaks, correctness matrix, variant comparison, benchmarks;
- ``variants.html``: the cross-chip variant matrix, divergent variants first;
- ``history-<kernel>--<chip>.html``: a plot per (dtype, shape) overlaying the variants (inline SVG, its log-axis
  layer behind a checkbox) and the commit table; ``histories-<kernel>.html``: the same on every chip, a chip selector;
- ``regressions.html``: new correctness failures, then confirmed regressions, with their evidence.
- ``compare-*.html`` and ``samples-*.html``: the evidence path, a compare page per chip and per regression and the
  raw samples behind them (``reports.evidence``).

Inputs are the plain records of ``harness.analysis.site_inputs`` (chips, runs with jobs) and ``harness.analysis``
(``VariantMatrix``, ``SeriesHistory``, ``RegressionEvidence``); records are read by attribute, so any object
with the same fields renders. Templates autoescape everything; the only ``Markup`` is the SVG built by
``reports.svg``, which escapes every text it embeds (hover texts built here are escaped before being marked safe).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemBytecodeCache, PackageLoader, select_autoescape
from jinja2.bccache import Bucket
from markupsafe import Markup, escape

STATIC = Path(__file__).resolve().parent / "static"
MAX_PLOT_POINTS = 120  # per plot; longer histories are downsampled into this many buckets


# --- formatting ------------------------------------------------------------------------------------------------


def fmt_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
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
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"


def fmt_scaled(value: float | None, scale: float) -> str:
    """A rate in a fixed unit (TFLOP/s, GB/s) so a column compares at a glance."""
    return "–" if not value else f"{value / scale:.3g}"


def fmt_p(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def fmt_when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value or "")[:16].replace("T", " ")


def first_line(text: str | None, limit: int = 90) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def breakable(text: Any, after: str = ",") -> Markup:
    """Escaped text that may wrap only after one of ``after`` (a shape key after its commas, a variant name after
    "_" too), so a wide table shrinks to the page without cutting ``S_q=2048`` in two."""
    escaped = str(escape(str(text)))
    for char in after:
        escaped = escaped.replace(char, char + "<wbr>")
    return Markup(escaped)


def fmt_ratio_ci(ratio: float | None, low: float | None, high: float | None) -> str:
    if ratio is None or not math.isfinite(ratio):
        return "–"
    text = f"×{ratio:.3f}"
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        text += f" [{low:.3f}, {high:.3f}]"
    return text


def fmt_iso(value: Any) -> str:
    """An Atom date: ISO 8601 with a time zone (UTC when the value has none); the epoch for None."""
    if value is None:
        return "1970-01-01T00:00:00Z"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.isoformat(timespec="seconds") + "Z"
        return value.isoformat(timespec="seconds")
    return str(value)


# --- file names --------------------------------------------------------------------------------------------------


def slug(text: str) -> str:
    """A file-name-safe form; when characters had to be replaced, a short hash keeps distinct names distinct."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text)
    if cleaned != text or not cleaned:
        cleaned = f"{cleaned[:40]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return cleaned


def chip_page_name(chip_key: str) -> str:
    return "chip-" + re.sub(r"[^A-Za-z0-9._-]", "_", chip_key) + ".html"


def history_page_name(kernel: str, chip_key: str) -> str:
    return f"history-{slug(kernel)}--{re.sub(r'[^A-Za-z0-9._-]', '_', chip_key)}.html"


def commit_anchor(sha: str) -> str:
    return "c-" + re.sub(r"[^A-Za-z0-9]", "", sha)[:16]


class _TemplateCodeCache(FileSystemBytecodeCache):
    """The templates' compiled code kept between processes, in jinja2's per-user folder of the temporary
    directory: a report runs as a process of its own, and compiling the templates was about 0.3 s of each. jinja2
    compiles a template again when its source or jinja2 itself changed, but not when the environment's options
    did: the files are named by a digest of this module, where they are set. A folder that cannot be read or
    written costs a compile, never a page."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except OSError:
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _template_code_cache() -> _TemplateCodeCache | None:
    options = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    try:
        return _TemplateCodeCache(pattern=f"__harness_reports_{options}_%s.cache")
    except (OSError, RuntimeError):  # no safe folder of this user's (jinja2 checks its owner and mode)
        return None


def environment() -> Environment:
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True, bytecode_cache=_template_code_cache())
    env.filters.update(time=fmt_time, rate=fmt_rate, num=fmt_num, chip_page=chip_page_name, scaled=fmt_scaled,
                       p=fmt_p, when=fmt_when, first_line=first_line, ratio_ci=fmt_ratio_ci,
                       anchor=commit_anchor, iso=fmt_iso)
    env.globals.update(history_page=history_page_name)
    env.filters["breakable"] = breakable  # shape keys and variant names in wide tables
    env.globals.update(page_script())  # the tables' script and its CSP source (base.html.j2)
    return env


def page_script() -> dict[str, Any]:
    """The one inline script of every page (``static/report.js``: sortable, filterable tables, the hover texts of
    bucketed histories) and the CSP source that allows exactly it, ``'sha256-<base64 of its SHA-256>'``: nothing
    else may run, nothing is fetched."""
    text = (STATIC / "report.js").read_text(encoding="utf-8")
    if "</" in text or "<!--" in text:  # it would end the <script> element early
        raise ValueError("static/report.js must not contain '</' or '<!--'")
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return {"page_script": Markup(text), "page_script_csp": f"'sha256-{digest}'"}
