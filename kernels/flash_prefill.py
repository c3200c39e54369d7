"""Causal flash prefill attention: the MLX SDPA baseline, tiled online-softmax variants, their reference and checks."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kernels.base import (
    CheckResult,
    Inputs,
    Kernel,
    Shape,
    Variant,
    max_abs_error,
    mlx_core,
    mx_dtype,
    register,
    run_variant,
    to_numpy,
)

SHAPE_KEYS = ("B", "H", "S_q", "S_kv", "D")
DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}

# Tiling grid of the flash variants: BQ query rows per block x BK keys per KV chunk.
BQ_CHOICES = (8, 16, 32)
BK_CHOICES = (16, 32, 64)

# Max abs error against the float64 reference. Inputs are ~N(0, 1) and each output row is a
# convex combination of v rows, so |out| < ~4. Worst errors measured on MLX 0.32.4 (CPU) over
# S_q/S_kv from 1/1 to 200/512, D in {8..128}, B*H up to 8, 3 seeds, every variant:
#   float32:  sdpa 1.2e-6, flash 1.3e-6  -> 2e-5 (15x margin; any mask or tiling bug is O(0.1..1))
#   float16:  sdpa 2.3e-3, flash 9.6e-4  -> 5e-3 (flash computes in float32, so its error is the
#             final rounding: half an ulp is 9.8e-4 for |out| in [1, 2), 2e-3 in [2, 4); sdpa
#             also rounds q*scale and the scores to float16)
#   bfloat16: sdpa 1.3e-2, flash 7.8e-3  -> 3e-2 (half an ulp is 7.8e-3 in [1, 2), 1.6e-2 in [2, 4))
TOLERANCE = {"float32": 2e-5, "float16": 5e-3, "bfloat16": 3e-2}

# masked_no_nan multiplies q by LARGE_Q: the logits grow by that factor and so does the rounding
# error of every score computed in a low precision, hence the bound tolerance[dtype] * LARGE_Q.
# Measured there (S=64 and 13/37, 3 seeds): float32 4.2e-5 (sdpa and flash alike: float32
# conditioning of logits ~100) vs 2e-3; float16 sdpa 0.14, flash 9.7e-4 vs 0.5; bfloat16 sdpa
# 0.93, flash 7.7e-3 vs 3.0 (for bfloat16 the bound mostly checks finiteness; a masking bug
# there is caught by the reference and causal_perturb checks).
LARGE_Q = 100.0


# --------------------------------------------------------------------------- shapes


def normalize_shape(shape: Mapping[str, int]) -> Shape:
    """Validate a shape; "S" is shorthand for S_q = S_kv = S. Returns exactly B, H, S_q, S_kv, D."""
    raw = dict(shape)
    for key in raw:
        if key not in SHAPE_KEYS and key != "S":
            raise ValueError(f"flash_prefill: unknown shape key {key!r}; expected {SHAPE_KEYS} (or 'S')")
    if "S" in raw:
        s = raw.pop("S")
        for key in ("S_q", "S_kv"):
            if key in raw and raw[key] != s:
                raise ValueError(f"flash_prefill: shape key 'S'={s!r} conflicts with {key}={raw[key]!r}")
            raw[key] = s
    out: Shape = {}
    for key in SHAPE_KEYS:
        if key not in raw:
            raise ValueError(f"flash_prefill: missing shape key {key!r}")
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"flash_prefill: shape key {key!r} must be an int, got {value!r}")
        if value <= 0:
            raise ValueError(f"flash_prefill: shape key {key!r} must be positive, got {value!r}")
        out[key] = int(value)
    if out["S_q"] > out["S_kv"]:
        raise ValueError(f"flash_prefill: shape key 'S_q'={out['S_q']} must be <= S_kv={out['S_kv']}")
    return out


def causal_pairs(S_q: int, S_kv: int) -> int:
    """Number of (query i, key j) pairs with j <= i + (S_kv - S_q): the unmasked work."""
    q_align = S_kv - S_q
    # row i sees i + q_align + 1 keys, never more than S_kv since i <= S_q - 1
    return S_q * (q_align + 1) + S_q * (S_q - 1) // 2


def flops(shape: Mapping[str, int]) -> float:
    s = normalize_shape(shape)
    return float(4 * s["B"] * s["H"] * s["D"] * causal_pairs(s["S_q"], s["S_kv"]))


def bytes_moved(shape: Mapping[str, int], dtype: str) -> float:
    s = normalize_shape(shape)
    elems = s["B"] * s["H"] * s["D"] * (2 * s["S_q"] + 2 * s["S_kv"])  # read q, k, v; write out
    return float(elems * ITEMSIZE[dtype])


# --------------------------------------------------------------------------- inputs and reference


def make_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    mx = mlx_core()
    s = normalize_shape(shape)
    B, H, S_q, S_kv, D = (s[k] for k in SHAPE_KEYS)
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    dt = mx_dtype(dtype)
    q = mx.random.normal((B, H, S_q, D), key=kq).astype(dt)
    k = mx.random.normal((B, H, S_kv, D), key=kk).astype(dt)
    v = mx.random.normal((B, H, S_kv, D), key=kv).astype(dt)
    mx.eval(q, k, v)
    return {"q": q, "k": k, "v": v, "scale": 1.0 / math.sqrt(D)}


def causal_mask_np(S_q: int, S_kv: int) -> np.ndarray:
    """(S_q, S_kv) bool: query i may attend key j iff j <= i + (S_kv - S_q) (tail alignment)."""
    q_align = S_kv - S_q
    return np.arange(S_kv)[None, :] <= np.arange(S_q)[:, None] + q_align


def reference(inputs: Inputs) -> np.ndarray:
    q, k, v = (to_numpy(inputs[name]) for name in ("q", "k", "v"))
    scores = np.einsum("bhid,bhjd->bhij", q, k) * float(inputs["scale"])
    scores = np.where(causal_mask_np(q.shape[2], k.shape[2]), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)  # row i always sees key 0, so the max is finite
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v)


# --------------------------------------------------------------------------- baseline


def sdpa(q, k, v, scale):
    """MLX's attention (fused kernel on GPU; on CPU MLX 0.32 lowers it to matmul + softmax ops).
    mask="causal" is lower-right (tail) aligned, i.e. q_align = S_kv - S_q, which is what we want:
    checked against the reference for S_q < S_kv (a head-aligned reading would be off by ~0.9)."""
    mx = mlx_core()
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


# --------------------------------------------------------------------------- flash schedule


@dataclass(frozen=True)
class ChunkStep:
    """One KV chunk of the schedule: keys [k0, k1) (k1 may pass S_kv: padding), the first
    computed query row r0 (a multiple of BQ: the blocks before it cannot see any key of the
    chunk and are skipped), and whether the causal/padding mask has to be applied."""

    chunk: int
    k0: int
    k1: int
    r0: int
    needs_mask: bool


# Fault injection, only for the tests to build deliberately broken variants (never used by a
# registered variant):
FAULTS = frozenset(
    {
        "no_causal_mask",  # attend to every key (no causal mask, hence no block skip either)
        "head_aligned",  # q_align = 0 instead of S_kv - S_q (wrong for KV-cache continuation)
        "drop_partial_kv",  # forget the partial final KV chunk when S_kv % BK != 0
        "skip_diagonal_block",  # block skip too eager: skips a block whose first row cannot see the chunk
        "no_running_max",  # exp(scores) without subtracting a running max (overflows for large logits)
    }
)


def _check_faults(faults: frozenset[str]) -> None:
    unknown = set(faults) - FAULTS
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; expected a subset of {sorted(FAULTS)}")


def flash_schedule(
    S_q: int, S_kv: int, BQ: int, BK: int, faults: frozenset[str] = frozenset()
) -> tuple[ChunkStep, ...]:
    """The tiles the flash implementation computes: for each KV chunk, the query blocks
    [r0 // BQ, ceil(S_q / BQ)) (causal block skip: a block that sees no key of the chunk is
    skipped; blocks only ever become invisible from the front since visibility is monotone)."""
    _check_faults(faults)
    causal = "no_causal_mask" not in faults
    q_align = 0 if "head_aligned" in faults else S_kv - S_q
    n_chunks = -(-S_kv // BK)
    if "drop_partial_kv" in faults and S_kv >= BK:
        n_chunks = S_kv // BK
    n_rows = -(-S_q // BQ) * BQ
    steps = []
    for c in range(n_chunks):
        k0, k1 = c * BK, (c + 1) * BK
        if causal:
            # block b sees the chunk iff its last row b*BQ + BQ - 1 has row + q_align >= k0
            first_block = max(0, (k0 - q_align) // BQ)
            if "skip_diagonal_block" in faults:
                first_block = max(0, -(-(k0 - q_align) // BQ))  # uses the block's first row instead
            r0 = min(first_block * BQ, n_rows)
            # the mask is needed iff the first computed row cannot see the chunk's last key, or
            # the chunk holds padding keys
            needs_mask = r0 + q_align < k1 - 1 or k1 > S_kv
        else:
            r0 = 0
            needs_mask = k1 > S_kv
        steps.append(ChunkStep(c, k0, k1, r0, needs_mask))
    return tuple(steps)


def schedule_stats(S_q: int, S_kv: int, BQ: int, BK: int) -> dict[str, int]:
    """What a flash variant computes: KV-loop iterations (each one matmul QK^T and one PV),
    (query block, KV chunk) tiles, score elements (padding rows/keys included) and masked steps."""
    steps = flash_schedule(S_q, S_kv, BQ, BK)
    n_rows = -(-S_q // BQ) * BQ
    return {
        "kv_steps": len(steps),
        "tiles": sum((n_rows - st.r0) // BQ for st in steps),
        "score_elements": sum((n_rows - st.r0) * BK for st in steps),
        "masked_steps": sum(st.needs_mask for st in steps),
    }


@functools.lru_cache(maxsize=4096)
def _tile_mask(b0: int, n_blocks: int, BQ: int, k0: int, k1: int, S_kv: int, q_align: int, causal: bool):
    """Bool mask (n_blocks - b0, BQ, k1 - k0): may query row r of blocks [b0, n_blocks) attend key j
    in [k0, k1)? (causal with tail alignment, and j < S_kv: padding keys never)."""
    mx = mlx_core()
    rows = np.arange(b0 * BQ, n_blocks * BQ)[:, None]
    keys = np.arange(k0, k1)[None, :]
    allowed = np.broadcast_to(keys < S_kv, (rows.shape[0], k1 - k0))
    if causal:
        allowed = allowed & (keys <= rows + q_align)
    return mx.array(allowed.reshape(n_blocks - b0, BQ, k1 - k0))


def _flash_attention_impl(q, k, v, scale: float, BQ: int, BK: int, faults: frozenset[str] = frozenset()):
    mx = mlx_core()
    B, H, S_q, D = q.shape
    S_kv = k.shape[2]
    if S_q > S_kv:
        raise ValueError(f"flash_attention: S_q={S_q} > S_kv={S_kv}")
    steps = flash_schedule(S_q, S_kv, BQ, BK, faults)
    causal = "no_causal_mask" not in faults
    q_align = 0 if "head_aligned" in faults else S_kv - S_q
    n_blocks = -(-S_q // BQ)
    n_rows = n_blocks * BQ
    n_keys = -(-S_kv // BK) * BK
    f32 = mx.float32
    # Compute in float32, the scale folded into q: a cast per input is O(S*D) against the
    # O(S^2*D) tile work, and the accuracy is then set by the final rounding to the input dtype.
    qp = mx.pad(q.astype(f32) * scale, [(0, 0), (0, 0), (0, n_rows - S_q), (0, 0)])
    kp = mx.pad(k.astype(f32), [(0, 0), (0, 0), (0, n_keys - S_kv), (0, 0)])
    vp = mx.pad(v.astype(f32), [(0, 0), (0, 0), (0, n_keys - S_kv), (0, 0)])
    # (B, H, blocks, BQ, D): each matmul below is a batch of (BQ x D) @ (D x BK) tiles, one per
    # active query block, the chunk's k / v broadcast over the block axis.
    qb = qp.reshape(B, H, n_blocks, BQ, D)

    # Running state of the still-active blocks [base, n_blocks): max m, sum l_sum, accumulator acc.
    base = 0
    m = l_sum = acc = None
    done = []  # outputs of the finished blocks, in order
    for step in steps:
        b0 = step.r0 // BQ
        if b0 > base:  # blocks before b0 see neither this chunk nor any later one: finish them
            cut = b0 - base
            done.append(acc[:, :, :cut] / l_sum[:, :, :cut])
            m, l_sum, acc = m[:, :, cut:], l_sum[:, :, cut:], acc[:, :, cut:]
            base = b0
        kc = kp[:, :, None, step.k0 : step.k1]  # (B, H, 1, BK, D)
        vc = vp[:, :, None, step.k0 : step.k1]
        s = qb[:, :, base:] @ kc.swapaxes(-1, -2)  # (B, H, active blocks, BQ, BK)
        if step.needs_mask:
            s = mx.where(_tile_mask(base, n_blocks, BQ, step.k0, step.k1, S_kv, q_align, causal), s, -mx.inf)
        if "no_running_max" in faults:
            p = mx.exp(s)
            l_sum = mx.sum(p, axis=-1, keepdims=True) + (0 if l_sum is None else l_sum)
            acc = p @ vc + (0 if acc is None else acc)
            m = l_sum  # unused on this path, kept non-None so the block-finishing slices stay uniform
            continue
        m_cur = mx.max(s, axis=-1, keepdims=True)
        m_new = m_cur if m is None else mx.maximum(m, m_cur)
        # Safe max: a row whose keys so far are all masked has m_new = -inf and exp(-inf - -inf)
        # would be NaN; shifting by 0 there gives exp(-inf) = 0. (In this schedule chunk 0 is
        # computed for every row and always holds key 0, which every row sees, so m is finite
        # from then on; the guard keeps the update safe for any schedule.)
        m_safe = mx.where(m_new == -mx.inf, 0.0, m_new)
        p = mx.exp(s - m_safe)
        if m is None:
            l_sum = mx.sum(p, axis=-1, keepdims=True)
            acc = p @ vc
        else:
            alpha = mx.exp(m - m_safe)
            l_sum = alpha * l_sum + mx.sum(p, axis=-1, keepdims=True)
            acc = alpha * acc + p @ vc
        m = m_new
    done.append(acc / l_sum)
    out = done[0] if len(done) == 1 else mx.concatenate(done, axis=2)
    return out.reshape(B, H, n_rows, D)[:, :, :S_q].astype(q.dtype)


def flash_attention(q, k, v, scale: float, BQ: int, BK: int):
    """Causal (tail-aligned) attention with online softmax over BK-key chunks, BQ-row query
    blocks, and causal block skip: a (query block, KV chunk) tile that is entirely masked is
    never computed. q: (B, H, S_q, D); k, v: (B, H, S_kv, D) with S_q <= S_kv."""
    return _flash_attention_impl(q, k, v, scale, BQ, BK)


def make_flash_variant(BQ: int, BK: int) -> Variant:
    def fn(q, k, v, scale):
        return flash_attention(q, k, v, scale, BQ, BK)

    return Variant(name=f"flash_bq{BQ}_bk{BK}", fn=fn, params={"BQ": BQ, "BK": BK})


# --------------------------------------------------------------------------- checks


def _perturb_positions(S_q: int, S_kv: int) -> list[int]:
    """Key positions to perturb: the last key (only the last row sees it) and the diagonal
    key of the middle query row (only the second half of the rows see it)."""
    q_align = S_kv - S_q
    return sorted({S_kv - 1, q_align + S_q // 2})


def check_causal_perturb(kernel: Kernel, variant: Variant, shape: Mapping[str, int], dtype: str) -> CheckResult:
    """Perturbing k and v at key j changes no row that cannot see j (bit-identical output) and
    changes every row that can (else the perturbation would prove nothing)."""
    mx = mlx_core()
    s = kernel.normalize_shape(shape)
    q_align = s["S_kv"] - s["S_q"]
    inputs = kernel.make_inputs(s, dtype, 0)
    base = to_numpy(run_variant(variant, inputs))
    problems = []
    worst_leak = 0.0
    for j in _perturb_positions(s["S_q"], s["S_kv"]):
        at_j = (mx.arange(s["S_kv"]) == j)[:, None]
        k2 = mx.where(at_j, inputs["k"] + 1.0, inputs["k"])
        v2 = mx.where(at_j, inputs["v"] + 1000.0, inputs["v"])
        out = to_numpy(run_variant(variant, dict(inputs, k=k2, v=v2)))
        blind = np.arange(s["S_q"]) + q_align < j  # rows that cannot see key j
        if not np.all(np.isfinite(out)):
            problems.append(f"key {j}: non-finite output")
            continue
        diff = np.abs(out - base).max(axis=(0, 1, 3))  # per query row
        if blind.any():
            leak = float(diff[blind].max())
            worst_leak = max(worst_leak, leak)
            if leak != 0.0:
                rows = np.nonzero(blind & (diff != 0.0))[0]
                problems.append(f"key {j}: rows {rows[:8].tolist()} cannot see it but changed by up to {leak:.3g}")
        unchanged = np.nonzero(~blind & (diff == 0.0))[0]
        if unchanged.size:
            problems.append(f"key {j}: rows {unchanged[:8].tolist()} can see it but did not change")
    detail = "; ".join(problems) or f"keys {_perturb_positions(s['S_q'], s['S_kv'])}: masked rows bit-identical"
    return CheckResult(not problems, worst_leak, 0.0, detail)


def _masked_shapes(shape: Shape) -> list[Shape]:
    """The given shape and a square S=64 one: with BQ, BK <= 32 some (query block, KV chunk)
    pairs there are fully masked and some rows are fully masked within a computed chunk."""
    square = dict(shape, S_q=64, S_kv=64)
    return [shape] if square == shape else [shape, square]


def check_masked_no_nan(kernel: Kernel, variant: Variant, shape: Mapping[str, int], dtype: str) -> CheckResult:
    """Large logits (q * 100) with fully masked tiles: output finite and within a relative bound
    (the dtype tolerance scaled by the logit growth) of the reference."""
    mx = mlx_core()
    s = kernel.normalize_shape(shape)
    tol = kernel.tolerance[dtype] * LARGE_Q
    worst = 0.0
    details = []
    for sh in _masked_shapes(s):
        inputs = kernel.make_inputs(sh, dtype, 1)
        inputs["q"] = inputs["q"] * mx.array(LARGE_Q, dtype=inputs["q"].dtype)
        out = run_variant(variant, inputs)
        err = max_abs_error(out, kernel.reference(inputs))  # inf if any NaN/inf
        worst = max(worst, err)
        details.append(f"S_q={sh['S_q']} S_kv={sh['S_kv']}: err {err:.3g}")
    passed = worst <= tol
    return CheckResult(passed, worst, tol, f"{'; '.join(details)} vs bound {tol:.3g}")


# --------------------------------------------------------------------------- registration


def _variants() -> dict[str, Variant]:
    variants = {"sdpa": Variant(name="sdpa", fn=sdpa, params={})}
    for bq in BQ_CHOICES:
        for bk in BK_CHOICES:
            v = make_flash_variant(bq, bk)
            variants[v.name] = v
    return variants


KERNEL = register(
    Kernel(
        name="flash_prefill",
        description="causal (tail-aligned) prefill attention softmax(q k^T * scale) v",
        default_variant="sdpa",
        variants=_variants(),
        normalize_shape=normalize_shape,
        make_inputs=make_inputs,
        reference=reference,
        tolerance=TOLERANCE,
        flops=flops,
        bytes_moved=bytes_moved,
        checks={"causal_perturb": check_causal_perturb, "masked_no_nan": check_masked_no_nan},
        dtypes=DTYPES,
    )
)

__all__ = ["KERNEL", "flash_attention", "flash_schedule", "normalize_shape", "reference", "schedule_stats"]
