"""Roofline calibration kernels: a square matmul (compute roof) and an array copy (bandwidth roof)."""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np

from kernels.base import CheckResult, Inputs, Kernel, Shape, Variant, mlx_core, mx_dtype, register, to_numpy

DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _normalize_n(kernel_name: str, shape: Mapping[str, int]) -> Shape:
    raw = dict(shape)
    for key in raw:
        if key != "N":
            raise ValueError(f"{kernel_name}: unknown shape key {key!r}; expected 'N'")
    if "N" not in raw:
        raise ValueError(f"{kernel_name}: missing shape key 'N'")
    n = raw["N"]
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise ValueError(f"{kernel_name}: shape key 'N' must be a positive int, got {n!r}")
    return {"N": int(n)}


# --------------------------------------------------------------------------- calib_matmul


def matmul_normalize_shape(shape: Mapping[str, int]) -> Shape:
    return _normalize_n("calib_matmul", shape)


def matmul_make_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    mx = mlx_core()
    n = matmul_normalize_shape(shape)["N"]
    ka, kb = mx.random.split(mx.random.key(seed), 2)
    # entries ~ N(0, 1/sqrt(N)) so that (a @ b) entries are ~ N(0, 1) at every N: the
    # absolute tolerance then means the same thing for every size.
    s = float(n) ** -0.25
    a = (mx.random.normal((n, n), key=ka) * s).astype(mx_dtype(dtype))
    b = (mx.random.normal((n, n), key=kb) * s).astype(mx_dtype(dtype))
    mx.eval(a, b)
    return {"a": a, "b": b}


def matmul_reference(inputs: Inputs) -> np.ndarray:
    return to_numpy(inputs["a"]) @ to_numpy(inputs["b"])


def matmul(a, b):
    return a @ b


# Outputs ~ N(0, 1) (|out| < ~5). Max abs errors measured on MLX 0.32.4 (CPU), N from 1 to 4096:
# float32 6.6e-6 at N=1024, 1.7e-5 at N=4096 (grows ~sqrt(N) * eps) -> 1e-4 (a backend doing
# float32 matmuls in TF32 would need ~1e-2); float16 2.0e-3 at every N (the output rounding:
# half an ulp is 2e-3 for |out| in [2, 4)) -> 1e-2; bfloat16 1.6e-2 (half an ulp in [2, 4)) -> 6e-2.
MATMUL_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}

MATMUL = register(
    Kernel(
        name="calib_matmul",
        description="square N x N matmul a @ b: calibrates the compute roof",
        default_variant="matmul",
        variants={"matmul": Variant(name="matmul", fn=matmul, params={})},
        normalize_shape=matmul_normalize_shape,
        make_inputs=matmul_make_inputs,
        reference=matmul_reference,
        tolerance=MATMUL_TOLERANCE,
        flops=lambda shape: float(2 * matmul_normalize_shape(shape)["N"] ** 3),
        bytes_moved=lambda shape, dtype: float(3 * matmul_normalize_shape(shape)["N"] ** 2 * ITEMSIZE[dtype]),
        dtypes=DTYPES,
    )
)


# --------------------------------------------------------------------------- calib_copy


def copy_normalize_shape(shape: Mapping[str, int]) -> Shape:
    return _normalize_n("calib_copy", shape)


def copy_make_inputs(shape: Shape, dtype: str, seed: int) -> Inputs:
    mx = mlx_core()
    n = copy_normalize_shape(shape)["N"]
    x = mx.random.normal((n,), key=mx.random.key(seed)).astype(mx_dtype(dtype))
    mx.eval(x)
    return {"x": x}


def copy_reference(inputs: Inputs) -> np.ndarray:
    return to_numpy(inputs["x"])


def copy(x):
    """A copy that really reads and writes every element.

    In MLX 0.32 ``x.astype(x.dtype)`` returns ``x`` itself and ``mx.contiguous(x)`` shares the
    buffer of an already contiguous ``x`` (both are free: nothing is read or written), while
    ``x + 0``, ``x * 1.0`` and ``mx.array(x)`` run an elementwise kernel into a new buffer
    (timed at the same ~memory-bandwidth speed). ``x * 1.0`` is used because it is also
    bit-exact (``-0.0 + 0`` is ``+0.0``, ``-0.0 * 1.0`` stays ``-0.0``).
    """
    return x * 1.0


def graph_primitives(out) -> list[str]:
    """Names of the primitives an unevaluated array still has to run (from MLX's DOT export)."""
    mx = mlx_core()
    buf = io.StringIO()
    mx.export_to_dot(buf, out)
    return [line.split('label ="', 1)[1].split('"', 1)[0] for line in buf.getvalue().split(";") if 'label ="' in line]


ELIDED_PRIMITIVES = {"Broadcast", "Contiguous", "Reshape", "Slice", "Transpose", "StopGradient"}


def check_not_elided(kernel: Kernel, variant: Variant, shape: Mapping[str, int], dtype: str) -> CheckResult:
    """The variant's output is produced by a data-moving primitive, not returned as (a view of) x."""
    inputs = kernel.make_inputs(kernel.normalize_shape(shape), dtype, 0)
    out = variant.fn(**inputs)
    prims = graph_primitives(out) if out is not inputs["x"] else []
    moving = [p for p in prims if p not in ELIDED_PRIMITIVES]
    exact = bool(np.array_equal(to_numpy(out), to_numpy(inputs["x"])))
    return CheckResult(
        bool(moving) and exact,
        detail=f"primitives {prims or 'none (output is the input)'}; bit-exact: {exact}",
    )


# A copy must be exact.
COPY_TOLERANCE = {"float32": 0.0, "float16": 0.0, "bfloat16": 0.0}

COPY = register(
    Kernel(
        name="calib_copy",
        description="1-D copy of N elements (reads and writes each once): calibrates the bandwidth roof",
        default_variant="copy",
        variants={"copy": Variant(name="copy", fn=copy, params={})},
        normalize_shape=copy_normalize_shape,
        make_inputs=copy_make_inputs,
        reference=copy_reference,
        tolerance=COPY_TOLERANCE,
        # one multiply per element actually runs; at 1/(2*itemsize) flop/byte it is far below any ridge point
        flops=lambda shape: float(copy_normalize_shape(shape)["N"]),
        bytes_moved=lambda shape, dtype: float(2 * copy_normalize_shape(shape)["N"] * ITEMSIZE[dtype]),
        checks={"not_elided": check_not_elided},
        dtypes=DTYPES,
    )
)

__all__ = ["COPY", "MATMUL", "copy", "graph_primitives", "matmul"]
