"""Machine-level configuration read from the environment: where the per-machine cache lives."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "mlx-harness"))


def cache_dir() -> Path:
    """The per-machine cache (clones, worktrees, cluster state): ``$HARNESS_CACHE`` read at call time."""
    env = os.environ.get("HARNESS_CACHE")
    return Path(env) if env else CACHE_DIR

# The folder that holds the harness, kernels and jobs packages (a checkout, or site-packages when installed).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
