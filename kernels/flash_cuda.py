"""CUDA variants of causal flash prefill attention (``mx.fast.cuda_kernel``, tensor cores via WMMA).

Each variant is the same kernel source compiled with different compile-time tile sizes:
BQ query rows per thread block (one warp per 16 rows) and BK keys per KV chunk. A block
loads its Q tile once into registers (WMMA fragments), then walks the KV chunks it can
see (causal block-skip: chunks wholly in the future of the block's last row are never
loaded), computing S = Q K^T on tensor cores, an online softmax in fp32 (exp2 with the
scale folded in, a safe max so a fully masked row never makes exp(-inf - -inf)), and
O += P V on tensor cores. Query blocks run heaviest-first to balance the causal triangle.

The accumulator rescaling reads WMMA accumulator fragments element-wise with the
m16n16k16 fp32 layout of sm_80+ (element i of lane l is row l/4 + 8*((i/2)%2), column
2*(l%4) + i%2 + 8*(i/4)); the correctness jobs are what prove that on a given chip.

Only fp16 and bf16 (the tensor-core input types); other dtypes are skipped with the reason.
Selected only where ``mx.cuda.is_available()``; elsewhere the suite records them as skipped.
"""

from __future__ import annotations

import functools

from kernels.base import Variant
from kernels.cuda_compile import cuda_kernel

BQ_CHOICES = (16, 32, 64, 128)
BK_CHOICES = (32, 64)
HEAD_DIMS = (32, 64, 128)
STATIC_SMEM_LIMIT = 48 * 1024

HEADER = """
#define FLASH_NEG_INF (-__int_as_float(0x7f800000))
#include <mma.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
"""

# Both CUDA kernel families: sizes, this block's query rows (heaviest causal blocks first), this thread, and
# the (batch, head) slices of q, k, v and out. Grid: x = query blocks, y = batch * heads.
PROLOGUE = """
    const int S_q = dims[0];
    const int S_kv = dims[1];
    const int q_align = S_kv - S_q;
    const float scale_log2 = scale[0] * 1.4426950408889634f;
    const int n_qblocks = (S_q + BQ - 1) / BQ;
    const int qb = n_qblocks - 1 - (int)blockIdx.x;    // heaviest (last) query blocks first
    const int bh = blockIdx.y;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int q0 = qb * BQ;

    const T* qg = q + (size_t)bh * S_q * D;
    const T* kg = k + (size_t)bh * S_kv * D;
    const T* vg = v + (size_t)bh * S_kv * D;
    T* og = out + (size_t)bh * S_q * D;
"""

SOURCE = """
    using namespace nvcuda;
    constexpr int NW = BQ / 16;          // warps per block, 16 query rows each
    constexpr int NT = NW * 32;
    constexpr int DP = D + 8;            // padded smem row (halves): fewer bank conflicts, 16-byte aligned rows
    constexpr int BKP = BK + 4;          // padded score row (floats)
    constexpr int LDP = 2 * BKP;         // P (in T) is written over its own score row
    constexpr int DT = D / 16;
    constexpr int KT = BK / 16;
    constexpr int KV_BYTES = BK * DP * 2;
    constexpr int S_BYTES = BQ * BKP * 4;
    constexpr int Q_BYTES = BQ * DP * 2;
    constexpr int MAIN_BYTES = KV_BYTES + S_BYTES;
    constexpr int SMEM_BYTES = MAIN_BYTES > Q_BYTES ? MAIN_BYTES : Q_BYTES;
    __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
    __shared__ float row_scale[BQ];
    __shared__ float row_l[BQ];

    T* kv_s = reinterpret_cast<T*>(smem);
    float* s_s = reinterpret_cast<float*>(smem + KV_BYTES);

""" + PROLOGUE + """
    // Stage the Q tile (rows past S_q are zeros), then keep it in registers.
    T* q_s = reinterpret_cast<T*>(smem);
    for (int i = tid; i < BQ * (D / 8); i += NT) {
        int r = i / (D / 8), c = (i % (D / 8)) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (q0 + r < S_q) val = *reinterpret_cast<const uint4*>(qg + (size_t)(q0 + r) * D + c);
        *reinterpret_cast<uint4*>(q_s + r * DP + c) = val;
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> q_frag[DT];
    for (int d = 0; d < DT; ++d) wmma::load_matrix_sync(q_frag[d], q_s + warp * 16 * DP + d * 16, DP);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag[DT];
    for (int d = 0; d < DT; ++d) wmma::fill_fragment(o_frag[d], 0.0f);
    __syncthreads();

    // Causal block-skip: only chunks holding a key the block's last row may see.
    const int last_row = min(q0 + BQ, S_q) - 1;
    const int kv_end = min(S_kv, last_row + q_align + 1);
    const int n_chunks = (kv_end + BK - 1) / BK;

    // Each row is owned by two lanes of its warp (halves of the chunk's columns).
    const int my_row = warp * 16 + lane / 2;
    const int my_row_global = q0 + my_row;
    const int half = lane % 2;
    float m_run = FLASH_NEG_INF, l_run = 0.0f;
    float* s_row = s_s + my_row * BKP;

    for (int chunk = 0; chunk < n_chunks; ++chunk) {
        const int k0 = chunk * BK;
        // K chunk -> smem.
        for (int i = tid; i < BK * (D / 8); i += NT) {
            int r = i / (D / 8), c = (i % (D / 8)) * 8;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (k0 + r < S_kv) val = *reinterpret_cast<const uint4*>(kg + (size_t)(k0 + r) * D + c);
            *reinterpret_cast<uint4*>(kv_s + r * DP + c) = val;
        }
        __syncthreads();
        // S = Q K^T for this warp's 16 rows.
        for (int j = 0; j < KT; ++j) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
            wmma::fill_fragment(s_frag, 0.0f);
            for (int d = 0; d < DT; ++d) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> k_frag;
                wmma::load_matrix_sync(k_frag, kv_s + j * 16 * DP + d * 16, DP);
                wmma::mma_sync(s_frag, q_frag[d], k_frag, s_frag);
            }
            wmma::store_matrix_sync(s_s + warp * 16 * BKP + j * 16, s_frag, BKP, wmma::mem_row_major);
        }
        __syncthreads();  // everyone is done with K: V may overwrite it
        for (int i = tid; i < BK * (D / 8); i += NT) {
            int r = i / (D / 8), c = (i % (D / 8)) * 8;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (k0 + r < S_kv) val = *reinterpret_cast<const uint4*>(vg + (size_t)(k0 + r) * D + c);
            *reinterpret_cast<uint4*>(kv_s + r * DP + c) = val;
        }
        // Online softmax on this lane's half row (masked: causal with tail alignment, and padding keys).
        float p[BK / 2];
        float m_loc = FLASH_NEG_INF;
        for (int c = 0; c < BK / 2; ++c) {
            int col = half * (BK / 2) + c;
            int key = k0 + col;
            bool ok = key < S_kv && key <= my_row_global + q_align;
            float sv = ok ? s_row[col] * scale_log2 : FLASH_NEG_INF;
            p[c] = sv;
            m_loc = fmaxf(m_loc, sv);
        }
        m_loc = fmaxf(m_loc, __shfl_xor_sync(0xffffffff, m_loc, 1));
        const float m_new = fmaxf(m_run, m_loc);
        const float m_safe = m_new == FLASH_NEG_INF ? 0.0f : m_new;
        float sum = 0.0f;
        for (int c = 0; c < BK / 2; ++c) {
            p[c] = exp2f(p[c] - m_safe);
            sum += p[c];
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        const float alpha = exp2f(m_run - m_safe);
        l_run = alpha * l_run + sum;
        m_run = m_new;
        __syncwarp();  // all score reads of this warp are done before P overwrites them
        T* p_row = reinterpret_cast<T*>(s_row);
        for (int c = 0; c < BK / 2; ++c) p_row[half * (BK / 2) + c] = T(p[c]);
        if (half == 0) row_scale[my_row] = alpha;
        __syncthreads();  // V is in smem; P and the row scales are visible to the warp
        // O = alpha * O + P V
        const int r_lo = warp * 16 + lane / 4;
        const float a_lo = row_scale[r_lo], a_hi = row_scale[r_lo + 8];
        for (int d = 0; d < DT; ++d) {
            for (int e = 0; e < o_frag[d].num_elements; ++e) o_frag[d].x[e] *= ((e >> 1) & 1) ? a_hi : a_lo;
        }
        const T* p_warp = reinterpret_cast<const T*>(s_s + warp * 16 * BKP);
        for (int j = 0; j < KT; ++j) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> p_frag;
            wmma::load_matrix_sync(p_frag, p_warp + j * 16, LDP);
            for (int d = 0; d < DT; ++d) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> v_frag;
                wmma::load_matrix_sync(v_frag, kv_s + j * 16 * DP + d * 16, DP);
                wmma::mma_sync(o_frag[d], p_frag, v_frag, o_frag[d]);
            }
        }
        __syncthreads();  // before the next chunk's K overwrites V and scores
    }

    if (half == 0) row_l[my_row] = l_run;
    __syncwarp();
    const int r_lo = warp * 16 + lane / 4;
    const float inv_lo = 1.0f / row_l[r_lo], inv_hi = 1.0f / row_l[r_lo + 8];
    for (int d = 0; d < DT; ++d) {
        for (int e = 0; e < o_frag[d].num_elements; ++e) {
            int r = r_lo + 8 * ((e >> 1) & 1);
            int c = d * 16 + 2 * (lane % 4) + (e & 1) + 8 * (e >> 2);
            if (q0 + r < S_q) og[(size_t)(q0 + r) * D + c] = T(o_frag[d].x[e] * (((e >> 1) & 1) ? inv_hi : inv_lo));
        }
    }
"""


def smem_bytes(BQ: int, BK: int, D: int) -> int:
    """Static shared memory of one block (must stay within the 48 KiB static limit)."""
    dp, bkp = D + 8, BK + 4
    main = BK * dp * 2 + BQ * bkp * 4
    return max(main, BQ * dp * 2) + 2 * BQ * 4


def check_launch(who: str, S_q: int, S_kv: int, D: int, smem: int, tiles: str,
                 limit: int = STATIC_SMEM_LIMIT) -> None:
    """Refuse, before any launch, what the kernels do not handle: the head dim, S_q > S_kv, too much smem."""
    if D not in HEAD_DIMS:
        raise ValueError(f"{who}: head dim {D} not in {HEAD_DIMS}")
    if S_q > S_kv:
        raise ValueError(f"{who}: S_q={S_q} > S_kv={S_kv}")
    if smem > limit:
        kind = "static" if limit == STATIC_SMEM_LIMIT else "dynamic"
        raise ValueError(f"{who}: {tiles} D={D} needs {smem} B of shared memory ({kind} limit {limit})")


def cuda_unavailable() -> str | None:
    import mlx.core as mx

    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return None
    return "CUDA not available"


@functools.cache
def _kernel():

    return cuda_kernel(name="flash_prefill_wmma", input_names=["q", "k", "v", "dims", "scale"],
                       output_names=["out"], source=SOURCE, header=HEADER, ensure_row_contiguous=True)


def flash_attention_cuda(q, k, v, scale: float, BQ: int, BK: int):
    """Causal (tail-aligned) attention with the WMMA kernel; q (B,H,S_q,D), k/v (B,H,S_kv,D), fp16/bf16."""
    import mlx.core as mx

    B, H, S_q, D = q.shape
    S_kv = k.shape[2]
    check_launch("flash_attention_cuda", S_q, S_kv, D, smem_bytes(BQ, BK, D), f"BQ={BQ} BK={BK}")
    n_qblocks = -(-S_q // BQ)
    dims = mx.array([S_q, S_kv], dtype=mx.int32)
    (out,) = _kernel()(
        inputs=[q, k, v, dims, mx.array([scale], dtype=mx.float32)],
        template=[("T", q.dtype), ("BQ", BQ), ("BK", BK), ("D", D)],
        grid=(n_qblocks * BQ * 2, B * H, 1),  # BQ/16 warps of 32 threads per block
        threadgroup=(BQ * 2, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    return out


def make_cuda_variant(BQ: int, BK: int) -> Variant:
    def fn(q, k, v, scale):
        return flash_attention_cuda(q, k, v, scale, BQ, BK)

    return Variant(name=f"cuda_bq{BQ}_bk{BK}", fn=fn, params={"BQ": BQ, "BK": BK}, backend="cuda",
                   requires=cuda_unavailable, dtypes=("float16", "bfloat16"))


def cuda_variants() -> list[Variant]:
    """Every tile shape that fits the static shared memory at the largest head dim."""
    return [make_cuda_variant(bq, bk) for bq in BQ_CHOICES for bk in BK_CHOICES
            if smem_bytes(bq, bk, max(HEAD_DIMS)) <= STATIC_SMEM_LIMIT]


def register_variants(variants: list[Variant]) -> None:
    """Add variants to the flash_prefill kernel (once: a module imported again adds nothing)."""
    from kernels.base import REGISTRY

    kernel = REGISTRY["flash_prefill"]
    for variant in variants:
        if variant.name not in kernel.variants:
            kernel.add_variant(variant)


register_variants(cuda_variants())
