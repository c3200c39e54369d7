"""The status vocabulary: every status a job or test can have, and what counts as failed. Every module imports it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Status = Literal["passed", "failed", "skipped", "crashed", "timeout", "lost", "error", "xfailed", "xpassed"]
STATUSES: tuple[str, ...] = ("passed", "failed", "skipped", "crashed", "timeout", "lost", "error", "xfailed",
                             "xpassed")
# What makes a run fail (exit status 1). "error" is a test whose setup or teardown failed (a fixture error);
# "xfailed" (an expected failure) and "xpassed" (a non-strict xfail that passed) are not failures, and
# "skipped" (e.g. "Metal not available" on a CUDA machine) never is.
BAD_STATUSES: tuple[str, ...] = ("failed", "error", "crashed", "timeout", "lost")
TEST_OUTCOMES: tuple[str, ...] = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def count_label(counts: Mapping[str, int], order: tuple[str, ...] = TEST_OUTCOMES) -> str:
    """'3 passed, 1 failed, 2 skipped' in a fixed order (zero counts left out)."""
    return ", ".join(f"{counts[o]} {o}" for o in order if counts.get(o)) or "no tests"
