"""Who set the pace of a pipelined benchmark: the device, or the host issuing its calls?

A pipelined sample (``harness.execute.timing``) issues its calls back to back and waits once at its end. When the
device is the bottleneck, calls queue up: the host issues the last one while the device still has a backlog of
them, and the time per call is the device's. When the host is the bottleneck (building and launching a call takes
longer than the device needs to run it), nothing queues: the device waits for every call, and the time per call
is the host's pace. A change in the kernel alone then hardly shows (a 5 % slower kernel that still finishes before
the next launch arrives changes nothing), and the time follows the host thread's pace, which differs between
processes.

The backlog is measured per sample: the calls the device still had to run when the host had issued the last one,
``(sample time - issuing time) x calls / sample time`` (``Measurement.backlog_calls``: the median over samples).

Measured on an NVIDIA H200 with MLX 0.32.4 (pipelined, default protocol, three fresh processes each): device-paced
kernels keep about 18 calls queued (MLX bounds the work in flight), whatever their length -- causal SDPA at
S=2048-8192 (56 us to 1.04 ms a call), a 4096^2 matmul (0.21 ms); host-paced ones 0.7-2.7 -- causal SDPA at S=1024
with H=16 (27-76 us a call; its process medians spread 15-41 % between processes), a 1024^2 matmul (25-35 us),
a chain of 50 tiny ops. :data:`HOST_PACED_BACKLOG` sits between. Statistics of the harness: docs/statistics.md.
"""

from __future__ import annotations

HOST_PACED_BACKLOG = 4.0
"""A pipelined series whose device had fewer calls than this queued when its host had issued a sample's last call is
host-paced. Only recorded where a sample holds at least twice this many calls (a backlog could build)."""


def host_paced(backlog_calls: float | None) -> bool:
    """Whether a measurement with this backlog (``None``: not recorded, or per-call) was paced by its host."""
    return backlog_calls is not None and backlog_calls < HOST_PACED_BACKLOG
