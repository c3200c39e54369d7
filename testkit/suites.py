"""A small valid suite document (as parsed TOML) to build variants of."""

from __future__ import annotations

GOOD = {
    "suite": {"name": "t"},
    "correctness": [{"name": "c", "kernel": "flash_prefill", "variants": ["sdpa"], "dtypes": ["float32"],
                     "checks": ["reference"], "shapes": [{"B": 1, "H": 1, "S_q": 4, "S_kv": 8, "D": 32}]}],
    "benchmark": [{"name": "b", "kernel": "flash_prefill", "variants": "all", "dtypes": ["float16"],
                   "grid": {"cpu": {"B": [1], "H": [2], "S": [64], "D": [32]}}}],
}
