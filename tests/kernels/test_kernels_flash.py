"""flash_prefill: every variant on boundary shapes, its checks, broken variants caught, shapes, flops, schedules."""

from __future__ import annotations

import collections

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY, Variant
from kernels import flash_prefill as fp
from kernels.base import check_against_reference, run_variant, to_numpy
from kernels.calibration import graph_primitives

KERNEL = REGISTRY["flash_prefill"]
# The portable MLX variants defined in kernels/flash_prefill.py (other modules may add variants for
# other backends to the same kernel; those carry their own tests).
VARIANTS = sorted(name for name, v in KERNEL.variants.items() if v.backend == "mlx")
FLASH = [name for name in VARIANTS if name.startswith("flash_bq")]
DTYPES = ("float32", "float16")

# (name, shape): first/last token, S_kv not a multiple of BK, query blocks hanging past S_q with a
# KV-cache continuation (S_q < S_kv), a single query row over a longer cache, a square prefill.
BOUNDARY = {
    "one_token": dict(B=1, H=2, S=1, D=8),
    "skv37_square": dict(B=1, H=2, S=37, D=16),
    "sq13_skv37": dict(B=2, H=2, S_q=13, S_kv=37, D=16),
    "sq13_skv36": dict(B=1, H=2, S_q=13, S_kv=36, D=8),
    "sq1_skv20": dict(B=1, H=2, S_q=1, S_kv=20, D=8),
    "square64": dict(B=1, H=1, S=64, D=32),
}


def _ids(d):
    return list(d)


def test_registered():
    assert KERNEL.default_variant == "sdpa"
    required = {f"flash_bq{bq}_bk{bk}" for bq in (8, 16) for bk in (16, 32)}
    assert required <= set(KERNEL.variants)
    assert {"reference", "causal_perturb", "masked_no_nan"} <= set(KERNEL.checks)
    for name in FLASH:
        params = KERNEL.variants[name].params
        assert name == f"flash_bq{params['BQ']}_bk{params['BK']}"


# ----------------------------------------------------------------------------- every variant passes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(BOUNDARY.values()), ids=_ids(BOUNDARY))
@pytest.mark.parametrize("variant", VARIANTS)
def test_reference(variant, shape, dtype):
    res = check_against_reference(KERNEL, KERNEL.variants[variant], shape, dtype)
    assert res.passed, res.detail


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_extra_checks_pass(variant, dtype):
    v = KERNEL.variants[variant]
    for shape in (BOUNDARY["sq13_skv37"], BOUNDARY["sq1_skv20"], BOUNDARY["square64"]):
        for name in ("causal_perturb", "masked_no_nan"):
            res = KERNEL.checks[name](KERNEL, v, shape, dtype)
            assert res.passed, (name, shape, res.detail)


def test_bfloat16_reference_smoke():
    for variant in ("sdpa", "flash_bq8_bk16", "flash_bq32_bk64"):
        res = check_against_reference(KERNEL, KERNEL.variants[variant], BOUNDARY["sq13_skv37"], "bfloat16")
        assert res.passed, res.detail


def test_sdpa_causal_mask_is_tail_aligned():
    """MLX's mask="causal" aligns the last query with the last key (what the sdpa variant relies on)."""
    inputs = KERNEL.make_inputs(dict(B=1, H=1, S_q=5, S_kv=12, D=8), "float32", 3)
    out = to_numpy(fp.sdpa(**inputs))
    assert np.abs(out - fp.reference(inputs)).max() < 1e-5
    head = dict(inputs, k=inputs["k"][:, :, :5], v=inputs["v"][:, :, :5])  # head alignment = first 5 keys only
    assert np.abs(out - fp.reference(head)).max() > 0.1


def test_flash_attention_public_helper():
    inputs = KERNEL.make_inputs(BOUNDARY["sq13_skv37"], "float32", 0)
    out = fp.flash_attention(inputs["q"], inputs["k"], inputs["v"], inputs["scale"], 8, 16)
    assert out.dtype == mx.float32 and out.shape == (2, 2, 13, 16)
    assert np.abs(to_numpy(out) - fp.reference(inputs)).max() <= KERNEL.tolerance["float32"]
    with pytest.raises(ValueError, match="S_q"):
        fp.flash_attention(inputs["k"], inputs["q"], inputs["q"], inputs["scale"], 8, 16)


def test_output_dtype_follows_input():
    inputs = KERNEL.make_inputs(BOUNDARY["sq13_skv37"], "float16", 0)
    for variant in ("sdpa", "flash_bq16_bk32"):
        assert run_variant(KERNEL.variants[variant], inputs).dtype == mx.float16


# ----------------------------------------------------------------------------- broken variants are caught


def _broken(*faults: str, BQ: int = 8, BK: int = 16) -> Variant:
    """A flash variant with a deliberate bug; never registered."""
    fs = frozenset(faults)

    def fn(q, k, v, scale):
        return fp._flash_attention_impl(q, k, v, scale, BQ, BK, fs)

    return Variant(name=f"broken_{'_'.join(sorted(fs))}", fn=fn, params={"BQ": BQ, "BK": BK})


def _check(name, variant, shape, dtype="float32"):
    return KERNEL.checks[name](KERNEL, variant, shape, dtype)


def test_fault_free_control_passes():
    v = _broken()
    for shape in BOUNDARY.values():
        for name in ("reference", "causal_perturb", "masked_no_nan"):
            assert _check(name, v, shape).passed, (name, shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_mask_off_is_caught(dtype):
    v = _broken("no_causal_mask")
    res = _check("causal_perturb", v, BOUNDARY["sq13_skv37"], dtype)
    assert not res.passed and "cannot see it but changed" in res.detail
    assert not _check("causal_perturb", v, BOUNDARY["square64"], dtype).passed
    assert not _check("reference", v, BOUNDARY["sq13_skv37"], dtype).passed


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropped_partial_kv_block_is_caught(dtype):
    v = _broken("drop_partial_kv")  # BK=16: S_kv=37 leaves a 5-key final chunk
    res = _check("causal_perturb", v, BOUNDARY["sq13_skv37"], dtype)
    assert not res.passed and "can see it but did not change" in res.detail
    assert not _check("reference", v, BOUNDARY["sq13_skv37"], dtype).passed
    assert not _check("reference", v, BOUNDARY["sq1_skv20"], dtype).passed
    # invisible when S_kv is a multiple of BK: only the boundary shapes catch it
    assert _check("reference", v, BOUNDARY["square64"], dtype).passed


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_aligned_mask_is_caught(dtype):
    v = _broken("head_aligned")  # q_align = 0: a KV-cache continuation attends to the wrong keys
    assert not _check("causal_perturb", v, BOUNDARY["sq13_skv37"], dtype).passed
    assert not _check("causal_perturb", v, BOUNDARY["sq1_skv20"], dtype).passed
    assert not _check("reference", v, BOUNDARY["sq13_skv37"], dtype).passed
    # identical to the right alignment when S_q == S_kv
    assert _check("reference", v, BOUNDARY["square64"], dtype).passed


@pytest.mark.parametrize("dtype", DTYPES)
def test_too_eager_block_skip_is_caught(dtype):
    v = _broken("skip_diagonal_block")  # S_q=13, S_kv=36: skips the last chunk although rows 9..12 see it
    assert not _check("causal_perturb", v, BOUNDARY["sq13_skv36"], dtype).passed
    assert not _check("reference", v, BOUNDARY["sq13_skv36"], dtype).passed


@pytest.mark.parametrize("dtype", DTYPES)
def test_missing_running_max_is_caught_by_masked_no_nan(dtype):
    v = _broken("no_running_max")
    # fine at ordinary logits, so the reference check alone would let it through ...
    assert _check("reference", v, BOUNDARY["square64"], dtype).passed
    # ... but exp() overflows with large logits
    res = _check("masked_no_nan", v, BOUNDARY["sq13_skv37"], dtype)
    assert not res.passed and res.max_error == float("inf")


def test_unknown_fault_rejected():
    with pytest.raises(ValueError, match="unknown faults"):
        fp.flash_schedule(4, 4, 8, 16, frozenset({"typo"}))


# ----------------------------------------------------------------------------- shapes, flops, bytes


def test_normalize_shape():
    assert fp.normalize_shape(dict(B=1, H=2, S=5, D=8)) == dict(B=1, H=2, S_q=5, S_kv=5, D=8)
    assert fp.normalize_shape(dict(B=1, H=2, S_q=3, S_kv=9, D=8)) == dict(B=1, H=2, S_q=3, S_kv=9, D=8)
    assert fp.normalize_shape(dict(B=1, H=2, S=5, S_q=5, D=8)) == dict(B=1, H=2, S_q=5, S_kv=5, D=8)
    src = dict(B=1, H=2, S=5, D=8)
    out = fp.normalize_shape(src)
    assert out is not src and src == dict(B=1, H=2, S=5, D=8)
    assert list(out) == ["B", "H", "S_q", "S_kv", "D"]


@pytest.mark.parametrize(
    "shape, bad_key",
    [
        (dict(H=2, S=5, D=8), "B"),
        (dict(B=1, H=2, S_q=5, D=8), "S_kv"),
        (dict(B=0, H=2, S=5, D=8), "B"),
        (dict(B=1, H=-2, S=5, D=8), "H"),
        (dict(B=1, H=2, S=5, D=8.0), "D"),
        (dict(B=1, H=2, S=True, D=8), "S_q"),
        (dict(B=1, H=2, S_q=9, S_kv=5, D=8), "S_q"),
        (dict(B=1, H=2, S=5, S_kv=6, D=8), "S"),
        (dict(B=1, H=2, S=5, D=8, N=3), "N"),
    ],
)
def test_normalize_shape_errors(shape, bad_key):
    with pytest.raises(ValueError, match=f"'{bad_key}'"):
        fp.normalize_shape(shape)


@pytest.mark.parametrize("S_q, S_kv", [(1, 1), (1, 20), (13, 37), (37, 37), (64, 64), (5, 6)])
def test_flops_counts_only_unmasked_pairs(S_q, S_kv):
    allowed = sum(1 for i in range(S_q) for j in range(S_kv) if j <= i + (S_kv - S_q))
    shape = dict(B=2, H=3, S_q=S_q, S_kv=S_kv, D=8)
    assert KERNEL.flops(shape) == 4 * 2 * 3 * 8 * allowed
    assert fp.causal_pairs(S_q, S_kv) == int(fp.causal_mask_np(S_q, S_kv).sum()) == allowed


def test_bytes_moved():
    shape = dict(B=2, H=3, S_q=5, S_kv=7, D=8)
    elems = 2 * 3 * 8 * (5 + 7 + 7 + 5)
    assert KERNEL.bytes_moved(shape, "float32") == 4 * elems
    assert KERNEL.bytes_moved(shape, "float16") == KERNEL.bytes_moved(shape, "bfloat16") == 2 * elems


def test_make_inputs():
    inputs = KERNEL.make_inputs(BOUNDARY["sq13_skv37"], "float16", 7)
    assert inputs["q"].shape == (2, 2, 13, 16) and inputs["k"].shape == inputs["v"].shape == (2, 2, 37, 16)
    assert inputs["q"].dtype == mx.float16 and inputs["scale"] == pytest.approx(0.25)
    again = KERNEL.make_inputs(BOUNDARY["sq13_skv37"], "float16", 7)
    other = KERNEL.make_inputs(BOUNDARY["sq13_skv37"], "float16", 8)
    assert mx.array_equal(inputs["q"], again["q"]).item() and not mx.array_equal(inputs["q"], other["q"]).item()
    assert not mx.array_equal(inputs["k"], inputs["v"]).item()


# ----------------------------------------------------------------------------- schedules differ and skip exactly


def _brute_force_tiles(S_q, S_kv, BQ, BK):
    """(query block, KV chunk) pairs holding at least one allowed (real row, real key) pair."""
    mask = fp.causal_mask_np(S_q, S_kv)
    return sum(
        bool(mask[b * BQ : (b + 1) * BQ, c * BK : (c + 1) * BK].any())
        for b in range(-(-S_q // BQ))
        for c in range(-(-S_kv // BK))
    )


@pytest.mark.parametrize("S_q, S_kv", [(1, 1), (1, 20), (13, 37), (13, 36), (37, 37), (64, 64), (40, 100), (7, 7)])
@pytest.mark.parametrize("variant", FLASH)
def test_block_skip_is_exact(variant, S_q, S_kv):
    """Exactly the tiles that hold an allowed pair are computed: nothing fully masked, nothing needed skipped."""
    p = KERNEL.variants[variant].params
    assert fp.schedule_stats(S_q, S_kv, p["BQ"], p["BK"])["tiles"] == _brute_force_tiles(S_q, S_kv, p["BQ"], p["BK"])


def test_block_skip_saves_work():
    stats = fp.schedule_stats(64, 64, 8, 16)
    assert stats["tiles"] == 20 < 8 * 4  # 20 of the 32 tiles of a 64 x 64 causal prefill


def test_variants_have_different_op_graphs():
    """Each flash variant builds a different MLX graph: BK sets the KV-loop length (two matmuls per
    iteration, counted in the exported graph), BQ the skip granularity / tile shape, hence the work."""
    shape = dict(B=1, H=1, S_q=40, S_kv=100, D=8)  # continuation: q_align = 60 is no multiple of any BQ
    inputs = KERNEL.make_inputs(shape, "float32", 0)
    signatures = {}
    for name in FLASH:
        p = KERNEL.variants[name].params
        stats = fp.schedule_stats(40, 100, p["BQ"], p["BK"])
        prims = collections.Counter(graph_primitives(KERNEL.variants[name].fn(**inputs)))
        assert prims["Matmul"] == 2 * stats["kv_steps"] == 2 * -(-100 // p["BK"])
        signatures[name] = (stats["kv_steps"], stats["score_elements"], sum(prims.values()))
    assert len(set(signatures.values())) == len(FLASH), signatures
