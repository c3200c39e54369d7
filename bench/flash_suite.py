"""Print the flash slice of jobs/builtin.toml (header, flash correctness, the half-precision GPU grid at
S 2048/8192 x D 64/128) as a suite of its own: what tests/data/recorded/h200-88a6d6f-flash.bundle ran.

    python bench/flash_suite.py > /tmp/flash.toml && harness run --suite /tmp/flash.toml
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BUILTIN = Path(__file__).resolve().parent.parent / "jobs" / "builtin.toml"
CORRECTNESS = ("flash-boundaries", "flash-masking")
GPU_GRID = "grid.gpu = { B = [1], H = [32], S = [2048, 8192], D = [64, 128] }"


def flash_suite(text: str) -> str:
    """The header and the flash sections of a suite document, each cut before the next kernel's banner."""
    header, *sections = re.split(r"(?m)^(?=\[\[)", text)
    keep = [header]
    for section in sections:
        name = re.search(r'name = "([^"]+)"', section).group(1)
        if name in CORRECTNESS:
            keep.append(section)
        elif name == "flash-grid-half":
            keep.append(re.sub(r"grid.gpu = .*", GPU_GRID, section))
    body = "".join(part.split("\n# ---- ")[0] + "\n" for part in keep)
    return body.replace('name = "builtin"', 'name = "builtin-flash"', 1)


if __name__ == "__main__":
    sys.stdout.write(flash_suite(BUILTIN.read_text()))
