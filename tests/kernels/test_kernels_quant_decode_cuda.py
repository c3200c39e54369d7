"""The CUDA decode-attention variants (kernels.quant_decode_cuda).

They only run where MLX has a CUDA device. Here (CPU backend) they must register, fit the static shared memory,
be skipped with the reason and refuse bad shapes before any launch. Their logic (indexing, GQA rows, causal
tail, KV splits, the combine, the layer grid) is executed by the CPU emulator (testkit.cuda_emulator: each CUDA
thread a host thread) in float32 and held to the float64 reference; and the batched launch must equal the
per-layer launches bit for bit. What the real chip computes is checked on its recorded outputs.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels import REGISTRY
from kernels import quant_decode as qd
from kernels import quant_decode_cuda as qdc
from kernels.flash_cuda import STATIC_SMEM_LIMIT
from testkit import cuda_emulator
from testkit.paths import recorded

SINGLE = REGISTRY["quant_decode"]
LAYERS = REGISTRY["quant_decode_layers"]
BUILTIN_DECODE_SHAPES = [  # (H_q / H_kv * S_q, D) of the built-in suite's decode sections, GPU grid included
    (4, 64), (4, 32), (16, 32), (2, 32), (4, 128), (1, 64), (16, 64)]


def test_variants_are_registered_on_both_kernels():
    for variant in qdc.single_layer_variants():
        assert SINGLE.variants[variant.name].backend == "cuda"
        assert set(variant.dtypes) == {"float32", "float16", "bfloat16"}
    for variant in qdc.layers_variants():
        registered = LAYERS.variants[variant.name]
        assert registered.params["single_layer"] in SINGLE.variants  # what layer_parity compares against
    assert {"batched_cuda_splitk", "loop_cuda_splitk"} <= set(LAYERS.variants)


def test_skipped_with_the_reason_without_cuda():
    if not (hasattr(mx, "cuda") and mx.cuda.is_available()):
        for name in ("cuda_split1", "cuda_splitk"):
            assert SINGLE.variants[name].unsupported("float16") == "CUDA not available"


@pytest.mark.parametrize(("rows", "D"), BUILTIN_DECODE_SHAPES + [(32, 128), (64, 64)])
def test_every_supported_shape_fits_static_shared_memory(rows, D):
    bk = qdc.key_block(rows, D)
    assert bk in qdc.KEY_BLOCKS and qdc.smem_bytes(rows, D, bk) <= STATIC_SMEM_LIMIT


@pytest.mark.parametrize(("q_shape", "kv_shape", "group", "words"), [
    ((1, 8, 1, 48), (1, 2, 16, 24), 32, "multiple of group"),
    ((1, 6, 1, 64), (1, 4, 16, 32), 32, "not a multiple of H_kv"),
    ((1, 4, 4, 64), (1, 4, 3, 32), 32, "S_q=4 > S_kv=3"),
    ((1, 32, 4, 64), (1, 1, 16, 32), 32, "exceed 64"),
    ((1, 64, 1, 128), (1, 1, 16, 64), 32, "shared memory"),
])
def test_bad_shapes_are_refused_before_launch(q_shape, kv_shape, group, words):
    with pytest.raises(ValueError, match=words):
        qdc.plan_launch(q_shape, kv_shape, 4, group, "splitk")


def test_the_split_count_never_depends_on_the_layer_count():
    one = qdc.plan_launch((2, 32, 1, 128), (2, 8, 4096, 64), 4, 32, "splitk")
    many = qdc.plan_launch((32, 2, 32, 1, 128), (32, 2, 8, 4096, 64), 4, 32, "splitk")
    assert one.splits == many.splits > 1 and many.slabs == 32 * one.slabs
    assert qdc.plan_launch((2, 32, 1, 128), (2, 8, 4096, 64), 4, 32, "split1").splits == 1
    assert qdc.plan_launch((1, 4, 1, 64), (1, 1, 100, 32), 4, 32, "splitk").splits == 1  # short caches: one split


# --- the kernels' own source, executed on the CPU -------------------------------------------------------------------


def emulate(inputs: dict, splits: int | None = None, mode: str = "splitk") -> np.ndarray:
    """``decode_attend_cuda`` with each kernel run by the emulator (float32)."""
    arrays = {name: np.array(inputs[name]) for name in qd._LAYER_ARRAYS}
    q = arrays["q"].astype(np.float32)
    plan = qdc.plan_launch(q.shape, arrays["k_codes"].shape, inputs["bits"], inputs["group_size"], mode, splits)
    partial_inputs = {name: arrays[name] if name.endswith("codes") else arrays[name].astype(np.float32)
                      for name in qd._LAYER_ARRAYS}
    partial_inputs["dims"] = np.array([plan.S_kv], dtype=np.int32)
    partial_inputs["scale"] = np.array([inputs["scale"]], dtype=np.float32)
    o_shape, ml_shape = plan.partial_shapes
    parts = cuda_emulator.EmulatedKernel(
        "quant_decode_partial", qdc.PARTIAL_SOURCE, qdc.HEADER, partial_inputs,
        {"o_part": (o_shape, np.float32), "ml_part": (ml_shape, np.float32)},
        {"T": "float", **dict(plan.partial_template)}).run(plan.partial_grid, (qdc.THREADS, 1, 1))
    combined = cuda_emulator.EmulatedKernel(
        "quant_decode_combine", qdc.COMBINE_SOURCE, qdc.HEADER,
        {**parts, "dims": np.array([plan.splits, plan.elements], dtype=np.int32)},
        {"out": (q.shape, np.float32)}, {"T": "float", **dict(plan.combine_template)},
    ).run(plan.combine_grid, (qdc.COMBINE_THREADS, 1, 1))
    return combined["out"]


needs_gxx = pytest.mark.skipif(cuda_emulator.available() is not None, reason=str(cuda_emulator.available()))


@needs_gxx
@pytest.mark.parametrize(("shape", "splits"), [
    ({"B": 2, "H_q": 4, "H_kv": 1, "S_q": 4, "S_kv": 45, "D": 32, "bits": 4, "group": 32}, None),
    ({"B": 1, "H_q": 8, "H_kv": 2, "S_q": 4, "S_kv": 7, "D": 32, "bits": 4, "group": 32}, 5),  # 1-2 keys a split
    ({"B": 1, "H_q": 4, "H_kv": 4, "S_q": 1, "S_kv": 37, "D": 64, "bits": 8, "group": 64}, 3),
    ({"B": 2, "H_q": 2, "H_kv": 1, "S_q": 2, "S_kv": 70, "D": 64, "bits": 4, "group": 64}, 4),
    ({"B": 1, "H_q": 2, "H_kv": 1, "S_q": 1, "S_kv": 1, "D": 32, "bits": 8, "group": 32}, 1),
])
def test_the_kernel_source_matches_the_reference(shape, splits):
    inputs = qd.make_inputs(shape, "float32", 7)
    got = emulate(inputs, splits)
    want = qd.reference(inputs)
    assert np.all(np.isfinite(got))
    assert float(np.max(np.abs(got - want))) <= qd.TOLERANCE["float32"]


@needs_gxx
def test_a_split_whose_keys_are_all_in_a_rows_future_gets_no_weight():
    # S_kv=9, S_q=4, 9 splits of one key: query 0 sees keys 0..5, so splits 6-8 are fully masked for it.
    inputs = qd.make_inputs({"B": 1, "H_q": 1, "H_kv": 1, "S_q": 4, "S_kv": 9, "D": 32}, "float32", 3)
    got = emulate(inputs, splits=9)
    assert float(np.max(np.abs(got - qd.reference(inputs)))) <= qd.TOLERANCE["float32"]


@needs_gxx
def test_the_batched_launch_is_the_per_layer_launch_bit_for_bit_and_keeps_every_slot():
    shape = {"NL": 3, "B": 2, "H_q": 4, "H_kv": 2, "S_q": 2, "S_kv": 20, "D": 32}
    inputs = qd.make_layers_inputs(shape, "float32", 11)
    batched = emulate(inputs, splits=2)
    for layer in range(3):
        alone = emulate(qd._layer_inputs(inputs, layer), splits=2)
        assert np.array_equal(batched[layer], alone)
        for b in range(2):
            one = {k: (a[layer, b : b + 1] if isinstance(a, mx.array) else a) for k, a in inputs.items()}
            assert float(np.max(np.abs(batched[layer, b] - qd.reference(one)[0]))) <= qd.TOLERANCE["float32"]


# --- what the H200 recorded: the built-in suite with these kernels, compiled by MLX's JIT in every process
# (h200-202d829.bundle, and h200-3c1c045.bundle at the commit that closed the kernel work) and through the harness's
# cubin cache (h200-2d82df7.bundle, kernels/cuda_compile.py) ----------------------------------------------------------

H200_BUNDLES = ("h200-202d829.bundle", "h200-2d82df7.bundle", "h200-3c1c045.bundle")
LAYER_CHECKS = {"layer_parity", "layers_differ", "stride_adversarial", "reference"}


@pytest.fixture(scope="module", params=H200_BUNDLES)
def h200_jobs(request, tmp_path_factory):
    from sqlalchemy import select

    from harness.record.bundle import import_bundle
    from harness.record.models import JobRecord
    from harness.record.outbox import open_store

    db = open_store(f"sqlite:///{tmp_path_factory.mktemp('h200') / 'h200.db'}")
    try:
        import_bundle(db, recorded(request.param))
        with db.session() as session:
            jobs = session.scalars(select(JobRecord).where(JobRecord.kernel.in_(("quant_decode",
                                                                                 "quant_decode_layers")))).all()
            session.expunge_all()
        yield jobs
    finally:
        db.close()


def test_on_the_h200_every_layer_job_of_the_cuda_kernels_passed_in_every_dtype(h200_jobs):
    cuda = [j for j in h200_jobs if j.kind == "correctness" and j.variant in {v.name for v in qdc.layers_variants()}]
    seen = {(j.variant, j.dtype, j.check_name, j.shape["NL"]) for j in cuda}
    assert all(j.status == "passed" for j in cuda), [(j.variant, j.dtype, j.check_name) for j in cuda
                                                       if j.status != "passed"]
    for variant in ("batched_cuda_splitk", "loop_cuda_splitk"):
        for dtype in ("float32", "float16", "bfloat16"):
            assert {nl for v, d, c, nl in seen if (v, d, c) == (variant, dtype, "layer_parity")} == {1, 4, 32}
            assert {c for v, d, c, _ in seen if (v, d) == (variant, dtype)} == LAYER_CHECKS
    parity = [j for j in cuda if j.check_name == "layer_parity"]
    assert parity and all(j.max_error == 0.0 for j in parity)  # bit-identical, not merely close


def test_on_the_h200_the_mlx_op_batched_variants_are_what_the_parity_check_catches(h200_jobs):
    failed = {(j.variant, j.dtype) for j in h200_jobs if j.kind == "correctness" and j.status == "failed"}
    assert failed == {("batched", "float32"), ("batched_fused_split4", "float32"),
                      ("batched_fused_split4", "float16"), ("batched_fused_split4", "bfloat16")}


def test_on_the_h200_the_split_kernel_beats_dequant_sdpa_at_every_batch(h200_jobs):
    medians = {(j.variant, j.shape_key): j.median_s for j in h200_jobs
               if j.kind == "benchmark" and j.kernel == "quant_decode" and j.status == "passed"}
    shapes = {key for _, key in medians}
    assert {key.split(",")[0] for key in shapes} >= {"B=1", "B=4", "B=32"}
    for key in shapes:
        assert medians[("cuda_splitk", key)] < medians[("dequant_sdpa", key)], key
