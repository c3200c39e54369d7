"""swiglu: every variant on boundary shapes (F vs the chunk widths), roofline, broken variants."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY, Variant
from kernels import swiglu as sw
from kernels.base import run_variant

DTYPES = ("float32", "float16")
KERNEL = REGISTRY["swiglu"]


def test_registered():
    assert KERNEL.default_variant == "unfused"
    assert set(KERNEL.variants) == {"unfused", "fused_gateup", "chunked_f64", "chunked_f256"}
    assert {"reference", "saturated_gate"} <= set(KERNEL.checks)


@pytest.mark.parametrize("bad, key", [(dict(M=0), "M"), (dict(D=1.5), "D"), (dict(F=None), "F"), (dict(K=3), "K")])
def test_normalize_shape_names_bad_key(bad, key):
    with pytest.raises(ValueError, match=repr(key)):
        KERNEL.normalize_shape({**dict(M=2, D=8, F=16), **bad})
    with pytest.raises(ValueError, match="'F'"):
        KERNEL.normalize_shape(dict(M=2, D=8))


def test_roofline():
    s = dict(M=4, D=16, F=48)
    assert KERNEL.flops(s) == 2 * 4 * 16 * 48 * 3 + 5 * 4 * 48
    assert KERNEL.bytes_moved(s, "float16") == (3 * 16 * 48 + 2 * 4 * 16) * 2
    assert KERNEL.bytes_moved(s, "float32") == 2 * KERNEL.bytes_moved(s, "float16")


# F = 1; F below, at, and just past 64; not a multiple of 64 nor 256; exactly 256; M = 1.
SHAPES = [
    dict(M=1, D=8, F=1),
    dict(M=3, D=16, F=63),
    dict(M=5, D=8, F=64),
    dict(M=2, D=16, F=65),
    dict(M=4, D=8, F=256),
    dict(M=3, D=16, F=300),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_variant_passes_every_check(shape, dtype):
    for variant in KERNEL.variants.values():
        for name, check in KERNEL.checks.items():
            res = check(KERNEL, variant, shape, dtype)
            assert res.passed, (variant.name, name, res.detail)


def test_chunked_never_materializes_the_full_hidden(monkeypatch):
    widths = []
    real_silu = sw.silu

    def spy(x):
        widths.append(x.shape[-1])
        return real_silu(x)

    monkeypatch.setattr(sw, "silu", spy)
    inputs = KERNEL.make_inputs(dict(M=2, D=8, F=300), "float32", 0)
    run_variant(KERNEL.variants["chunked_f64"], inputs)
    assert widths == [64, 64, 64, 64, 44]
    widths.clear()
    run_variant(KERNEL.variants["chunked_f256"], inputs)
    assert widths == [256, 44]


def test_fused_gateup_uses_the_packed_weight():
    inputs = KERNEL.make_inputs(dict(M=2, D=8, F=16), "float32", 0)
    assert np.array_equal(np.array(inputs["w_gateup"]), np.concatenate([inputs["w_gate"], inputs["w_up"]], axis=1))
    a = np.array(run_variant(KERNEL.variants["fused_gateup"], inputs))
    b = np.array(run_variant(KERNEL.variants["fused_gateup"], dict(inputs, w_gate=None, w_up=None)))
    assert np.array_equal(a, b)


# ----------------------------------------------------------------------------- broken variants


def _swapped_gate_up(x, w_gate, w_up, w_down, w_gateup):
    return (sw.silu(x @ w_up) * (x @ w_gate)) @ w_down


def _interleaved_split(x, w_gate, w_up, w_down, w_gateup):
    gu = x @ w_gateup
    return (sw.silu(gu[:, 0::2]) * gu[:, 1::2]) @ w_down  # wrong layout: [Wg | Wu] is blocked, not interleaved


def _drops_partial_chunk(x, w_gate, w_up, w_down, w_gateup, fc=64):
    acc = mx.zeros((x.shape[0], w_down.shape[1]))
    for f0 in range(0, w_gate.shape[1] - fc + 1, fc):  # off by one chunk: the tail never runs
        h = sw.silu(x @ w_gate[:, f0 : f0 + fc]) * (x @ w_up[:, f0 : f0 + fc])
        acc = acc + h @ w_down[f0 : f0 + fc]
    return acc.astype(x.dtype)


def _misaligned_down(x, w_gate, w_up, w_down, w_gateup, fc=64):
    acc = mx.zeros((x.shape[0], w_down.shape[1]))
    f = w_gate.shape[1]
    for f0 in range(0, f, fc):
        f1 = min(f0 + fc, f)
        h = sw.silu(x @ w_gate[:, f0:f1]) * (x @ w_up[:, f0:f1])
        rows = mx.array([(i + 1) % f for i in range(f0, f1)])  # down rows shifted by one
        acc = acc + h @ w_down[rows]
    return acc.astype(x.dtype)


@pytest.mark.parametrize("fn", [_swapped_gate_up, _interleaved_split, _drops_partial_chunk, _misaligned_down])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broken_variant_fails_reference(fn, dtype):
    res = KERNEL.checks["reference"](KERNEL, Variant(fn.__name__, fn), dict(M=4, D=16, F=65), dtype)
    assert not res.passed and res.max_error > 3 * KERNEL.tolerance[dtype], res.detail


def test_dropped_tail_is_only_visible_off_the_chunk_grid():
    broken = Variant("drops_partial_chunk", _drops_partial_chunk)
    assert KERNEL.checks["reference"](KERNEL, broken, dict(M=4, D=16, F=128), "float32").passed
    assert not KERNEL.checks["reference"](KERNEL, broken, dict(M=4, D=16, F=130), "float32").passed
