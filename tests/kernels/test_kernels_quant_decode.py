"""quant_decode / quant_decode_layers: codec, every variant on boundary shapes, and broken variants the checks catch."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY, Variant
from kernels import quant_decode as qd
from kernels.base import max_abs_error, run_variant

DTYPES = ("float32", "float16", "bfloat16")
KERNEL = REGISTRY["quant_decode"]
LAYERS = REGISTRY["quant_decode_layers"]

# Boundary cases: S_kv = 1, S_kv not a multiple of the split counts (4, 16), S_q = 1 and
# S_q up to 4, GQA ratio 1 and 4, bits 4 and 8, group 32 and 64 (and two groups per row).
SHAPES = [
    dict(B=1, H_q=2, H_kv=2, S_q=1, S_kv=1, D=32, bits=4, group=32),
    dict(B=2, H_q=4, H_kv=1, S_q=1, S_kv=17, D=64, bits=8, group=64),
    dict(B=1, H_q=4, H_kv=1, S_q=4, S_kv=37, D=64, bits=4, group=64),
    dict(B=2, H_q=2, H_kv=2, S_q=3, S_kv=5, D=64, bits=8, group=32),
    dict(B=1, H_q=8, H_kv=2, S_q=2, S_kv=16, D=64, bits=4, group=32),
]


def _all_checks(kernel, variant, shape, dtype):
    return {name: check(kernel, variant, shape, dtype) for name, check in kernel.checks.items()}


def _assert_all_pass(results):
    failed = {name: r.detail for name, r in results.items() if not r.passed}
    assert not failed, failed


# ----------------------------------------------------------------------------- registration / shapes


def test_registered_with_baselines():
    assert KERNEL.default_variant == "dequant_sdpa"
    assert set(KERNEL.variants) == {"dequant_sdpa", "fused_split1", "fused_split4", "fused_split16", "cuda_split1",
                                    "cuda_splitk"}
    assert {"reference", "batch_rows", "causal_tail"} <= set(KERNEL.checks)
    assert LAYERS.default_variant == "loop"
    assert {"loop", "batched"} <= set(LAYERS.variants)
    assert {"reference", "layer_parity", "stride_adversarial", "layers_differ"} <= set(LAYERS.checks)
    assert "kernels.quant_decode" in __import__("kernels").BUILTIN_MODULES


@pytest.mark.parametrize(
    "bad, key",
    [
        (dict(bits=3), "bits"),
        (dict(group=16), "group"),
        (dict(D=48), "D"),
        (dict(H_q=3, H_kv=2), "H_q"),
        (dict(S_q=5, S_kv=8), "S_q"),
        (dict(S_q=3, S_kv=2), "S_q"),
        (dict(B=0), "B"),
        (dict(S_kv=2.0), "S_kv"),
        (dict(extra=1), "extra"),
    ],
)
def test_normalize_shape_names_bad_key(bad, key):
    shape = {**dict(B=1, H_q=2, H_kv=1, S_q=1, S_kv=8, D=64, bits=4, group=32), **bad}
    with pytest.raises(ValueError, match=repr(key)):
        KERNEL.normalize_shape(shape)
    with pytest.raises(ValueError, match=repr("NL")):
        LAYERS.normalize_shape({k: v for k, v in shape.items() if k != "extra"})


def test_normalize_shape_defaults():
    assert KERNEL.normalize_shape(dict(B=1, H_q=4, S_kv=8, D=64)) == dict(
        B=1, H_q=4, H_kv=4, S_q=1, S_kv=8, D=64, bits=4, group=32
    )


def test_roofline_scales_with_batch_and_bits():
    base = dict(H_q=4, H_kv=1, S_q=1, S_kv=100, D=64, bits=8, group=32)
    for b in (1, 4, 32):
        assert qd.per_request_divisor({**base, "B": b}) == b
        assert KERNEL.flops({**base, "B": b}) == b * KERNEL.flops({**base, "B": 1})
        assert KERNEL.bytes_moved({**base, "B": b}, "float16") == b * KERNEL.bytes_moved({**base, "B": 1}, "float16")
    # 4-bit codes are packed two per byte: code bytes halve (scale/zero/q/out unchanged).
    b8 = KERNEL.bytes_moved({**base, "B": 1}, "float16")
    b4 = KERNEL.bytes_moved({**base, "B": 1, "bits": 4}, "float16")
    assert b8 - b4 == 2 * 1 * 1 * 100 * 64 // 2
    assert LAYERS.flops({**base, "B": 2, "NL": 3}) == 3 * KERNEL.flops({**base, "B": 2})


# ----------------------------------------------------------------------------- codec


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("group", (32, 64))
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_layout_and_error_bound(bits, group, dtype):
    dt = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[dtype]
    x = (mx.random.normal((3, 5, 128), key=mx.random.key(1)) * 3).astype(dt)
    codes, scale, zero = qd.quantize(x, bits, group)
    assert codes.dtype == mx.uint8 and codes.shape == (3, 5, 128 * bits // 8)
    assert scale.shape == zero.shape == (3, 5, 128 // group) and scale.dtype == zero.dtype == dt
    deq = qd.dequantize(codes, scale, zero, bits, group)
    assert deq.dtype == dt
    # the numpy (reference) dequantization reads the same layout
    np_deq = qd.np_dequantize(codes, scale, zero, bits, group)
    assert np.max(np.abs(np.array(qd.dequantize(codes, scale, zero, bits, group, mx.float32)) - np_deq)) < 1e-5
    err = np.abs(qd.to_numpy(x) - qd.to_numpy(deq))
    bound = qd.quant_error_bound(x, bits, group)
    assert np.all(err <= bound)
    # the bound is not vacuous (bf16 8-bit: its clip term, range * u, is rarely reached: 0.25 of the bound seen)
    assert err.max() > (0.2 if dtype == "bfloat16" else 0.3) * bound.max()


def test_pack_unpack_roundtrip():
    codes = mx.array(np.random.default_rng(0).integers(0, 16, size=(2, 64)).astype(np.uint8))
    packed = qd.pack_codes(codes, 4)
    assert packed.shape == (2, 32)
    assert mx.array_equal(qd.unpack_codes(packed, 4), codes).item()
    assert np.array_equal(qd.np_unpack_codes(np.array(packed), 4), np.array(codes))
    # element 2t in the low nibble, 2t+1 in the high nibble
    assert int(packed[0, 0].item()) == int(codes[0, 0].item()) | (int(codes[0, 1].item()) << 4)


def test_constant_group_is_exact():
    x = mx.ones((1, 64)) * 0.75
    codes, scale, zero = qd.quantize(x, 4, 32)
    assert np.array_equal(np.array(qd.dequantize(codes, scale, zero, 4, 32)), np.array(x))


# ----------------------------------------------------------------------------- variants


def runnable(kernel):
    """The variants that run here (the CUDA source variants are tested in test_kernels_quant_decode_cuda.py)."""
    return [v for v in kernel.variants.values() if v.requires() is None]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_variant_passes_every_check(shape, dtype):
    for variant in runnable(KERNEL):
        _assert_all_pass(_all_checks(KERNEL, variant, shape, dtype))


@pytest.mark.parametrize("b", (1, 4, 32))
@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_requests_each_row_correct(b, dtype):
    shape = dict(B=b, H_q=4, H_kv=1, S_q=1, S_kv=19, D=32, bits=4, group=32)
    for variant in runnable(KERNEL):
        res = KERNEL.checks["batch_rows"](KERNEL, variant, shape, dtype)
        assert res.passed, (variant.name, res.detail)


def test_splits_change_the_schedule_not_the_result():
    shape = dict(B=1, H_q=2, H_kv=1, S_q=2, S_kv=33, D=32, bits=8, group=32)
    inputs = KERNEL.make_inputs(shape, "float32", 0)
    outs = {v.name: np.array(run_variant(v, inputs)) for v in runnable(KERNEL)}
    assert len({o.tobytes() for o in outs.values()}) > 1  # really different op orders
    for o in outs.values():
        assert np.max(np.abs(o - outs["dequant_sdpa"])) < KERNEL.tolerance["float32"]


# ----------------------------------------------------------------------------- broken variants


def check(kernel, variant, shape, dtype):
    return kernel.checks["reference"](kernel, variant, kernel.normalize_shape(shape), dtype)


def _fn(**overrides):
    """A broken single-layer variant: decode_attend with some inputs rewritten."""

    def fn(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        args = dict(q=q, k_codes=k_codes, k_scale=k_scale, k_zero=k_zero, v_codes=v_codes, v_scale=v_scale)
        args.update(v_zero=v_zero, group_size=group_size, scale=scale, bits=bits)
        for name, rewrite in overrides.items():
            args[name] = rewrite(args)
        return qd.decode_attend(**args, num_splits=4)

    return fn


def test_broken_off_by_one_group_fails_reference():
    # dequantizes group g with group g+1's scale
    broken = Variant("off_by_one_group", _fn(k_scale=lambda a: mx.roll(a["k_scale"], -1, axis=-1)))
    shape = dict(B=1, H_q=2, H_kv=1, S_q=1, S_kv=9, D=64, bits=4, group=32)
    assert not check(KERNEL, broken, shape, "float32").passed


def test_broken_wrong_scale_fails_reference():
    broken = Variant("wrong_scale", _fn(scale=lambda a: 1.0 / a["q"].shape[-1]))
    shape = dict(B=1, H_q=2, H_kv=2, S_q=1, S_kv=9, D=64, bits=8, group=64)
    assert not check(KERNEL, broken, shape, "float16").passed


def test_broken_missing_mask_fails_causal_tail_even_at_s_q_1():
    def no_mask(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        k = qd.dequantize(k_codes, k_scale, k_zero, bits, group_size, q.dtype)
        v = qd.dequantize(v_codes, v_scale, v_zero, bits, group_size, q.dtype)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)

    broken = Variant("no_mask", no_mask)
    shape = dict(B=1, H_q=4, H_kv=1, S_q=1, S_kv=12, D=32, bits=4, group=32)
    assert check(KERNEL, broken, shape, "float32").passed  # S_q = 1: the mask is moot
    res = KERNEL.checks["causal_tail"](KERNEL, broken, shape, "float32")
    assert not res.passed and res.max_error > 0.01


def test_broken_request_mixup_fails_batch_rows():
    # every request attends over request 0's K cache
    broken = Variant("row0_keys", _fn(k_codes=lambda a: mx.broadcast_to(a["k_codes"][:1], a["k_codes"].shape)))
    shape = dict(B=4, H_q=2, H_kv=1, S_q=1, S_kv=10, D=32, bits=4, group=32)
    res = KERNEL.checks["batch_rows"](KERNEL, broken, shape, "float32")
    assert not res.passed and "row" in res.detail


def test_broken_gqa_head_mapping_fails_reference():
    # query head h reads KV head h % H_kv (tiling) instead of h // (H_q / H_kv)
    def tile(name):
        return lambda a: mx.tile(a[name], (1, a["q"].shape[1] // a[name].shape[1], 1, 1))

    names = ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")
    broken = Variant("tiled_heads", _fn(**{n: tile(n) for n in names}))
    shape = dict(B=1, H_q=4, H_kv=2, S_q=1, S_kv=9, D=32, bits=8, group=32)
    assert not check(KERNEL, broken, shape, "float32").passed
    assert check(KERNEL, broken, {**shape, "H_kv": 4}, "float32").passed  # GQA ratio 1: same mapping


# ----------------------------------------------------------------------------- layers


LAYER_BASE = dict(B=1, H_q=2, H_kv=1, S_q=1, S_kv=5, D=32, bits=4, group=32)


@pytest.mark.parametrize("nl", (1, 4, 32))
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_parity_bit_identical(nl, dtype):
    shapes = [{**LAYER_BASE, "NL": nl}]
    if nl == 4:
        shapes.append({**LAYER_BASE, "NL": nl, "B": 2, "S_q": 3, "S_kv": 20, "bits": 8, "group": 32})
    for shape in shapes:
        for variant in runnable(LAYERS):
            res = LAYERS.checks["layer_parity"](LAYERS, variant, shape, dtype)
            assert res.passed and res.max_error == 0.0, (variant.name, res.detail)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_variants_pass_every_check(dtype):
    shape = {**LAYER_BASE, "NL": 4, "H_q": 4, "S_q": 2, "S_kv": 7}
    for variant in runnable(LAYERS):
        _assert_all_pass(_all_checks(LAYERS, variant, shape, dtype))


def _folded(fold, unfold, num_splits=None):
    def fn(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        nl, b = q.shape[:2]
        arrays = [fold(a, nl, b) for a in (q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero)]
        out = qd.decode_attend(*arrays, group_size, scale, bits=bits, num_splits=num_splits)
        return unfold(out, nl, b)

    return fn


def test_broken_swapped_layer_batch_axes_fails_stride_adversarial():
    # folds as (batch, layer) but unfolds as (layer, batch): invisible when NL == 1
    broken = Variant(
        "swapped_axes",
        _folded(
            lambda a, nl, b: a.swapaxes(0, 1).reshape(nl * b, *a.shape[2:]),
            lambda o, nl, b: o.reshape(nl, b, *o.shape[1:]),
        ),
        params={"single_layer": "dequant_sdpa"},
    )
    suite_shape = {**LAYER_BASE, "NL": 1, "B": 4}
    assert LAYERS.checks["layer_parity"](LAYERS, broken, suite_shape, "float32").passed
    res = LAYERS.checks["stride_adversarial"](LAYERS, broken, suite_shape, "float32")
    assert not res.passed and res.max_error > 0.05, res.detail
    # the correct fold passes the same check
    good = LAYERS.checks["stride_adversarial"](LAYERS, LAYERS.variants["batched"], suite_shape, "float32")
    assert good.passed


def test_broken_layer0_repeated_fails_layers_differ():
    def layer0(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        out = qd.decode_attend(
            q[0], k_codes[0], k_scale[0], k_zero[0], v_codes[0], v_scale[0], v_zero[0], group_size, scale, bits=bits
        )
        return mx.broadcast_to(out[None], (q.shape[0], *out.shape))

    broken = Variant("layer0_repeated", layer0, params={"single_layer": "dequant_sdpa"})
    suite_shape = {**LAYER_BASE, "NL": 1}
    assert LAYERS.checks["layer_parity"](LAYERS, broken, suite_shape, "float32").passed  # NL=1 cannot tell
    res = LAYERS.checks["layers_differ"](LAYERS, broken, suite_shape, "float16")
    assert not res.passed and res.max_error > 0.05, res.detail


def test_layer_parity_is_strict():
    # a batched path whose split schedule differs from its declared single-layer kernel
    # is within tolerance (reference passes) but not bit-identical
    broken = Variant(
        "other_schedule",
        _folded(
            lambda a, nl, b: a.reshape(nl * b, *a.shape[2:]),
            lambda o, nl, b: o.reshape(nl, b, *o.shape[1:]),
            num_splits=4,
        ),
        params={"single_layer": "fused_split1"},
    )
    shape = {**LAYER_BASE, "NL": 4, "S_kv": 40}
    assert LAYERS.checks["reference"](LAYERS, broken, shape, "float32").passed
    res = LAYERS.checks["layer_parity"](LAYERS, broken, shape, "float32")
    assert not res.passed and 0.0 < res.max_error < 1e-5


def test_layer_inputs_differ_and_reference_is_per_layer():
    shape = {**LAYER_BASE, "NL": 3, "B": 2}
    inputs = LAYERS.make_inputs(shape, "float32", 0)
    ref = LAYERS.reference(inputs)
    assert ref.shape == (3, 2, 2, 1, 32)
    one = {k: (a[2, 1:2] if isinstance(a, mx.array) else a) for k, a in inputs.items()}
    assert np.allclose(ref[2, 1:2], qd.reference(one), atol=1e-12)
    out = run_variant(LAYERS.variants["batched"], inputs)
    assert max_abs_error(out, ref) < LAYERS.tolerance["float32"]
    assert math.isclose(inputs["scale"], 1 / math.sqrt(32))
