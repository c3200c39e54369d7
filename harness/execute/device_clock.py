"""Timing queued calls on the device's own clock (timing mode ``device``; CUDA only).

Pipelined timing measures the device only while the device is the bottleneck; a short kernel whose calls the host
builds and launches more slowly than the device runs them is timed at the host's pace (``harness.stats.pacing``).
This takes the host out, as NVBench's blocking kernel does: a one-thread *hold* kernel spins on the GPU's
``%globaltimer`` for ``hold_s`` while the host queues ``k`` calls behind it, then a *stamp* kernel reads the clock.
The device then runs the ``k`` calls back to back whatever the host's pace, and ``stamp - end of hold`` is their
time on the device's clock (plus the stamp's own launch, which the caller cancels by taking the difference of two
``k``). The host's issue time is returned too: if it was not well inside the hold, some calls were queued after the
hold had ended, and the span is not the device's alone.

Measured on an NVIDIA H200 (MLX 0.32.4, ``bench/device_clock_probe.py``, five fresh processes each, 15 samples of
the slope between 4 and 12 calls): causal SDPA S=1024 H=16 D=128 fp16 22.53-22.74 us a call (within a process
0.2-0.6 %), pipelined 28.0-37.2 us in the same processes (host-paced); with 5 % more keys 24.60-24.70 us (+8.5 %,
pipelined 33.2-38.6); S=2048 H=32 87.16-87.73 us (pipelined 92.2-92.8, device-paced), with 5 % more keys
96.21-96.90 us.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

HOLD_SOURCE = """
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < (unsigned long long)ns[0]) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    out[0] = now;
"""
STAMP_SOURCE = """
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    out[0] = now;
"""

Span = Callable[[int, float], tuple[float, float]]
"""span(k, hold_s) -> (device seconds from the hold's end to the stamp after k calls, host seconds spent issuing)."""


def unavailable_reason() -> str | None:
    """Why the device clock cannot be used in this process (None: it can): it needs MLX's CUDA backend."""
    try:
        import mlx.core as mx  # loads mlx: only when the device clock is asked for
    except ImportError:
        return "MLX is not installed"
    if not (hasattr(mx, "cuda") and mx.cuda.is_available()) or mx.default_device() != mx.gpu:
        return "the device clock needs MLX's CUDA backend on the default (GPU) device"
    return None


def mlx_span(issue: Callable[[], None]) -> Span:
    """The span function for MLX's CUDA backend: ``issue()`` queues one call (``mx.async_eval(fn())``)."""
    import mlx.core as mx  # loads mlx: only in a job process that times on the device clock

    kernels = {name: mx.fast.cuda_kernel(name=f"harness_{name}", input_names=["ns"], output_names=["out"],
                                         source=source)
               for name, source in (("hold", HOLD_SOURCE), ("stamp", STAMP_SOURCE))}
    no_wait = mx.array([0], dtype=mx.uint64)

    def clock(name: str, ns) -> object:
        out = kernels[name](inputs=[ns], output_shapes=[(1,)], output_dtypes=[mx.uint64], grid=(1, 1, 1),
                            threadgroup=(1, 1, 1))[0]
        mx.async_eval(out)
        return out

    def span(k: int, hold_s: float) -> tuple[float, float]:
        hold_ns = mx.array([int(hold_s * 1e9)], dtype=mx.uint64)
        mx.eval(hold_ns, no_wait)
        mx.synchronize()
        start = clock("hold", hold_ns)
        issuing = perf_counter()
        for _ in range(k):
            issue()
        end = clock("stamp", no_wait)
        issued = perf_counter() - issuing
        mx.synchronize()
        return (int(end.item()) - int(start.item())) * 1e-9, issued

    return span
