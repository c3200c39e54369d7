"""The CUDA flash prefill variants (kernels.flash_cuda: WMMA; kernels.flash_cuda_mma: mma.sync/cp.async).

They only run where MLX has a CUDA device. Here (CPU backend) they must register, fit the static shared
memory, be skipped with the reason, and refuse bad shapes before any kernel launch. What they compute on a
real H200 is checked on the recorded outputs of that machine (reports/examples/).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from kernels import REGISTRY, flash_cuda, flash_cuda_mma

KERNEL = REGISTRY["flash_prefill"]
EXAMPLES = Path(__file__).resolve().parent.parent / "reports" / "examples"
FAMILIES = {
    "wmma": (flash_cuda.cuda_variants, flash_cuda.smem_bytes, flash_cuda.flash_attention_cuda, "cuda_bq"),
    "mma": (flash_cuda_mma.mma_variants, flash_cuda_mma.smem_bytes, flash_cuda_mma.flash_attention_mma,
            "cuda_mma_bq"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_variant_is_registered_and_fits_static_shared_memory(family):
    variants_of, smem_bytes, _, prefix = FAMILIES[family]
    names = [v.name for v in variants_of()]
    assert names and all(name.startswith(prefix) and name in KERNEL.variants for name in names)
    for variant in variants_of():
        BQ, BK = variant.params["BQ"], variant.params["BK"]
        assert all(smem_bytes(BQ, BK, D) <= flash_cuda.STATIC_SMEM_LIMIT for D in flash_cuda.HEAD_DIMS)
        assert variant.backend == "cuda" and variant.dtypes == ("float16", "bfloat16")


def test_mma_tiles_are_whole_warps_and_mma_steps():
    for variant in flash_cuda_mma.mma_variants():
        BQ, BK, WM = variant.params["BQ"], variant.params["BK"], variant.params["WM"]
        assert BQ % (16 * WM) == 0 and BK % 16 == 0  # one warp per 16*WM rows; P V takes keys 16 at a time
        assert variant.name.endswith("" if WM == 1 else f"_r{16 * WM}")


def test_shared_memory_counts_the_q_tile():
    assert flash_cuda_mma.smem_bytes(128, 32, 128) == 128 * 128 * 2  # staged Q (in registers after) > K + V
    assert flash_cuda_mma.smem_bytes(64, 64, 128) == 2 * 64 * 128 * 2
    assert flash_cuda_mma.smem_bytes(128, 32, 128, WM=2) == (128 + 2 * 32) * 128 * 2  # Q stays in smem


def test_swizzled_smem_rows_keep_every_chunk_and_ldmatrix_hits_eight_bank_groups():
    """The kernel's ``at(r, c)`` (unpadded rows, 16-byte chunk index XOR a row function), in Python."""
    for D in flash_cuda.HEAD_DIMS:
        chunks = D // 8
        period = min(chunks, 8)

        def at(r, c, D=D, period=period):
            return r * D + (((c >> 3) ^ ((r // (8 // period)) % period)) << 3)

        for r in range(64):
            assert sorted(at(r, c) for c in range(0, D, 8)) == list(range(r * D, (r + 1) * D, 8))
        for r0 in range(0, 64, 8):  # one 8x8 ldmatrix: 8 rows, same logical chunk -> 8 distinct bank groups
            for c in range(0, D, 8):
                assert len({(at(r0 + i, c) * 2 // 16) % 8 for i in range(8)}) == 8


@pytest.mark.parametrize("source", [flash_cuda.HEADER, flash_cuda.SOURCE, flash_cuda_mma.HEADER,
                                    flash_cuda_mma.SOURCE])
def test_cuda_source_has_no_broken_string_literal(source):
    """A Python escape slip (\\n written as a real newline inside an asm string) only fails at JIT time."""
    assert all(line.count('"') % 2 == 0 for line in source.splitlines())


@pytest.mark.skipif(hasattr(mx, "cuda") and mx.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("family", FAMILIES)
def test_skipped_with_the_reason_without_cuda(family):
    for variant in FAMILIES[family][0]():
        assert variant.unsupported("float16") == "CUDA not available"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("q_shape", "kv_shape", "BQ", "BK", "words"), [
    ((1, 1, 8, 48), (1, 1, 8, 48), 64, 32, "head dim 48"),
    ((1, 1, 9, 64), (1, 1, 8, 64), 64, 32, "S_q=9 > S_kv=8"),
    ((1, 1, 8, 128), (1, 1, 8, 128), 128, 256, "shared memory"),
])
def test_bad_shapes_are_refused_before_launch(family, q_shape, kv_shape, BQ, BK, words):
    attention = FAMILIES[family][2]
    q, kv = mx.zeros(q_shape, dtype=mx.float16), mx.zeros(kv_shape, dtype=mx.float16)
    with pytest.raises(ValueError, match=words):
        attention(q, kv, kv, 0.125, BQ, BK)
