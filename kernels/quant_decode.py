"""Group-quantized (KIVI-style) decode attention, single layer and batched across layers.

Storage format (shared by K and V). Along the head dim ``D`` the values are cut into
groups of ``group_size`` (32 or 64) and each group gets one affine pair::

    x ~= code * scale + zero        code in [0, 2**bits - 1], bits in {4, 8}

``scale``/``zero`` have the activation dtype and shape ``[..., D // group_size]``.
Codes are uint8; for ``bits == 4`` two codes are packed per byte (element ``2t`` in
the low nibble, ``2t + 1`` in the high nibble), so the code array is ``[..., D // 2]``;
for ``bits == 8`` it is ``[..., D]``. ``bytes_moved`` counts exactly these bytes.

Attention layout: ``q`` is ``[B, H_q, S_q, D]``, the caches ``[B, H_kv, S_kv, ...]``,
``H_q`` a multiple of ``H_kv`` (query head ``h`` reads KV head ``h // (H_q // H_kv)``),
``1 <= S_q <= 4`` and causal tail alignment: query row ``i`` sees keys
``j <= i + S_kv - S_q`` (the last query row sees the whole cache).

Kernels registered here:

- ``quant_decode`` (shape keys B, H_q, H_kv, S_q, S_kv, D, bits, group):
  variants ``dequant_sdpa`` (baseline) and ``fused_split{1,4,16}``.
- ``quant_decode_layers`` (the same keys plus NL, every input has a leading layer
  axis): variants ``loop`` (baseline), ``batched`` and ``batched_fused_split4``.

``per_request_divisor(shape)`` returns B: the harness reports time per request as
time / B (every request in the batch has the same cache length).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from kernels.base import CheckResult, Inputs, Kernel, Shape, Variant, max_abs_error, register, run_variant, to_numpy

BITS = (4, 8)
GROUP_SIZES = (32, 64)
SPLITS = (1, 4, 16)
MAX_S_Q = 4

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


# ----------------------------------------------------------------------------- shapes


def _int_key(shape: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    if key not in shape:
        raise ValueError(f"shape key {key!r} is missing")
    value = shape[key]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"shape key {key!r} must be an int, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"shape key {key!r} must be >= {minimum}, got {value}")
    return value


def _reject_unknown(shape: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in shape:
        if key not in allowed:
            raise ValueError(f"unknown shape key {key!r} (allowed: {', '.join(allowed)})")


_DECODE_KEYS = ("B", "H_q", "H_kv", "S_q", "S_kv", "D", "bits", "group")


def normalize_shape(shape: Mapping[str, Any]) -> Shape:
    """Validate a ``quant_decode`` shape. Defaults: S_q=1, H_kv=H_q, bits=4, group=32."""
    _reject_unknown(shape, _DECODE_KEYS)
    filled = {"S_q": 1, "bits": 4, "group": 32, **shape}
    if "H_kv" not in filled and "H_q" in filled:
        filled["H_kv"] = filled["H_q"]
    out = {key: _int_key(filled, key) for key in _DECODE_KEYS}
    if out["bits"] not in BITS:
        raise ValueError(f"shape key 'bits' must be one of {BITS}, got {out['bits']}")
    if out["group"] not in GROUP_SIZES:
        raise ValueError(f"shape key 'group' must be one of {GROUP_SIZES}, got {out['group']}")
    if out["D"] % out["group"]:
        raise ValueError(f"shape key 'D' ({out['D']}) must be a multiple of group ({out['group']})")
    if out["H_q"] % out["H_kv"]:
        raise ValueError(f"shape key 'H_q' ({out['H_q']}) must be a multiple of H_kv ({out['H_kv']})")
    if out["S_q"] > MAX_S_Q:
        raise ValueError(f"shape key 'S_q' must be <= {MAX_S_Q} for decode, got {out['S_q']}")
    if out["S_q"] > out["S_kv"]:
        raise ValueError(f"shape key 'S_q' ({out['S_q']}) must be <= S_kv ({out['S_kv']})")
    return out


def normalize_layers_shape(shape: Mapping[str, Any]) -> Shape:
    """Validate a ``quant_decode_layers`` shape: the ``quant_decode`` keys plus NL."""
    _reject_unknown(shape, ("NL",) + _DECODE_KEYS)
    nl = _int_key(shape, "NL")
    return {"NL": nl, **normalize_shape({k: v for k, v in shape.items() if k != "NL"})}


def per_request_divisor(shape: Mapping[str, Any]) -> int:
    """Requests per call: time per request = time / B (all rows share one cache length)."""
    return int(normalize_shape({k: v for k, v in shape.items() if k != "NL"})["B"])


# ----------------------------------------------------------------------------- codec


def _check_codec(bits: int, group_size: int, d: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    if d % group_size:
        raise ValueError(f"head dim {d} is not a multiple of group_size {group_size}")


def pack_codes(codes: mx.array, bits: int) -> mx.array:
    """uint8 codes ``[..., D]`` to the stored layout (two nibbles per byte for 4 bits)."""
    if bits == 8:
        return codes
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return mx.bitwise_or(pairs[..., 0], mx.left_shift(pairs[..., 1], 4))


def unpack_codes(packed: mx.array, bits: int) -> mx.array:
    """Stored codes to one uint8 code per element ``[..., D]``."""
    if bits == 8:
        return packed
    low = mx.bitwise_and(packed, 15)
    high = mx.right_shift(packed, 4)
    return mx.stack([low, high], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize(x: mx.array, bits: int, group_size: int) -> tuple[mx.array, mx.array, mx.array]:
    """Per-group asymmetric quantization along the last axis.

    Returns ``(codes, scale, zero)``: codes in the packed uint8 layout, scale/zero in
    ``x.dtype`` with shape ``[..., D // group_size]``. ``zero`` is the group minimum
    (exactly representable: it is one of the inputs) and ``scale = (max - min) / (2**bits - 1)``
    rounded to ``x.dtype``; codes are computed against the *stored* scale/zero.
    """
    d = x.shape[-1]
    _check_codec(bits, group_size, d)
    levels = 2**bits - 1
    xg = x.astype(mx.float32).reshape(*x.shape[:-1], d // group_size, group_size)
    lo = mx.min(xg, axis=-1)
    hi = mx.max(xg, axis=-1)
    scale = ((hi - lo) / levels).astype(x.dtype)
    zero = lo.astype(x.dtype)
    s32 = scale.astype(mx.float32)[..., None]
    safe = mx.where(s32 > 0, s32, 1.0)
    codes = mx.round((xg - zero.astype(mx.float32)[..., None]) / safe)
    codes = mx.clip(codes, 0, levels).astype(mx.uint8).reshape(x.shape)
    return pack_codes(codes, bits), scale, zero


def dequantize(
    codes: mx.array, scale: mx.array, zero: mx.array, bits: int, group_size: int, dtype: Any = None
) -> mx.array:
    """``code * scale + zero`` computed in float32, returned in ``dtype`` (default: scale's dtype)."""
    c = unpack_codes(codes, bits)
    d = c.shape[-1]
    _check_codec(bits, group_size, d)
    cg = c.astype(mx.float32).reshape(*c.shape[:-1], d // group_size, group_size)
    x = cg * scale.astype(mx.float32)[..., None] + zero.astype(mx.float32)[..., None]
    return x.reshape(c.shape).astype(scale.dtype if dtype is None else dtype)


def np_unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 15
    out[..., 1::2] = packed >> 4
    return out


def np_dequantize(codes: Any, scale: Any, zero: Any, bits: int, group_size: int) -> np.ndarray:
    """Float64 numpy dequantization of the stored codes (the reference's view of K/V)."""
    c = np_unpack_codes(np.array(codes), bits).astype(np.float64)
    d = c.shape[-1]
    cg = c.reshape(c.shape[:-1] + (d // group_size, group_size))
    x = cg * to_numpy(scale)[..., None] + to_numpy(zero)[..., None]
    return x.reshape(c.shape)


def quant_error_bound(x: mx.array, bits: int, group_size: int) -> np.ndarray:
    """Per-element bound on ``|x - dequantize(quantize(x))|`` (float64, from x alone).

    Per group, ``L = 2**bits - 1``, ``u`` the unit roundoff of x.dtype (2**-11 fp16, 2**-8 bf16,
    2**-24 fp32), ``e = 2**-24`` (float32). ``z = min`` is stored exactly (it is one of the
    inputs); the stored scale is ``s = (max - min) / L`` rounded through float32 to x.dtype, so
    ``s <= s_hi = (max - min) / L * (1 + u + 2e) + 2**-25`` (the last term: fp16 subnormals).
    Codes are ``clip(round((x - z) / s), 0, L)`` against the stored ``s`` and ``z``:

    - unclipped: ``|x - z - code * s| <= s * (1/2 + (L + 1) * 2e)`` (float32 rounding of the
      difference and the quotient, each relative ``e`` on a value ``<= L + 1/2``);
    - clipped at the top (only when ``s`` was rounded down): ``<= (max - min) - L * s <=
      (max - min) * (u + 2e) + L * 2**-25``; nothing clips at the bottom (``x >= z``);
    - dequantization ``code * s + z`` in float32 then cast to x.dtype adds
      ``2e * (|x| + L * s) + u * (|x| + s)`` (+ ``2**-25`` for fp16 subnormal outputs).

    The bound is the sum of the three (the first two are exclusive, summing is looser).
    For normal values it is ``~ s/2 + L * s * u``: 0.5 s for float32, 0.51 s (4-bit) and
    0.62 s (8-bit) for float16.
    """
    xs = to_numpy(x)
    d = xs.shape[-1]
    levels = 2**bits - 1
    fp16 = x.dtype == mx.float16
    u = {mx.float16: 2.0**-11, mx.bfloat16: 2.0**-8}.get(x.dtype, 2.0**-24)
    e = 2.0**-24
    xg = xs.reshape(xs.shape[:-1] + (d // group_size, group_size))
    lo = xg.min(-1, keepdims=True)
    hi = xg.max(-1, keepdims=True)
    s_hi = (hi - lo) / levels * (1 + u + 2 * e) + 2.0**-25
    rnd = s_hi * (0.5 + (levels + 1) * 2 * e)
    clip = (hi - lo) * (u + 2 * e) + levels * 2.0**-25
    mag = np.abs(xg)
    out = 2 * e * (mag + levels * s_hi) + u * (mag + s_hi) + (2.0**-25 if fp16 else 0.0)
    return (rnd + clip + out).reshape(xs.shape)


# ----------------------------------------------------------------------------- attention


def _visible_limit(s_q: int, s_kv: int) -> np.ndarray:
    """Last key index each query row may see (causal tail alignment)."""
    return np.arange(s_q) + (s_kv - s_q)


def _dequant_sdpa(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
    k = dequantize(k_codes, k_scale, k_zero, bits, group_size, dtype=q.dtype)
    v = dequantize(v_codes, v_scale, v_zero, bits, group_size, dtype=q.dtype)
    mask = "causal" if q.shape[2] > 1 else None  # MLX "causal" is lower-right (tail) aligned
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def _fused_split(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits, num_splits):
    """Flash-decoding: dequantize one KV split at a time, per-split softmax stats, then combine.

    Split ``s`` covers keys ``[s * S_kv // N, (s + 1) * S_kv // N)`` (balanced, empty splits
    are skipped when S_kv < N). Each split produces an unnormalized partial output, its row
    max ``m_s`` and its row sum ``l_s`` (float32); the combine rescales by ``exp(m_s - M)``.
    A split whose keys are all masked for a row has ``m_s = -inf``: its local exponent uses
    0 instead (so no ``-inf - -inf``) and its combine weight is ``exp(-inf - M) = 0``.
    """
    b, h_q, s_q, d = q.shape
    h_kv, s_kv = k_codes.shape[1], k_codes.shape[2]
    groups = h_q // h_kv
    # Rows ordered (g, i): query head h = h_kv_index * groups + g, query position i.
    qf = (q.astype(mx.float32) * scale).reshape(b, h_kv, groups * s_q, d)
    row_limit = mx.array(np.tile(_visible_limit(s_q, s_kv), groups))[:, None]
    first_masked = s_kv - s_q + 1  # keys >= this index are hidden from at least one row
    bounds = [(i * s_kv) // num_splits for i in range(num_splits + 1)]
    ms, ls, os_ = [], [], []
    for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True):
        if s1 <= s0:
            continue
        k = dequantize(k_codes[:, :, s0:s1], k_scale[:, :, s0:s1], k_zero[:, :, s0:s1], bits, group_size, mx.float32)
        v = dequantize(v_codes[:, :, s0:s1], v_scale[:, :, s0:s1], v_zero[:, :, s0:s1], bits, group_size, mx.float32)
        scores = qf @ k.swapaxes(-1, -2)
        if s1 > first_masked:
            visible = mx.arange(s0, s1)[None, :] <= row_limit
            scores = mx.where(visible, scores, -mx.inf)
        m = mx.max(scores, axis=-1, keepdims=True)
        m_safe = mx.where(m == -mx.inf, 0.0, m)
        p = mx.exp(scores - m_safe)
        ms.append(m)
        ls.append(mx.sum(p, axis=-1, keepdims=True))
        os_.append(p @ v)
    m_all = mx.stack(ms)
    m_max = mx.max(m_all, axis=0)  # finite: every row sees key 0
    w = mx.exp(m_all - m_max)
    out = mx.sum(w * mx.stack(os_), axis=0) / mx.sum(w * mx.stack(ls), axis=0)
    return out.reshape(b, h_q, s_q, d).astype(q.dtype)


def decode_attend(
    q: mx.array,
    k_codes: mx.array,
    k_scale: mx.array,
    k_zero: mx.array,
    v_codes: mx.array,
    v_scale: mx.array,
    v_zero: mx.array,
    group_size: int,
    scale: float,
    bits: int = 4,
    num_splits: int | None = None,
) -> mx.array:
    """Decode attention over a group-quantized KV cache; returns ``[B, H_q, S_q, D]`` in q.dtype.

    ``num_splits=None`` dequantizes the whole cache and calls the fused SDPA (baseline);
    an int ``N`` runs the flash-decoding path with N KV splits (see :func:`_fused_split`).
    """
    if q.ndim != 4 or k_codes.ndim != 4 or v_codes.ndim != 4:
        raise ValueError("q and the code arrays must be 4-D [B, H, S, D]")
    if q.shape[1] % k_codes.shape[1]:
        raise ValueError(f"H_q={q.shape[1]} is not a multiple of H_kv={k_codes.shape[1]}")
    if q.shape[2] > k_codes.shape[2]:
        raise ValueError(f"S_q={q.shape[2]} > S_kv={k_codes.shape[2]}")
    args = (q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits)
    if num_splits is None:
        return _dequant_sdpa(*args)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return _fused_split(*args, num_splits)


_LAYER_ARRAYS = ("q", "k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")


def decode_attend_layers(
    q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits=4, num_splits=None
) -> mx.array:
    """All layers in one call: fold the layer axis into the batch axis and back.

    Every layer's rows go through exactly the ops of :func:`decode_attend` (the batch
    axis only indexes independent problems), so the result is bit-identical to the
    per-layer loop.
    """
    arrays = dict(zip(_LAYER_ARRAYS, (q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero), strict=True))
    nl, b = q.shape[0], q.shape[1]
    folded = {name: a.reshape(nl * b, *a.shape[2:]) for name, a in arrays.items()}
    out = decode_attend(**folded, group_size=group_size, scale=scale, bits=bits, num_splits=num_splits)
    return out.reshape(nl, b, *out.shape[1:])


def decode_attend_layers_loop(
    q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits=4, num_splits=None
) -> mx.array:
    """The per-layer loop: one single-layer call per layer, stacked."""
    arrays = (q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero)
    outs = [
        decode_attend(*(a[layer] for a in arrays), group_size, scale, bits=bits, num_splits=num_splits)
        for layer in range(q.shape[0])
    ]
    return mx.stack(outs)


# ----------------------------------------------------------------------------- reference


def np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Exact float64 attention, GQA and causal tail alignment; q ``[..., H_q, S_q, D]``."""
    h_q, s_q = q.shape[-3], q.shape[-2]
    h_kv, s_kv = k.shape[-3], k.shape[-2]
    k = np.repeat(k, h_q // h_kv, axis=-3)
    v = np.repeat(v, h_q // h_kv, axis=-3)
    scores = np.einsum("...qd,...kd->...qk", q, k) * scale
    visible = np.arange(s_kv)[None, :] <= _visible_limit(s_q, s_kv)[:, None]
    scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("...qk,...kd->...qd", p, v)


def reference(inputs: Inputs) -> np.ndarray:
    """Dequantize the stored codes in float64, then exact attention (works with any leading axes)."""
    bits, g = inputs["bits"], inputs["group_size"]
    k = np_dequantize(inputs["k_codes"], inputs["k_scale"], inputs["k_zero"], bits, g)
    v = np_dequantize(inputs["v_codes"], inputs["v_scale"], inputs["v_zero"], bits, g)
    return np_attention(to_numpy(inputs["q"]), k, v, inputs["scale"])


# ----------------------------------------------------------------------------- inputs and roofline


def _make(shape: Shape, dtype: str, seed: int, lead: tuple[int, ...]) -> Inputs:
    dt = _DTYPES[dtype]
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    h_q, h_kv, s_q, s_kv, d = shape["H_q"], shape["H_kv"], shape["S_q"], shape["S_kv"], shape["D"]
    bits, group = shape["bits"], shape["group"]
    q = mx.random.normal((*lead, h_q, s_q, d), key=kq).astype(dt)
    k = mx.random.normal((*lead, h_kv, s_kv, d), key=kk).astype(dt)
    v = mx.random.normal((*lead, h_kv, s_kv, d), key=kv).astype(dt)
    k_codes, k_scale, k_zero = quantize(k, bits, group)
    v_codes, v_scale, v_zero = quantize(v, bits, group)
    inputs = dict(q=q, k_codes=k_codes, k_scale=k_scale, k_zero=k_zero, v_codes=v_codes, v_scale=v_scale)
    inputs.update(v_zero=v_zero, group_size=group, scale=1.0 / math.sqrt(d), bits=bits)
    mx.eval([a for a in inputs.values() if isinstance(a, mx.array)])
    return inputs


def make_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    shape = normalize_shape(shape)
    return _make(shape, dtype, seed, (shape["B"],))


def make_layers_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    shape = normalize_layers_shape(shape)
    return _make(shape, dtype, seed, (shape["NL"], shape["B"]))


def visible_pairs(s_q: int, s_kv: int) -> int:
    """(query, key) pairs that survive the causal tail mask."""
    return int(np.sum(np.minimum(_visible_limit(s_q, s_kv) + 1, s_kv)))


def flops(shape: Shape) -> float:
    """QK^T and PV over the visible pairs (2 flops per MAC each), plus K/V dequant (mul+add)."""
    s = normalize_shape(shape)
    attn = 4.0 * s["B"] * s["H_q"] * visible_pairs(s["S_q"], s["S_kv"]) * s["D"]
    dequant = 2.0 * 2 * s["B"] * s["H_kv"] * s["S_kv"] * s["D"]
    return attn + dequant


def bytes_moved(shape: Shape, dtype: str) -> float:
    """q and out in dtype, K/V codes at bits/8 bytes per value, one scale + one zero per group."""
    s = normalize_shape(shape)
    item = _ITEMSIZE[dtype]
    qo = 2 * s["B"] * s["H_q"] * s["S_q"] * s["D"] * item
    tokens = s["B"] * s["H_kv"] * s["S_kv"]
    codes = 2 * tokens * s["D"] * s["bits"] // 8
    params = 2 * tokens * (s["D"] // s["group"]) * 2 * item
    return float(qo + codes + params)


def layers_flops(shape: Shape) -> float:
    s = normalize_layers_shape(shape)
    return s["NL"] * flops({k: v for k, v in s.items() if k != "NL"})


def layers_bytes_moved(shape: Shape, dtype: str) -> float:
    s = normalize_layers_shape(shape)
    return s["NL"] * bytes_moved({k: v for k, v in s.items() if k != "NL"}, dtype)


# Tolerances (max abs error vs the float64 attention over the *dequantized* cache; inputs
# are N(0, 1), so outputs are convex combinations of values with |v| <~ 5.5).
# Measured worst case over bits {4, 8} x group {32, 64} x GQA {1, 4} x S_q {1, 4} x
# S_kv {1, 7, 33, 100, 257} x B {1, 4, 32} x 2-3 seeds, all variants (~2000 runs):
#   float32: 1.7e-6 (float32 dequant, scores, softmax) -> 2e-5 (>10x margin; a mask, group,
#            split or GQA-mapping bug costs O(0.1..1))
#   float16: 2.8e-3 (dequant_sdpa: fp16 K/V, fp16 scores, and half an fp16 ulp of |out| in
#            [4, 8) is 2e-3; the fused splits compute in float32: 9.8e-4) -> 8e-3 (~3x)
#   bfloat16: 1.7e-2 (dequant_sdpa; half a bf16 ulp of |out| in [4, 8) is 1.6e-2; the fused splits
#            7.8e-3; 384 cases: bits x group x GQA x S_q x S_kv {7, 33, 257} x B {1, 4} x 2 seeds) -> 4e-2
TOLERANCE = {"float32": 2e-5, "float16": 8e-3, "bfloat16": 4e-2}


# ----------------------------------------------------------------------------- checks


def _row_errors(out: Any, ref: np.ndarray) -> np.ndarray:
    got = to_numpy(out)
    err = np.abs(got - ref).reshape(got.shape[0], -1).max(axis=1)
    err[~np.all(np.isfinite(got.reshape(got.shape[0], -1)), axis=1)] = np.inf
    return err


def check_batch_rows(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """Every batch row matches its own reference, and rows computed alone match rows in the batch.

    Catches cross-request contamination (a row reading another row's cache, a softmax over
    the batch axis) that a single max over the whole batch could hide behind one good row.
    """
    shape = normalize_shape(shape)
    inputs = make_inputs(shape, dtype, 3)
    tol = kernel.tolerance[dtype]
    out = run_variant(variant, inputs)
    errs = _row_errors(out, reference(inputs))
    worst = int(np.argmax(errs))
    b = shape["B"]
    alone_err = 0.0
    for row in sorted({0, b // 2, b - 1}):
        single = {k: (a[row : row + 1] if isinstance(a, mx.array) else a) for k, a in inputs.items()}
        alone_err = max(alone_err, max_abs_error(out[row : row + 1], to_numpy(run_variant(variant, single))))
    err = max(float(errs.max()), alone_err)
    detail = f"worst row {worst} error {errs[worst]:.3g}; batched vs alone {alone_err:.3g}; tolerance {tol:.3g}"
    return CheckResult(err <= tol, err, tol, detail)


def check_causal_tail(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """Forces S_q = min(4, S_kv) so the tail mask matters, and verifies the mask is live.

    The reference with and without the mask must differ by > 10x tolerance (else the case
    could not catch a missing mask); the variant must match the masked reference.
    """
    shape = normalize_shape(shape)
    s_q = min(MAX_S_Q, shape["S_kv"])
    tol = kernel.tolerance[dtype]
    if s_q < 2:
        return CheckResult(True, 0.0, tol, "not applicable: S_kv=1 has no causal tail")
    shape = {**shape, "S_q": s_q}
    inputs = make_inputs(shape, dtype, 5)
    ref = reference(inputs)
    k = np_dequantize(inputs["k_codes"], inputs["k_scale"], inputs["k_zero"], inputs["bits"], inputs["group_size"])
    v = np_dequantize(inputs["v_codes"], inputs["v_scale"], inputs["v_zero"], inputs["bits"], inputs["group_size"])
    q = to_numpy(inputs["q"])
    unmasked = _np_unmasked(q, k, v, inputs["scale"])
    gap = float(np.max(np.abs(unmasked - ref)))
    if gap <= 10 * tol:
        return CheckResult(False, None, tol, f"mask is not exercised (masked vs unmasked gap {gap:.3g})")
    err = max_abs_error(run_variant(variant, inputs), ref)
    return CheckResult(err <= tol, err, tol, f"S_q={s_q}: error {err:.3g} (mask gap {gap:.3g}), tolerance {tol:.3g}")


def _np_unmasked(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    h_q, h_kv = q.shape[-3], k.shape[-3]
    k = np.repeat(k, h_q // h_kv, axis=-3)
    v = np.repeat(v, h_q // h_kv, axis=-3)
    scores = np.einsum("...qd,...kd->...qk", q, k) * scale
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", p / p.sum(-1, keepdims=True), v)


# --------------------------------------------------------------- layer checks


def _layer_inputs(inputs: Inputs, layer: int) -> Inputs:
    return {k: (a[layer] if isinstance(a, mx.array) else a) for k, a in inputs.items()}


def check_layer_parity(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """Bit-identity (max abs diff == 0.0) with the single-layer kernel called NL times and stacked.

    The single-layer implementation is ``QUANT_DECODE.variants[variant.params['single_layer']]``.
    """
    shape = normalize_layers_shape(shape)
    inputs = make_layers_inputs(shape, dtype, 0)
    out = run_variant(variant, inputs)
    single = QUANT_DECODE.variants[variant.params.get("single_layer", QUANT_DECODE.default_variant)]
    stacked = mx.stack([single.fn(**_layer_inputs(inputs, layer)) for layer in range(shape["NL"])])
    mx.eval(stacked)
    if out.shape != stacked.shape or out.dtype != stacked.dtype:
        return CheckResult(False, None, 0.0, f"output {out.shape}/{out.dtype} vs loop {stacked.shape}/{stacked.dtype}")
    got, want = to_numpy(out), to_numpy(stacked)
    if not np.all(np.isfinite(got)):
        return CheckResult(False, float("inf"), 0.0, "non-finite output")
    diff = float(np.max(np.abs(got - want)))
    per_layer = np.abs(got - want).reshape(shape["NL"], -1).max(axis=1)
    bad = [int(i) for i in np.nonzero(per_layer)[0]]
    detail = f"NL={shape['NL']}: max |batched - loop| = {diff!r}" + (f"; differing layers {bad[:8]}" if bad else "")
    return CheckResult(diff == 0.0, diff, 0.0, detail)


def check_stride_adversarial(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """NL=3, B=2, every (layer, batch) problem distinct, each held to its own numpy reference.

    With NL != B and both > 1, swapping the layer and batch strides (or folding in the wrong
    order) sends some (layer, batch) output to another slot; the check first confirms all
    six per-slot references differ pairwise by > 10x tolerance so any such swap is visible.
    """
    shape = {**normalize_layers_shape(shape), "NL": 3, "B": 2}
    inputs = make_layers_inputs(shape, dtype, 11)
    tol = kernel.tolerance[dtype]
    out = to_numpy(run_variant(variant, inputs))
    refs = {}
    for layer in range(3):
        for b in range(2):
            one = {k: (a[layer, b : b + 1] if isinstance(a, mx.array) else a) for k, a in inputs.items()}
            refs[layer, b] = reference(one)[0]
    slots = list(refs)
    sep = min(float(np.max(np.abs(refs[a] - refs[b]))) for i, a in enumerate(slots) for b in slots[i + 1 :])
    if sep <= 10 * tol:
        return CheckResult(False, None, tol, f"slots not distinguishable (min separation {sep:.3g})")
    if out.shape[:2] != (3, 2):
        return CheckResult(False, None, tol, f"output leading axes {out.shape[:2]} != (3, 2)")
    errs = {
        slot: float(np.max(np.abs(out[slot] - refs[slot]))) if np.all(np.isfinite(out[slot])) else np.inf
        for slot in slots
    }
    worst = max(errs, key=errs.get)
    err = errs[worst]
    return CheckResult(err <= tol, err, tol, f"worst (layer, batch) {worst}: {err:.3g}; separation {sep:.3g}")


def check_layers_differ(kernel: Kernel, variant: Variant, shape: Shape, dtype: str) -> CheckResult:
    """Every layer's data differs; each layer's output must match that layer's own reference.

    Uses NL = max(NL, 3) so "layer 0's output repeated" (or any layer-index mixup) fails.
    """
    shape = normalize_layers_shape(shape)
    shape = {**shape, "NL": max(shape["NL"], 3)}
    inputs = make_layers_inputs(shape, dtype, 17)
    tol = kernel.tolerance[dtype]
    refs = [reference(_layer_inputs(inputs, layer)) for layer in range(shape["NL"])]
    sep = min(float(np.max(np.abs(refs[i] - refs[j]))) for i in range(len(refs)) for j in range(i))
    if sep <= 10 * tol:
        return CheckResult(False, None, tol, f"layers not distinguishable (min separation {sep:.3g})")
    out = to_numpy(run_variant(variant, inputs))
    errs = [float(np.max(np.abs(out[i] - r))) if np.all(np.isfinite(out[i])) else np.inf for i, r in enumerate(refs)]
    worst = int(np.argmax(errs))
    return CheckResult(errs[worst] <= tol, errs[worst], tol, f"NL={shape['NL']}: worst layer {worst} {errs[worst]:.3g}")


# ----------------------------------------------------------------------------- registration


def _single_variant(name: str, num_splits: int | None) -> Variant:
    def fn(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        return decode_attend(
            q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits=bits, num_splits=num_splits
        )

    params = {"num_splits": num_splits} if num_splits is not None else {}
    return Variant(name=name, fn=fn, params=params)


QUANT_DECODE = register(
    Kernel(
        name="quant_decode",
        description="KIVI-style group-quantized (4/8-bit, group 32/64) decode attention with GQA and causal tail",
        default_variant="dequant_sdpa",
        variants={
            "dequant_sdpa": _single_variant("dequant_sdpa", None),
            **{f"fused_split{n}": _single_variant(f"fused_split{n}", n) for n in SPLITS},
        },
        normalize_shape=normalize_shape,
        make_inputs=make_inputs,
        reference=reference,
        tolerance=TOLERANCE,
        dtypes=tuple(_DTYPES),
        flops=flops,
        bytes_moved=bytes_moved,
        checks={"batch_rows": check_batch_rows, "causal_tail": check_causal_tail},
    )
)


def _layers_variant(name: str, batched: bool, single_layer: str) -> Variant:
    num_splits = QUANT_DECODE.variants[single_layer].params.get("num_splits")
    impl = decode_attend_layers if batched else decode_attend_layers_loop

    def fn(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        return impl(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits, num_splits)

    return Variant(name=name, fn=fn, params={"single_layer": single_layer, "batched": batched})


QUANT_DECODE_LAYERS = register(
    Kernel(
        name="quant_decode_layers",
        description="quant_decode over a leading layer axis NL (per-layer loop vs one folded call)",
        default_variant="loop",
        variants={
            "loop": _layers_variant("loop", False, "dequant_sdpa"),
            "batched": _layers_variant("batched", True, "dequant_sdpa"),
            "batched_fused_split4": _layers_variant("batched_fused_split4", True, "fused_split4"),
        },
        normalize_shape=normalize_layers_shape,
        make_inputs=make_layers_inputs,
        reference=reference,
        tolerance=TOLERANCE,
        dtypes=tuple(_DTYPES),
        flops=layers_flops,
        bytes_moved=layers_bytes_moved,
        checks={
            "layer_parity": check_layer_parity,
            "stride_adversarial": check_stride_adversarial,
            "layers_differ": check_layers_differ,
        },
    )
)
