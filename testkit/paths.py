"""Where the project's files are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PLUGINS = TESTS / "plugins"
DATA = TESTS / "data"
EXAMPLES = ROOT / "reports" / "examples"  # the recorded runs the docs use (and tests read)
RECORDED = DATA / "recorded"  # recorded-hardware runs that only tests read
TOOLS = ROOT / "tools"
BENCH = ROOT / "bench"


def recorded(name: str) -> Path:
    """A recorded run or probe output by file name, from reports/examples/ or tests/data/recorded/."""
    for folder in (EXAMPLES, RECORDED):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{name} is in neither {EXAMPLES} nor {RECORDED}")
