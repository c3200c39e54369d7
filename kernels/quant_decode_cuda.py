"""CUDA source variants of group-quantized decode attention (``mx.fast.cuda_kernel``), one layer or many.

The layout and the maths are ``kernels.quant_decode``'s (KIVI-style K/V codes with one affine pair per group,
GQA, causal tail alignment, flash-decoding KV splits). Two kernels per call:

- ``quant_decode_partial``: one thread block per (KV split, problem row block). A block owns one
  (request, KV head) pair and every query row that reads that KV head: ``ROWS = (H_q / H_kv) * S_q`` rows in
  the order (group member g, query position i), exactly the order of q and out in memory, so the block's q
  rows and output rows are one contiguous slab. It walks its split's keys ``BK`` at a time: dequantises the
  K and V chunk into shared memory in float32 (``code * scale + zero``), scores every (row, key) pair (a
  fixed-order float32 dot product), updates each row's running max and sum (online softmax, a safe max so a
  row with every key of the split masked never computes ``-inf - -inf``), and accumulates the unnormalised
  output in registers. It writes the split's output, max and sum in float32.
- ``quant_decode_combine``: one thread per output element; rescales the splits by ``exp(m_s - M)`` in split
  order and divides, then casts to the activation dtype.

**Bit-identical across layers by construction.** The batched form is not a second kernel: it is the same
compiled kernels launched over a grid whose row-block axis also runs over the layers (``NL * B * H_kv``
blocks instead of ``B * H_kv``). A block's arithmetic depends only on its own slab, its split and the split
count, and the split count is chosen from (B, H_kv, S_kv) -- never from NL -- so every layer's output is the
single-layer kernel's output, bit for bit. No atomics, no cross-block reduction order: the result is also
deterministic from run to run.

Variants: ``cuda_split1`` (one split: every block walks the whole cache) and ``cuda_splitk`` (enough splits
to put about two blocks on each SM of an H200-sized GPU at this B * H_kv); ``quant_decode_layers`` gets
``batched_cuda_splitk`` (one call for every layer) and ``loop_cuda_splitk`` (the single-layer kernel called
per layer), so the loop and the batched call of the same kernel meet in the benchmark grid.

Selected only where ``mx.cuda.is_available()``; elsewhere the suite records them as skipped with the reason.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from kernels.base import Variant
from kernels.cuda_compile import cuda_kernel
from kernels.flash_cuda import STATIC_SMEM_LIMIT, cuda_unavailable

THREADS = 128
KEY_BLOCKS = (32, 16)  # keys per chunk, the largest that fits the static shared memory
TARGET_BLOCKS = 264  # two blocks per SM on a 132-SM H200: the split count aims at this many blocks per layer
MIN_KEYS_PER_SPLIT = 128
MAX_ROWS = 64
DTYPES = ("float32", "float16", "bfloat16")

HEADER = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define QDEC_NEG_INF (-__int_as_float(0x7f800000))
"""

# Template: T (activation dtype), D, BITS, GROUP, S_Q, ROWS (= H_q / H_kv * S_q), BK.
# dims = [S_kv]; grid x = splits * THREADS, y = problem row blocks (layers * B * H_kv).
PARTIAL_SOURCE = """
    constexpr int NT = 128;
    constexpr int CB = D * BITS / 8;          // code bytes per key row
    constexpr int NG = D / GROUP;             // affine pairs per key row
    constexpr int KP = D + 1;                 // padded K row: the score loop reads K rows across lanes
    constexpr int SP = BK + 1;
    constexpr int PER = (ROWS * D + NT - 1) / NT;
    __shared__ float q_s[ROWS * D];
    __shared__ float k_s[BK * KP];
    __shared__ float v_s[BK * D];
    __shared__ float s_s[ROWS * SP];
    __shared__ float m_s[ROWS];
    __shared__ float l_s[ROWS];
    __shared__ float c_s[ROWS];

    const int S_kv = dims[0];
    const int n_splits = gridDim.x;
    const int split = blockIdx.x;
    const size_t slab = blockIdx.y;           // (layer, request, KV head), flattened
    const int tid = threadIdx.x;
    const int s0 = (int)(((long long)split * S_kv) / n_splits);
    const int s1 = (int)(((long long)(split + 1) * S_kv) / n_splits);
    const int tail = S_kv - S_Q;              // query i sees keys <= i + tail

    const T* qg = q + slab * ROWS * D;
    const uint8_t* kcg = k_codes + slab * (size_t)S_kv * CB;
    const uint8_t* vcg = v_codes + slab * (size_t)S_kv * CB;
    const T* ksg = k_scale + slab * (size_t)S_kv * NG;
    const T* kzg = k_zero + slab * (size_t)S_kv * NG;
    const T* vsg = v_scale + slab * (size_t)S_kv * NG;
    const T* vzg = v_zero + slab * (size_t)S_kv * NG;

    const float sc = scale[0];
    for (int e = tid; e < ROWS * D; e += NT) q_s[e] = static_cast<float>(qg[e]) * sc;
    for (int r = tid; r < ROWS; r += NT) { m_s[r] = QDEC_NEG_INF; l_s[r] = 0.0f; }
    float o[PER];
    for (int t = 0; t < PER; ++t) o[t] = 0.0f;
    __syncthreads();

    for (int k0 = s0; k0 < s1; k0 += BK) {
        // Dequantise the chunk's K and V rows (keys past the split are zeros and masked below).
        for (int e = tid; e < BK * D; e += NT) {
            const int j = e / D, d = e % D, key = k0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (key < s1) {
                const size_t row = (size_t)key;
                unsigned kc, vc;
                if (BITS == 4) {
                    const int shift = 4 * (d & 1);
                    kc = (kcg[row * CB + d / 2] >> shift) & 15u;
                    vc = (vcg[row * CB + d / 2] >> shift) & 15u;
                } else {
                    kc = kcg[row * CB + d];
                    vc = vcg[row * CB + d];
                }
                const size_t p = row * NG + d / GROUP;
                kv = __fadd_rn(__fmul_rn((float)kc, static_cast<float>(ksg[p])), static_cast<float>(kzg[p]));
                vv = __fadd_rn(__fmul_rn((float)vc, static_cast<float>(vsg[p])), static_cast<float>(vzg[p]));
            }
            k_s[j * KP + d] = kv;
            v_s[j * D + d] = vv;
        }
        __syncthreads();
        // Scores of every (row, key) pair; masked: past the split, or in the row's causal future.
        for (int e = tid; e < ROWS * BK; e += NT) {
            const int r = e / BK, j = e % BK, key = k0 + j;
            const bool visible = key < s1 && key <= (r % S_Q) + tail;
            float acc = 0.0f;
            for (int d = 0; d < D; ++d) acc = fmaf(q_s[r * D + d], k_s[j * KP + d], acc);
            s_s[r * SP + j] = visible ? acc : QDEC_NEG_INF;
        }
        __syncthreads();
        // Online softmax, one thread per row.
        for (int r = tid; r < ROWS; r += NT) {
            float m_chunk = QDEC_NEG_INF;
            for (int j = 0; j < BK; ++j) m_chunk = fmaxf(m_chunk, s_s[r * SP + j]);
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, m_chunk);
            const float m_safe = m_new == QDEC_NEG_INF ? 0.0f : m_new;
            float sum = 0.0f;
            for (int j = 0; j < BK; ++j) {
                const float p = expf(s_s[r * SP + j] - m_safe);
                s_s[r * SP + j] = p;
                sum += p;
            }
            const float corr = expf(m_old - m_safe);
            l_s[r] = l_s[r] * corr + sum;
            m_s[r] = m_new;
            c_s[r] = corr;
        }
        __syncthreads();
        // O = corr * O + P V
        for (int t = 0; t < PER; ++t) {
            const int e = tid + t * NT;
            if (e < ROWS * D) {
                const int r = e / D, d = e % D;
                float acc = o[t] * c_s[r];
                for (int j = 0; j < BK; ++j) acc = fmaf(s_s[r * SP + j], v_s[j * D + d], acc);
                o[t] = acc;
            }
        }
        __syncthreads();
    }

    float* og = o_part + (slab * n_splits + split) * ROWS * D;
    for (int t = 0; t < PER; ++t) {
        const int e = tid + t * NT;
        if (e < ROWS * D) og[e] = o[t];
    }
    float* mg = ml_part + (slab * n_splits + split) * ROWS * 2;
    for (int r = tid; r < ROWS; r += NT) { mg[2 * r] = m_s[r]; mg[2 * r + 1] = l_s[r]; }
"""

# Template: T, D, ROWS. dims = [splits, elements]; one thread per output element (slab, row, d).
COMBINE_SOURCE = """
    const int n_splits = dims[0];
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)dims[1]) return;
    const long long slab = e / (ROWS * D);
    const int r = (int)((e / D) % ROWS);
    const int d = (int)(e % D);
    const float* ml = ml_part + slab * n_splits * ROWS * 2;
    const float* op = o_part + slab * n_splits * ROWS * D;
    float M = QDEC_NEG_INF;
    for (int s = 0; s < n_splits; ++s) M = fmaxf(M, ml[(s * ROWS + r) * 2]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
        const float w = expf(ml[(s * ROWS + r) * 2] - M);    // 0 for a split with every key masked
        num = fmaf(w, op[((size_t)s * ROWS + r) * D + d], num);
        den = fmaf(w, ml[(s * ROWS + r) * 2 + 1], den);
    }
    out[e] = T(num / den);
"""


def key_block(rows: int, D: int) -> int | None:
    """Keys per chunk: the largest of KEY_BLOCKS whose shared memory fits; None when none does."""
    for bk in KEY_BLOCKS:
        if smem_bytes(rows, D, bk) <= STATIC_SMEM_LIMIT:
            return bk
    return None


def smem_bytes(rows: int, D: int, BK: int) -> int:
    """Static shared memory of one partial block (float32 q rows, padded K chunk, V chunk, scores, row stats)."""
    return 4 * (rows * D + BK * (D + 1) + BK * D + rows * (BK + 1) + 3 * rows)


def num_splits(B: int, H_kv: int, S_kv: int, mode: str) -> int:
    """KV splits per (request, KV head): never a function of the layer count, so layers stay bit-identical."""
    if mode == "split1":
        return 1
    wanted = math.ceil(TARGET_BLOCKS / (B * H_kv))
    return max(1, min(wanted, S_kv // MIN_KEYS_PER_SPLIT))


def check_launch(who: str, q_shape: tuple[int, ...], kv_shape: tuple[int, ...], bits: int, group: int) -> int:
    """Refuse, before any launch, what the kernel does not handle; returns the keys per chunk."""
    *_, H_q, S_q, D = q_shape
    H_kv, S_kv = kv_shape[-3], kv_shape[-2]
    if D % group or D % 2:
        raise ValueError(f"{who}: head dim {D} is not a multiple of group {group}")
    if H_q % H_kv:
        raise ValueError(f"{who}: H_q={H_q} is not a multiple of H_kv={H_kv}")
    if S_q > S_kv:
        raise ValueError(f"{who}: S_q={S_q} > S_kv={S_kv}")
    rows = H_q // H_kv * S_q
    if rows > MAX_ROWS:
        raise ValueError(f"{who}: {rows} query rows per KV head (H_q/H_kv * S_q) exceed {MAX_ROWS}")
    bk = key_block(rows, D)
    if bk is None:
        need = smem_bytes(rows, D, KEY_BLOCKS[-1])
        raise ValueError(f"{who}: {rows} rows x D={D} need {need} B of shared memory (static limit "
                         f"{STATIC_SMEM_LIMIT})")
    return bk


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the two launches need besides the arrays: template arguments, grids and output shapes."""

    rows: int
    splits: int
    slabs: int
    D: int
    S_kv: int
    partial_template: tuple[tuple[str, int], ...]  # the dtype ("T") is added at launch
    combine_template: tuple[tuple[str, int], ...]
    partial_grid: tuple[int, int, int]
    combine_grid: tuple[int, int, int]

    @property
    def elements(self) -> int:
        return self.slabs * self.rows * self.D

    @property
    def partial_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.slabs, self.splits, self.rows, self.D), (self.slabs, self.splits, self.rows, 2)


COMBINE_THREADS = 256


def plan_launch(q_shape: tuple[int, ...], kv_shape: tuple[int, ...], bits: int, group: int, mode: str,
                splits: int | None = None) -> LaunchPlan:
    """The launch of q ``[..., H_q, S_q, D]`` over caches ``[..., H_kv, S_kv, ...]`` (every leading index one
    problem); ``splits`` overrides the mode's split count (tests)."""
    bk = check_launch("decode_attend_cuda", q_shape, kv_shape, bits, group)
    H_q, S_q, D = q_shape[-3:]
    H_kv, S_kv = kv_shape[-3], kv_shape[-2]
    rows = H_q // H_kv * S_q
    batch = q_shape[-4] if len(q_shape) >= 4 else 1
    n_splits = splits if splits is not None else num_splits(batch, H_kv, S_kv, mode)
    slabs = math.prod(q_shape[:-3]) * H_kv
    elements = slabs * rows * D
    return LaunchPlan(
        rows=rows, splits=n_splits, slabs=slabs, D=D, S_kv=S_kv,
        partial_template=(("D", D), ("BITS", bits), ("GROUP", group), ("S_Q", S_q), ("ROWS", rows), ("BK", bk)),
        combine_template=(("D", D), ("ROWS", rows)),
        partial_grid=(n_splits * THREADS, slabs, 1),
        combine_grid=(-(-elements // COMBINE_THREADS) * COMBINE_THREADS, 1, 1))


PARTIAL_INPUTS = ("q", "k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "dims", "scale")


@functools.cache
def _kernels():

    partial = cuda_kernel(
        name="quant_decode_partial", input_names=list(PARTIAL_INPUTS), output_names=["o_part", "ml_part"],
        source=PARTIAL_SOURCE, header=HEADER, ensure_row_contiguous=True)
    combine = cuda_kernel(
        name="quant_decode_combine", input_names=["o_part", "ml_part", "dims"], output_names=["out"],
        source=COMBINE_SOURCE, header=HEADER, ensure_row_contiguous=True)
    return partial, combine


def decode_attend_cuda(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size: int, scale: float,
                       bits: int, mode: str):
    """Decode attention over any number of leading axes (``[..., H_q, S_q, D]``; the caches ``[..., H_kv, S_kv,
    ...]``): every leading index is one independent problem, all launched in one grid."""
    import mlx.core as mx

    plan = plan_launch(q.shape, k_codes.shape, bits, group_size, mode)
    partial, combine = _kernels()
    o_part, ml_part = partial(
        inputs=[q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, mx.array([plan.S_kv], dtype=mx.int32),
                mx.array([scale], dtype=mx.float32)],
        template=[("T", q.dtype), *plan.partial_template], grid=plan.partial_grid, threadgroup=(THREADS, 1, 1),
        output_shapes=list(plan.partial_shapes), output_dtypes=[mx.float32, mx.float32])
    (out,) = combine(
        inputs=[o_part, ml_part, mx.array([plan.splits, plan.elements], dtype=mx.int32)],
        template=[("T", q.dtype), *plan.combine_template], grid=plan.combine_grid,
        threadgroup=(COMBINE_THREADS, 1, 1), output_shapes=[q.shape], output_dtypes=[q.dtype])
    return out


def _fn(mode: str):
    def fn(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        return decode_attend_cuda(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits,
                                  mode)

    return fn


def _loop_fn(mode: str):
    single = _fn(mode)

    def fn(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, group_size, scale, bits):
        import mlx.core as mx

        arrays = (q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero)
        return mx.stack([single(*(a[layer] for a in arrays), group_size, scale, bits) for layer in range(q.shape[0])])

    return fn


MODES = ("split1", "splitk")


def single_layer_variants() -> list[Variant]:
    return [Variant(name=f"cuda_{mode}", fn=_fn(mode), params={"splits": mode}, backend="cuda",
                    requires=cuda_unavailable, dtypes=DTYPES) for mode in MODES]


def layers_variants() -> list[Variant]:
    """The batched call and the per-layer loop of the ``cuda_splitk`` kernel."""
    mode = "splitk"
    common = dict(backend="cuda", requires=cuda_unavailable, dtypes=DTYPES)
    return [
        Variant(name=f"batched_cuda_{mode}", fn=_fn(mode),
                params={"single_layer": f"cuda_{mode}", "batched": True}, **common),
        Variant(name=f"loop_cuda_{mode}", fn=_loop_fn(mode),
                params={"single_layer": f"cuda_{mode}", "batched": False}, **common),
    ]


def register_variants() -> None:
    """Add the variants to quant_decode and quant_decode_layers (once)."""
    from kernels.base import REGISTRY

    for kernel_name, variants in (("quant_decode", single_layer_variants()), ("quant_decode_layers",
                                                                               layers_variants())):
        kernel = REGISTRY[kernel_name]
        for variant in variants:
            if variant.name not in kernel.variants:
                kernel.add_variant(variant)


register_variants()
