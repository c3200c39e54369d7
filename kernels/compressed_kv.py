"""Compressed-KV prefill attention: RaBitQ-style 1-bit keys and scalar-codebook values.

Keys (RaBitQ, simple form). A random orthogonal ``rot`` (D x D, float32, drawn from the
seed) rotates each key: ``k_r = k @ rot``. Stored per key: the sign bits of ``k_r``
(packed 8 per uint8, bit ``t`` of byte ``j`` is dim ``8j + t``, 1 means +1), the norm
``n = ||k||`` and the correction ``c = <k_r / ||k||, sign(k_r)> / sqrt(D) = ||k_r||_1 / (n sqrt(D))``
(``c = 1`` for a zero key). With ``o = k_r / n`` and the unit sign vector
``o_bar = sign(k_r) / sqrt(D)``, RaBitQ's estimator ``<o, x> ~= <o_bar, x> / <o_bar, o>`` gives::

    q . k  ~=  n / (sqrt(D) * c) * <q @ rot, sign(k_r)>

so the attention logit of query ``i`` and key ``j`` is
``scale * n_j / (sqrt(D) c_j) * <q_i @ rot, s_j>``. This *estimator* is what the kernel
computes and what the reference computes in float64; how far it is from exact attention
on the uncompressed keys is reported by :func:`estimator_report`, not a correctness failure.

Values. A per-dimension scalar codebook shared across tokens: for every (batch, head,
dim) ``C`` (16 or 256) entries placed at the empirical quantiles ``(i + 1/2) / C`` of that
dimension's values (k-means free); each value is stored as the uint8 index of the
nearest entry (one index per byte, also for C = 16).

Kernel ``compressed_kv_prefill``: shape keys B, H, S_q, S_kv, D (a multiple of 8),
``causal`` (0: cross-attention, no mask; 1: causal with tail alignment, query row ``i``
sees keys ``j <= i + S_kv - S_q``, requires S_q <= S_kv) and ``C`` (default 16).
Variants ``decode_then_sdpa`` (baseline) and ``chunked_bk{32,64}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from kernels.base import CheckResult, Inputs, Kernel, Shape, Variant, max_abs_error, register, run_variant, to_numpy

CODEBOOK_SIZES = (16, 256)
BK_CHOICES = (32, 64)
SHAPE_KEYS = ("B", "H", "S_q", "S_kv", "D", "causal", "C")

_DTYPES = {"float32": mx.float32, "float16": mx.float16}
_ITEMSIZE = {"float32": 4, "float16": 2}
_BIT_WEIGHTS = np.array([1 << t for t in range(8)], dtype=np.uint8)


# ----------------------------------------------------------------------------- shapes


def _int_key(shape: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    if key not in shape:
        raise ValueError(f"shape key {key!r} is missing")
    value = shape[key]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"shape key {key!r} must be an int, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"shape key {key!r} must be >= {minimum}, got {value}")
    return int(value)


def normalize_shape(shape: Mapping[str, Any]) -> Shape:
    """Validate B, H, S_q, S_kv, D, causal, C (defaults: causal=1, C=16)."""
    for key in shape:
        if key not in SHAPE_KEYS:
            raise ValueError(f"unknown shape key {key!r} (allowed: {', '.join(SHAPE_KEYS)})")
    filled = {"causal": 1, "C": 16, **shape}
    out = {key: _int_key(filled, key, minimum=0 if key == "causal" else 1) for key in SHAPE_KEYS}
    if out["causal"] not in (0, 1):
        raise ValueError(f"shape key 'causal' must be 0 or 1, got {out['causal']}")
    if out["C"] not in CODEBOOK_SIZES:
        raise ValueError(f"shape key 'C' must be one of {CODEBOOK_SIZES}, got {out['C']}")
    if out["D"] % 8:
        raise ValueError(f"shape key 'D' ({out['D']}) must be a multiple of 8 (packed sign bits)")
    if out["causal"] and out["S_q"] > out["S_kv"]:
        raise ValueError(f"shape key 'S_q' ({out['S_q']}) must be <= S_kv ({out['S_kv']}) when causal")
    return out


# ----------------------------------------------------------------------------- codecs


def random_rotation(d: int, seed: int) -> mx.array:
    """A random orthogonal D x D matrix (QR of a Gaussian drawn with mx.random.key(seed)), float32."""
    g = np.array(mx.random.normal((d, d), key=mx.random.key(seed)), dtype=np.float64)
    qm, rm = np.linalg.qr(g)
    qm = qm * np.sign(np.where(np.diag(rm) == 0, 1.0, np.diag(rm)))[None, :]
    return mx.array(qm.astype(np.float32))


def pack_signs(positive: mx.array) -> mx.array:
    """Bool ``[..., D]`` (True = +1) to uint8 ``[..., D // 8]``."""
    d = positive.shape[-1]
    bits = positive.astype(mx.uint8).reshape(*positive.shape[:-1], d // 8, 8)
    return mx.sum(bits * mx.array(_BIT_WEIGHTS), axis=-1).astype(mx.uint8)


def unpack_signs(packed: mx.array) -> mx.array:
    """uint8 ``[..., D // 8]`` to float32 +-1 ``[..., D]``."""
    shifts = mx.arange(8, dtype=mx.uint8)
    bits = mx.bitwise_and(mx.right_shift(packed[..., None], shifts), 1)
    return bits.reshape(*packed.shape[:-1], packed.shape[-1] * 8).astype(mx.float32) * 2.0 - 1.0


def np_unpack_signs(packed: Any) -> np.ndarray:
    bits = np.unpackbits(np.array(packed, dtype=np.uint8)[..., None], axis=-1, bitorder="little")
    return bits.reshape(bits.shape[:-2] + (-1,)).astype(np.float64) * 2.0 - 1.0


def compress_keys(k: mx.array, rot: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """``(sign bits uint8 [..., D/8], norm [...], correction [...])``; norm/correction in k.dtype."""
    d = k.shape[-1]
    kf = k.astype(mx.float32)
    norm = mx.sqrt(mx.sum(kf * kf, axis=-1))
    kr = kf @ rot
    corr = mx.sum(mx.abs(kr), axis=-1) / (mx.maximum(norm, 1e-30) * math.sqrt(d))
    corr = mx.where(norm > 0, corr, 1.0)
    return pack_signs(kr >= 0), norm.astype(k.dtype), corr.astype(k.dtype)


def key_coefficients(norm: mx.array, corr: mx.array, d: int) -> mx.array:
    """Per-key factor ``n / (sqrt(D) c)`` of the estimator, float32."""
    return norm.astype(mx.float32) / (corr.astype(mx.float32) * math.sqrt(d))


def build_value_codebook(v: mx.array, c: int) -> tuple[mx.array, mx.array]:
    """Quantile codebook per (batch, head, dim) and nearest-entry indices.

    Returns ``(codes uint8 [B, H, S, D], codebook [B, H, D, C] in v.dtype)``.
    """
    s = v.shape[2]
    vf = v.astype(mx.float32)
    pos = np.minimum(((np.arange(c) + 0.5) / c * s).astype(np.int64), s - 1)
    book = mx.take(mx.sort(vf, axis=2), mx.array(pos.astype(np.int32)), axis=2)  # [B, H, C, D]
    book = book.swapaxes(2, 3).astype(v.dtype)  # [B, H, D, C]
    dist = mx.abs(vf[..., None] - book.astype(mx.float32)[:, :, None, :, :])  # [B, H, S, D, C]
    return mx.argmin(dist, axis=-1).astype(mx.uint8), book


def decode_values(codes: mx.array, codebook: mx.array) -> mx.array:
    """``codebook[b, h, d, codes[b, h, s, d]]`` as ``[B, H, S, D]`` in the codebook dtype."""
    idx = codes.astype(mx.int32).swapaxes(-1, -2)  # [B, H, D, S]
    return mx.take_along_axis(codebook, idx, axis=-1).swapaxes(-1, -2)


def np_decode_values(codes: Any, codebook: Any) -> np.ndarray:
    idx = np.array(codes).astype(np.int64).swapaxes(-1, -2)
    return np.take_along_axis(to_numpy(codebook), idx, axis=-1).swapaxes(-1, -2)


# ----------------------------------------------------------------------------- attention


def _decode_then_sdpa(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal):
    """Reconstruct ``k_hat = n / (sqrt(D) c) * sign @ rot^T`` (so ``q . k_hat`` is the estimator), then SDPA."""
    d = q.shape[-1]
    coef = key_coefficients(k_norm, k_corr, d)
    k_hat = (unpack_signs(k_bits) * coef[..., None]) @ rot.T
    v_hat = decode_values(v_codes, v_codebook)
    mask = "causal" if causal and q.shape[2] > 1 else None  # MLX "causal" is lower-right (tail) aligned
    return mx.fast.scaled_dot_product_attention(q, k_hat.astype(q.dtype), v_hat.astype(q.dtype), scale=scale, mask=mask)


def _chunked(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal, bk):
    """Online softmax over KV chunks of ``bk`` keys, scoring directly against the sign bits.

    ``q_rot = q @ rot * scale`` once; per chunk ``s = (q_rot @ signs^T) * n / (sqrt(D) c)``,
    values gathered from the codebook. Each chunk computes its *own* row max (so chunks
    are independent, flash-decoding style) and is merged into the running state. Safe-max
    guard: a row fully masked in a chunk has chunk max ``-inf``; its exponent uses 0
    instead (``exp(-inf - 0) = 0``, never ``exp(-inf - -inf) = NaN``) and its merge weight
    ``exp(-inf - m) = 0``.
    """
    b, h, s_q, d = q.shape
    s_kv = k_bits.shape[2]
    q_align = s_kv - s_q
    q_rot = (q.astype(mx.float32) @ rot) * scale
    coef = key_coefficients(k_norm, k_corr, d)
    row_limit = mx.arange(s_q)[:, None] + q_align
    m = mx.full((b, h, s_q, 1), -mx.inf, dtype=mx.float32)
    l_sum = mx.zeros((b, h, s_q, 1), dtype=mx.float32)
    o = mx.zeros((b, h, s_q, d), dtype=mx.float32)
    for k0 in range(0, s_kv, bk):
        k1 = min(k0 + bk, s_kv)
        s = (q_rot @ unpack_signs(k_bits[:, :, k0:k1]).swapaxes(-1, -2)) * coef[:, :, None, k0:k1]
        if causal and k1 - 1 > q_align:
            s = mx.where(mx.arange(k0, k1)[None, :] <= row_limit, s, -mx.inf)
        m_c = mx.max(s, axis=-1, keepdims=True)
        p = mx.exp(s - mx.where(m_c == -mx.inf, 0.0, m_c))
        v_c = decode_values(v_codes[:, :, k0:k1], v_codebook).astype(mx.float32)
        m_new = mx.maximum(m, m_c)
        m_new_safe = mx.where(m_new == -mx.inf, 0.0, m_new)
        alpha = mx.exp(m - m_new_safe)
        beta = mx.exp(m_c - m_new_safe)
        l_sum = alpha * l_sum + beta * mx.sum(p, axis=-1, keepdims=True)
        o = alpha * o + beta * (p @ v_c)
        m = m_new
    return (o / mx.where(l_sum > 0, l_sum, 1.0)).astype(q.dtype)


def compressed_attention(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal, bk=None) -> mx.array:
    """Attention with the RaBitQ key estimator and codebook values; ``bk=None`` is decode + SDPA."""
    if causal and q.shape[2] > k_bits.shape[2]:
        raise ValueError(f"causal needs S_q <= S_kv, got {q.shape[2]} > {k_bits.shape[2]}")
    args = (q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal)
    return _decode_then_sdpa(*args) if bk is None else _chunked(*args, bk)


# ----------------------------------------------------------------------------- reference


def estimator_scores(inputs: Inputs) -> np.ndarray:
    """Float64 estimator logits ``scale * n / (sqrt(D) c) * <q @ rot, signs>`` ``[B, H, S_q, S_kv]``."""
    q = to_numpy(inputs["q"])
    d = q.shape[-1]
    signs = np_unpack_signs(inputs["k_bits"])
    coef = to_numpy(inputs["k_norm"]) / (math.sqrt(d) * to_numpy(inputs["k_corr"]))
    q_rot = q @ to_numpy(inputs["rot"])
    return np.einsum("bhqd,bhkd->bhqk", q_rot, signs) * coef[:, :, None, :] * inputs["scale"]


def _np_softmax_attend(scores: np.ndarray, v: np.ndarray, causal: int) -> np.ndarray:
    s_q, s_kv = scores.shape[-2], scores.shape[-1]
    if causal:
        visible = np.arange(s_kv)[None, :] <= (np.arange(s_q) + s_kv - s_q)[:, None]
        scores = np.where(visible, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", p / p.sum(-1, keepdims=True), v)


def reference(inputs: Inputs) -> np.ndarray:
    """The same estimator in float64: estimator logits, decoded codebook values, exact softmax."""
    v = np_decode_values(inputs["v_codes"], inputs["v_codebook"])
    return _np_softmax_attend(estimator_scores(inputs), v, inputs["causal"])


# ----------------------------------------------------------------------------- inputs


def _raw(shape: Shape, dtype: str, seed: int, key_gain: float = 1.0) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    dt = _DTYPES[dtype]
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    b, h, s_q, s_kv, d = (shape[key] for key in ("B", "H", "S_q", "S_kv", "D"))
    q = mx.random.normal((b, h, s_q, d), key=kq).astype(dt)
    k = (mx.random.normal((b, h, s_kv, d), key=kk) * key_gain).astype(dt)
    v = mx.random.normal((b, h, s_kv, d), key=kv).astype(dt)
    return q, k, v, random_rotation(d, seed + 1)


def _compress(shape: Shape, q, k, v, rot) -> Inputs:
    k_bits, k_norm, k_corr = compress_keys(k, rot)
    v_codes, v_codebook = build_value_codebook(v, shape["C"])
    inputs = dict(q=q, k_bits=k_bits, k_norm=k_norm, k_corr=k_corr, v_codes=v_codes, v_codebook=v_codebook, rot=rot)
    inputs.update(scale=1.0 / math.sqrt(shape["D"]), causal=shape["causal"])
    mx.eval([a for a in inputs.values() if isinstance(a, mx.array)])
    return inputs


def make_inputs(shape: Shape, dtype: str, seed: int, key_gain: float = 1.0) -> Inputs:
    """q, k, v ~ N(0, 1) (k times ``key_gain``) in dtype, compressed; rotation from seed + 1."""
    shape = normalize_shape(shape)
    return _compress(shape, *_raw(shape, dtype, seed, key_gain))


def estimator_report(shape: Mapping[str, Any], dtype: str = "float32", seed: int = 0) -> dict[str, float]:
    """How far the estimator attention is from exact attention on the uncompressed q, k, v.

    Returns max/mean abs difference of the outputs, the RMS logit error and the logit
    correlation. Informational: the kernel is held to the estimator, not to this.
    """
    shape = normalize_shape(shape)
    q, k, v, rot = _raw(shape, dtype, seed)
    inputs = _compress(shape, q, k, v, rot)
    est_scores = estimator_scores(inputs)
    true_scores = np.einsum("bhqd,bhkd->bhqk", to_numpy(q), to_numpy(k)) * inputs["scale"]
    exact = _np_softmax_attend(true_scores, to_numpy(v), shape["causal"])
    approx = reference(inputs)
    diff = np.abs(approx - exact)
    return {
        "attn_max_abs": float(diff.max()),
        "attn_mean_abs": float(diff.mean()),
        "logit_rmse": float(np.sqrt(np.mean((est_scores - true_scores) ** 2))),
        "logit_corr": float(np.corrcoef(est_scores.ravel(), true_scores.ravel())[0, 1]) if est_scores.size > 1 else 1.0,
    }


def _pairs(s: Shape) -> int:
    if not s["causal"]:
        return s["S_q"] * s["S_kv"]
    return int(np.sum(np.minimum(np.arange(s["S_q"]) + s["S_kv"] - s["S_q"] + 1, s["S_kv"])))


def flops(shape: Shape) -> float:
    """q rotation (2 S_q D^2) plus QK^T and PV over the visible (query, key) pairs."""
    s = normalize_shape(shape)
    bh = s["B"] * s["H"]
    return 2.0 * bh * s["S_q"] * s["D"] ** 2 + 4.0 * bh * _pairs(s) * s["D"]


def bytes_moved(shape: Shape, dtype: str) -> float:
    """q, out (dtype); per key D/8 sign bytes + norm + correction; per value token D uint8 codes;
    the codebook (B H D C entries, dtype) and the float32 rotation."""
    s = normalize_shape(shape)
    item = _ITEMSIZE[dtype]
    bh = s["B"] * s["H"]
    qo = 2 * bh * s["S_q"] * s["D"] * item
    keys = bh * s["S_kv"] * (s["D"] // 8 + 2 * item)
    values = bh * s["S_kv"] * s["D"] + bh * s["D"] * s["C"] * item
    return float(qo + keys + values + 4 * s["D"] * s["D"])


# Tolerances vs the float64 estimator (q, v ~ N(0,1) so |out| <~ 4; logits are O(1..5)).
# Measured worst case over causal {0, 1}, C {16, 256}, S_q/S_kv in {1..130} including
# chunk boundaries, D {8, 16, 32, 64}, B*H up to 4, several seeds, all variants:
#   float32: ~1.5e-6  -> 2e-5 (>10x margin; masking/chunking bugs are O(0.1..1))
#   float16: ~2.3e-3 (decode_then_sdpa rounds k_hat, the scores and the output to fp16;
#            chunked ~1e-3 = half an fp16 ulp of the output) -> 8e-3 (>3x)
TOLERANCE = {"float32": 2e-5, "float16": 8e-3}

# masked_chunk_no_nan multiplies the keys by this: logits (and the rounding error of every
# score formed in a low precision) grow by the same factor, hence the scaled bound.
LARGE_KEY_GAIN = 32.0


def masked_chunk_case(shape: Mapping[str, Any], bk: int) -> Shape:
    """Causal, S_q = S_kv = 2 bk + 3 (q_align = 0): rows < bk see nothing of chunk 1 and rows
    < 2 bk nothing of chunk 2 (a partial chunk of 3 keys), so whole chunks are fully masked."""
    s = normalize_shape(shape)
    return {**s, "causal": 1, "S_q": 2 * bk + 3, "S_kv": 2 * bk + 3}


def check_masked_chunk_no_nan(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """Fully masked KV chunks with large logits (keys x 32, logits up to ~100): output finite and
    within ``tolerance * 32`` of the reference. Uses the variant's ``bk`` (32 when it has none)."""
    case = masked_chunk_case(shape, int(variant.params.get("bk", 32)))
    inputs = make_inputs(case, dtype, 7, key_gain=LARGE_KEY_GAIN)
    tol = kernel.tolerance[dtype] * LARGE_KEY_GAIN
    out = run_variant(variant, inputs)
    got = to_numpy(out)
    if not np.all(np.isfinite(got)):
        bad = np.nonzero(~np.all(np.isfinite(got), axis=(0, 1, 3)))[0]
        return CheckResult(False, float("inf"), tol, f"non-finite output in query rows {bad[:8].tolist()}")
    ref = reference(inputs)
    err = max_abs_error(out, ref)
    max_logit = float(np.abs(estimator_scores(inputs)).max())
    detail = f"S={case['S_kv']}: finite; error {err:.3g} vs bound {tol:.3g} (max |logit| {max_logit:.3g})"
    return CheckResult(err <= tol, err, tol, detail)


def check_causal_mode(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """Runs the shape in the *other* mode too (causal 0 and 1, when valid): both must match.

    The suite's shape fixes one mode; this guards the mode switch itself (a variant that
    ignores ``causal`` passes one mode and fails the other).
    """
    s = normalize_shape(shape)
    tol = kernel.tolerance[dtype]
    modes = [0, 1] if s["S_q"] <= s["S_kv"] else [0]
    worst, parts = 0.0, []
    for mode in modes:
        inputs = make_inputs({**s, "causal": mode}, dtype, 13)
        err = max_abs_error(run_variant(variant, inputs), reference(inputs))
        worst = max(worst, err)
        parts.append(f"causal={mode}: {err:.3g}")
    return CheckResult(worst <= tol, worst, tol, "; ".join(parts) + f" vs tolerance {tol:.3g}")


def _variant(name: str, bk: int | None) -> Variant:
    def fn(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal):
        return compressed_attention(q, k_bits, k_norm, k_corr, v_codes, v_codebook, rot, scale, causal, bk=bk)

    return Variant(name=name, fn=fn, params={} if bk is None else {"bk": bk})


KERNEL = register(
    Kernel(
        name="compressed_kv_prefill",
        description="RaBitQ-style 1-bit keys (random rotation, norm, correction) + codebook values, prefill attention",
        default_variant="decode_then_sdpa",
        variants={
            "decode_then_sdpa": _variant("decode_then_sdpa", None),
            **{f"chunked_bk{bk}": _variant(f"chunked_bk{bk}", bk) for bk in BK_CHOICES},
        },
        normalize_shape=normalize_shape,
        make_inputs=make_inputs,
        reference=reference,
        tolerance=TOLERANCE,
        flops=flops,
        bytes_moved=bytes_moved,
        checks={"masked_chunk_no_nan": check_masked_chunk_no_nan, "causal_mode": check_causal_mode},
    )
)
