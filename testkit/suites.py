"""A small valid suite document (as parsed TOML) to build variants of, and the benchmark slice of a suite file."""

from __future__ import annotations

import re

GOOD = {
    "suite": {"name": "t"},
    "correctness": [{"name": "c", "kernel": "flash_prefill", "variants": ["sdpa"], "dtypes": ["float32"],
                     "checks": ["reference"], "shapes": [{"B": 1, "H": 1, "S_q": 4, "S_kv": 8, "D": 32}]}],
    "benchmark": [{"name": "b", "kernel": "flash_prefill", "variants": "all", "dtypes": ["float16"],
                   "grid": {"cpu": {"B": [1], "H": [2], "S": [64], "D": [32]}}}],
}


def benchmark_sections(text: str) -> str:
    """The header ([suite], [timing], [calibration.*]) and every [[benchmark]] section of a suite document (each cut
    before the next kernel's ``# ----`` banner), named ``<name>-benchmarks``."""
    header, *sections = re.split(r"(?m)^(?=\[\[)", text)
    kept = [header] + [section for section in sections if section.startswith("[[benchmark]]")]
    body = "".join(part.split("\n# ---- ")[0] + "\n" for part in kept)
    return re.sub(r'(?m)^name = "([^"]+)"', r'name = "\1-benchmarks"', body, count=1)
