"""The timing protocol: warm-up, timing mode, inner-loop calibration, raw samples, and the host's round trip.

MLX is lazy: ``fn()`` only builds a graph, and the work runs when it is evaluated. One MLX call is therefore
issued as ``mx.async_eval(fn())`` (schedule the work, do not wait) and ``mx.synchronize()`` waits until everything
issued has finished. Where the wait goes is the *timing mode*:

- ``per-call``: every call is waited for before the next is issued (``async_eval`` then ``synchronize``, which is
  what ``mx.eval(fn())``, the harness's only mode until now, does). Each call then also pays the host's round
  trip: the kernel launch latency, the device idling while the host wakes up, and the host building the next
  graph while the device waits.
- ``pipelined``: a sample issues its ``inner`` calls back to back and waits once, at its end. The host builds and
  launches call k+1 while the device runs call k, so the time per call is the device's steady-state throughput,
  which is what a kernel change moves, and one round trip is spread over the whole sample.

Why pipelined is the default: on an NVIDIA H200, with 8 fresh processes per setting, causal SDPA (S=2048, D=128,
fp16) measured 0.168 ms/call with 2.8 % spread between processes per-call, and 0.093 ms with 0.35 % pipelined; a
4096^2 fp16 matmul 0.312 ms / 10 % per-call and 0.209 ms / 0.46 % pipelined. Per-call added 50-80 % to the time: the
round trip paid on every call, whose jitter (host scheduling, the device idling between calls) swamps the kernel's
own variation; a longer warm-up changed nothing. But a launch-bound chain of 50 tiny ops went the other way: 17 %
spread between processes pipelined against 4-7 % per-call (the cause is not established; thousands of tiny
launches queued at once are the suspect). Hence the default mode ``auto``: after the warm-up, a short *pilot*
calibrates both modes and times :data:`PILOT_SAMPLES` short interleaved samples in each; pipelined is used unless
its relative spread is more than :data:`SPREAD_RATIO` times the per-call one *and* above :data:`SPREAD_FLOOR`
(:func:`choose_mode`). The pilot sees only the spread within one process; the spread between processes shows only
across trials (``bench/timing_spread.py`` reports both). When a call is long (fewer than :data:`PILOT_MIN_INNER`
pipelined calls fill a sample: over 2.5 ms at the default ``min_sample_s``) a round trip is small against it and
the pilot is skipped (pipelined); otherwise it costs the two calibrations (about 1.2 ``min_sample_s`` each) plus
2 x :data:`PILOT_SAMPLES` samples of a quarter ``min_sample_s``: about 0.1-0.15 s at the default 0.02 s. The mode
used and both pilot spreads are stored with the result: the two modes give different times for one kernel, so
compare medians of one mode only.

A *sample* times ``inner`` calls (as pyperf and timeit do), with ``inner`` calibrated in the sample's mode so
that a sample lasts at least ``min_sample_s``; the stored value is seconds per call. A warm-up of at least
``warmup_s`` (and ``warmup_calls`` calls) comes first, in the mode that will be timed (pipelined for ``auto``):
JIT compilation, caches, allocator pools, clocks. Pipelined warm-up issues its calls in bursts that double in
length and waits after each, so it never queues more than about ``warmup_s`` of work. The spread (IQR / median)
is stored with every result so noisy series are visible.

The host's round trip is measured apart, after the warm-up: the median of :data:`ROUND_TRIP_REPEATS` trivial
calls-and-waits (for MLX, ``mx.eval`` + ``mx.synchronize()`` of a one-element array). It is what per-call mode adds
to every call, and it tells a slow host from a slow kernel.

- ``device`` (MLX's CUDA backend; elsewhere ``pipelined``): the device's own clock. A hold kernel keeps the stream
  busy while the host queues a span of calls behind it, and stamp kernels read the GPU clock when the hold ends and
  after the calls (``harness.execute.device_clock``): a sample is the slope between spans of 4 and 12 calls, so
  neither the host's pace nor a launch's fixed cost is in it. For kernels shorter than the host's work per call
  (host-paced, below) it is the only mode that sees the kernel: on the H200 causal SDPA at S=1024 took 22.5-22.7 us
  a call in five fresh processes, where pipelined said 28-37 us.

A pipelined sample also records the device's *backlog*: the calls it still had to run when the host had issued the
last one (``Measurement.backlog_calls``, the median over samples). Device-paced kernels keep a queue; host-paced
ones (a call is built and launched more slowly than the device runs it) leave none, and their time per call is the
host's pace, not the kernel's (``harness.stats.pacing``: the measurements and the threshold).

:func:`measure` times any callable with a given ``sync`` (a plain Python callable with a no-op sync too: its mode
then makes no difference); :func:`measure_mlx` times an MLX function with the protocol's mode.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

from harness.core import defaults
from harness.execute import device_clock
from harness.execute.device_clock import Span
from harness.stats import pacing

MODES = ("auto", "pipelined", "per-call", "device")
DEVICE_CALLS = (4, 12)  # "device": a sample is the slope of the device time between this many queued calls (fewer
# than the ~18 calls MLX lets queue on the H200, so the host never waits while the hold runs)
DEVICE_HOLD_S = 0.002  # "device": the hold the host queues a span's calls behind, doubled while too short ...
DEVICE_HOLD_MAX_S = 0.128  # ... up to this; beyond, the calls cannot all be queued: pipelined instead
DEVICE_HOLD_MARGIN = 0.5  # a span counts only if the host issued its calls within this fraction of the hold
PILOT_SAMPLES = 5  # pilot samples per mode (interleaved) in "auto"
PILOT_FRACTION = 0.25  # a pilot sample times this fraction of the mode's calibrated inner loop
PILOT_MIN_INNER = 8  # no pilot (pipelined) when fewer pipelined calls fill a sample: a call is then over
# min_sample_s / 8 (2.5 ms at the default), which dwarfs a round trip, and a pilot sample would hold 1 call
SPREAD_RATIO = 1.5  # "auto" falls back to per-call when the pipelined pilot spread is over this many times ...
SPREAD_FLOOR = 0.01  # ... the per-call one and over this (relative spread, IQR / median)
ROUND_TRIP_REPEATS = 20  # trivial call-and-waits whose median is the host's round trip
BACKLOG_MIN_INNER = int(2 * pacing.HOST_PACED_BACKLOG)  # fewer calls a sample: no backlog recorded (it could not build)


@dataclass(frozen=True)
class TimingProtocol:
    """How one benchmark job is timed; every field is stored with the result."""

    warmup_s: float = defaults.WARMUP_S
    warmup_calls: int = defaults.WARMUP_CALLS
    min_sample_s: float = defaults.MIN_SAMPLE_S
    samples: int = defaults.SAMPLES
    max_inner: int = defaults.MAX_INNER
    mode: str = defaults.TIMING_MODE  # "auto" | "pipelined" | "per-call"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"timing mode {self.mode!r} is none of {', '.join(MODES)}")


@dataclass(frozen=True)
class Measurement:
    """Raw samples (seconds per call) and how they were taken."""

    samples: list[float]
    inner: int
    warmup_s: float
    warmup_calls: int
    mode: str  # the mode the samples were taken in: "pipelined" or "per-call"
    round_trip_s: float  # median seconds of one trivial call-and-wait, measured apart
    pilot_spread_pipelined: float | None = None  # "auto"'s pilot: relative spread (IQR / median) of each mode;
    pilot_spread_per_call: float | None = None  # None when no pilot ran
    backlog_calls: float | None = None  # pipelined: the calls still queued when the host had issued a sample's
    # last one (median over samples); None per-call or with too few calls a sample (harness.stats.pacing)


def relative_spread(samples: list[float]) -> float:
    """IQR / median (linear-interpolated quartiles, as numpy's default): 0.0 for fewer than 2 samples."""
    if len(samples) < 2:
        return 0.0
    median = statistics.median(samples)
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


def choose_mode(pipelined_spread: float, per_call_spread: float) -> str:
    """Pipelined unless its pilot spread is over ``SPREAD_RATIO`` x the per-call one and over ``SPREAD_FLOOR``."""
    if pipelined_spread > SPREAD_FLOOR and pipelined_spread > SPREAD_RATIO * per_call_spread:
        return "per-call"
    return "pipelined"


def _run(call: Callable[[], None], sync: Callable[[], None], inner: int, mode: str) -> tuple[float, float]:
    """(seconds for ``inner`` calls in ``mode``, seconds until the last one was issued): one sync at the end
    (pipelined) or one after every call."""
    sync()
    start = perf_counter()
    if mode == "pipelined":
        for _ in range(inner):
            call()
        issued = perf_counter()
        sync()
    else:
        for _ in range(inner):
            call()
            sync()
        issued = perf_counter()
    return perf_counter() - start, issued - start


def _timed(call: Callable[[], None], sync: Callable[[], None], inner: int, mode: str = "per-call") -> float:
    """Seconds for ``inner`` calls in ``mode``."""
    return _run(call, sync, inner, mode)[0]


def _sample(call: Callable[[], None], sync: Callable[[], None], inner: int, mode: str) -> tuple[float, float | None]:
    """One sample: (seconds for ``inner`` calls in ``mode``, the device's backlog in calls when the host had issued
    the last one). The backlog is None per-call (nothing queues) and when ``inner`` is under
    :data:`BACKLOG_MIN_INNER` (too few calls for a backlog to build)."""
    elapsed, issued = _run(call, sync, inner, mode)
    if mode != "pipelined" or inner < BACKLOG_MIN_INNER or elapsed <= 0:
        return elapsed, None
    return elapsed, (elapsed - issued) * inner / elapsed


def warm_up(call: Callable[[], None], sync: Callable[[], None], protocol: TimingProtocol,
            mode: str = "per-call") -> tuple[float, int]:
    """At least ``warmup_s`` and ``warmup_calls`` calls in ``mode``; returns (seconds, calls).

    Calls go in bursts (waited for at their end) that double in length but never aim past ``warmup_s``: a
    pipelined warm-up so never queues much more work than it has time for.
    """
    start = perf_counter()
    calls, burst = 0, 1
    while calls < protocol.warmup_calls or perf_counter() - start < protocol.warmup_s:
        _timed(call, sync, burst, mode)
        calls += burst
        elapsed = perf_counter() - start
        fits = int((protocol.warmup_s - elapsed) * calls / elapsed) if elapsed > 0 else 2 * burst
        burst = max(1, min(2 * burst, protocol.max_inner, max(fits, protocol.warmup_calls - calls)))
    return perf_counter() - start, calls


def calibrate_inner(call: Callable[[], None], sync: Callable[[], None], protocol: TimingProtocol,
                    mode: str = "per-call") -> int:
    """Smallest power-of-two-ish loop count whose sample (in ``mode``) lasts at least ``min_sample_s``."""
    inner = 1
    while inner < protocol.max_inner:
        elapsed = _timed(call, sync, inner, mode)
        if elapsed >= protocol.min_sample_s:
            break
        # Aim straight for the target with headroom instead of doubling blindly.
        factor = protocol.min_sample_s / max(elapsed, 1e-9)
        inner = min(protocol.max_inner, max(inner * 2, int(inner * factor * 1.2) + 1))
    return inner


def round_trip(probe: Callable[[], None], repeats: int = ROUND_TRIP_REPEATS) -> float:
    """Median seconds of one ``probe()`` (a trivial call-and-wait), after two unmeasured ones."""
    times = []
    for i in range(repeats + 2):
        start = perf_counter()
        probe()
        if i >= 2:
            times.append(perf_counter() - start)
    return statistics.median(times)


def pilot(call: Callable[[], None], sync: Callable[[], None],
          protocol: TimingProtocol) -> tuple[str, int, float | None, float | None]:
    """``auto``'s choice: (mode, its calibrated inner, pipelined pilot spread, per-call pilot spread).

    Both modes are calibrated, then :data:`PILOT_SAMPLES` short samples of each are taken, interleaved so drift
    hits both alike. When fewer than :data:`PILOT_MIN_INNER` pipelined calls fill a sample, a call is long enough
    that where the wait goes hardly matters (and with one call the modes coincide): pipelined, no pilot (spreads
    None).
    """
    inner = {"pipelined": calibrate_inner(call, sync, protocol, "pipelined")}
    if inner["pipelined"] < PILOT_MIN_INNER:
        return "pipelined", inner["pipelined"], None, None
    inner["per-call"] = calibrate_inner(call, sync, protocol, "per-call")
    short = {mode: max(1, round(n * PILOT_FRACTION)) for mode, n in inner.items()}
    taken: dict[str, list[float]] = {"pipelined": [], "per-call": []}
    for _ in range(PILOT_SAMPLES):
        for mode in taken:
            taken[mode].append(_timed(call, sync, short[mode], mode) / short[mode])
    spreads = {mode: relative_spread(values) for mode, values in taken.items()}
    chosen = choose_mode(spreads["pipelined"], spreads["per-call"])
    return chosen, inner[chosen], spreads["pipelined"], spreads["per-call"]


def measure(call: Callable[[], None], sync: Callable[[], None], protocol: TimingProtocol, *,
            mode: str = "per-call", probe: Callable[[], None] | None = None, span: Span | None = None
            ) -> Measurement:
    """Warm up, pick the mode (``auto``: :func:`pilot`), calibrate, then take ``samples`` samples of s per call.

    ``call`` issues one call, ``sync`` waits until all issued calls have finished (a no-op for a plain Python
    callable, which then times the same in every mode). ``mode`` is "per-call" (the default, whatever the
    protocol says: the protocol's mode is :func:`measure_mlx`'s), "pipelined", "auto" or "device" (with ``span``,
    the device clock's: :func:`device_samples`; pipelined without one, or when the calls cannot all be queued
    behind the hold). ``probe`` is the trivial call-and-wait of the round trip; without it ``sync`` alone is timed.
    """
    if mode not in MODES:
        raise ValueError(f"timing mode {mode!r} is none of {', '.join(MODES)}")
    warm_s, warm_calls = warm_up(call, sync, protocol, mode if mode in ("pipelined", "per-call") else "pipelined")
    trip = round_trip(probe or sync)
    spread_pipelined = spread_per_call = None
    if mode == "device":  # pipelined without a device clock (only MLX's CUDA backend has one) or when it cannot
        on_device = device_samples(span, protocol.samples) if span is not None else None
        if on_device is not None:
            return Measurement(samples=on_device, inner=DEVICE_CALLS[1], warmup_s=warm_s, warmup_calls=warm_calls,
                               mode="device", round_trip_s=trip)
        mode = "pipelined"
    if mode == "auto":
        mode, inner, spread_pipelined, spread_per_call = pilot(call, sync, protocol)
    else:
        inner = calibrate_inner(call, sync, protocol, mode)
    timed = [_sample(call, sync, inner, mode) for _ in range(protocol.samples)]
    backlogs = [backlog for _, backlog in timed if backlog is not None]
    return Measurement(samples=[elapsed / inner for elapsed, _ in timed], inner=inner, warmup_s=warm_s,
                       warmup_calls=warm_calls, mode=mode, round_trip_s=trip, pilot_spread_pipelined=spread_pipelined,
                       pilot_spread_per_call=spread_per_call,
                       backlog_calls=statistics.median(backlogs) if backlogs else None)


def device_samples(span: Span, samples: int) -> list[float] | None:
    """``samples`` device seconds per call, each the slope between spans of :data:`DEVICE_CALLS` queued calls
    (the stamp's own launch cancels out). A span pair the host did not issue well inside the hold doubles the
    hold; past :data:`DEVICE_HOLD_MAX_S`, or when too few slopes come out positive, None (time it otherwise)."""
    few, many = DEVICE_CALLS
    hold, taken, tries = DEVICE_HOLD_S, [], 0
    while len(taken) < samples:
        tries += 1
        if tries > 3 * samples:
            return None
        (short, issued_short), (long, issued_long) = span(few, hold), span(many, hold)
        if max(issued_short, issued_long) > DEVICE_HOLD_MARGIN * hold:
            if hold >= DEVICE_HOLD_MAX_S:
                return None
            hold *= 2
            continue
        if long > short:
            taken.append((long - short) / (many - few))
    return taken


def _device_span(issue: Callable[[], None]) -> Span | None:
    """The device clock's span function, tried once (its two kernels compile and run), or None with a one-line
    warning on stderr (the job is then timed pipelined, and its stored mode says so)."""
    reason = device_clock.unavailable_reason()
    if reason is None:
        try:
            span = device_clock.mlx_span(issue)
            span(0, 1e-5)
            return span
        except Exception as exc:  # noqa: BLE001 - any failure of the clock means: time it pipelined
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
    print(f"warning: timing mode 'device' unavailable ({reason}); timed pipelined", file=sys.stderr)
    return None


def measure_mlx(fn: Callable[[], object], protocol: TimingProtocol, *, mode: str | None = None) -> Measurement:
    """Time an MLX function in ``mode`` (default: the protocol's): a call is ``mx.async_eval(fn())``, the wait
    ``mx.synchronize()``, the round trip ``mx.eval`` + ``mx.synchronize()`` of a one-element array."""
    import mlx.core as mx  # loads mlx: only when needed

    tiny = mx.zeros((1,), dtype=mx.float32)
    mx.eval(tiny)

    def probe() -> None:
        mx.eval(tiny + 1)
        mx.synchronize()

    mode = mode or protocol.mode

    def issue() -> None:
        mx.async_eval(fn())

    span = _device_span(issue) if mode == "device" else None
    return measure(issue, mx.synchronize, protocol, mode=mode, probe=probe, span=span)
