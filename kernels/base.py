"""The kernel interface: a kernel, its tuning variants, its reference and its correctness checks.

A kernel module builds a :class:`Kernel` and calls :func:`register`. The harness
only talks to kernels through this interface, and nothing here imports the
harness: kernels are the subject under test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Shape = dict[str, int]
Inputs = dict[str, Any]


FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def mlx_core():
    """``mlx.core``, imported on first use (planning and validation never load MLX)."""
    import mlx.core as mx

    return mx


def mx_dtype(dtype: str):
    """The MLX dtype named ``dtype``; ValueError naming the accepted ones otherwise."""
    mx = mlx_core()
    try:
        return {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {FLOAT_DTYPES}") from None


def always_available() -> str | None:
    """A variant that runs everywhere MLX runs."""
    return None


@dataclass(frozen=True)
class Variant:
    """One implementation of a kernel with fixed tuning parameters.

    ``fn(**inputs)`` returns an ``mx.array``; ``requires()`` returns the reason the
    variant cannot run on this machine (e.g. "CUDA not available"), or None. A source
    kernel (``mx.fast.cuda_kernel`` / ``metal_kernel``) is just another variant with a
    ``backend`` and a ``requires``.
    """

    name: str
    fn: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    backend: str = "mlx"
    requires: Callable[[], str | None] = always_available
    dtypes: tuple[str, ...] = ()  # the dtypes it implements; empty means every dtype of the kernel

    def unsupported(self, dtype: str) -> str | None:
        """Why this variant cannot run ``dtype`` here (a skip reason), or None."""
        if self.dtypes and dtype not in self.dtypes:
            return f"variant {self.name} implements {', '.join(self.dtypes)} only"
        return self.requires()


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one correctness case: pass/fail, the error seen and the bound it was held to."""

    passed: bool
    max_error: float | None = None
    tolerance: float | None = None
    detail: str = ""


Check = Callable[["Kernel", Variant, Shape, str], CheckResult]


@dataclass
class Kernel:
    """A kernel under test.

    - ``normalize_shape(shape)`` validates a shape dict and fills derived keys
      (raises ValueError naming the bad key).
    - ``make_inputs(shape, dtype, seed)`` returns the keyword arguments of every
      variant's ``fn`` (mx arrays and static ints/floats).
    - ``reference(inputs)`` computes the oracle output in numpy (float64).
    - ``tolerance[dtype]`` is the max abs error allowed against the reference.
    - ``flops(shape)`` / ``bytes_moved(shape, dtype)`` give the roofline work of one call.
    - ``checks`` maps a case name to a check function; "reference" is always present.
    """

    name: str
    description: str
    default_variant: str
    variants: dict[str, Variant]
    normalize_shape: Callable[[Mapping[str, int]], Shape]
    make_inputs: Callable[[Shape, str, int], Inputs]
    reference: Callable[[Inputs], np.ndarray]
    tolerance: Mapping[str, float]
    flops: Callable[[Shape], float]
    bytes_moved: Callable[[Shape, str], float]
    checks: dict[str, Check] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("float32", "float16")

    def __post_init__(self) -> None:
        self.tolerance = Tolerances(self.tolerance)
        self.checks.setdefault("reference", check_against_reference)
        if self.default_variant not in self.variants:
            raise ValueError(f"kernel {self.name}: default variant {self.default_variant!r} is not a variant")

    def add_variant(self, variant: Variant) -> None:
        if variant.name in self.variants:
            raise ValueError(f"kernel {self.name}: variant {variant.name!r} already registered")
        self.variants[variant.name] = variant


def matmul_runs_in_tf32() -> bool:
    """MLX's CUDA backend computes float32 matmuls in TF32 (a 10-bit mantissa, as float16 has).

    Measured on the H200 (MLX 0.32.4): float32 flash attention was 1.3e-3 from the float64
    reference where the CPU gives 1.3e-6, with every variant, SDPA included.
    """
    import mlx.core as mx

    return hasattr(mx, "cuda") and mx.cuda.is_available() and mx.default_device().type == mx.gpu


class Tolerances(dict):
    """Per-dtype tolerances; on a backend whose float32 matmuls run in TF32, float32 gets the
    float16 bound (same mantissa), so a kernel is judged by the precision the chip computes in."""

    def __getitem__(self, dtype: str) -> float:
        value = super().__getitem__(dtype)
        if dtype == "float32" and "float16" in self and matmul_runs_in_tf32():
            return max(value, super().__getitem__("float16"))
        return value


REGISTRY: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    """Add a kernel to the registry (idempotent for the same object)."""
    existing = REGISTRY.get(kernel.name)
    if existing is not None and existing is not kernel:
        raise ValueError(f"kernel {kernel.name!r} already registered")
    REGISTRY[kernel.name] = kernel
    return kernel


def to_numpy(x: Any) -> np.ndarray:
    """An mx.array (any dtype, bfloat16 included) or array-like as float64 numpy."""
    import mlx.core as mx

    if isinstance(x, mx.array):
        if x.dtype in (mx.bfloat16, mx.float16):
            x = x.astype(mx.float32)
        return np.array(x, dtype=np.float64)
    return np.asarray(x, dtype=np.float64)


def max_abs_error(out: Any, ref: np.ndarray) -> float:
    """Max abs difference; NaN or inf anywhere in the output counts as an infinite error."""
    got = to_numpy(out)
    if got.shape != ref.shape:
        raise ValueError(f"output shape {got.shape} != reference shape {ref.shape}")
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - ref))) if got.size else 0.0


def run_variant(variant: Variant, inputs: Inputs) -> Any:
    """Call a variant and force evaluation."""
    import mlx.core as mx

    out = variant.fn(**inputs)
    mx.eval(out)
    return out


def check_against_reference(kernel: Kernel, variant: Variant, shape: Shape, dtype: str, seed: int = 0) -> CheckResult:
    """The variant's output is within the dtype tolerance of the float64 reference."""
    inputs = kernel.make_inputs(shape, dtype, seed)
    out = run_variant(variant, inputs)
    err = max_abs_error(out, kernel.reference(inputs))
    tol = kernel.tolerance[dtype]
    return CheckResult(err <= tol, err, tol, f"max abs error {err:.3g} vs tolerance {tol:.3g}")
