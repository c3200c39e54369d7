"""Q8_0 codec (format, error bound), q8_0_roundtrip and q8_0_prefill: variants, checks, broken variants."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY, Variant, q8_0
from kernels.base import to_numpy

DTYPES = ("float32", "float16")
PREFILL = REGISTRY["q8_0_prefill"]
ROUNDTRIP = REGISTRY["q8_0_roundtrip"]
MX = {"float32": mx.float32, "float16": mx.float16}


def _assert_all_pass(kernel, variant, shape, dtype):
    failed = {}
    for name, check in kernel.checks.items():
        res = check(kernel, variant, shape, dtype)
        if not res.passed:
            failed[name] = res.detail
    assert not failed, (variant.name, shape, dtype, failed)


def test_registered():
    assert PREFILL.default_variant == "dequant_sdpa"
    assert set(PREFILL.variants) == {"dequant_sdpa", "fused_bk32", "fused_bk64"}
    assert ROUNDTRIP.default_variant == "blocked"
    assert "error_bound" in ROUNDTRIP.checks and "reference" in ROUNDTRIP.checks


# ----------------------------------------------------------------------------- codec


def test_format_34_bytes_per_block():
    x = mx.random.normal((2, 3, 96), key=mx.random.key(0))
    codes, scales = q8_0.q8_0_quantize(x)
    assert codes.dtype == mx.int8 and codes.shape == (2, 3, 96)
    assert scales.dtype == mx.float16 and scales.shape == (2, 3, 3)
    assert (codes.nbytes + scales.nbytes) / (codes.size // 32) == 34
    c = np.array(codes)
    assert c.min() >= -127 and c.max() <= 127
    assert np.all(np.abs(c).reshape(2, 3, 3, 32).max(-1) == 127)  # the block max maps to +-127
    with pytest.raises(ValueError):
        q8_0.q8_0_quantize(mx.zeros((2, 40)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_bound_holds_and_is_tight(dtype):
    """The docstring bound, both forms: with the stored scale s and with the ideal d = max|x|/127."""
    rng = np.random.default_rng(1)
    blocks = rng.standard_normal((512, 32)) * 10.0 ** rng.uniform(-9, 3, (512, 1))
    blocks[:8] = 0.0  # all-zero blocks
    blocks[8, 5] = 1e-6  # lone tiny value: fp16-subnormal scale
    x = mx.array(blocks.reshape(16, 1024).astype(np.float32)).astype(MX[dtype])
    codes, scales = q8_0.q8_0_quantize(x)
    deq = to_numpy(q8_0.q8_0_dequantize(codes, scales, mx.float32))  # exact: |q| <= 127, s has 11 bits
    xs = to_numpy(x)
    err = np.abs(xs - deq).reshape(16, 32, 32)
    s = to_numpy(scales)[..., None]
    d = np.abs(xs).reshape(16, 32, 32).max(-1, keepdims=True) / 127
    # |x - deq| <= s/2 (1 + 2^-16) + 127 |d - s|  and  |d - s| <= (2^-11 + 2^-24) d + 2^-25
    assert np.all(err <= s / 2 * (1 + 2.0**-16) + 127 * np.abs(d - s))
    assert np.all(np.abs(d - s) <= (2.0**-11 + 2.0**-24) * d + 2.0**-25)
    # normal-range scales never clip, so there the plain s/2 bound holds
    normal = np.broadcast_to(s >= 2.0**-14, err.shape)
    assert np.all(err[normal] <= (s / 2 * (1 + 2.0**-16) * np.ones_like(err))[normal])
    ratio = (np.abs(xs - deq) / q8_0.q8_0_error_bound(x, "float32")).max()
    assert 0.8 < ratio <= 1.0  # holds, and is nearly attained
    assert np.all(deq.reshape(16, 32, 32)[0, :8] == 0)  # all-zero blocks (scale 0) stay exactly zero


def test_numpy_twin_matches_bit_for_bit():
    x = mx.random.normal((64, 256), key=mx.random.key(3)) * 5
    codes, scales = q8_0.q8_0_quantize(x.astype(mx.float16))
    np_codes, np_scales = q8_0.np_q8_0_quantize(x.astype(mx.float16))
    assert np.array_equal(np.array(codes).astype(np.float64), np_codes)
    assert np.array_equal(to_numpy(scales), np_scales)


def test_bytes_vs_fp16():
    shape = dict(B=2, H=4, S_q=16, S_kv=256, D=64)
    q8, fp16 = q8_0.bytes_vs_fp16(shape)
    kv = 2 * 2 * 4 * 256 * 64
    qo = 2 * 2 * 4 * 16 * 64 * 2
    assert q8 == qo + kv * 34 / 32 == PREFILL.bytes_moved(shape, "float16")
    assert fp16 == qo + kv * 2
    assert PREFILL.flops({**shape, "B": 4}) == 2 * PREFILL.flops(shape)


@pytest.mark.parametrize(
    "bad, key",
    [(dict(D=48), "D"), (dict(S_q=9, S_kv=8), "S_q"), (dict(H=0), "H"), (dict(Z=1), "Z"), (dict(B=True), "B")],
)
def test_prefill_normalize_shape_names_bad_key(bad, key):
    with pytest.raises(ValueError, match=repr(key)):
        PREFILL.normalize_shape({**dict(B=1, H=1, S_q=4, S_kv=8, D=64), **bad})


def test_roundtrip_normalize_shape():
    assert ROUNDTRIP.normalize_shape(dict(N=3, D=64)) == dict(N=3, D=64)
    with pytest.raises(ValueError, match="'D'"):
        ROUNDTRIP.normalize_shape(dict(N=3, D=33))
    with pytest.raises(ValueError, match="'N'"):
        ROUNDTRIP.normalize_shape(dict(D=32))


# ----------------------------------------------------------------------------- roundtrip kernel


@pytest.mark.parametrize("shape", [dict(N=1, D=32), dict(N=5, D=96)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_variants_pass(shape, dtype):
    for variant in ROUNDTRIP.variants.values():
        _assert_all_pass(ROUNDTRIP, variant, shape, dtype)


def _truncating(x):
    xb = x.astype(mx.float32).reshape(x.shape[0], -1, 32)
    s = (mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127.0).astype(mx.float16).astype(mx.float32)
    q = (xb / mx.where(s > 0, s, 1.0)).astype(mx.int8)  # truncates toward zero instead of rounding
    return (q.astype(mx.float32) * s).reshape(x.shape).astype(x.dtype)


def _scale_128(x):
    xb = x.astype(mx.float32).reshape(x.shape[0], -1, 32)
    s = (mx.max(mx.abs(xb), axis=-1, keepdims=True) / 128.0).astype(mx.float16).astype(mx.float32)
    q = mx.clip(mx.round(xb / mx.where(s > 0, s, 1.0)), -127, 127)  # the block max clips
    return (q * s).reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("fn", [_truncating, _scale_128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broken_roundtrip_fails_error_bound(fn, dtype):
    res = ROUNDTRIP.checks["error_bound"](ROUNDTRIP, Variant(fn.__name__, fn), dict(N=4, D=64), dtype)
    assert not res.passed and res.max_error > 1.1, res.detail


# ----------------------------------------------------------------------------- prefill kernel

# S_q = S_kv = 1; S_q = 1 decode-like; S_kv not a multiple of 32/64 (and of both); chunk
# boundaries exactly on 32/64; S_q < S_kv with tail alignment; D = 32 (one block) and 64.
PREFILL_SHAPES = [
    dict(B=1, H=1, S_q=1, S_kv=1, D=32),
    dict(B=1, H=2, S_q=1, S_kv=37, D=64),
    dict(B=2, H=1, S_q=5, S_kv=5, D=32),
    dict(B=1, H=2, S_q=33, S_kv=65, D=64),
    dict(B=1, H=1, S_q=64, S_kv=64, D=32),
    dict(B=1, H=1, S_q=20, S_kv=100, D=64),
]


@pytest.mark.parametrize("shape", PREFILL_SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_variants_pass(shape, dtype):
    for variant in PREFILL.variants.values():
        _assert_all_pass(PREFILL, variant, shape, dtype)


def _broken_prefill(rewrite):
    def fn(q, k_codes, k_scales, v_codes, v_scales, scale):
        return rewrite(q, k_codes, k_scales, v_codes, v_scales, scale)

    return fn


def _no_mask(q, k_codes, k_scales, v_codes, v_scales, scale):
    k = q8_0.q8_0_dequantize(k_codes, k_scales, q.dtype)
    v = q8_0.q8_0_dequantize(v_codes, v_scales, q.dtype)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)


def _unsigned_codes(q, k_codes, k_scales, v_codes, v_scales, scale):
    # reads the int8 codes as uint8 (-1 becomes 255)
    return q8_0.q8_0_attention(q, k_codes.view(mx.uint8), k_scales, v_codes.view(mx.uint8), v_scales, scale, bk=32)


def _next_block_scale(q, k_codes, k_scales, v_codes, v_scales, scale):
    # block b of a row dequantized with block b+1's scale
    return q8_0.q8_0_attention(q, k_codes, mx.roll(k_scales, -1, axis=-1), v_codes, v_scales, scale, bk=64)


@pytest.mark.parametrize(
    "fn, check",
    [
        (_no_mask, "reference"),
        (_unsigned_codes, "reference"),
        (_next_block_scale, "reference"),
        (_next_block_scale, "scale_extremes"),
    ],
)
def test_broken_prefill_fails(fn, check):
    shape = dict(B=1, H=2, S_q=9, S_kv=40, D=64)
    res = PREFILL.checks[check](PREFILL, Variant(fn.__name__, fn), shape, "float16")
    assert not res.passed and res.max_error > 5 * PREFILL.tolerance["float16"], res.detail


def test_fused_large_logits_finite_and_s_q_gt_s_kv_rejected():
    # q x 100: logits in the hundreds; every chunk after the first is fully masked for early rows
    q = mx.random.normal((1, 1, 70, 32), key=mx.random.key(0)) * 100
    k = mx.random.normal((1, 1, 70, 32), key=mx.random.key(1))
    v = mx.random.normal((1, 1, 70, 32), key=mx.random.key(2))
    kc, ks = q8_0.q8_0_quantize(k)
    vc, vs = q8_0.q8_0_quantize(v)
    for bk in (32, 64):
        out = q8_0.q8_0_attention(q, kc, ks, vc, vs, 0.2, bk=bk)
        assert np.all(np.isfinite(np.array(out)))
    with pytest.raises(ValueError):
        q8_0.q8_0_attention(q, kc[:, :, :2], ks[:, :, :2], vc[:, :, :2], vs[:, :, :2], 0.2)
