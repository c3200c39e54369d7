"""compressed_kv_prefill: codecs, the RaBitQ estimator, every variant's checks, the NaN guard, broken variants."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY, Variant
from kernels import compressed_kv as ckv
from kernels.base import run_variant, to_numpy

DTYPES = ("float32", "float16")
KERNEL = REGISTRY["compressed_kv_prefill"]


def _assert_all_pass(variant, shape, dtype):
    failed = {}
    for name, check in KERNEL.checks.items():
        res = check(KERNEL, variant, shape, dtype)
        if not res.passed:
            failed[name] = res.detail
    assert not failed, (variant.name, shape, dtype, failed)


def test_registered():
    assert KERNEL.default_variant == "decode_then_sdpa"
    assert set(KERNEL.variants) == {"decode_then_sdpa", "chunked_bk32", "chunked_bk64"}
    assert {"reference", "masked_chunk_no_nan", "causal_mode"} <= set(KERNEL.checks)


@pytest.mark.parametrize(
    "bad, key",
    [
        (dict(D=12), "D"),
        (dict(causal=2), "causal"),
        (dict(C=32), "C"),
        (dict(S_q=9, S_kv=8), "S_q"),
        (dict(foo=1), "foo"),
        (dict(B=-1), "B"),
    ],
)
def test_normalize_shape_names_bad_key(bad, key):
    with pytest.raises(ValueError, match=repr(key)):
        KERNEL.normalize_shape({**dict(B=1, H=1, S_q=4, S_kv=8, D=16), **bad})


def test_normalize_shape_defaults_and_cross_attention():
    assert KERNEL.normalize_shape(dict(B=1, H=1, S_q=4, S_kv=8, D=16))["causal"] == 1
    s = KERNEL.normalize_shape(dict(B=1, H=1, S_q=9, S_kv=8, D=16, causal=0, C=256))
    assert s["causal"] == 0 and s["C"] == 256


# ----------------------------------------------------------------------------- codecs


def test_sign_bits_roundtrip_and_layout():
    rng = np.random.default_rng(0)
    positive = rng.random((3, 5, 24)) > 0.5
    packed = ckv.pack_signs(mx.array(positive))
    assert packed.dtype == mx.uint8 and packed.shape == (3, 5, 3)
    assert np.array_equal(np.array(ckv.unpack_signs(packed)), np.where(positive, 1.0, -1.0))
    assert np.array_equal(ckv.np_unpack_signs(np.array(packed)), np.where(positive, 1.0, -1.0))
    assert int(packed[0, 0, 0].item()) == sum(1 << t for t in range(8) if positive[0, 0, t])


def test_rotation_is_orthogonal_and_seeded():
    r = np.array(ckv.random_rotation(32, 4), dtype=np.float64)
    assert np.allclose(r @ r.T, np.eye(32), atol=1e-5)
    assert np.array_equal(np.array(ckv.random_rotation(32, 4)), np.array(ckv.random_rotation(32, 4)))
    assert not np.array_equal(np.array(ckv.random_rotation(32, 4)), np.array(ckv.random_rotation(32, 5)))


def test_estimator_is_exact_for_keys_on_the_sign_lattice():
    # k_r = a * sign vector (every rotated coordinate of equal magnitude): correction = 1 and
    # the RaBitQ estimator equals the exact dot product
    d = 16
    rot = ckv.random_rotation(d, 0)
    signs = np.where(np.random.default_rng(2).random((1, 1, 6, d)) > 0.5, 1.0, -1.0)
    k = mx.array((0.7 * signs @ np.array(rot).T).astype(np.float32))
    bits, norm, corr = ckv.compress_keys(k, rot)
    assert np.allclose(np.array(corr), 1.0, atol=1e-5)
    q = mx.random.normal((1, 1, 3, d), key=mx.random.key(3))
    inputs = dict(q=q, k_bits=bits, k_norm=norm, k_corr=corr, rot=rot, scale=1.0)
    exact = np.einsum("bhqd,bhkd->bhqk", to_numpy(q), to_numpy(k))
    assert np.allclose(ckv.estimator_scores(inputs), exact, atol=1e-4)


def test_correction_range_and_zero_key():
    rot = ckv.random_rotation(32, 1)
    k = mx.random.normal((1, 1, 50, 32), key=mx.random.key(9))
    k = mx.concatenate([k, mx.zeros((1, 1, 1, 32))], axis=2)
    bits, norm, corr = ckv.compress_keys(k, rot)
    c = np.array(corr)
    assert np.all(c > 1 / math.sqrt(32) - 1e-6) and np.all(c <= 1 + 1e-6)
    assert c[0, 0, -1] == 1.0 and np.array(norm)[0, 0, -1] == 0.0  # zero key: estimator gives 0, no NaN


@pytest.mark.parametrize("c", (16, 256))
def test_value_codebook(c):
    v = mx.random.normal((1, 2, 40, 8), key=mx.random.key(5)).astype(mx.float16)
    codes, book = ckv.build_value_codebook(v, c)
    assert codes.dtype == mx.uint8 and codes.shape == (1, 2, 40, 8)
    assert book.shape == (1, 2, 8, c) and book.dtype == mx.float16
    dec = ckv.decode_values(codes, book)
    assert np.array_equal(to_numpy(dec), ckv.np_decode_values(codes, book))
    # nearest entry: no codebook entry is closer than the chosen one
    dist = np.abs(to_numpy(v)[..., None] - to_numpy(book)[:, :, None, :, :])
    assert np.allclose(np.abs(to_numpy(v) - to_numpy(dec)), dist.min(-1))


def test_decode_then_sdpa_scores_equal_the_estimator():
    shape = KERNEL.normalize_shape(dict(B=1, H=2, S_q=5, S_kv=9, D=16, causal=0))
    inputs = KERNEL.make_inputs(shape, "float32", 0)
    coef = np.array(ckv.key_coefficients(inputs["k_norm"], inputs["k_corr"], 16), dtype=np.float64)
    k_hat = ckv.np_unpack_signs(inputs["k_bits"]) * coef[..., None] @ to_numpy(inputs["rot"]).T
    scores = np.einsum("bhqd,bhkd->bhqk", to_numpy(inputs["q"]), k_hat) * inputs["scale"]
    assert np.allclose(scores, ckv.estimator_scores(inputs), atol=1e-5)


def test_estimator_report_is_informational():
    rep = ckv.estimator_report(dict(B=1, H=2, S_q=8, S_kv=64, D=64, causal=0))
    assert set(rep) == {"attn_max_abs", "attn_mean_abs", "logit_rmse", "logit_corr"}
    assert all(np.isfinite(v) for v in rep.values())
    assert rep["logit_corr"] > 0.6  # 1-bit keys at D=64: correlated, far from exact
    assert rep["attn_max_abs"] > KERNEL.tolerance["float32"]  # and that is not a kernel failure


def test_roofline():
    s = dict(B=2, H=2, S_q=4, S_kv=64, D=32, causal=0)
    assert KERNEL.flops(s) == 2 * 2 * 2 * 4 * 32 * 32 + 4 * 2 * 2 * 4 * 64 * 32
    assert KERNEL.flops({**s, "causal": 1}) < KERNEL.flops(s)
    # 1 bit per key dim + norm + corr, 1 byte per value dim: far below fp16 K/V
    kv_fp16 = 2 * 2 * 2 * 64 * 32 * 2
    assert KERNEL.bytes_moved(s, "float16") < kv_fp16


# ----------------------------------------------------------------------------- variants

# cross-attention (S_q << S_kv, no mask, S_kv not a multiple of 32/64), causal S_q = S_kv = 1,
# S_q = 1 causal, causal with tail alignment across chunk boundaries, C = 256, D = 8 (one sign byte)
SHAPES = [
    dict(B=1, H=2, S_q=3, S_kv=70, D=16, causal=0, C=16),
    dict(B=1, H=1, S_q=1, S_kv=1, D=8, causal=1, C=16),
    dict(B=2, H=1, S_q=1, S_kv=33, D=16, causal=1, C=256),
    dict(B=1, H=2, S_q=5, S_kv=65, D=32, causal=1, C=16),
    dict(B=1, H=1, S_q=40, S_kv=40, D=8, causal=1, C=256),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_variant_passes_every_check(shape, dtype):
    for variant in KERNEL.variants.values():
        _assert_all_pass(variant, shape, dtype)


# ----------------------------------------------------------------------------- NaN guard


def _naive_chunked(bk):
    """The chunked variant without the safe-max guard: exp(s - m_chunk) with m_chunk = -inf."""

    def fn(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal):
        b, h, s_q, d = q.shape
        s_kv = k_bits.shape[2]
        q_rot = (q.astype(mx.float32) @ rot) * scale
        coef = ckv.key_coefficients(k_norm, k_corr, d)
        row_limit = mx.arange(s_q)[:, None] + (s_kv - s_q)
        m = mx.full((b, h, s_q, 1), -mx.inf)
        l_sum = mx.zeros((b, h, s_q, 1))
        o = mx.zeros((b, h, s_q, d))
        for k0 in range(0, s_kv, bk):
            k1 = min(k0 + bk, s_kv)
            s = (q_rot @ ckv.unpack_signs(k_bits[:, :, k0:k1]).swapaxes(-1, -2)) * coef[:, :, None, k0:k1]
            if causal:
                s = mx.where(mx.arange(k0, k1)[None, :] <= row_limit, s, -mx.inf)
            m_c = mx.max(s, axis=-1, keepdims=True)
            p = mx.exp(s - m_c)  # no guard: -inf - -inf
            v_c = ckv.decode_values(v_codes[:, :, k0:k1], v_codebook).astype(mx.float32)
            m_new = mx.maximum(m, m_c)
            alpha, beta = mx.exp(m - m_new), mx.exp(m_c - m_new)
            l_sum = alpha * l_sum + beta * mx.sum(p, axis=-1, keepdims=True)
            o = alpha * o + beta * (p @ v_c)
            m = m_new
        return (o / l_sum).astype(q.dtype)

    return Variant(f"naive_bk{bk}", fn, params={"bk": bk})


@pytest.mark.parametrize("bk", (32, 64))
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_chunk_case_guarded_finite_naive_nan(bk, dtype):
    suite_shape = dict(B=1, H=2, S_q=1, S_kv=1, D=16)
    case = ckv.masked_chunk_case(suite_shape, bk)
    inputs = KERNEL.make_inputs(case, dtype, 7, key_gain=ckv.LARGE_KEY_GAIN)
    assert np.abs(ckv.estimator_scores(inputs)).max() > 89  # exp would overflow float32 without max subtraction
    good = np.array(run_variant(KERNEL.variants[f"chunked_bk{bk}"], inputs).astype(mx.float32))
    assert np.all(np.isfinite(good))
    naive = np.array(run_variant(_naive_chunked(bk), inputs).astype(mx.float32))
    nan_rows = np.nonzero(np.isnan(naive).any(axis=(0, 1, 3)))[0]
    # exactly the rows that have a fully masked chunk: rows < 2 bk (chunk 2 holds keys 2bk..2bk+2)
    assert nan_rows.tolist() == list(range(2 * bk))
    res = KERNEL.checks["masked_chunk_no_nan"](KERNEL, _naive_chunked(bk), suite_shape, dtype)
    assert not res.passed and "non-finite" in res.detail
    assert KERNEL.checks["masked_chunk_no_nan"](KERNEL, KERNEL.variants[f"chunked_bk{bk}"], suite_shape, dtype).passed


# ----------------------------------------------------------------------------- broken variants


def _chunked_with(**rewrites):
    def fn(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal):
        args = dict(q=q, k_bits=k_bits, k_norm=k_norm, k_corr=k_corr, v_codes=v_codes, v_codebook=v_codebook)
        args.update(rot=rot, scale=scale, causal=causal)
        for name, rewrite in rewrites.items():
            args[name] = rewrite(args)
        return ckv.compressed_attention(**args, bk=32)

    return fn


BROKEN = {
    # causal shapes run unmasked
    "missing_mask": _chunked_with(causal=lambda a: 0),
    # logits scaled by 1/D instead of 1/sqrt(D)
    "wrong_scale": _chunked_with(scale=lambda a: 1.0 / a["q"].shape[-1]),
    # estimator without the RaBitQ correction (n / sqrt(D) instead of n / (sqrt(D) c))
    "no_correction": _chunked_with(k_corr=lambda a: mx.ones_like(a["k_corr"])),
    # query not rotated into the sign basis
    "unrotated_query": _chunked_with(rot=lambda a: mx.eye(a["q"].shape[-1])),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("dtype", DTYPES)
def test_broken_variant_fails_reference(name, dtype):
    shape = KERNEL.normalize_shape(dict(B=1, H=2, S_q=6, S_kv=40, D=16, causal=1))
    res = KERNEL.checks["reference"](KERNEL, Variant(name, BROKEN[name]), shape, dtype)
    assert not res.passed and res.max_error > 5 * KERNEL.tolerance[dtype], res.detail


def test_missing_mask_caught_by_causal_mode_on_a_cross_attention_suite_shape():
    shape = dict(B=1, H=1, S_q=4, S_kv=40, D=16, causal=0)
    broken = Variant("missing_mask", BROKEN["missing_mask"])
    assert KERNEL.checks["reference"](KERNEL, broken, shape, "float32").passed  # cross mode cannot tell
    res = KERNEL.checks["causal_mode"](KERNEL, broken, shape, "float32")
    assert not res.passed and "causal=1" in res.detail
