"""Timing protocol: warm-up before timing, inner loop calibrated to the sample length, the timing modes (where the
waits go, auto's pilot), the round trip, median CI coverage."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from harness.execute import timing
from harness.execute.timing import (
    TimingProtocol,
    calibrate_inner,
    choose_mode,
    measure,
    measure_mlx,
    relative_spread,
)
from harness.stats import pacing
from harness.stats.summary import median_ci, summarize


def test_warmup_runs_first_and_each_sample_lasts_the_minimum():
    calls = []

    def call():
        calls.append(time.perf_counter())
        time.sleep(0.0005)

    protocol = TimingProtocol(warmup_s=0.01, warmup_calls=5, min_sample_s=0.005, samples=4)
    m = measure(call, lambda: None, protocol)
    assert m.warmup_calls >= 5 and m.warmup_s >= 0.01
    assert len(m.samples) == 4 and m.inner >= 5  # 0.5 ms calls need about 10 of them for 5 ms
    assert all(4e-4 < s < 5e-3 for s in m.samples)


def test_calibration_stops_at_the_cap():
    assert calibrate_inner(lambda: None, lambda: None, TimingProtocol(min_sample_s=10.0, max_inner=64)) == 64


def test_measure_mlx_times_evaluated_work():
    import mlx.core as mx

    a = mx.ones((64, 64))
    m = measure_mlx(lambda: a @ a, TimingProtocol(warmup_s=0.0, min_sample_s=0.001, samples=3))
    assert len(m.samples) == 3 and min(m.samples) > 0


class Fake:
    """A fake device on a virtual clock (so timings are exact even on a loaded machine): ``call`` issues work that
    takes ``call_s``, ``sync`` waits for it, taking ``jitter(pending calls)`` more; records the order of both."""

    def __init__(self, monkeypatch, call_s: float = 0.0, jitter=None):
        self.events: list[str] = []
        self.pending = 0
        self.now = 0.0
        self.call_s = call_s
        self.jitter = jitter
        monkeypatch.setattr(timing, "perf_counter", lambda: self.now)

    def call(self) -> None:
        self.events.append("call")
        self.pending += 1
        self.now += self.call_s

    def sync(self) -> None:
        self.events.append("sync")
        if self.jitter is not None and self.pending:
            self.now += self.jitter(self.pending)
        self.pending = 0


# min_sample_s is never reached, so calibration stops at max_inner: inner is exactly 4.
FIXED = dict(warmup_s=0.0, warmup_calls=1, min_sample_s=10.0, samples=3, max_inner=4)


def test_pipelined_mode_waits_once_per_sample(monkeypatch):
    fake = Fake(monkeypatch, call_s=1e-6)
    m = measure(fake.call, fake.sync, TimingProtocol(**FIXED), mode="pipelined")
    assert m.mode == "pipelined" and m.inner == 4 and len(m.samples) == 3
    # Each sample: a guard sync before the clock starts, then 4 calls and the one wait.
    assert fake.events[-3 * 6:] == (["sync"] + ["call"] * 4 + ["sync"]) * 3


def test_per_call_mode_waits_after_every_call(monkeypatch):
    fake = Fake(monkeypatch, call_s=1e-6)
    m = measure(fake.call, fake.sync, TimingProtocol(**FIXED), mode="per-call")
    assert m.mode == "per-call" and m.inner == 4
    assert fake.events[-3 * 9:] == (["sync"] + ["call", "sync"] * 4) * 3


def test_measure_defaults_to_per_call_whatever_the_protocol_says(monkeypatch):
    fake = Fake(monkeypatch, call_s=1e-6)
    m = measure(fake.call, fake.sync, TimingProtocol(**FIXED, mode="pipelined"))
    assert m.mode == "per-call" and m.pilot_spread_pipelined is None
    assert m.round_trip_s >= 0


def test_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="timing mode"):
        TimingProtocol(mode="batched")
    with pytest.raises(ValueError, match="timing mode"):
        measure(lambda: None, lambda: None, TimingProtocol(), mode="batched")


def test_choose_mode_keeps_pipelined_unless_its_spread_is_clearly_worse():
    assert choose_mode(0.003, 0.030) == "pipelined"  # the usual case: pipelined is steadier
    assert choose_mode(0.170, 0.050) == "per-call"  # launch-bound chains: pipelined much noisier
    assert choose_mode(0.014, 0.010) == "pipelined"  # worse, but not 1.5x
    assert choose_mode(0.009, 0.001) == "pipelined"  # 9x, but under 1 %: both are quiet
    assert choose_mode(0.0, 0.0) == "pipelined"


def test_relative_spread_is_iqr_over_median():
    assert relative_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(summarize([1.0, 2.0, 3.0, 4.0, 5.0]).iqr_rel)
    assert relative_spread([2.0]) == 0.0


TINY = dict(warmup_s=0.0, warmup_calls=2, min_sample_s=0.002, samples=3)


def test_auto_falls_back_to_per_call_when_the_pipelined_pilot_is_noisy(monkeypatch):
    rng = random.Random(0)
    # A wait after a burst of calls takes up to as long again as the burst; a wait after one call takes no extra.
    fake = Fake(monkeypatch, call_s=20e-6,
                jitter=lambda pending: rng.uniform(0.0, pending * 20e-6) if pending > 1 else 0.0)
    m = measure(fake.call, fake.sync, TimingProtocol(**TINY), mode="auto")
    assert m.mode == "per-call"
    assert m.pilot_spread_pipelined > 1.5 * m.pilot_spread_per_call
    assert fake.events[-(2 * m.inner + 1):] == ["sync"] + ["call", "sync"] * m.inner


def test_auto_keeps_pipelined_when_per_call_is_the_noisy_one(monkeypatch):
    rng = random.Random(0)
    # Every wait is a noisy round trip: per-call pays one per call, pipelined one per sample.
    fake = Fake(monkeypatch, call_s=20e-6, jitter=lambda pending: rng.uniform(0.0, 40e-6))
    m = measure(fake.call, fake.sync, TimingProtocol(**TINY), mode="auto")
    assert m.mode == "pipelined" and m.pilot_spread_per_call is not None
    assert fake.events[-(m.inner + 2):] == ["sync"] + ["call"] * m.inner + ["sync"]


def test_auto_skips_the_pilot_when_a_call_is_long(monkeypatch):
    fake = Fake(monkeypatch, call_s=0.003)
    m = measure(fake.call, fake.sync, TimingProtocol(**TINY), mode="auto")
    assert m.mode == "pipelined" and m.inner == 1 and m.pilot_spread_pipelined is None


@pytest.mark.parametrize("call_s", [1e-6, 2e-5, 1e-3, 2e-3, 4e-3, 0.03])
def test_the_pilot_costs_well_under_half_a_second_at_the_default_sample_length(monkeypatch, call_s):
    rng = random.Random(0)
    fake = Fake(monkeypatch, call_s=call_s, jitter=lambda pending: rng.uniform(0.0, 30e-6))
    m = measure(fake.call, fake.sync, TimingProtocol(warmup_s=0.0, warmup_calls=0, samples=1), mode="auto")
    assert fake.now - m.samples[0] * m.inner < 0.2  # everything but the one sample: the pilot, mostly


def test_measure_mlx_chooses_a_mode_and_measures_the_round_trip():
    import mlx.core as mx

    a = mx.ones((32, 32))
    start = time.perf_counter()
    m = measure_mlx(lambda: a @ a, TimingProtocol(warmup_s=0.0, min_sample_s=0.002, samples=3))
    assert time.perf_counter() - start < 2.0
    assert m.mode in ("pipelined", "per-call") and m.round_trip_s > 0
    assert len(m.samples) == 3 and min(m.samples) > 0
    for mode in ("pipelined", "per-call"):
        forced = measure_mlx(lambda: a @ a, TimingProtocol(warmup_s=0.0, min_sample_s=0.001, samples=2), mode=mode)
        assert forced.mode == mode and forced.pilot_spread_per_call is None


def test_median_ci_brackets_the_median_and_covers_about_95_percent():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        sample = rng.lognormal(0.0, 0.1, size=15)
        med, lo, hi = median_ci(sample.tolist())
        assert lo <= med <= hi
        hits += lo <= 1.0 <= hi  # the true median of lognormal(0, s) is 1
    assert 0.92 <= hits / 400 <= 0.995


def test_small_samples_and_summary():
    assert median_ci([2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        median_ci([])
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.median == 3.0 and s.n == 5 and s.iqr_rel == pytest.approx(2.0 / 3.0)


class QueuedDevice:
    """A device on a virtual clock that runs issued calls in order: issuing one costs the host ``host_s``, running
    it costs the device ``device_s``, starting when both it has been issued and the previous call has finished;
    ``sync`` waits for the last one."""

    def __init__(self, monkeypatch, host_s: float, device_s: float):
        self.now = self.device_free = 0.0
        self.host_s, self.device_s = host_s, device_s
        monkeypatch.setattr(timing, "perf_counter", lambda: self.now)

    def call(self) -> None:
        self.now += self.host_s
        self.device_free = max(self.device_free, self.now) + self.device_s

    def sync(self) -> None:
        self.now = max(self.now, self.device_free)


BACKLOG = dict(warmup_s=0.0, warmup_calls=1, min_sample_s=10.0, samples=3, max_inner=40)


def test_a_device_paced_sample_leaves_a_backlog_and_a_host_paced_one_none(monkeypatch):
    device_paced = QueuedDevice(monkeypatch, host_s=20e-6, device_s=100e-6)
    m = measure(device_paced.call, device_paced.sync, TimingProtocol(**BACKLOG), mode="pipelined")
    # 40 calls of 100 us issued 20 us apart: when the last is issued (at 0.8 ms) 3.2 ms of 4.02 ms are left.
    assert m.backlog_calls == pytest.approx(40 * (4.02e-3 - 0.8e-3) / 4.02e-3)
    assert not pacing.host_paced(m.backlog_calls)
    assert m.samples[0] == pytest.approx(4.02e-3 / 40)  # the device's pace (plus the first call's issue)
    host_paced = QueuedDevice(monkeypatch, host_s=100e-6, device_s=20e-6)
    m = measure(host_paced.call, host_paced.sync, TimingProtocol(**BACKLOG), mode="pipelined")
    assert m.backlog_calls == pytest.approx(40 * 20e-6 / 4.02e-3)  # only the last call's run is left
    assert pacing.host_paced(m.backlog_calls)
    assert m.samples[0] == pytest.approx(4.02e-3 / 40)  # the same time per call: only the backlog tells them apart


def test_no_backlog_is_recorded_per_call_or_with_too_few_calls_to_build_one(monkeypatch):
    fake = QueuedDevice(monkeypatch, host_s=100e-6, device_s=20e-6)
    assert measure(fake.call, fake.sync, TimingProtocol(**BACKLOG), mode="per-call").backlog_calls is None
    few = {**BACKLOG, "max_inner": timing.BACKLOG_MIN_INNER - 1}
    assert measure(fake.call, fake.sync, TimingProtocol(**few), mode="pipelined").backlog_calls is None
    enough = {**BACKLOG, "max_inner": timing.BACKLOG_MIN_INNER}
    assert measure(fake.call, fake.sync, TimingProtocol(**enough), mode="pipelined").backlog_calls is not None


def test_host_paced_means_a_backlog_under_the_threshold():
    assert pacing.host_paced(0.0) and pacing.host_paced(pacing.HOST_PACED_BACKLOG - 0.01)
    assert not pacing.host_paced(pacing.HOST_PACED_BACKLOG) and not pacing.host_paced(18.0)
    assert not pacing.host_paced(None)  # not recorded: not claimed either way


class SpanDevice:
    """A device clock's span function: ``k`` calls of ``call_s`` each after the hold, plus a stamp's fixed
    ``launch_s``; the host needs ``issue_s`` per call to queue them."""

    def __init__(self, call_s: float, issue_s: float, launch_s: float = 5e-6):
        self.call_s, self.issue_s, self.launch_s = call_s, issue_s, launch_s
        self.holds: list[float] = []

    def __call__(self, k: int, hold_s: float) -> tuple[float, float]:
        self.holds.append(hold_s)
        return self.launch_s + k * self.call_s, k * self.issue_s


def test_device_samples_are_the_slope_between_spans_without_the_fixed_launch():
    span = SpanDevice(call_s=22e-6, issue_s=35e-6)  # host-paced if pipelined: 35 us to issue a 22 us call
    samples = timing.device_samples(span, 5)
    assert samples == pytest.approx([22e-6] * 5)
    assert set(span.holds) == {timing.DEVICE_HOLD_S}  # 12 x 35 us fits well inside the 2 ms hold


def test_the_hold_doubles_until_the_host_queues_every_call_inside_it_and_gives_up_past_the_cap():
    slow_host = SpanDevice(call_s=1e-3, issue_s=1e-3)  # 12 ms to queue 12 calls: needs a hold of at least 24 ms
    assert timing.device_samples(slow_host, 3) == pytest.approx([1e-3] * 3)
    assert min(slow_host.holds) == timing.DEVICE_HOLD_S and max(slow_host.holds) == 0.032
    hopeless = SpanDevice(call_s=1e-3, issue_s=0.1)  # 1.2 s to queue: past DEVICE_HOLD_MAX_S
    assert timing.device_samples(hopeless, 3) is None
    assert max(hopeless.holds) == timing.DEVICE_HOLD_MAX_S


def test_device_mode_stores_its_samples_and_falls_back_to_pipelined_without_a_clock(monkeypatch):
    fake = QueuedDevice(monkeypatch, host_s=35e-6, device_s=22e-6)
    m = measure(fake.call, fake.sync, TimingProtocol(**BACKLOG), mode="device", span=SpanDevice(22e-6, 35e-6))
    assert m.mode == "device" and m.samples == pytest.approx([22e-6] * 3) and m.backlog_calls is None
    m = measure(fake.call, fake.sync, TimingProtocol(**BACKLOG), mode="device")  # no clock here
    assert m.mode == "pipelined" and m.samples[0] == pytest.approx(35e-6, rel=0.05)  # the host's pace
    m = measure(fake.call, fake.sync, TimingProtocol(**BACKLOG), mode="device", span=SpanDevice(22e-6, 0.1))
    assert m.mode == "pipelined"  # the calls could not all be queued behind the hold


def test_device_mode_on_mlx_without_cuda_warns_once_and_times_pipelined(capsys):
    import mlx.core as mx

    a = mx.ones((64, 64))
    m = measure_mlx(lambda: a @ a, TimingProtocol(warmup_s=0.0, min_sample_s=0.001, samples=3, mode="device"))
    assert m.mode == "pipelined" and len(m.samples) == 3
    assert capsys.readouterr().err.count("warning: timing mode 'device' unavailable") == 1
