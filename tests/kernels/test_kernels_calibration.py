"""Roofline calibration kernels: calib_matmul and calib_copy pass their checks; the copy really moves data."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from harness.core.job import CALIBRATION_COPY, CALIBRATION_MATMUL
from kernels import REGISTRY, Variant
from kernels import calibration as cal
from kernels.base import check_against_reference, run_variant, to_numpy

MATMUL = REGISTRY[CALIBRATION_MATMUL]  # the names the harness plans and reads peaks from are the registry's
COPY = REGISTRY[CALIBRATION_COPY]
DTYPES = ("float32", "float16", "bfloat16")


def test_registered():
    assert MATMUL.default_variant == "matmul" and COPY.default_variant == "copy"
    assert "not_elided" in COPY.checks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 64])
def test_matmul_reference(n, dtype):
    res = check_against_reference(MATMUL, MATMUL.variants["matmul"], {"N": n}, dtype)
    assert res.passed, res.detail


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_copy_checks(n, dtype):
    for name, check in COPY.checks.items():
        res = check(COPY, COPY.variants["copy"], {"N": n}, dtype)
        assert res.passed, (name, res.detail)


def test_roofline_numbers():
    assert MATMUL.flops({"N": 8}) == 2 * 8**3
    assert MATMUL.bytes_moved({"N": 8}, "float32") == 3 * 64 * 4
    assert MATMUL.bytes_moved({"N": 8}, "bfloat16") == 3 * 64 * 2
    assert COPY.bytes_moved({"N": 10}, "float16") == 2 * 10 * 2
    assert COPY.flops({"N": 10}) == 10


def test_matmul_inputs_keep_outputs_unit_scale():
    inputs = MATMUL.make_inputs({"N": 64}, "float32", 0)
    assert inputs["a"].shape == inputs["b"].shape == (64, 64)
    assert 0.7 < float(np.std(MATMUL.reference(inputs))) < 1.3


@pytest.mark.parametrize("kernel", [MATMUL, COPY])
@pytest.mark.parametrize("shape", [{}, {"N": 0}, {"N": -1}, {"N": 2.0}, {"N": True}, {"N": 4, "M": 4}])
def test_normalize_shape_errors(kernel, shape):
    bad = next(iter(set(shape) - {"N"}), "N")
    with pytest.raises(ValueError, match=f"'{bad}'"):
        kernel.normalize_shape(shape)


def test_copy_is_bit_exact_and_a_new_array():
    x = mx.array(np.array([-0.0, 1.5, np.inf, -np.inf, 3.0], dtype=np.float32))
    y = cal.copy(x)
    assert y is not x
    assert np.array_equal(np.signbit(to_numpy(y)), np.signbit(to_numpy(x)))
    nan = mx.array(np.array([np.nan], dtype=np.float32))
    assert np.isnan(to_numpy(run_variant(COPY.variants["copy"], {"x": nan}))).all()


def test_graph_of_copy_and_of_elided_forms():
    """What the copy choice rests on (MLX 0.32): x * 1.0 runs a Multiply into a new buffer, while
    astype to the same dtype runs nothing and contiguous() of a contiguous array shares x's buffer."""
    x = COPY.make_inputs({"N": 16}, "float32", 0)["x"]
    assert "Multiply" in cal.graph_primitives(cal.copy(x))
    assert cal.graph_primitives(x.astype(mx.float32)) == []
    assert cal.graph_primitives(mx.contiguous(x)) == ["Contiguous"]


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda x: x, "returns the input"),
        (lambda x: x.astype(x.dtype), "same-dtype astype is a no-op"),
        (lambda x: mx.contiguous(x), "contiguous x is shared, not copied"),
    ],
)
def test_not_elided_catches_free_copies(fn, why):
    res = COPY.checks["not_elided"](COPY, Variant(name="elided", fn=fn), {"N": 32}, "float32")
    assert not res.passed, why
