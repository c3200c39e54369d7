"""CUDA flash prefill, FlashAttention-2 style: ``mma.sync`` m16n8k16 from registers, ``ldmatrix``, ``cp.async``.

The WMMA variants (kernels.flash_cuda) round-trip every score tile through shared memory and load K and V
into one buffer with no overlap. These variants follow the FlashAttention-2 forward schedule instead:

- S = Q K^T stays in registers (mma accumulators, the documented PTX fragment layout of m16n8k16); the online
  softmax runs on them (row max/sum across the 4 lanes of a row by shuffles, ``ex2.approx`` with the scale
  folded in, a safe max so a fully masked row never makes exp(-inf - -inf)), and P is repacked in registers
  as the A operand of O += P V; V is read with ``ldmatrix.trans``;
- K and V have their own buffers, filled with ``cp.async`` (zero-filled past S_kv): V of a chunk loads while
  Q K^T runs, the next chunk's K while the softmax and P V run;
- shared-memory rows are unpadded and XOR-swizzled by 16-byte chunk, so the 8 rows one ``ldmatrix`` reads
  hit 8 different bank groups (tests/test_kernels_flash_cuda.py checks the index map);
- causal block skip (chunks wholly in the future of the block's last row are never loaded), the mask is only
  evaluated on chunks that cross the diagonal or the end of the keys, heaviest query blocks first.

Tiles are compile-time: BQ query rows per block, BK keys per chunk, WM m-tiles of 16 rows per warp. WM=1
keeps Q in registers; WM=2 (``_r32`` variants, FlashAttention-2's layout for head dim 128) re-reads Q from
shared memory so each K/V fragment feeds two m-tiles. fp16 and bf16 only (the tensor-core input types);
sm_80 or newer. Measured on the H200: bench/results/README.md.
"""

from __future__ import annotations

import functools

from kernels.base import Variant
from kernels.cuda_compile import CudaKernel
from kernels.flash_cuda import HEAD_DIMS, PROLOGUE, STATIC_SMEM_LIMIT, check_launch, cuda_unavailable, register_variants

# (m-tiles per warp, BQ choices, BK choices): one warp per 16 rows with Q in registers, or per 32 rows
# with Q in shared memory (FlashAttention-2's layout for head dim 128).
TILES = ((1, (64, 128), (32, 64)), (2, (64, 128), (32, 64)))
# Tiles beyond the 48 KB of static shared memory, in dynamic shared memory (``shared_memory=``; the kernel's limit
# is raised above 48 KB at launch): FlashAttention-2's own head-dim-128 forward tile (BQ 128, BK 64, 4 warps of 32
# rows: 64 KB) and 64-key-deeper chunks (BK 128: half the chunk overheads -- barriers, O rescales -- per key).
DYNAMIC_TILES = ((1, (64, 128), (128,)), (2, (128,), (64,)))
# Measured on the H200 (bench/results/h200-flash-candidates.json, bench/gpu_flash_bench.py --candidates):
# FlashAttention-2's tile is the fastest variant at S=8192, D=128 (0.454x SDPA against 0.446x for
# cuda_mma_bq64_bk64) and slower at S=2048 (0.39x against 0.45x): a variant whose win depends on the shape, so it is
# registered. The 128-key chunks lose at both (0.36-0.39x) and stay candidates (``--candidates`` registers them).
REGISTERED_DYNAMIC = ("cuda_mma_bq128_bk64_r32",)
# The opt-in limit of the smallest sm_80+ part (sm_86/sm_89: 99 KB; sm_80 163 KB, sm_90 227 KB)
DYNAMIC_SMEM_LIMIT = 99 * 1024

# What the mma.sync and the wgmma kernels (kernels.flash_cuda_wgmma) share: -inf, a pointer's shared-memory
# address, 16-byte cp.async copies and their groups, ex2, and packing two floats into a half2/bfloat162 register.
HELPERS = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define FA2_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ unsigned fa2_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void fa2_cp16(void* dst, const void* src, bool valid) {
    // 16 bytes global -> shared, bypassing L1; src_size 0 zero-fills (keys/rows past the end)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n"
                 :: "r"(fa2_smem(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ float fa2_exp2(float x) {  // MUFU ex2; ex2(-inf) = +0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ void fa2_commit() { asm volatile("cp.async.commit_group;\\n" ::); }
template <int N> __device__ __forceinline__ void fa2_wait() { asm volatile("cp.async.wait_group %0;\\n" :: "n"(N)); }

__device__ __forceinline__ unsigned fa2_pack(float lo, float hi, __half) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ unsigned fa2_pack(float lo, float hi, __nv_bfloat16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
"""

HEADER = HELPERS + """
__device__ __forceinline__ void fa2_ldsm_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa2_smem(p)));
}
__device__ __forceinline__ void fa2_ldsm_x4_t(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa2_smem(p)));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulate; the last argument picks the input type.
__device__ __forceinline__ void fa2_mma(float* c, const unsigned* a, const unsigned* b, __half) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void fa2_mma(float* c, const unsigned* a, const unsigned* b, __nv_bfloat16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""

SOURCE = """
    constexpr int RW = 16 * WM;             // query rows per warp: WM m-tiles of 16
    constexpr int NW = BQ / RW;             // warps per block
    constexpr int NT = NW * 32;
    constexpr int CPR = D / 8;              // 16-byte chunks per smem row (rows are unpadded, XOR-swizzled)
    constexpr int SW = CPR < 8 ? CPR : 8;   // swizzle period: the 8 rows one ldmatrix reads hit 8 bank groups
    constexpr int SDIV = 8 / SW;
    constexpr int ND = D / 8;               // 8-wide column tiles of O
    constexpr int KD = D / 16;              // 16-deep k steps of Q K^T
    constexpr int NK = BK / 8;              // 8-wide key tiles of S
    constexpr bool Q_IN_REGS = WM == 1;     // else Q is re-read from smem (registers go to the 2 m-tiles)
    constexpr int KV_ELEMS = BK * D;
    constexpr int Q_ELEMS = BQ * D;
    constexpr int SMEM_BYTES = Q_IN_REGS ? (2 * KV_ELEMS > Q_ELEMS ? 2 * KV_ELEMS : Q_ELEMS) * 2
                                         : (2 * KV_ELEMS + Q_ELEMS) * 2;
    SMEM_DECLARATION
    T* k_s = reinterpret_cast<T*>(smem);
    T* v_s = k_s + KV_ELEMS;
    T* q_s = Q_IN_REGS ? k_s : v_s + KV_ELEMS;  // in registers: staged once, in the K/V space
    const T tag = T(0.0f);
""" + PROLOGUE + """
    const int g = lane / 4;                 // fragment row (and row + 8)
    const int t = lane % 4;                 // fragment column pair
    const int lm = lane / 8, lr = lane % 8; // ldmatrix: which 8x8 matrix this lane addresses, and its row
    // Element offset of (row r, column c) in a swizzled tile; c is a multiple of 8 (one 16-byte chunk).
    auto at = [&](int r, int c) -> int { return r * D + ((((c >> 3) ^ ((r / SDIV) % SW))) << 3); };

    // Q tile -> smem (rows past S_q are zeros); with WM == 1 -> registers (A fragments per 16-deep k step).
    for (int i = tid; i < BQ * (D / 8); i += NT) {
        int r = i / (D / 8), c = (i % (D / 8)) * 8;
        bool ok = q0 + r < S_q;
        fa2_cp16(q_s + at(r, c), qg + (size_t)(ok ? q0 + r : 0) * D + c, ok);
    }
    fa2_commit();
    fa2_wait<0>();
    __syncthreads();
    const int q_row = warp * RW + (lm % 2) * 8 + lr, q_col = (lm / 2) * 8;  // + 16 m rows, + 16 kk columns
    unsigned qa[Q_IN_REGS ? KD : 1][4];
    if (Q_IN_REGS) {
        #pragma unroll
        for (int kk = 0; kk < KD; ++kk) fa2_ldsm_x4(qa[kk], q_s + at(q_row, q_col + kk * 16));
        __syncthreads();  // Q is in registers: K and V may overwrite it
    }

    const int last_row = min(q0 + BQ, S_q) - 1;
    const int kv_end = min(S_kv, last_row + q_align + 1);
    const int n_chunks = (kv_end + BK - 1) / BK;

    auto load_kv = [&](T* dst, const T* src, int k0) {
        for (int i = tid; i < BK * (D / 8); i += NT) {
            int r = i / (D / 8), c = (i % (D / 8)) * 8;
            bool ok = k0 + r < S_kv;
            fa2_cp16(dst + at(r, c), src + (size_t)(ok ? k0 + r : 0) * D + c, ok);
        }
    };

    float o[WM][ND][4];
    float m_run[WM][2], l_run[WM][2];            // l_run: this lane's partial row sums, reduced at the end
    #pragma unroll
    for (int m = 0; m < WM; ++m) {
        #pragma unroll
        for (int d = 0; d < ND; ++d) o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.0f;
        m_run[m][0] = m_run[m][1] = FA2_NEG_INF;
        l_run[m][0] = l_run[m][1] = 0.0f;
    }
    const int row_a = q0 + warp * RW + g;        // this lane's rows: row_a + 16 m + 8 h

    load_kv(k_s, kg, 0);
    fa2_commit();
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
        const int k0 = chunk * BK;
        load_kv(v_s, vg, k0);
        fa2_commit();
        fa2_wait<1>();                            // this chunk's K has landed
        __syncthreads();

        float s[WM][NK][4];
        #pragma unroll
        for (int m = 0; m < WM; ++m) {
            #pragma unroll
            for (int n = 0; n < NK; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
        }
        #pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            unsigned a[WM][4];
            #pragma unroll
            for (int m = 0; m < WM; ++m) {
                if (Q_IN_REGS) {
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) a[m][i] = qa[Q_IN_REGS ? kk : 0][i];
                } else {
                    fa2_ldsm_x4(a[m], q_s + at(q_row + m * 16, q_col + kk * 16));
                }
            }
            #pragma unroll
            for (int np = 0; np < NK / 2; ++np) {
                unsigned b[4];
                fa2_ldsm_x4(b, k_s + at(np * 16 + (lm / 2) * 8 + lr, kk * 16 + (lm % 2) * 8));
                #pragma unroll
                for (int m = 0; m < WM; ++m) {
                    fa2_mma(s[m][2 * np], a[m], b, tag);
                    fa2_mma(s[m][2 * np + 1], a[m], b + 2, tag);
                }
            }
        }
        __syncthreads();                          // every warp is done with K
        const bool more = chunk + 1 < n_chunks;
        if (more) load_kv(k_s, kg, k0 + BK);      // the next K loads during softmax and P V
        fa2_commit();

        // Online softmax on the accumulators: s[m][n][0..1] are row_a + 16 m, s[m][n][2..3] that + 8.
        const bool need_mask = k0 + BK > S_kv || k0 + BK - 1 > q0 + q_align;
        #pragma unroll
        for (int m = 0; m < WM; ++m) {
            float m_loc[2] = {FA2_NEG_INF, FA2_NEG_INF};
            #pragma unroll
            for (int n = 0; n < NK; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float sv = s[m][n][e] * scale_log2;
                    if (need_mask) {
                        const int key = k0 + n * 8 + 2 * t + (e & 1);
                        const int row = row_a + 16 * m + 8 * (e >> 1);
                        if (key >= S_kv || key > row + q_align) sv = FA2_NEG_INF;
                    }
                    s[m][n][e] = sv;
                    m_loc[e >> 1] = fmaxf(m_loc[e >> 1], sv);
                }
            }
            float m_safe[2];
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                m_loc[h] = fmaxf(m_loc[h], __shfl_xor_sync(0xffffffff, m_loc[h], 1));
                m_loc[h] = fmaxf(m_loc[h], __shfl_xor_sync(0xffffffff, m_loc[h], 2));
                const float m_new = fmaxf(m_run[m][h], m_loc[h]);
                m_safe[h] = m_new == FA2_NEG_INF ? 0.0f : m_new;
                const float alpha = fa2_exp2(m_run[m][h] - m_safe[h]);
                m_run[m][h] = m_new;
                l_run[m][h] *= alpha;
                #pragma unroll
                for (int d = 0; d < ND; ++d) { o[m][d][2 * h] *= alpha; o[m][d][2 * h + 1] *= alpha; }
            }
            #pragma unroll
            for (int n = 0; n < NK; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = fa2_exp2(s[m][n][e] - m_safe[e >> 1]);
                    s[m][n][e] = p;
                    l_run[m][e >> 1] += p;
                }
            }
        }

        if (more) fa2_wait<1>(); else fa2_wait<0>();   // this chunk's V has landed
        __syncthreads();
        #pragma unroll
        for (int j = 0; j < BK / 16; ++j) {
            unsigned pa[WM][4];
            #pragma unroll
            for (int m = 0; m < WM; ++m) {
                pa[m][0] = fa2_pack(s[m][2 * j][0], s[m][2 * j][1], tag);
                pa[m][1] = fa2_pack(s[m][2 * j][2], s[m][2 * j][3], tag);
                pa[m][2] = fa2_pack(s[m][2 * j + 1][0], s[m][2 * j + 1][1], tag);
                pa[m][3] = fa2_pack(s[m][2 * j + 1][2], s[m][2 * j + 1][3], tag);
            }
            #pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b[4];
                fa2_ldsm_x4_t(b, v_s + at(j * 16 + (lm % 2) * 8 + lr, dp * 16 + (lm / 2) * 8));
                #pragma unroll
                for (int m = 0; m < WM; ++m) {
                    fa2_mma(o[m][2 * dp], pa[m], b, tag);
                    fa2_mma(o[m][2 * dp + 1], pa[m], b + 2, tag);
                }
            }
        }
        __syncthreads();                          // every warp is done with V before the next chunk's V
    }

    #pragma unroll
    for (int m = 0; m < WM; ++m) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[m][h];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            const int row = row_a + 16 * m + 8 * h;
            if (row >= S_q) continue;
            T* orow = og + (size_t)row * D;
            #pragma unroll
            for (int d = 0; d < ND; ++d) {
                unsigned packed = fa2_pack(o[m][d][2 * h] * inv, o[m][d][2 * h + 1] * inv, tag);
                *reinterpret_cast<unsigned*>(orow + d * 8 + 2 * t) = packed;
            }
        }
    }
"""


def smem_bytes(BQ: int, BK: int, D: int, WM: int = 1) -> int:
    """Static shared memory of one block: K and V buffers, plus the Q tile (WM > 1) or the larger of the two."""
    kv, q_tile = 2 * BK * D * 2, BQ * D * 2
    return max(kv, q_tile) if WM == 1 else kv + q_tile


STATIC_SMEM = "__shared__ __align__(128) unsigned char smem[SMEM_BYTES];"
DYNAMIC_SMEM = "extern __shared__ __align__(128) unsigned char smem[];  // SMEM_BYTES, requested at launch"


def mma_kernel(dynamic_bytes: int = 0, min_blocks: int | None = None) -> CudaKernel:
    """The static-smem kernel (0), or the kernel that takes ``dynamic_bytes`` of dynamic shared memory (its own
    module: the request is a property of the kernel object); ``min_blocks``: see ``CudaKernel``."""
    name, declaration = ("flash_prefill_mma", STATIC_SMEM) if not dynamic_bytes else (
        f"flash_prefill_mma_dyn{dynamic_bytes}", DYNAMIC_SMEM)
    return CudaKernel(name, ["q", "k", "v", "dims", "scale"], ["out"],
                      SOURCE.replace("SMEM_DECLARATION", declaration), HEADER, True, dynamic_bytes, min_blocks)


_kernel = functools.cache(mma_kernel)  # what flash_attention_mma launches (a probe may swap it)


def needs_dynamic(BQ: int, BK: int, D: int, WM: int) -> bool:
    return smem_bytes(BQ, BK, D, WM) > STATIC_SMEM_LIMIT


def flash_attention_mma(q, k, v, scale: float, BQ: int, BK: int, WM: int = 1):
    """Causal (tail-aligned) attention with the mma.sync kernel; q (B,H,S_q,D), k/v (B,H,S_kv,D), fp16/bf16.

    WM: m-tiles of 16 query rows per warp (1: Q kept in registers; 2: Q re-read from shared memory, each
    K/V fragment feeds two m-tiles)."""
    import mlx.core as mx

    B, H, S_q, D = q.shape
    S_kv = k.shape[2]
    if BQ % (16 * WM) or BK % 16:
        raise ValueError(f"flash_attention_mma: BQ={BQ} must be a multiple of {16 * WM} and BK={BK} of 16")
    smem = smem_bytes(BQ, BK, D, WM)
    check_launch("flash_attention_mma", S_q, S_kv, D, smem, f"BQ={BQ} BK={BK} WM={WM}", limit=DYNAMIC_SMEM_LIMIT)
    dims = mx.array([S_q, S_kv], dtype=mx.int32)
    threads = BQ // (16 * WM) * 32
    (out,) = _kernel(smem if needs_dynamic(BQ, BK, D, WM) else 0)(
        inputs=[q, k, v, dims, mx.array([scale], dtype=mx.float32)],
        template=[("T", q.dtype), ("BQ", BQ), ("BK", BK), ("D", D), ("WM", WM)],
        grid=(-(-S_q // BQ) * threads, B * H, 1),  # one warp per 16 * WM rows
        threadgroup=(threads, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    return out


def make_mma_variant(BQ: int, BK: int, WM: int = 1) -> Variant:
    def fn(q, k, v, scale):
        return flash_attention_mma(q, k, v, scale, BQ, BK, WM)

    suffix = "" if WM == 1 else f"_r{16 * WM}"
    return Variant(name=f"cuda_mma_bq{BQ}_bk{BK}{suffix}", fn=fn, params={"BQ": BQ, "BK": BK, "WM": WM},
                   backend="cuda", requires=cuda_unavailable, dtypes=("float16", "bfloat16"))


def mma_variants() -> list[Variant]:
    """Every tile shape (BQ, BK, rows per warp) that fits the static shared memory at the largest head dim."""
    return [make_mma_variant(bq, bk, wm) for wm, bqs, bks in TILES for bq in bqs for bk in bks
            if smem_bytes(bq, bk, max(HEAD_DIMS), wm) <= STATIC_SMEM_LIMIT]


def mma_dynamic_variants() -> list[Variant]:
    """The larger tiles (``DYNAMIC_TILES``), in dynamic shared memory up to ``DYNAMIC_SMEM_LIMIT``."""
    return [make_mma_variant(bq, bk, wm) for wm, bqs, bks in DYNAMIC_TILES for bq in bqs for bk in bks
            if smem_bytes(bq, bk, max(HEAD_DIMS), wm) <= DYNAMIC_SMEM_LIMIT]


register_variants(mma_variants() + [v for v in mma_dynamic_variants() if v.name in REGISTERED_DYNAMIC])
