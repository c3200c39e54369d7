"""The wgmma flash kernel (kernels.flash_cuda_wgmma) and its GEMM probe, checked without a GPU.

Nothing here runs the kernel: these tests check what can be known on a CPU (and, where the CUDA toolkit is
installed, what ptxas says of the sm_90a build). Shapes and tiles are refused before any
launch; the two tiles measured fastest on the H200 are registered and all skip with the reason where there is no
sm_90 GPU; shared memory fits; and the
layout model the kernel is built on -- descriptor bit fields, the 128B/64B swizzle, the accumulator and A-register
fragment maps, and the descriptors the kernel and the probe pass for each k16 step -- agrees with the PTX ISA.

The last part uses an emulator of how ``wgmma`` reads a shared-memory operand, written from the PTX ISA's
"Canonical Layouts" table (section 9.7.15.5.1.2, in units of T = 8 16-bit elements) and its "Matrix Descriptor
Format", independently of the kernel's own layout functions: it decodes a descriptor, walks the canonical layout,
applies Swizzle<B,4,3> to the address, and must read back exactly the logical matrix the kernel stored. It is only
as right as our reading of that table; the device probe (bench/cuda_wgmma_gemm_probe.py) settled it on the H200
(every case passes; tests/data/recorded/h200-wgmma-gemm.json).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY, flash_cuda
from kernels import flash_cuda_wgmma as wg
from testkit.cuda import nvcc
from testkit.paths import BENCH, ROOT

sys.path.insert(0, str(BENCH))
import cuda_wgmma_gemm_probe as probe  # noqa: E402

KERNEL = REGISTRY["flash_prefill"]
VARIANTS = wg.wgmma_variants()


# ----------------------------------------------------------------------------- variants, sizes, refusals

def test_variants_are_named_by_their_tiles_and_the_measured_best_are_registered():
    names = [v.name for v in VARIANTS]
    assert names == ["cuda_wgmma_bq64_bk64", "cuda_wgmma_bq64_bk128", "cuda_wgmma_bq128_bk64",
                     "cuda_wgmma_bq128_bk128"]
    for variant in VARIANTS:
        assert variant.name == f"cuda_wgmma_bq{variant.params['BQ']}_bk{variant.params['BK']}"
        assert variant.backend == "cuda" and variant.dtypes == ("float16", "bfloat16")
        assert variant.params["BQ"] % 64 == 0 and variant.params["BK"] in wg.WGMMA_N
    # the registered ones are the kernel's own; bench/gpu_flash_bench.py --candidates adds the rest
    assert set(names) & set(KERNEL.variants) == set(wg.REGISTERED) == {"cuda_wgmma_bq128_bk128", "cuda_wgmma_bq64_bk64"}
    assert "flash_cuda_wgmma.wgmma_variants()" in (BENCH / "gpu_flash_bench.py").read_text()
    builtin = (ROOT / "jobs" / "builtin.toml").read_text()
    assert all(f'"{name}"' in builtin for name in wg.REGISTERED)  # timed in the built-in GPU grid


@pytest.mark.skipif(hasattr(mx, "cuda") and mx.cuda.is_available(), reason="this machine has CUDA")
def test_skipped_with_the_reason_without_cuda():
    for variant in VARIANTS:
        assert variant.unsupported("float16") == "CUDA not available"
        assert variant.unsupported("float32") == f"variant {variant.name} implements float16, bfloat16 only"


def test_shared_memory_fits_and_two_blocks_share_an_sm_at_head_dim_128():
    assert wg.smem_bytes(64, 64, 128) == (64 + 2 * 64) * 128 * 2 + 1024
    assert wg.smem_bytes(128, 128, 128) == (128 + 2 * 128) * 128 * 2 + 1024
    for variant in VARIANTS:
        BQ, BK = variant.params["BQ"], variant.params["BK"]
        for D in flash_cuda.HEAD_DIMS:
            assert wg.smem_bytes(BQ, BK, D) <= wg.WGMMA_SMEM_LIMIT == 227 * 1024
        assert 2 * wg.smem_bytes(BQ, BK, 128) <= 228 * 1024  # an H100/H200 SM has 228 KB of shared memory


@pytest.mark.parametrize(("q_shape", "kv_shape", "BQ", "BK", "words"), [
    ((1, 1, 8, 128), (1, 1, 8, 128), 96, 64, "BQ=96 must be a multiple of 64"),
    ((1, 1, 8, 128), (1, 1, 8, 128), 64, 40, "BK=40 must be a multiple of 16"),
    ((1, 1, 8, 128), (1, 1, 8, 128), 64, 48, r"BK=48 must be one of \(32, 64, 128\)"),
    ((1, 1, 8, 48), (1, 1, 8, 48), 64, 64, "head dim 48"),
    ((1, 1, 9, 64), (1, 1, 8, 64), 64, 64, "S_q=9 > S_kv=8"),
    ((1, 1, 8, 128), (1, 1, 8, 128), 1024, 128, r"needs 328704 B of shared memory \(dynamic limit 232448\)"),
    ((1, 1, 8, 32), (1, 1, 8, 32), 1024, 128, "needs 2048 threads"),
])
def test_bad_tiles_and_shapes_are_refused_before_launch(q_shape, kv_shape, BQ, BK, words):
    q, kv = mx.zeros(q_shape, dtype=mx.float16), mx.zeros(kv_shape, dtype=mx.float16)
    with pytest.raises(ValueError, match=words):
        wg.flash_attention_wgmma(q, kv, kv, 0.125, BQ, BK)


# ----------------------------------------------------------------------------- descriptor bit fields

def test_descriptor_fields_are_the_ptx_isa_table():
    # PTX ISA "Matrix Descriptor Format": 13-0 start, 29-16 LBO, 45-32 SBO, 51-49 base offset, 63-62 swizzle
    assert wg.DESC_FIELDS == (("start", 0, 14), ("lbo", 16, 14), ("sbo", 32, 14), ("base_offset", 49, 3),
                              ("swizzle", 62, 2))
    assert wg.SWIZZLE_MODE == {0: 0, 128: 1, 64: 2, 32: 3}  # 0 none, 1 128B, 2 64B, 3 32B
    # matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4, and the worked examples of the ISA's layout section
    assert wg.desc_encode(64 * 4) == 16 and wg.desc_encode(32 * 4) == 8          # K-major no swizzle, tf32
    assert wg.desc_encode(256 * 2) == 32 and wg.desc_encode(512 * 2) == 64       # MN-major 64B swizzle, bf16
    assert wg.desc_encode(0x40000 + 0x420) == 0x42                               # only 18 address bits count
    # start 0x420, LBO 16 ("assumed 1"), SBO 1024, 128B swizzle, worked out by hand
    assert wg.make_desc(0x420, 16, 1024, 128) == 0x4000_0040_0001_0042
    assert wg.make_desc(0x420, 16, 1024, 64) == 0x8000_0040_0001_0042
    with pytest.raises(ValueError, match="base_offset"):
        wg.make_desc(0, 16, 1024, 128, base_offset=8)


def test_the_cuda_descriptor_function_uses_the_same_fields():
    body = wg.WGMMA_HEADER[wg.WGMMA_HEADER.index("wg_desc(unsigned addr"):]
    body = body[:body.index("}")]
    assert "(desc_enc(addr) << 0)" in body and "(desc_enc(lbo) << 16)" in body and "(desc_enc(sbo) << 32)" in body
    assert "(0ull << 49)" in body and "((unsigned long long)mode << 62)" in body
    assert "(x & 0x3FFFF) >> 4" in wg.WGMMA_HEADER


# ----------------------------------------------------------------------------- swizzle

def cute_swizzle(addr: int, bits: int) -> int:
    """CUTLASS ``Swizzle<B,4,3>``: XOR address bits [7, 7+B) into bits [4, 4+B) (cute/swizzle.hpp)."""
    yyy = ((1 << bits) - 1) << 7
    return addr ^ ((addr & yyy) >> 3)


@pytest.mark.parametrize(("swb", "bits"), [(128, 3), (64, 2), (32, 1)])
def test_swizzle_is_cutlass_swizzle_b43(swb, bits):
    for addr in range(0, 16384, 2):
        assert wg.swizzle(addr, swb) == cute_swizzle(addr, bits)
    assert wg.swizzle(1234, 0) == 1234


@pytest.mark.parametrize("D", flash_cuda.HEAD_DIMS)
@pytest.mark.parametrize("rows", [64, 128])
def test_tile_layout_is_a_bijection_onto_the_tile(D, rows):
    swb = wg.tile_swizzle_bytes(D)
    offsets = [wg.tile_offset(r, c, rows, swb) for r in range(rows) for c in range(D)]
    assert sorted(offsets) == list(range(0, rows * D * 2, 2))


def test_128b_swizzle_moves_16_byte_chunk_c_of_row_r_to_c_xor_r_mod_8():
    for r in range(64):
        for c in range(128):
            block, cc = divmod(c, 64)
            expect = block * 64 * 128 + r * 128 + (((cc // 8) ^ (r % 8)) * 8 + cc % 8) * 2
            assert wg.tile_offset(r, c, 64, 128) == expect


@pytest.mark.parametrize("D", flash_cuda.HEAD_DIMS)
def test_a_cp_async_chunk_stays_contiguous_and_eight_rows_hit_eight_bank_groups(D):
    swb = wg.tile_swizzle_bytes(D)
    for r in range(64):
        for c8 in range(0, D, 8):
            base = wg.tile_offset(r, c8, 64, swb)
            assert base % 16 == 0
            assert [wg.tile_offset(r, c8 + e, 64, swb) for e in range(8)] == [base + 2 * e for e in range(8)]
    for r0 in range(0, 64, 8):  # the 16-byte chunk c of 8 consecutive rows: distinct bank groups (of 8)
        for c8 in range(0, D, 8):
            groups = {(wg.tile_offset(r0 + i, c8, 64, swb) // 16) % 8 for i in range(8)}
            assert len(groups) == 8


# ----------------------------------------------------------------------------- fragment maps

@pytest.mark.parametrize("N", wg.WGMMA_N)
def test_accumulator_map_covers_the_64_by_n_tile_once(N):
    seen = [wg.acc_coord(tid, i) for tid in range(128) for i in range(N // 2)]
    assert sorted(seen) == [(r, c) for r in range(64) for c in range(N)]


def test_accumulator_map_matches_the_ptx_figure():
    # Figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D": warp w rows 16w..16w+15,
    # lane l: row l/4 (+8 for d2,d3), columns 2(l%4), +1, repeated every 8 columns (d4..d7, ...)
    assert [wg.acc_coord(0, i) for i in range(8)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert wg.acc_coord(5, 0) == (1, 2) and wg.acc_coord(32, 0) == (16, 0) and wg.acc_coord(127, 31) == (63, 63)


def test_the_kernel_s_uses_of_the_accumulator_map():
    for tid in range(128):
        for i in range(64):
            row, col = wg.acc_coord(tid, i)
            assert row == wg.acc_coord(tid, 0)[0] + 8 * ((i // 2) % 2)     # the mask's and the softmax's row
            if i % 2 == 0:
                assert wg.acc_coord(tid, i + 1) == (row, col + 1)          # packed 2-element stores of O
            if i % 4 == 0:
                assert wg.acc_coord(tid, i + 2) == (row + 8, col)          # o[i + 2h] is row + 8h, same column
    for row in range(64):  # the 4 threads of a row differ only in bits 0-1: __shfl_xor 1 and 2 reduce a row
        holders = {tid for tid in range(128) for i in range(32) if wg.acc_coord(tid, i)[0] == row}
        base = min(holders)
        assert holders == {base, base ^ 1, base ^ 2, base ^ 3} and base % 4 == 0


def test_a_register_map_covers_the_64_by_16_tile_once_and_matches_the_ptx_figure():
    seen = [wg.a_coord(tid, j, h) for tid in range(128) for j in range(4) for h in range(2)]
    assert sorted(seen) == [(r, c) for r in range(64) for c in range(16)]
    # Figure "WGMMA .m64nNk16 register fragment layout for matrix A": a0,a1 row l/4, a2,a3 row +8, a4..a7 col +8
    assert [wg.a_coord(0, j, h) for j in range(4) for h in range(2)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8),
                                                                        (0, 9), (8, 8), (8, 9)]
    assert wg.a_coord(6, 0, 1) == (1, 5) and wg.a_coord(64, 3, 0) == (32 + 8, 8)


@pytest.mark.parametrize("BK", [32, 64, 128])
def test_p_accumulators_are_the_a_fragments_of_p_v_in_order(BK):
    """The kernel packs s[8j + 2r], s[8j + 2r + 1] into A register r of k step j: that element must be P's
    (row, key 16 j + column) of the A fragment."""
    for tid in range(128):
        for j in range(BK // 16):
            for r in range(4):
                for h in range(2):
                    a_row, a_col = wg.a_coord(tid, r, h)
                    assert wg.acc_coord(tid, 8 * j + 2 * r + h) == (a_row, 16 * j + a_col)


# ----------------------------------------------------------------------------- wgmma operand emulator

def decode(desc: int) -> tuple[int, int, int, int]:
    """(start, LBO, SBO, swizzle bytes) from the bit positions of the PTX ISA table (not from DESC_FIELDS)."""
    assert (desc >> 49) & 0b111 == 0  # base offset: our tiles start on the pattern's boundary
    fields = [((desc >> first) & 0x3FFF) << 4 for first in (0, 16, 32)]
    return fields[0], fields[1], fields[2], {0: 0, 1: 128, 2: 64, 3: 32}[desc >> 62]


def read_operand(mem: np.ndarray, desc: int, major: str, mn: int) -> np.ndarray:
    """The (mn x 16) operand one k16 wgmma reads: x along M or N, y along K. PTX ISA canonical layouts, T = 8:
    K-major none ((8,m),(T,2k)):((1T,SBO),(1,LBO)); K-major swizzled ((8,m),(T,2k)):((S*T,SBO),(1,T));
    MN-major none ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)); MN-major swizzled ((T,S,m),(8,k)):((1,T,LBO),(S*T,SBO)),
    S = swizzle bytes / 16, offsets in elements; then Swizzle<log2 S,4,3> on the byte address."""
    start, lbo, sbo, swb = decode(desc)
    T, S = 8, swb // 16
    lbo_e, sbo_e = lbo // 2, sbo // 2
    x, y = np.meshgrid(np.arange(mn), np.arange(16), indexing="ij")
    if major == "K":
        off = ((x % 8) * T + (x // 8) * sbo_e + y % T + (y // T) * lbo_e if not swb
               else (x % 8) * S * T + (x // 8) * sbo_e + y)
    else:
        off = (x % T + (x // T) * sbo_e + (y % 8) * T + (y // 8) * lbo_e if not swb
               else x % (T * S) + (x // (T * S)) * lbo_e + (y % 8) * S * T + (y // 8) * sbo_e)
    addr = start + 2 * off
    if swb:
        addr = cute_swizzle(addr, S.bit_length() - 1)
    inside = (addr >= 0) & (addr // 2 < mem.size)
    return np.where(inside, mem[np.clip(addr // 2, 0, mem.size - 1)], np.nan)  # outside the tile: never right


def store(matrix: np.ndarray, offset, size: int) -> np.ndarray:
    """Shared memory (in 2-byte elements) holding ``matrix`` where ``offset(r, c)`` (bytes) says."""
    mem = np.full(size // 2, np.nan)
    for r in range(matrix.shape[0]):
        for c in range(matrix.shape[1]):
            mem[offset(r, c) // 2] = matrix[r, c]
    return mem


def emulate_probe_case(case: probe.Case, rng) -> tuple[np.ndarray, np.ndarray]:
    """What the probe kernel would compute, given our reading of the PTX ISA, and the reference."""
    a = rng.standard_normal((64, case.k))
    b = rng.standard_normal((case.n, case.k) if case.b_major == "K" else (case.k, case.n))
    b_rows = b.shape[0]
    a_mem = store(a, lambda r, c: probe.layout_offset(case.layout, r, c, 64), probe.tile_bytes(case.layout, *a.shape))
    b_mem = store(b, lambda r, c: probe.layout_offset(case.layout, r, c, b_rows),
                  probe.tile_bytes(case.layout, *b.shape))
    d = np.zeros((64, case.n))
    for ks in range(case.k // 16):
        if case.a_src == "regs":
            a_op = a[:, 16 * ks:16 * ks + 16]
        else:
            start, lbo, sbo, swb = probe.kmajor_desc_args(case, 64, ks)
            a_op = read_operand(a_mem, wg.make_desc(start, lbo, sbo, swb), "K", 64)
        args = probe.kmajor_desc_args(case, b_rows, ks) if case.b_major == "K" else probe.mn_desc_args(case, ks)
        b_op = read_operand(b_mem, wg.make_desc(*args), case.b_major, case.n)
        d += a_op @ b_op.T
    return d, a @ (b.T if case.b_major == "K" else b)


@pytest.mark.parametrize("case", probe.CASES, ids=lambda c: c.name)
def test_each_probe_case_computes_its_product_under_the_ptx_layouts(case):
    out, ref = emulate_probe_case(case, np.random.default_rng(7))
    ok = bool(np.all(np.isfinite(out))) and np.allclose(out, ref)
    assert ok == (case.expect == "pass"), case.name  # the swapped-LBO/SBO diagnostic must read the wrong matrix


def test_the_emulator_notices_an_unswizzled_tile_behind_a_swizzled_descriptor():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 64))
    plain = store(a, lambda r, c: r * 128 + c * 2, a.size * 2)  # what a kernel that forgot the swizzle would store
    assert not np.allclose(read_operand(plain, wg.make_desc(0, 16, 1024, 128), "K", 64), a[:, :16])


@pytest.mark.parametrize(("BQ", "BK", "D"), [(64, 64, 128), (128, 64, 128), (128, 128, 128), (128, 64, 64),
                                             (64, 128, 32)])
def test_the_flash_kernel_descriptors_read_q_k_and_v(BQ, BK, D):
    """For every k16 step: the Q rows of each warpgroup and the K columns of S = Q K^T, and the V rows of O += P V,
    read through the kernel's descriptors from tiles stored as its cp.async loop stores them."""
    rng = np.random.default_rng(BQ + BK + D)
    swb = wg.tile_swizzle_bytes(D)
    q, k, v = rng.standard_normal((BQ, D)), rng.standard_normal((BK, D)), rng.standard_normal((BK, D))
    q_mem = store(q, lambda r, c: wg.tile_offset(r, c, BQ, swb), q.size * 2)
    k_mem = store(k, lambda r, c: wg.tile_offset(r, c, BK, swb), k.size * 2)
    v_mem = store(v, lambda r, c: wg.tile_offset(r, c, BK, swb), v.size * 2)
    for w in range(BQ // 64):
        for kk in range(D // 16):
            (a_start, lbo, sbo), (b_start, b_lbo, b_sbo) = wg.qk_descriptor(w, kk, BQ, BK, D)
            a_op = read_operand(q_mem, wg.make_desc(a_start, lbo, sbo, swb), "K", 64)
            assert np.array_equal(a_op, q[64 * w:64 * w + 64, 16 * kk:16 * kk + 16])
            b_op = read_operand(k_mem, wg.make_desc(b_start, b_lbo, b_sbo, swb), "K", BK)
            assert np.array_equal(b_op, k[:, 16 * kk:16 * kk + 16])
    for j in range(BK // 16):
        start, lbo, sbo = wg.pv_descriptor(j, BK, D)
        b_op = read_operand(v_mem, wg.make_desc(start, lbo, sbo, swb), "MN", D)
        assert np.array_equal(b_op, v[16 * j:16 * j + 16, :].T)


def test_the_kernel_source_pastes_the_tested_descriptor_expressions():
    for name, expr in (("QK_A_START", wg.QK_A_START), ("QK_B_START", wg.QK_B_START), ("PV_B_START", wg.PV_B_START),
                       ("PV_LBO", wg.PV_LBO), ("KMAJOR_SBO", wg.KMAJOR_SBO)):
        assert name not in wg.SOURCE and f"({expr})" in wg.SOURCE
    for name in ("ACC_COL", "A_ROW", "A_COL", "SWIZZLE", "TILE_LINEAR"):
        assert getattr(wg, name) in wg.WGMMA_HEADER
    assert "constexpr int SWB = D >= 64 ? 128 : 64;" in wg.SOURCE  # tile_swizzle_bytes


# ----------------------------------------------------------------------------- generated instructions

def wgmma_functions() -> list[str]:
    return re.findall(r"template <int T[AB][^\n]*\n    asm volatile\(.*?\);\n}", wg.WGMMA_HEADER, flags=re.S)


def test_every_generated_wgmma_names_each_operand_once():
    functions = wgmma_functions()
    assert len(functions) == 2 * len(wg.WGMMA_N) * 2  # ss/rs x n x f16/bf16
    for text in functions:
        n = int(re.search(r"m64n(\d+)k16", text).group(1))
        operands = len(re.findall(r'"[+=]?[frln]"\(', text))
        assert operands == n // 2 + (5 if "wg_ss" in text else 7)
        template = re.search(r'asm volatile\("(.*?)"\n', text, flags=re.S).group(1)
        used = [int(x) for x in re.findall(r"%(\d+)", template)]
        assert sorted(used) == list(range(operands)), text[:120]
        ab = "bf16" if "__nv_bfloat16" in text else "f16"
        assert f".f32.{ab}.{ab} " in template
        assert (", p, 1, 1, %" in template) and template.count("setp.ne.b32 p") == 1


@pytest.mark.parametrize("source", [wg.WGMMA_HEADER, wg.SOURCE, probe.PROBE_HEADER,
                                    *(probe.gemm_source(c)[0] for c in probe.CASES)])
def test_cuda_source_has_no_broken_string_literal(source):
    assert all(line.count('"') % 2 == 0 for line in source.splitlines())


CUDA_STUBS = r"""
#include <cstddef>
#define asm(...) ((void)0)
#define volatile
#define __device__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __shared__
struct __half { unsigned short x; __half() {} __half(float) {} };
struct __nv_bfloat16 { unsigned short x; __nv_bfloat16() {} __nv_bfloat16(float) {} };
struct __half2 { __half a, b; };
struct __nv_bfloat162 { __nv_bfloat16 a, b; };
inline __half2 __floats2half2_rn(float, float) { return __half2(); }
inline __nv_bfloat162 __floats2bfloat162_rn(float, float) { return __nv_bfloat162(); }
inline float __int_as_float(int) { return 0.f; }
inline unsigned long __cvta_generic_to_shared(const void*) { return 0; }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
inline void __syncthreads() {}
inline float fmaxf(float a, float b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
struct Dim3 { unsigned x, y, z; };
static Dim3 blockIdx, threadIdx;
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_kernel_sources_parse_as_cpp17_with_cuda_stubbed(tmp_path):
    """No CUDA compiler here: g++ checks the C++ around the asm (templates, overloads on WgN<n> and the element
    tag, lambdas) for every tile and dtype; ptxas, on the device, checks the PTX."""
    from kernels import cuda_compile

    units = []
    for T in ("float16", "bfloat16"):
        for BQ, BK, D in ((64, 64, 128), (128, 128, 64), (128, 64, 32)):
            units.append((wg.SOURCE, wg.WGMMA_HEADER, [("q", T), ("k", T), ("v", T), ("dims", "int32"),
                                                       ("scale", "float32")], [("out", T)],
                          [("T", T), ("BQ", BQ), ("BK", BK), ("D", D)]))
    for case in probe.CASES:
        units.append((probe.gemm_source(case)[0], wg.WGMMA_HEADER + probe.PROBE_HEADER,
                      [("a", case.dtype), ("b", case.dtype)], [("c", "float32")], [("T", case.dtype)]))
    for i, (source, header, inputs, outputs, template) in enumerate(units):
        text = cuda_compile.kernel_source(header, source, inputs, outputs, template)
        text = re.sub(r"#include <cuda_(fp16|bf16)\.h>", "", text.replace(cuda_compile.NAME_PLACEHOLDER, "kern"))
        text = text.replace('extern "C" __global__', 'extern "C"')
        path = tmp_path / f"unit{i}.cpp"
        path.write_text(CUDA_STUBS + text.replace("typedef signed char int8_t;", "").replace(
            "typedef unsigned char uint8_t;", ""))
        result = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wno-unknown-pragmas", str(path)],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[:3000]


def one_unit(kernels: list[tuple[str, str, list, list, list]], header: str) -> str:
    """Several kernels in one translation unit: the prelude and header once, then each ``__global__`` function."""
    from kernels import cuda_compile

    parts = [cuda_compile.PRELUDE + header]
    for name, source, inputs, outputs, template in kernels:
        text = cuda_compile.kernel_source("", source, inputs, outputs, template)
        parts.append(text[len(cuda_compile.PRELUDE):].replace(cuda_compile.NAME_PLACEHOLDER, name))
    return "\n".join(parts)


@pytest.mark.skipif(nvcc() is None, reason="no nvcc")
@pytest.mark.parametrize("unit", ["flash", "probe"])
def test_ptxas_assembles_every_kernel_for_sm_90a_without_spills(unit, tmp_path):
    """Where the CUDA toolkit is installed (no GPU needed), ptxas must accept the wgmma PTX for sm_90a, and the
    kernels must keep their accumulators in registers: no spills, no stack frame, no wgmma serialisation warning."""
    io = [("q", None), ("k", None), ("v", None), ("dims", "int32"), ("scale", "float32")]
    if unit == "flash":
        header = wg.WGMMA_HEADER
        kernels = [(f"flash_{T}_{bq}_{bk}_{D}", wg.SOURCE, [(n, t or T) for n, t in io], [("out", T)],
                    [("T", T), ("BQ", bq), ("BK", bk), ("D", D)])
                   for T, bq, bk, D in [("float16", v.params["BQ"], v.params["BK"], 128) for v in VARIANTS]
                   + [("bfloat16", 128, 64, 128), ("float16", 64, 64, 64), ("float16", 64, 64, 32)]]
    else:
        header = wg.WGMMA_HEADER + probe.PROBE_HEADER
        kernels = [(f"probe_{c.name}", probe.gemm_source(c)[0], [("a", c.dtype), ("b", c.dtype)],
                    [("c", "float32")], [("T", c.dtype)]) for c in probe.CASES]
    path = tmp_path / f"{unit}.cu"
    path.write_text(one_unit(kernels, header))
    result = subprocess.run([nvcc(), "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "--ptxas-options=-v",
                             "-diag-suppress", "177", "-o", str(tmp_path / f"{unit}.cubin"), str(path)],
                            capture_output=True, text=True)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    reports = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", log)
    assert sorted(name for name, *_ in reports) == sorted(name for name, *_ in kernels)
    assert all(frame == stores == loads == "0" for _, frame, stores, loads in reports), reports
    assert "serializ" not in log.lower() and "performance loss" not in log.lower(), log[-4000:]
