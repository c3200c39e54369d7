"""The kernel interface: tolerances follow the precision the chip computes in; variants declare dtypes."""

from __future__ import annotations

from kernels import REGISTRY, base
from kernels.base import Tolerances, Variant


def test_float32_gets_the_float16_bound_where_matmuls_run_in_tf32(monkeypatch):
    tolerances = Tolerances({"float32": 2e-5, "float16": 5e-3})
    monkeypatch.setattr(base, "matmul_runs_in_tf32", lambda: False)
    assert tolerances["float32"] == 2e-5
    monkeypatch.setattr(base, "matmul_runs_in_tf32", lambda: True)
    assert tolerances["float32"] == 5e-3 and tolerances["float16"] == 5e-3


def test_every_registered_kernel_uses_backend_aware_tolerances():
    assert all(isinstance(kernel.tolerance, Tolerances) for kernel in REGISTRY.values())


def test_this_cpu_is_not_tf32():
    assert base.matmul_runs_in_tf32() is False


def test_a_variant_names_the_dtypes_it_implements():
    v = Variant("v", lambda: None, dtypes=("float16",))
    assert v.unsupported("float16") is None
    assert v.unsupported("float32") == "variant v implements float16 only"
    assert Variant("w", lambda: None, requires=lambda: "CUDA not available").unsupported("float16") == \
        "CUDA not available"
