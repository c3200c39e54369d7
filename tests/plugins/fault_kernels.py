"""Test plugin for the reliability tests: no-op jobs (no MLX work) that pass, wait, crash or hang on cue.

- ``ok`` passes at once; ``gate`` waits (up to 120 s) until the file named by $HARNESS_TEST_GATE exists, so a test
  can break the database while the run is in flight; ``slow`` sleeps $HARNESS_TEST_SLOW_S seconds (default 1);
  ``segv`` dereferences a null pointer (a real SIGSEGV); ``hang`` never returns.
Each variant prints a line first, so crash and timeout results carry it in their output tail.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from kernels import REGISTRY, CheckResult, Kernel, Variant, register


def _ok(shape):
    return True


def _gate(shape):
    gate = os.environ.get("HARNESS_TEST_GATE")
    deadline = time.monotonic() + 120
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def _slow(shape):
    time.sleep(float(os.environ.get("HARNESS_TEST_SLOW_S", "1")))
    return True


def _segv(shape):
    import ctypes

    ctypes.string_at(0)
    return True


def _hang(shape):
    time.sleep(3600)
    return True


def check_noop(kernel, variant, shape, dtype) -> CheckResult:
    print(f"fault job {variant.name} {shape} starting", flush=True)
    passed = variant.fn(shape)
    return CheckResult(passed, 0.0, 0.5, "no-op check")


if "fault" not in REGISTRY:
    register(Kernel(
        name="fault",
        description="no-op jobs that pass, wait, crash or hang on cue (reliability tests)",
        default_variant="ok",
        variants={name: Variant(name, fn) for name, fn in
                  (("ok", _ok), ("gate", _gate), ("slow", _slow), ("segv", _segv), ("hang", _hang))},
        normalize_shape=lambda shape: {k: int(v) for k, v in shape.items()},
        make_inputs=lambda shape, dtype, seed: {"shape": shape},
        reference=lambda inputs: np.zeros(1),
        tolerance={"float32": 0.5, "float16": 0.5},
        flops=lambda shape: 1.0,
        bytes_moved=lambda shape, dtype: 1.0,
        checks={"noop": check_noop},
    ))
