"""The result record one job produces: the same shape from every executor, and what the store writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["passed", "failed", "skipped", "crashed", "timeout", "lost"]
STATUSES: tuple[str, ...] = ("passed", "failed", "skipped", "crashed", "timeout", "lost")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
