"""Timing modes: series timed in different modes are never compared, their verdict is ``incomparable``
(docs/statistics.md, section 5)."""

from __future__ import annotations

__all__ = ["same_mode"]


def same_mode(first: str | None, second: str | None) -> bool:
    """Whether two series were timed alike: pipelined and per-call timings differ by the host round trip and by how
    busy the GPU is kept (3x for a 30 us kernel on an H200, 5-15 % at 1-3 ms), so they are never compared. A side
    whose mode was not recorded (before modes were) or that mixes modes ("a+b") is only alike an identical one."""
    return not first or not second or first == second
