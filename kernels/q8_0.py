"""Q8_0 KV cache: int8 codes + one fp16 scale per block of 32, and causal prefill attention over it.

Format (llama.cpp's Q8_0, stored as two arrays): along the last axis, blocks of
``BLOCK = 32`` values; per block ``codes`` int8 ``[..., D]`` and ``scales`` float16
``[..., D // 32]``; 32 + 2 = 34 bytes per 32 values. ``x ~= codes * scale``.

Kernels registered here:

- ``q8_0_prefill`` (shape keys B, H, S_q, S_kv, D; D a multiple of 32): causal flash
  prefill attention reading Q8_0 K/V; query row ``i`` sees keys ``j <= i + S_kv - S_q``
  (tail alignment, S_q <= S_kv). Variants ``dequant_sdpa`` (baseline) and ``fused_bk{32,64}``.
- ``q8_0_roundtrip`` (shape keys N, D): quantize + dequantize; variants ``blocked``
  (baseline) and ``fused``; check ``error_bound`` holds the output to the bound of
  :func:`q8_0_quantize`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from kernels.base import CheckResult, Inputs, Kernel, Shape, Variant, max_abs_error, register, run_variant, to_numpy

BLOCK = 32
BLOCK_BYTES = 34  # 32 int8 codes + one fp16 scale
BK_CHOICES = (32, 64)

_DTYPES = {"float32": mx.float32, "float16": mx.float16}
_ITEMSIZE = {"float32": 4, "float16": 2}

# Unit roundoff of the fp16 scale, plus the float32 division that precedes the cast
# (double rounding f64 -> f32 -> f16 is within 2**-11 + 2**-24 relative).
_SCALE_REL = 2.0**-11 + 2.0**-24
_SCALE_ABS = 2.0**-25  # half the smallest fp16 subnormal: absolute rounding of tiny scales
_DIV_SLACK = 2.0**-16  # float32 rounding of x / s: |fl(x/s) - x/s| <= 127.1 * 2**-24 < 2**-17 = (1/2) 2**-16


# ----------------------------------------------------------------------------- codec


def q8_0_quantize(x: mx.array) -> tuple[mx.array, mx.array]:
    """Quantize the last axis (a multiple of 32) to Q8_0: ``(codes int8 [..., D], scales fp16 [..., D//32])``.

    Per block ``d = max|x| / 127`` (float32), ``s = float16(d)`` (the stored scale) and
    ``q = clip(round(x / s), -127, 127)`` computed against the *stored* ``s``
    (``s = 0`` for an all-zero block, whose codes are 0).

    Error bound (per element, ``deq = q * s`` evaluated exactly: |q| <= 127 and s has an
    11-bit significand, so the product fits float32)::

        |x - deq| <= s/2 * (1 + 2**-16) + 127 * |d - s|
        |d - s|   <= (2**-11 + 2**-24) * d + 2**-25

    Derivation: when ``|x / s| <= 127.5`` (no clipping) ``q`` is ``x / s`` rounded to the
    nearest integer, so ``|x - q s| <= s/2``; float32 rounding of the quotient
    (``<= 127.1 * 2**-24 < 2**-17``) adds ``s * 2**-17``. Clipping only happens when fp16
    rounded the scale down (``s < d``) and then ``|x - 127 s| <= 127 d - 127 s``. The
    second line is the fp16 rounding of the scale: half an ulp relative for normal fp16
    (``d >= 2**-14``), and at most half the smallest subnormal (``2**-25``) below that,
    plus the float32 division before the cast. For normal scales the bound is
    ``~ 0.562 d``; rounding the dequantized value to an fp16 output adds ``2**-11 |deq| + 2**-25``.
    Valid for ``max|x| / 127 <= 65504`` (the fp16 scale must not overflow).
    """
    d = x.shape[-1]
    if d % BLOCK:
        raise ValueError(f"last axis {d} is not a multiple of the Q8_0 block ({BLOCK})")
    xb = x.astype(mx.float32).reshape(*x.shape[:-1], d // BLOCK, BLOCK)
    scales = (mx.max(mx.abs(xb), axis=-1) / 127.0).astype(mx.float16)
    s32 = scales.astype(mx.float32)[..., None]
    safe = mx.where(s32 > 0, s32, 1.0)
    codes = mx.clip(mx.round(xb / safe), -127, 127).astype(mx.int8)
    return codes.reshape(x.shape), scales


def q8_0_dequantize(codes: mx.array, scales: mx.array, dtype: Any = mx.float32) -> mx.array:
    """``codes * scale`` per block (exact in float32), returned in ``dtype``."""
    d = codes.shape[-1]
    if d % BLOCK:
        raise ValueError(f"last axis {d} is not a multiple of the Q8_0 block ({BLOCK})")
    cb = codes.astype(mx.float32).reshape(*codes.shape[:-1], d // BLOCK, BLOCK)
    return (cb * scales.astype(mx.float32)[..., None]).reshape(codes.shape).astype(dtype)


def q8_0_error_bound(x: Any, out_dtype: str = "float32") -> np.ndarray:
    """The per-element bound of :func:`q8_0_quantize`'s docstring, from ``x`` alone (float64)."""
    xs = to_numpy(x)
    xb = xs.reshape(xs.shape[:-1] + (xs.shape[-1] // BLOCK, BLOCK))
    d = np.abs(xb).max(-1, keepdims=True) / 127.0
    ds = _SCALE_REL * d + _SCALE_ABS  # bound on |d - s|
    s_max = d + ds
    bound = s_max / 2 * (1 + _DIV_SLACK) + 127 * ds
    bound = np.broadcast_to(bound, xb.shape).reshape(xs.shape)
    if out_dtype == "float16":  # |deq| <= |x| + s_max; half an fp16 ulp (or half a subnormal step)
        bound = bound + 2.0**-11 * (np.abs(xs) + np.broadcast_to(s_max, xb.shape).reshape(xs.shape)) + 2.0**-25
    return bound


def np_q8_0_quantize(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Numpy twin of :func:`q8_0_quantize` (same float32 division and fp16 cast): codes, scales as float64."""
    xb = to_numpy(x).astype(np.float32)
    xb = xb.reshape(xb.shape[:-1] + (xb.shape[-1] // BLOCK, BLOCK))
    scales = (np.abs(xb).max(-1) / np.float32(127.0)).astype(np.float16).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))[..., None]
    codes = np.clip(np.round(xb / safe), -127, 127)
    return codes.reshape(to_numpy(x).shape).astype(np.float64), scales.astype(np.float64)


def np_q8_0_dequantize(codes: Any, scales: Any) -> np.ndarray:
    c = np.asarray(np.array(codes), dtype=np.float64)
    cb = c.reshape(c.shape[:-1] + (c.shape[-1] // BLOCK, BLOCK))
    return (cb * to_numpy(scales)[..., None]).reshape(c.shape)


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


def _reject_unknown(shape: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in shape:
        if key not in allowed:
            raise ValueError(f"unknown shape key {key!r} (allowed: {', '.join(allowed)})")


PREFILL_KEYS = ("B", "H", "S_q", "S_kv", "D")
ROUNDTRIP_KEYS = ("N", "D")


def normalize_prefill_shape(shape: Mapping[str, Any]) -> Shape:
    """Validate B, H, S_q, S_kv, D: D a multiple of 32, S_q <= S_kv (causal tail alignment)."""
    _reject_unknown(shape, PREFILL_KEYS)
    out = {key: _int_key(shape, key) for key in PREFILL_KEYS}
    if out["D"] % BLOCK:
        raise ValueError(f"shape key 'D' ({out['D']}) must be a multiple of {BLOCK}")
    if out["S_q"] > out["S_kv"]:
        raise ValueError(f"shape key 'S_q' ({out['S_q']}) must be <= S_kv ({out['S_kv']})")
    return out


def normalize_roundtrip_shape(shape: Mapping[str, Any]) -> Shape:
    """Validate N (rows) and D (a multiple of 32)."""
    _reject_unknown(shape, ROUNDTRIP_KEYS)
    out = {key: _int_key(shape, key) for key in ROUNDTRIP_KEYS}
    if out["D"] % BLOCK:
        raise ValueError(f"shape key 'D' ({out['D']}) must be a multiple of {BLOCK}")
    return out


# ----------------------------------------------------------------------------- prefill attention


def _dequant_sdpa(q, k_codes, k_scales, v_codes, v_scales, scale):
    k = q8_0_dequantize(k_codes, k_scales, q.dtype)
    v = q8_0_dequantize(v_codes, v_scales, q.dtype)
    mask = "causal" if q.shape[2] > 1 else None  # MLX "causal" is lower-right (tail) aligned
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def _fused_prefill(q, k_codes, k_scales, v_codes, v_scales, scale, bk):
    """Online softmax over KV chunks of ``bk`` keys, dequantizing each chunk in float32.

    Running row max ``m``, sum ``l`` and unnormalized output ``o`` (float32). Chunks are
    visited in increasing key order; a row whose keys are all masked so far keeps
    ``m = -inf`` and the update uses 0 in its place (no ``-inf - -inf``).
    """
    b, h, s_q, d = q.shape
    s_kv = k_codes.shape[2]
    q_align = s_kv - s_q
    qf = q.astype(mx.float32) * scale
    row_limit = mx.arange(s_q)[:, None] + q_align
    m = mx.full((b, h, s_q, 1), -mx.inf, dtype=mx.float32)
    l_sum = mx.zeros((b, h, s_q, 1), dtype=mx.float32)
    o = mx.zeros((b, h, s_q, d), dtype=mx.float32)
    for k0 in range(0, s_kv, bk):
        k1 = min(k0 + bk, s_kv)
        kc = q8_0_dequantize(k_codes[:, :, k0:k1], k_scales[:, :, k0:k1], mx.float32)
        vc = q8_0_dequantize(v_codes[:, :, k0:k1], v_scales[:, :, k0:k1], mx.float32)
        s = qf @ kc.swapaxes(-1, -2)
        if k1 - 1 > q_align:  # some key in the chunk is in some row's future
            s = mx.where(mx.arange(k0, k1)[None, :] <= row_limit, s, -mx.inf)
        m_new = mx.maximum(m, mx.max(s, axis=-1, keepdims=True))
        m_safe = mx.where(m_new == -mx.inf, 0.0, m_new)
        p = mx.exp(s - m_safe)
        alpha = mx.exp(m - m_safe)
        l_sum = alpha * l_sum + mx.sum(p, axis=-1, keepdims=True)
        o = alpha * o + p @ vc
        m = m_new
    return (o / l_sum).astype(q.dtype)


def q8_0_attention(q, k_codes, k_scales, v_codes, v_scales, scale: float, bk: int | None = None) -> mx.array:
    """Causal (tail-aligned) attention over a Q8_0 KV cache; ``bk=None`` is dequantize + SDPA."""
    if q.shape[2] > k_codes.shape[2]:
        raise ValueError(f"S_q={q.shape[2]} > S_kv={k_codes.shape[2]}")
    if bk is None:
        return _dequant_sdpa(q, k_codes, k_scales, v_codes, v_scales, scale)
    return _fused_prefill(q, k_codes, k_scales, v_codes, v_scales, scale, bk)


def np_causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s_q, s_kv = q.shape[-2], k.shape[-2]
    scores = np.einsum("...qd,...kd->...qk", q, k) * scale
    visible = np.arange(s_kv)[None, :] <= (np.arange(s_q) + s_kv - s_q)[:, None]
    scores = np.where(visible, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", p / p.sum(-1, keepdims=True), v)


def prefill_reference(inputs: Inputs) -> np.ndarray:
    k = np_q8_0_dequantize(inputs["k_codes"], inputs["k_scales"])
    v = np_q8_0_dequantize(inputs["v_codes"], inputs["v_scales"])
    return np_causal_attention(to_numpy(inputs["q"]), k, v, inputs["scale"])


def _prefill_inputs(shape: Shape, dtype: str, seed: int, block_scale: tuple[float, float] | None = None) -> Inputs:
    dt = _DTYPES[dtype]
    kq, kk, kv, ks = mx.random.split(mx.random.key(seed), 4)
    b, h, s_q, s_kv, d = (shape[key] for key in PREFILL_KEYS)
    q = mx.random.normal((b, h, s_q, d), key=kq)
    k = mx.random.normal((b, h, s_kv, d), key=kk)
    v = mx.random.normal((b, h, s_kv, d), key=kv)
    if block_scale is not None:
        lo, hi = block_scale
        exps = mx.random.uniform(lo, hi, (2, b, h, s_kv, d // BLOCK, 1), key=ks)
        mult = mx.power(10.0, exps)
        mult = mx.where(exps < lo + 0.1 * (hi - lo), 0.0, mult)  # ~10% all-zero blocks (scale 0)
        k = (k.reshape(b, h, s_kv, d // BLOCK, BLOCK) * mult[0]).reshape(k.shape)
        v = (v.reshape(b, h, s_kv, d // BLOCK, BLOCK) * mult[1]).reshape(v.shape)
    k_codes, k_scales = q8_0_quantize(k.astype(dt))
    v_codes, v_scales = q8_0_quantize(v.astype(dt))
    inputs = dict(q=q.astype(dt), k_codes=k_codes, k_scales=k_scales, v_codes=v_codes, v_scales=v_scales)
    inputs["scale"] = 1.0 / math.sqrt(d)
    mx.eval([a for a in inputs.values() if isinstance(a, mx.array)])
    return inputs


def make_prefill_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    return _prefill_inputs(normalize_prefill_shape(shape), dtype, seed)


def _visible_pairs(s_q: int, s_kv: int) -> int:
    return int(np.sum(np.minimum(np.arange(s_q) + s_kv - s_q + 1, s_kv)))


def prefill_flops(shape: Shape) -> float:
    """QK^T + PV over the causally visible pairs, plus one multiply per dequantized K/V value."""
    s = normalize_prefill_shape(shape)
    attn = 4.0 * s["B"] * s["H"] * _visible_pairs(s["S_q"], s["S_kv"]) * s["D"]
    return attn + 2.0 * s["B"] * s["H"] * s["S_kv"] * s["D"]


def _kv_values(s: Shape) -> int:
    return 2 * s["B"] * s["H"] * s["S_kv"] * s["D"]


def prefill_bytes_moved(shape: Shape, dtype: str) -> float:
    """q and out in dtype; K and V at 34/32 bytes per value (Q8_0)."""
    s = normalize_prefill_shape(shape)
    qo = 2 * s["B"] * s["H"] * s["S_q"] * s["D"] * _ITEMSIZE[dtype]
    return float(qo + _kv_values(s) * BLOCK_BYTES // BLOCK)


def bytes_vs_fp16(shape: Mapping[str, Any]) -> tuple[float, float]:
    """Bytes of one call with fp16 activations: (Q8_0 K/V, the same call with fp16 K/V)."""
    s = normalize_prefill_shape(shape)
    q8 = prefill_bytes_moved(s, "float16")
    qo = 2 * s["B"] * s["H"] * s["S_q"] * s["D"] * 2
    return q8, float(qo + _kv_values(s) * 2)


# Tolerances vs the float64 attention over the dequantized cache (N(0,1) inputs, |out| <~ 4.5).
# Measured worst case over S_q/S_kv in {1, 5, 31, 32, 33, 64, 65, 100}, D in {32, 64, 128},
# B*H up to 4, 2 seeds, all variants (scale_extremes inputs: at most the same):
#   float32: 1.2e-6             -> 2e-5 (>15x margin; mask/tiling/block bugs are O(0.1..1))
#   float16: 2.6e-3 (sdpa: fp16 K/V and scores; fused 9.8e-4 = half an fp16 ulp of |out|
#            in [2, 4)) -> 8e-3 (~3x; |out| can reach [4, 8) where half an ulp is 2e-3)
PREFILL_TOLERANCE = {"float32": 2e-5, "float16": 8e-3}


def check_scale_extremes(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """K/V blocks scaled by 10**U(-6, 0) (fp16 subnormal scales) and ~10% all-zero blocks (scale 0).

    The tolerance is the dtype tolerance (values stay <~ 4.5 as in the reference check).
    Catches a variant that reads the wrong block's scale, divides by a zero scale, or
    flushes small scales.
    """
    shape = normalize_prefill_shape(shape)
    inputs = _prefill_inputs(shape, dtype, 23, block_scale=(-6.0, 0.0))
    tol = kernel.tolerance[dtype]
    err = max_abs_error(run_variant(variant, inputs), prefill_reference(inputs))
    return CheckResult(err <= tol, err, tol, f"max abs error {err:.3g} vs tolerance {tol:.3g}")


def _prefill_variant(name: str, bk: int | None) -> Variant:
    def fn(q, k_codes, k_scales, v_codes, v_scales, scale):
        return q8_0_attention(q, k_codes, k_scales, v_codes, v_scales, scale, bk=bk)

    return Variant(name=name, fn=fn, params={} if bk is None else {"bk": bk})


Q8_0_PREFILL = register(
    Kernel(
        name="q8_0_prefill",
        description="causal flash prefill attention over a Q8_0 (int8 + fp16 scale per 32) KV cache",
        default_variant="dequant_sdpa",
        variants={
            "dequant_sdpa": _prefill_variant("dequant_sdpa", None),
            **{f"fused_bk{bk}": _prefill_variant(f"fused_bk{bk}", bk) for bk in BK_CHOICES},
        },
        normalize_shape=normalize_prefill_shape,
        make_inputs=make_prefill_inputs,
        reference=prefill_reference,
        tolerance=PREFILL_TOLERANCE,
        flops=prefill_flops,
        bytes_moved=prefill_bytes_moved,
        checks={"scale_extremes": check_scale_extremes},
    )
)


# ----------------------------------------------------------------------------- roundtrip


def _roundtrip_blocked(x):
    codes, scales = q8_0_quantize(x)
    return q8_0_dequantize(codes, scales, x.dtype)


def _roundtrip_fused(x):
    """Same arithmetic without materializing int8 codes: ``clip(round(x / s)) * s`` in float32."""
    n, d = x.shape[:-1], x.shape[-1]
    if d % BLOCK:
        raise ValueError(f"last axis {d} is not a multiple of the Q8_0 block ({BLOCK})")
    xb = x.astype(mx.float32).reshape(*n, d // BLOCK, BLOCK)
    s = (mx.max(mx.abs(xb), axis=-1, keepdims=True) / 127.0).astype(mx.float16).astype(mx.float32)
    q = mx.clip(mx.round(xb / mx.where(s > 0, s, 1.0)), -127, 127)
    return (q * s).reshape(x.shape).astype(x.dtype)


def _roundtrip_inputs(shape: Shape, dtype: str, seed: int, exp_range: tuple[float, float]) -> Inputs:
    kx, ks = mx.random.split(mx.random.key(seed), 2)
    n, d = shape["N"], shape["D"]
    x = mx.random.normal((n, d // BLOCK, BLOCK), key=kx)
    exps = mx.random.uniform(*exp_range, (n, d // BLOCK, 1), key=ks)
    x = (x * mx.power(10.0, exps)).reshape(n, d).astype(_DTYPES[dtype])
    mx.eval(x)
    return {"x": x}


def make_roundtrip_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    """Rows of N(0,1) blocks each multiplied by 10**U(-3, 0): |x| <~ 5 (absolute tolerances stay meaningful)."""
    return _roundtrip_inputs(normalize_roundtrip_shape(shape), dtype, seed, (-3.0, 0.0))


def roundtrip_reference(inputs: Inputs) -> np.ndarray:
    """Numpy emulation of the format (float32 division, fp16 scale, round-half-even), exact dequant."""
    return np_q8_0_dequantize(*np_q8_0_quantize(inputs["x"]))


def roundtrip_flops(shape: Shape) -> float:
    """Per value: abs, max, divide, round, clip, multiply (~6 ops)."""
    s = normalize_roundtrip_shape(shape)
    return 6.0 * s["N"] * s["D"]


def roundtrip_bytes_moved(shape: Shape, dtype: str) -> float:
    """Read x, write the Q8_0 blocks, read them back, write the output."""
    s = normalize_roundtrip_shape(shape)
    values = s["N"] * s["D"]
    return float(2 * values * _ITEMSIZE[dtype] + 2 * values * BLOCK_BYTES // BLOCK)


# Measured over N {1, 7, 64, 4096} x D {32, 96, 256} x 3 seeds: float32 0.0 (q * s is exact
# in float32 and the reference emulates the same rounding decisions); float16 9.8e-4 (half an
# fp16 ulp of |out| < 4; the bound allows |out| up to 8).
ROUNDTRIP_TOLERANCE = {"float32": 1e-6, "float16": 4e-3}


def check_error_bound(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """``|x - out| <= q8_0_error_bound(x)`` element-wise on blocks spanning 1e-9..1e3.

    The range covers all-zero blocks (fp16 input underflow), subnormal fp16 scales and
    large scales. Reported error/tolerance are the worst ratio |x - out| / bound (pass <= 1).
    The bound is computed from x only, so it holds any implementation to the format.
    """
    shape = normalize_roundtrip_shape(shape)
    shape = {**shape, "N": max(shape["N"], 16)}
    inputs = _roundtrip_inputs(shape, dtype, 29, (-9.0, 3.0))
    x = inputs["x"]
    out = to_numpy(run_variant(variant, inputs))
    xs = to_numpy(x)
    if out.shape != xs.shape or not np.all(np.isfinite(out)):
        return CheckResult(False, float("inf"), 1.0, f"bad output (shape {out.shape}, finite {np.isfinite(out).all()})")
    ratio = np.abs(xs - out) / q8_0_error_bound(x, dtype)
    worst = float(ratio.max())
    idx = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    detail = f"worst |x - deq| / bound = {worst:.3f} at {tuple(int(i) for i in idx)} (x={xs[idx]:.4g})"
    return CheckResult(worst <= 1.0, worst, 1.0, detail)


Q8_0_ROUNDTRIP = register(
    Kernel(
        name="q8_0_roundtrip",
        description="Q8_0 quantize + dequantize (int8 codes, fp16 scale per block of 32)",
        default_variant="blocked",
        variants={
            "blocked": Variant(name="blocked", fn=_roundtrip_blocked),
            "fused": Variant(name="fused", fn=_roundtrip_fused),
        },
        normalize_shape=normalize_roundtrip_shape,
        make_inputs=make_roundtrip_inputs,
        reference=roundtrip_reference,
        tolerance=ROUNDTRIP_TOLERANCE,
        flops=roundtrip_flops,
        bytes_moved=roundtrip_bytes_moved,
        checks={"error_bound": check_error_bound},
    )
)
