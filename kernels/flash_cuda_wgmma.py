"""CUDA flash prefill with Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a): 0.585x SDPA at S=8192, D=128.

Why. The ``mma.sync`` kernels (kernels.flash_cuda_mma) stop at 0.454x SDPA at S=8192, D=128 on the H200: ptxas gives
them 251-255 registers a thread (the O accumulator, the scores and Q's fragments all live in registers), so an SM
holds 8 warps and the tensor cores wait. ``wgmma`` reads B (and here A for S = Q K^T) straight from shared memory
through a matrix descriptor, runs asynchronously across a warpgroup (4 consecutive warps, 128 threads), and keeps
only the accumulators in registers: cuDNN's Hopper kernel, SDPA here, is built on it.

Design (same inputs, outputs and semantics as ``flash_cuda_mma.flash_attention_mma``: q (B,H,S_q,D), k/v
(B,H,S_kv,D), fp16/bf16, tail-aligned causal mask, ``scale``):

- a block is BQ/64 warpgroups (BQ 64 or 128); each warpgroup owns 64 query rows;
- shared memory (dynamic, aligned to 1024 bytes at run time) holds the Q tile and one K and one V chunk of BK keys
  (BK 64 or 128), all in the canonical 128-byte-swizzled layout of the PTX ISA (64-byte for D=32): a tile of
  ``rows`` x D is stored as D/64 column blocks of ``rows`` x 64 elements, 128 bytes a row, the 16-byte chunks of
  row r XOR-ed with r % 8 (:func:`swizzle`, :func:`tile_offset`);
- Q, K and V arrive with ``cp.async`` (zero-filled past the ends), K and V in their own buffers as the mma kernel
  does: this chunk's V loads during S = Q K^T and the softmax, the next chunk's K during the softmax and O += P V;
  each thread issues ``fence.proxy.async.shared::cta`` after its copies land, before the barrier, because wgmma
  reads shared memory through the async proxy;
- S = Q K^T: D/16 ``wgmma m64n{BK}k16`` with A = Q and B = K from shared memory (both K-major, 128B swizzle, the
  descriptor's start address advanced 32 bytes per k16 step inside a swizzle atom), the first with scale-d = 0;
- online softmax on the S accumulators (f32, the m64nNk16 fragment layout: :func:`acc_coord`): row max and sum
  across the 4 threads of a row by shuffles, ``ex2.approx`` with the scale folded in, a safe max for rows whose
  chunk is fully masked, the mask evaluated only on chunks that cross the diagonal or the end of the keys,
  chunks wholly in the future of the block's last row never loaded (causal block skip), heaviest blocks first;
- P is converted to fp16/bf16 in registers: the accumulator elements of 16 consecutive keys are, in order, the
  A-register fragment of one m64k16 step (:func:`a_coord`), so O += P V is BK/16 ``wgmma m64n{D}k16`` with A
  from registers and B = V from shared memory, MN-major (``imm-trans-b`` = 1: V is keys x D with D contiguous);
- final 1/l normalisation in registers and 4-byte stores.

Layout facts and their sources (PTX ISA 8.x/9.x, section 9.7.15.5.1 "Register Fragments and Shared Memory Matrix
Layouts", and CUTLASS ``cute/arch/mma_sm90_desc.hpp`` / ``mma_sm90_gmma.hpp``):

- matrix descriptor (64 bits, "Matrix Descriptor Format"): bits 0-13 start address, 16-29 leading dimension byte
  offset (LBO), 32-45 stride dimension byte offset (SBO), each ``(x & 0x3FFFF) >> 4``; bits 49-51 base offset
  (0 when the swizzle pattern starts on a 1024-byte boundary for 128B swizzle, 512 for 64B); bits 62-63 swizzle
  mode 0 none, 1 128B, 2 64B, 3 32B (:data:`DESC_FIELDS`; CUTLASS ``GmmaDescriptor`` has the same bit fields and
  ``LayoutType`` INTERLEAVE=0, B128=1, B64=2, B32=3);
- canonical layouts ("Canonical Layouts" table, in units of T = 8 16-bit elements): K-major no swizzle
  ``((8,m),(T,2k)):((1T,SBO),(1,LBO))``: LBO = byte distance between core matrices (8 rows x 16 bytes) adjacent in
  K, SBO = between 8-row groups; K-major 128B swizzle ``((8,m),(T,2k)):((8T,SBO),(1,T))``: rows 128 bytes apart,
  SBO between 8-row groups (1024 for a dense tile), LBO "not used, assumed to be 1"; MN-major 128B swizzle
  ``((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))``: 64 elements contiguous along N, LBO between 64-wide atoms along N, SBO
  between groups of 8 K rows. Swizzle<3,4,3> (128B): byte-address bits 4-6 XOR bits 7-9; Swizzle<2,4,3> (64B):
  bits 4-5 XOR bits 7-8;
- accumulator D of m64nNk16 with .f32 (Figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix
  D"; CUTLASS ``CLayout_64xN = ((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512))``): thread ``tid`` of the warpgroup,
  register i < N/2 holds row ``16*(tid/32) + (tid%32)/4 + 8*((i/2)%2)``, column ``8*(i/4) + 2*(tid%4) + i%2``;
- A in registers, m64k16 f16/bf16 (Figure "... register fragment layout for matrix A"; CUTLASS
  ``ALayout_64x16 = ((4,8,4),(2,2,2)):((128,1,16),(64,8,512))``): four .b32 registers of two elements; register j,
  half h holds row ``16*(tid/32) + (tid%32)/4 + 8*(j%2)``, column ``8*(j/2) + 2*(tid%4) + h`` (mma.sync's
  m16n8k16 A layout per warp);
- instruction forms (CUTLASS ``SM90_64xNx16_F32F16F16_SS/RS``): ``wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16
  {d}, descA, descB, p, 1, 1, tnspA, tnspB;`` and ``{d}, {a0,a1,a2,a3}, descB, p, 1, 1, tnspB;`` with p =
  scale-d (0: D = A B), tnsp 0 = K-major, 1 = MN-major (transpose only for 16-bit types); ``wgmma.fence`` before
  the first wgmma and whenever registers it reads were written by other instructions, ``commit_group`` /
  ``wait_group N`` around each batch.

The C expressions of the fragment maps and of the swizzle are Python strings here (:data:`ACC_ROW` ...), compiled
into the kernel and evaluated by tests/kernels/test_kernels_flash_cuda_wgmma.py, so the tested model is the code.

Two numbers (METHOD.md), causal B=1, H=32, S=8192, D=128: 4*H*D*S(S+1)/2 = 5.498e11 FLOP; at the calibrated
643 TFLOP/s of the H200 the floor is 0.855 ms; bytes (q, k, v read once, out written once: 268 MB at 3.81 TB/s)
0.070 ms, so the kernel is compute-bound. SDPA takes 1.055 ms (521 TFLOP/s, 81 %); the 0.5x goal is 2.11 ms
(260 TFLOP/s, 41 % of peak); the best mma.sync kernel takes 2.327 ms (0.454x).

What bench/cuda_wgmma_gemm_probe.py verifies on the device, one tiny kernel per case (random data, float64
reference, NaN-poisoned output, each case in its own process so a fault in one does not hide the others):

- a ``a_ss_interleave``: m64n64k16, A and B K-major in shared memory, no swizzle: descriptor fields and the
  accumulator map. ``a_ss_interleave_swapped`` (diagnostic) swaps LBO and SBO: exactly one of the two must pass;
- b ``b_ss_sw128``: the same with the 128B swizzle (1024-aligned tiles, LBO = 1 "assumed"); ``b_ss_sw128_k64``:
  K = 64 as 4 k16 steps, start address +32 bytes each inside the atom (how the kernel walks D);
  ``b_ss_sw64_k32``: 64-byte swizzle (the D=32 layout);
- c ``c_rs_sw128``: A from registers (the m64k16 fragment map), B from shared memory;
- d ``d_kloop_d128``: K = 128 over two 64-wide column blocks (the Q and K tiles of the kernel at D=128), two
  commit groups, ``wait_group 1`` then 0, accumulators poisoned with NaN before a first wgmma with scale-d = 0;
  also in bf16;
- e ``e_ss_mn_n64``: B MN-major (transposed, as V) with n=64 (one atom); ``e_ss_mn_n128``: n = 128 = head dim
  (two atoms along N, LBO = atom stride, SBO = 8 K rows) and its ``_swapped`` diagnostic (LBO and SBO exchanged:
  should fail); ``e_rs_mn_n128``: A from registers, B MN-major, n = 128, K = 64 keys: exactly O += P V at BK=64;
  also in bf16 and at n=32 with the 64-byte swizzle; ``f_ss_n128``: K-major B with n=128 (S = Q K^T at BK=128);
- ``flash_*``: every wgmma variant against a float64 causal reference at small odd shapes (D 32/64/128, S_q <
  S_kv), with ptxas's register/spill report for each.

Device commands (one H200; the first shows whether the building blocks hold before the second spends time on
timing):

    python bench/cuda_wgmma_gemm_probe.py --out $OUT/wgmma-gemm.json
    python bench/gpu_flash_bench.py --candidates --skip-mlx --only cuda_wgmma cuda_mma_bq128_bk64_r32 \\
        --seq 2048 8192 --dims 128 --out $OUT/flash.json

Where to look first if a case fails: the MN-major descriptor of V (``e_*``: ``e_ss_mn_n128`` passes and its
``_swapped`` diagnostic, LBO and SBO exchanged, fails, as the ISA reading expects); LBO = 16 ("assumed 1") for
swizzled K-major operands (``b_*``); the +32-byte start-address walk inside an atom (``b_ss_sw128_k64``); ptxas's
``compile_log`` (registers, spills, "wgmma ... serialized" warnings, which cost speed, not correctness).

Compiled, not run (2026-12-01, on a machine with no GPU): the CUDA 13.0.88 toolkit is installed there at
/usr/local/cuda-13.0 (not on PATH), the same nvcc as the H200 machines. ``nvcc -cubin
-gencode=arch=compute_90a,code=sm_90a --ptxas-options=-v`` assembles every variant and every probe case with no
spills, no stack frame and no wgmma serialisation warning (tests/kernels/test_kernels_flash_cuda_wgmma.py repeats
this wherever nvcc is found). Registers a thread at D = 128: BK 64 -> 128 (BQ 64 or 128), BK 128 -> 168; D = 64:
114 / 152; D = 32: 94 / 126. The SASS (nvdisasm from the ``nvidia-cuda-nvdisasm`` wheel, installed outside the
project) of ``cuda_wgmma_bq128_bk64`` at D = 128 has what was meant: 8 ``HGMMA.64x64x16.F32`` from two descriptors
(the first with ``RZ, !UPT``: scale-d = 0), ``WARPGROUP.DEPBAR``, then 4 ``HGMMA.64x128x16.F32`` with A in registers
and ``.tnspB``, 24 ``LDGSTS.E.BYPASS.128`` (cp.async), no LDL/STL.

Occupancy from those counts (65,536 registers and 228 KB of shared memory an SM): BK 64 at 128 registers gives 16
warps an SM, 4 blocks of BQ 64 (49 KB each) or 2 of BQ 128 (65 KB): four warpgroups, so while one runs its softmax
the others can keep the tensor cores busy (the kernel itself does not overlap them inside a warpgroup). BK 128 at
168 registers: 12 warps by registers, and BQ 64's 81 KB blocks fit only 2 (8 warps); BQ 128, 1 block (8 warps).
Measured on the H200 (2026-12-01, MLX 0.32.4, which compiles custom kernels for sm_90a there):
``bench/cuda_wgmma_gemm_probe.py`` passes every building block (descriptors, swizzles, fragment maps, the K loop,
MN-major V) and the four tiles against the float64 causal reference at odd shapes; ``bench/gpu_flash_bench.py
--candidates`` (causal, B=1, H=32, fp16, bench/results/h200-flash-wgmma.json) at S=8192, D=128: BQ 128/BK 128
1.80 ms, 306 TFLOP/s, 0.585x SDPA (1.05 ms); BQ 64/BK 128 0.533x, BQ 64/BK 64 0.524x, BQ 128/BK 64 0.517x; at
S=2048: 0.542x, 0.529x, 0.510x, 0.486x (the best mma.sync tile: 0.451x and 0.394x). The BK 128 tiles win, against
the guess above. :data:`REGISTERED` are the variants of the kernel; ``--candidates`` adds the others. Levers not
yet taken: a register cap with 2 blocks an SM, overlapping the softmax of one warpgroup with the other's wgmma
(FlashAttention-3's ping-pong), TMA loads on an mbarrier, deeper K/V stages.
"""

from __future__ import annotations

import functools

from kernels.base import Variant
from kernels.cuda_compile import CudaKernel
from kernels.flash_cuda import HEAD_DIMS, PROLOGUE, check_launch, cuda_unavailable, register_variants
from kernels.flash_cuda_mma import HELPERS

# Tiles offered as candidates: BQ query rows (64 per warpgroup), BK keys per chunk (the N of S = Q K^T).
BQ_CHOICES = (64, 128)
BK_CHOICES = (64, 128)
# The tiles registered with flash_prefill: the fastest at S=2048 and 8192, D=128 (BQ 128, BK 128) and the smallest
# block (BQ 64, BK 64: 49 KB, four blocks an SM), which may win where the other's one block an SM starves.
REGISTERED = ("cuda_wgmma_bq128_bk128", "cuda_wgmma_bq64_bk64")
# The n of the generated wgmma instructions: BK for S = Q K^T, D for O += P V.
WGMMA_N = (32, 64, 128)
# The opt-in dynamic shared memory of one block on sm_90 (227 KB).
WGMMA_SMEM_LIMIT = 227 * 1024
# Run-time alignment of the dynamic shared memory to the 128B swizzle's 1024-byte repeat (base offset 0).
ALIGN_PAD = 1024

# --------------------------------------------------------------------------- layout model (shared with the tests)

# (field, first bit, width) of the wgmma matrix descriptor: PTX ISA "Matrix Descriptor Format".
DESC_FIELDS = (("start", 0, 14), ("lbo", 16, 14), ("sbo", 32, 14), ("base_offset", 49, 3), ("swizzle", 62, 2))
# Swizzle span in bytes -> the descriptor's mode bits (0 = no swizzle / interleave).
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}

# C expressions (also evaluated in Python with / as floor division) of the fragment maps and the swizzle.
ACC_ROW = "16 * (tid / 32) + (tid % 32) / 4 + 8 * ((i / 2) % 2)"
ACC_COL = "8 * (i / 4) + 2 * (tid % 4) + (i % 2)"
A_ROW = "16 * (tid / 32) + (tid % 32) / 4 + 8 * (j % 2)"
A_COL = "8 * (j / 2) + 2 * (tid % 4) + h"
SWIZZLE = "o ^ (((o >> 7) & (swb / 16 - 1)) << 4)"
TILE_LINEAR = "(c / (swb / 2)) * rows * swb + r * swb + (c % (swb / 2)) * 2"


# Descriptor arguments of the kernel (byte offsets from the tile's 1024-aligned base, LBO, SBO), as C expressions
# pasted into SOURCE and evaluated by the tests: k16 step kk of S = Q K^T (column c = 16 kk) for warpgroup wg, and
# k16 step j of O += P V.
QK_A_START = "wg * 64 * SWB + (c / SWE) * BQ * SWB + (c % SWE) * 2"  # Q: this warpgroup's 64 rows, K-major
QK_B_START = "(c / SWE) * BK * SWB + (c % SWE) * 2"                  # K chunk: BK rows, K-major
KMAJOR_LBO = "16"                                                     # swizzled K-major: "not used, assumed 1"
KMAJOR_SBO = "8 * SWB"                                                # 8 rows of one atom
PV_B_START = "j * 16 * SWB"                                           # V chunk: 16 keys further per k16 step
PV_LBO = "BK * SWB"                                                   # MN-major: next 64-wide atom along D
PV_SBO = "8 * SWB"                                                    # MN-major: next 8 keys


@functools.cache
def _compiled(expr: str):
    return compile(expr.replace("/", "//"), "<layout expression>", "eval")


def _py(expr: str, **names: int) -> int:
    """Evaluate one of the C integer expressions above in Python (all operands non-negative: / is floor division)."""
    return eval(_compiled(expr), {}, names)  # noqa: S307 - our own constant expressions


def desc_encode(x: int) -> int:
    """``matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4`` (PTX ISA)."""
    return (x & 0x3FFFF) >> 4


def make_desc(start: int, lbo: int, sbo: int, swizzle_bytes: int, base_offset: int = 0) -> int:
    """The 64-bit descriptor of a shared-memory matrix at byte address ``start``."""
    values = {"start": desc_encode(start), "lbo": desc_encode(lbo), "sbo": desc_encode(sbo),
              "base_offset": base_offset, "swizzle": SWIZZLE_MODE[swizzle_bytes]}
    desc = 0
    for name, first, width in DESC_FIELDS:
        if values[name] >= 1 << width:
            raise ValueError(f"descriptor field {name}={values[name]} does not fit {width} bits")
        desc |= values[name] << first
    return desc


def swizzle(o: int, swb: int) -> int:
    """Swizzle<B,4,3> on a byte offset from a 1024-aligned base (B = log2(swb/16)); identity without swizzle."""
    return o if swb == 0 else _py(SWIZZLE, o=o, swb=swb)


def tile_offset(r: int, c: int, rows: int, swb: int) -> int:
    """Byte offset of 16-bit element (r, c) of a ``rows`` x cols tile stored as cols/(swb/2) column blocks of
    ``rows`` x swb bytes, swizzled: the layout of the Q, K and V tiles (row r = query or key, c = head dim)."""
    return swizzle(_py(TILE_LINEAR, r=r, c=c, rows=rows, swb=swb), swb)


def acc_coord(tid: int, i: int) -> tuple[int, int]:
    """(row, column) of f32 accumulator register i of warpgroup thread ``tid`` (m64nNk16)."""
    return _py(ACC_ROW, tid=tid, i=i), _py(ACC_COL, tid=tid, i=i)


def a_coord(tid: int, j: int, h: int) -> tuple[int, int]:
    """(row, column) of half h of A-fragment register j of warpgroup thread ``tid`` (m64k16, 16-bit types)."""
    return _py(A_ROW, tid=tid, j=j, h=h), _py(A_COL, tid=tid, j=j, h=h)


def tile_swizzle_bytes(D: int) -> int:
    """The kernel's SWB: 128-byte swizzle rows, 64-byte at D = 32 (a row of 32 halves)."""
    return 128 if D >= 64 else 64


def qk_descriptor(wg: int, kk: int, BQ: int, BK: int, D: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(start offset, LBO, SBO) of the A (Q) and B (K) descriptors of k16 step kk of S = Q K^T, warpgroup wg."""
    names = {"wg": wg, "c": 16 * kk, "BQ": BQ, "BK": BK, "SWB": tile_swizzle_bytes(D),
             "SWE": tile_swizzle_bytes(D) // 2}
    lbo, sbo = _py(KMAJOR_LBO, **names), _py(KMAJOR_SBO, **names)
    return (_py(QK_A_START, **names), lbo, sbo), (_py(QK_B_START, **names), lbo, sbo)


def pv_descriptor(j: int, BK: int, D: int) -> tuple[int, int, int]:
    """(start offset, LBO, SBO) of the B (V, MN-major) descriptor of k16 step j of O += P V."""
    names = {"j": j, "BK": BK, "SWB": tile_swizzle_bytes(D)}
    return _py(PV_B_START, **names), _py(PV_LBO, **names), _py(PV_SBO, **names)


# --------------------------------------------------------------------------- CUDA helpers (generated)

AB_TYPES = (("f16", "__half"), ("bf16", "__nv_bfloat16"))


def _desc_function() -> str:
    parts = {"start": "desc_enc(addr)", "lbo": "desc_enc(lbo)", "sbo": "desc_enc(sbo)",
             "base_offset": "0ull", "swizzle": "(unsigned long long)mode"}
    terms = " | ".join(f"({parts[name]} << {first})" for name, first, _ in DESC_FIELDS)
    return ("__device__ __forceinline__ unsigned long long desc_enc(unsigned x) {\n"
            "    return (unsigned long long)((x & 0x3FFFF) >> 4);\n}\n"
            "// PTX ISA 'Matrix Descriptor Format' (DESC_FIELDS in kernels/flash_cuda_wgmma.py); base offset 0: every\n"
            "// tile starts on a 1024-byte boundary\n"
            "__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo,"
            " unsigned mode) {\n"
            f"    return {terms};\n}}\n")


def _wgmma_function(kind: str, n: int, ab: str, ctype: str) -> str:
    """``wg_ss`` (A, B from shared memory) or ``wg_rs`` (A from registers) for m64n{n}k16, f32 accumulators,
    overloaded on the element type (tag) and on n (``WgN<n>``); the transpose flags are template arguments."""
    regs = n // 2
    d_ops = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    head = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab}"
    if kind == "ss":
        p, ta, tb = regs + 2, regs + 3, regs + 4
        body = f"{head} {{{d_ops}}}, %{regs}, %{regs + 1}, p, 1, 1, %{ta}, %{tb};"
        ins = '"l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB)'
        sig = (f"template <int TA, int TB> __device__ __forceinline__ void wg_ss(float* d, unsigned long long da, "
               f"unsigned long long db, int scale_d, {ctype}, WgN<{n}>)")
    else:
        p, tb = regs + 5, regs + 6
        body = f"{head} {{{d_ops}}}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, %{tb};"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB)'
        sig = (f"template <int TB> __device__ __forceinline__ void wg_rs(float* d, const unsigned* a, "
               f"unsigned long long db, int scale_d, {ctype}, WgN<{n}>)")
    return (f"{sig} {{\n"
            f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p}, 0;\\n{body}\\n}}\\n"\n'
            f"                 : {outs}\n"
            f"                 : {ins} : \"memory\");\n}}\n")


def _map_functions() -> str:
    return (f"__device__ __forceinline__ int wg_acc_row(int tid, int i) {{ return {ACC_ROW}; }}\n"
            f"__device__ __forceinline__ int wg_acc_col(int tid, int i) {{ return {ACC_COL}; }}\n"
            f"__device__ __forceinline__ int wg_a_row(int tid, int j) {{ return {A_ROW}; }}\n"
            f"__device__ __forceinline__ int wg_a_col(int tid, int j, int h) {{ return {A_COL}; }}\n"
            "// byte offset of 16-bit element (r, c) of a swizzled tile of `rows` rows (tile_offset in Python)\n"
            "template <int swb> __device__ __forceinline__ int wg_tile_off(int r, int c, int rows) {\n"
            f"    const int o = {TILE_LINEAR};\n"
            f"    return {SWIZZLE};\n}}\n")


WGMMA_HEADER = (HELPERS + """
template <int N> struct WgN {};

// Ordinary (and cp.async) writes to shared memory that wgmma (the async proxy) reads next: each writing thread
// fences before the barrier (PTX ISA "Async proxy"; HOPPER.md).
__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\\n" :: "n"(N) : "memory");
}
// Keep the compiler from moving accesses of accumulator registers across wgmma (CUTLASS warpgroup_fence_operand).
template <int N> __device__ __forceinline__ void wg_fence_regs(float* d) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
template <int N> __device__ __forceinline__ void wg_fence_regs(unsigned* d) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i]) :: "memory");
}
""" + _desc_function() + _map_functions()
    + "".join(_wgmma_function(kind, n, ab, ctype) for kind in ("ss", "rs") for n in WGMMA_N for ab, ctype in AB_TYPES))

SOURCE = """
    constexpr int NWG = BQ / 64;             // warpgroups, 64 query rows each
    constexpr int NT = NWG * 128;
    constexpr int SWB = D >= 64 ? 128 : 64;  // swizzle span: 128-byte rows (64-byte at D=32): tile_swizzle_bytes
    constexpr int SWE = SWB / 2;             // elements per swizzle-atom row
    constexpr unsigned SW_MODE = SWB == 128 ? 1u : 2u;
    constexpr int Q_BYTES = BQ * D * 2;
    constexpr int KV_BYTES = BK * D * 2;
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    // The swizzle pattern repeats every 1024 bytes and the descriptors say base offset 0: align at run time
    // (ALIGN_PAD extra bytes are requested).
    unsigned char* smem = wg_smem_raw + ((1024u - (fa2_smem(wg_smem_raw) & 1023u)) & 1023u);
    unsigned char* q_s = smem;
    unsigned char* k_s = q_s + Q_BYTES;
    unsigned char* v_s = k_s + KV_BYTES;
    const T tag = T(0.0f);
""" + PROLOGUE + """
    const int wg = warp / 4;                 // this thread's warpgroup
    const int wtid = tid % 128;              // its index in the warpgroup (the fragment maps' tid)
    const int row_a = q0 + wg * 64 + wg_acc_row(wtid, 0);  // this thread's rows: row_a and row_a + 8

    auto load_tile = [&](unsigned char* dst, const T* src, int row0, int rows, int limit) {
        for (int i = tid; i < rows * (D / 8); i += NT) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8;
            const bool ok = row0 + r < limit;
            fa2_cp16(dst + wg_tile_off<SWB>(r, c, rows), src + (size_t)(ok ? row0 + r : 0) * D + c, ok);
        }
    };

    const int last_row = min(q0 + BQ, S_q) - 1;
    const int kv_end = min(S_kv, last_row + q_align + 1);
    const int n_chunks = (kv_end + BK - 1) / BK;

    const unsigned q_addr = fa2_smem(q_s);
    const unsigned k_addr = fa2_smem(k_s);
    const unsigned v_addr = fa2_smem(v_s);

    float o[D / 2];
    float s[BK / 2];
    float m_run[2] = {FA2_NEG_INF, FA2_NEG_INF};
    float l_run[2] = {0.0f, 0.0f};           // this thread's partial row sums, reduced at the end
    #pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    #pragma unroll
    for (int i = 0; i < BK / 2; ++i) s[i] = 0.0f;

    load_tile(q_s, qg, q0, BQ, S_q);
    load_tile(k_s, kg, 0, BK, S_kv);
    fa2_commit();                          // group: Q and the first K
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
        const int k0 = chunk * BK;
        load_tile(v_s, vg, k0, BK, S_kv);
        fa2_commit();
        fa2_wait<1>();                      // Q and this chunk's K have landed
        wg_fence_proxy();
        __syncthreads();

        // S = Q K^T: A = Q (64 x D), B = K (BK x D), both K-major; one k16 step = 32 bytes into a 128-byte row,
        // the next column block (64 elements) BQ or BK rows further on.
        wg_fence_regs<BK / 2>(s);
        wg_fence();
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const int c = kk * 16;
            const unsigned long long da = wg_desc(q_addr + (QK_A_START), KMAJOR_LBO, KMAJOR_SBO, SW_MODE);
            const unsigned long long db = wg_desc(k_addr + (QK_B_START), KMAJOR_LBO, KMAJOR_SBO, SW_MODE);
            wg_ss<0, 0>(s, da, db, kk > 0 ? 1 : 0, tag, WgN<BK>());
        }
        wg_commit();
        wg_wait<0>();
        wg_fence_regs<BK / 2>(s);
        __syncthreads();                      // every warpgroup is done with K
        const bool more = chunk + 1 < n_chunks;
        if (more) load_tile(k_s, kg, k0 + BK, BK, S_kv);  // the next K loads during softmax and P V
        fa2_commit();

        // Online softmax: s[i] is row row_a + 8 * ((i / 2) % 2), key k0 + wg_acc_col(wtid, i).
        const bool need_mask = k0 + BK > S_kv || k0 + BK - 1 > q0 + q_align;
        float m_loc[2] = {FA2_NEG_INF, FA2_NEG_INF};
        #pragma unroll
        for (int i = 0; i < BK / 2; ++i) {
            float sv = s[i] * scale_log2;
            if (need_mask) {
                const int key = k0 + wg_acc_col(wtid, i);
                const int row = row_a + 8 * ((i / 2) % 2);
                if (key >= S_kv || key > row + q_align) sv = FA2_NEG_INF;
            }
            s[i] = sv;
            m_loc[(i / 2) % 2] = fmaxf(m_loc[(i / 2) % 2], sv);
        }
        float m_safe[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_loc[h] = fmaxf(m_loc[h], __shfl_xor_sync(0xffffffff, m_loc[h], 1));
            m_loc[h] = fmaxf(m_loc[h], __shfl_xor_sync(0xffffffff, m_loc[h], 2));
            const float m_new = fmaxf(m_run[h], m_loc[h]);
            m_safe[h] = m_new == FA2_NEG_INF ? 0.0f : m_new;
            const float alpha = fa2_exp2(m_run[h] - m_safe[h]);
            m_run[h] = m_new;
            l_run[h] *= alpha;
            #pragma unroll
            for (int i = 0; i < D / 2; ++i) {
                if ((i / 2) % 2 == h) o[i] *= alpha;
            }
        }
        // P in registers: the accumulators of keys 16 j .. 16 j + 15 are, in order, the A fragment of k step j.
        unsigned pa[BK / 16][4];
        #pragma unroll
        for (int j = 0; j < BK / 16; ++j) {
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                const float p0 = fa2_exp2(s[8 * j + 2 * r] - m_safe[r % 2]);
                const float p1 = fa2_exp2(s[8 * j + 2 * r + 1] - m_safe[r % 2]);
                l_run[r % 2] += p0 + p1;
                pa[j][r] = fa2_pack(p0, p1, tag);
            }
        }

        if (more) fa2_wait<1>(); else fa2_wait<0>();  // this chunk's V has landed
        wg_fence_proxy();
        __syncthreads();
        // O += P V: A = P (registers), B = V (BK x D, D contiguous: MN-major, imm-trans-b = 1); LBO = the distance
        // between 64-wide column blocks of V, SBO = between groups of 8 keys; one k16 step = 16 rows of V.
        wg_fence_regs<D / 2>(o);
        wg_fence_regs<BK / 4>(&pa[0][0]);
        wg_fence();
        #pragma unroll
        for (int j = 0; j < BK / 16; ++j) {
            const unsigned long long db = wg_desc(v_addr + (PV_B_START), PV_LBO, PV_SBO, SW_MODE);
            wg_rs<1>(o, pa[j], db, 1, tag, WgN<D>());
        }
        wg_commit();
        wg_wait<0>();
        wg_fence_regs<D / 2>(o);
        __syncthreads();                      // every warpgroup is done with V before the next chunk's V
    }

    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int row = row_a + 8 * h;
        if (row >= S_q) continue;
        T* orow = og + (size_t)row * D;
        #pragma unroll
        for (int i = 0; i < D / 2; i += 4) {   // registers i, i + 1 (row half 0) and i + 2, i + 3 (half 1)
            const int col = wg_acc_col(wtid, i);
            *reinterpret_cast<unsigned*>(orow + col) = fa2_pack(o[i + 2 * h] * inv, o[i + 2 * h + 1] * inv, tag);
        }
    }
"""
for _name, _expr in (("QK_A_START", QK_A_START), ("QK_B_START", QK_B_START), ("KMAJOR_LBO", KMAJOR_LBO),
                     ("KMAJOR_SBO", KMAJOR_SBO), ("PV_B_START", PV_B_START), ("PV_LBO", PV_LBO), ("PV_SBO", PV_SBO)):
    SOURCE = SOURCE.replace(_name, f"({_expr})")


def smem_bytes(BQ: int, BK: int, D: int) -> int:
    """Dynamic shared memory of one block: the Q tile, one K and one V chunk, and the 1024-byte alignment pad."""
    return (BQ + 2 * BK) * D * 2 + ALIGN_PAD


@functools.cache
def _kernel(dynamic_bytes: int) -> CudaKernel:
    """One kernel object per dynamic shared-memory size (the request is a property of the kernel object)."""
    return CudaKernel(f"flash_prefill_wgmma_dyn{dynamic_bytes}", ["q", "k", "v", "dims", "scale"], ["out"], SOURCE,
                      WGMMA_HEADER, ensure_row_contiguous=True, shared_memory=dynamic_bytes, arch_suffix="a")


def check_tiles(S_q: int, S_kv: int, D: int, BQ: int, BK: int) -> None:
    """Refuse, before any launch, the tiles and shapes this kernel does not handle (ValueError)."""
    if BQ <= 0 or BQ % 64:
        raise ValueError(f"flash_attention_wgmma: BQ={BQ} must be a multiple of 64 (one warpgroup per 64 rows)")
    if BK <= 0 or BK % 16:
        raise ValueError(f"flash_attention_wgmma: BK={BK} must be a multiple of 16 (P V takes keys 16 at a time)")
    if BK not in WGMMA_N:
        raise ValueError(f"flash_attention_wgmma: BK={BK} must be one of {WGMMA_N} (the generated wgmma n)")
    check_launch("flash_attention_wgmma", S_q, S_kv, D, smem_bytes(BQ, BK, D), f"BQ={BQ} BK={BK}",
                 limit=WGMMA_SMEM_LIMIT)
    if BQ // 64 * 128 > 1024:
        raise ValueError(f"flash_attention_wgmma: BQ={BQ} needs {BQ // 64 * 128} threads a block (at most 1024)")
    assert D in WGMMA_N, D  # HEAD_DIMS == WGMMA_N: the O += P V instruction exists for every head dim


def flash_attention_wgmma(q, k, v, scale: float, BQ: int, BK: int):
    """Causal (tail-aligned) attention with the wgmma kernel; q (B,H,S_q,D), k/v (B,H,S_kv,D), fp16/bf16."""
    import mlx.core as mx

    B, H, S_q, D = q.shape
    S_kv = k.shape[2]
    check_tiles(S_q, S_kv, D, BQ, BK)
    threads = BQ // 64 * 128
    (out,) = _kernel(smem_bytes(BQ, BK, D))(
        inputs=[q, k, v, mx.array([S_q, S_kv], dtype=mx.int32), mx.array([scale], dtype=mx.float32)],
        template=[("T", q.dtype), ("BQ", BQ), ("BK", BK), ("D", D)],
        grid=(-(-S_q // BQ) * threads, B * H, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    return out


def wgmma_unavailable() -> str | None:
    """Why the wgmma kernels cannot run here: no CUDA, or a GPU other than compute capability 9.x (sm_90a)."""
    reason = cuda_unavailable()
    if reason:
        return reason
    import mlx.core as mx

    info = mx.device_info()
    major = info.get("compute_capability_major")
    if major != 9:
        return f"wgmma needs compute capability 9.x (sm_90a); this GPU is {info.get('architecture', major)}"
    return None


def make_wgmma_variant(BQ: int, BK: int) -> Variant:
    def fn(q, k, v, scale):
        return flash_attention_wgmma(q, k, v, scale, BQ, BK)

    return Variant(name=f"cuda_wgmma_bq{BQ}_bk{BK}", fn=fn, params={"BQ": BQ, "BK": BK}, backend="cuda",
                   requires=wgmma_unavailable, dtypes=("float16", "bfloat16"))


def wgmma_variants() -> list[Variant]:
    """Every candidate tile (:data:`REGISTERED` are registered; ``bench/gpu_flash_bench.py --candidates`` adds
    the rest)."""
    return [make_wgmma_variant(bq, bk) for bq in BQ_CHOICES for bk in BK_CHOICES
            if smem_bytes(bq, bk, max(HEAD_DIMS)) <= WGMMA_SMEM_LIMIT]


register_variants([v for v in wgmma_variants() if v.name in REGISTERED])
