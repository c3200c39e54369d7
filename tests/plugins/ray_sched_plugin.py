"""Test plugin for the Ray executor tests: a kernel whose variants cost nothing (no MLX work).

- ``ok`` passes at once; ``bad`` fails; ``sleepy`` sleeps ``T`` seconds on its first attempt only.
Each call drops a marker file (job shape, attempt, Ray node id from HARNESS_RAY_NODE_ID) in $HARNESS_TEST_MARKERS,
so a test can see where a job runs and kill that node while the job sleeps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from kernels import REGISTRY, CheckResult, Kernel, Variant, register


def _mark(variant: str, shape: dict) -> int:
    """Record this call; returns how many calls for the same job came before it."""
    folder = os.environ.get("HARNESS_TEST_MARKERS")
    if not folder:
        return 0
    stem = f"{variant}-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    earlier = len(list(Path(folder).glob(f"{stem}.*")))
    # Written aside, then renamed: a test polling for the marker never reads it empty (it names the node).
    staged = Path(folder, f".{stem}.{earlier}.{os.getpid()}")
    staged.write_text(os.environ.get("HARNESS_RAY_NODE_ID", ""))
    staged.replace(Path(folder, f"{stem}.{earlier}"))
    return earlier


def _ok(shape):
    return True


def _bad(shape):
    return False


def _sleepy(shape):
    if _mark("sleepy", shape) == 0:
        time.sleep(shape.get("T", 20))
    return True


def check_noop(kernel, variant, shape, dtype) -> CheckResult:
    if variant.name != "sleepy":
        _mark(variant.name, shape)
    passed = variant.fn(shape)
    return CheckResult(passed, 0.0 if passed else 1.0, 0.5, "no-op check" if passed else "this variant always fails")


def _normalize(shape):
    out = {k: int(v) for k, v in shape.items()}
    if "N" not in out:
        raise ValueError("shape needs N")
    return out


if "ray_sched" not in REGISTRY:
    register(Kernel(
        name="ray_sched",
        description="no-op jobs for scheduling tests",
        default_variant="ok",
        variants={"ok": Variant("ok", _ok), "bad": Variant("bad", _bad), "sleepy": Variant("sleepy", _sleepy)},
        normalize_shape=_normalize,
        make_inputs=lambda shape, dtype, seed: {"shape": shape},
        reference=lambda inputs: np.zeros(1),
        tolerance={"float32": 0.5, "float16": 0.5},
        flops=lambda shape: 1.0,
        bytes_moved=lambda shape, dtype: 1.0,
        checks={"noop": check_noop},
    ))
