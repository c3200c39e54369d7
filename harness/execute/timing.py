"""The timing protocol: warm-up, inner-loop calibration, raw samples, median and its confidence interval.

MLX is lazy, so one call is timed as ``mx.eval(fn())``, with ``mx.synchronize()``
before the clock starts and before it stops. Each synchronize costs tens of
microseconds on a GPU, so (as pyperf and timeit do) one *sample* times ``inner``
back-to-back calls, with ``inner`` calibrated so that a sample lasts at least
``min_sample_s``; the stored value is seconds per call. A warm-up of at least
``warmup_s`` (and ``warmup_calls`` calls) comes first: JIT compilation, caches,
GPU clocks. The spread (IQR / median) is stored with every result so noisy
series are visible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.core import defaults


@dataclass(frozen=True)
class TimingProtocol:
    """How one benchmark job is timed; every field is stored with the result."""

    warmup_s: float = defaults.WARMUP_S
    warmup_calls: int = defaults.WARMUP_CALLS
    min_sample_s: float = defaults.MIN_SAMPLE_S
    samples: int = defaults.SAMPLES
    max_inner: int = defaults.MAX_INNER


@dataclass(frozen=True)
class Measurement:
    """Raw samples (seconds per call) and how they were taken."""

    samples: list[float]
    inner: int
    warmup_s: float
    warmup_calls: int


def _timed(call: Callable[[], None], sync: Callable[[], None], inner: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(inner):
        call()
    sync()
    return time.perf_counter() - start


def calibrate_inner(call: Callable[[], None], sync: Callable[[], None], protocol: TimingProtocol) -> int:
    """Smallest power-of-two-ish loop count whose sample lasts at least ``min_sample_s``."""
    inner = 1
    while inner < protocol.max_inner:
        elapsed = _timed(call, sync, inner)
        if elapsed >= protocol.min_sample_s:
            break
        # Aim straight for the target with headroom instead of doubling blindly.
        factor = protocol.min_sample_s / max(elapsed, 1e-9)
        inner = min(protocol.max_inner, max(inner * 2, int(inner * factor * 1.2) + 1))
    return inner


def measure(call: Callable[[], None], sync: Callable[[], None], protocol: TimingProtocol) -> Measurement:
    """Warm up, calibrate the inner loop, then take ``samples`` samples of seconds per call."""
    start = time.perf_counter()
    calls = 0
    while calls < protocol.warmup_calls or time.perf_counter() - start < protocol.warmup_s:
        call()
        calls += 1
    sync()
    warm = time.perf_counter() - start
    inner = calibrate_inner(call, sync, protocol)
    samples = [_timed(call, sync, inner) / inner for _ in range(protocol.samples)]
    return Measurement(samples=samples, inner=inner, warmup_s=warm, warmup_calls=calls)


def measure_mlx(fn: Callable[[], object], protocol: TimingProtocol) -> Measurement:
    """Time an MLX function: each call is ``mx.eval(fn())``."""
    import mlx.core as mx  # loads mlx: only when needed

    return measure(lambda: mx.eval(fn()), mx.synchronize, protocol)


