"""The result record one job produces: the same shape from every executor, and what the store writes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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


@dataclass
class TestOutcome:
    """One pytest test's outcome, as harness/pytest_plugin.py records it (the JSON lines it writes)."""

    __test__ = False  # not a pytest test class
    nodeid: str
    outcome: str  # one of TEST_OUTCOMES
    duration_s: float = 0.0
    detail: str = ""  # skip / xfail reason, or the first lines of the failure
    longrepr: str = ""  # the failure's full report (tail kept)


@dataclass
class JobResult:
    """What happened to one job. Benchmarks carry raw samples (seconds per call) and the protocol used."""

    key: str
    status: Status
    detail: str = ""
    max_error: float | None = None
    tolerance: float | None = None
    samples: list[float] = field(default_factory=list)
    inner: int | None = None
    warmup_s: float | None = None
    warmup_calls: int | None = None
    flops: float | None = None
    bytes_moved: float | None = None
    duration_s: float = 0.0
    output_tail: str = ""
    node: str = ""
    attempts: int = 1
    tests: list[dict[str, Any]] = field(default_factory=list)  # a pytest job's per-test outcomes (TestOutcome)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
