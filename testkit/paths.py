"""Where the project's files are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PLUGINS = TESTS / "plugins"
DATA = TESTS / "data"
