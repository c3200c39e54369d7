"""Test plugin: a toy kernel whose every call appends "pid time variant" to the file named by $GATE_LOG, so a test
can see when each job process called it (harness/execute/local.py: processes that compile together, then time in
turn). ``src`` poses as a source kernel (backend "cuda", available everywhere), ``ops`` is MLX ops,
``src_dies`` a source kernel whose process dies at its first call on 16 elements."""

from __future__ import annotations

import os
import time

import numpy as np

from kernels import REGISTRY
from kernels.base import Kernel, Variant, register


def _log(name: str) -> None:
    with open(os.environ["GATE_LOG"], "a") as log:
        log.write(f"{os.getpid()} {time.time():.6f} {name}\n")


def _src(x):
    _log("src")
    return x * 2


def _ops(x):
    _log("ops")
    return x * 2


def _src_dies(x):
    _log("src_dies")
    if x.size == 16:
        os.abort()
    return x * 2


def _inputs(shape, dtype, seed):
    import mlx.core as mx

    return {"x": mx.random.normal((shape["N"],), key=mx.random.key(seed))}


if "gatelog" not in REGISTRY:
    register(Kernel(
        name="gatelog", description="doubles a vector and logs each call", default_variant="ops",
        variants={"ops": Variant("ops", _ops), "src": Variant("src", _src, backend="cuda"),
                  "src_dies": Variant("src_dies", _src_dies, backend="cuda")},
        normalize_shape=lambda s: {"N": int(s["N"])},
        make_inputs=_inputs,
        reference=lambda inputs: 2 * np.array(inputs["x"], dtype=np.float64),
        tolerance={"float32": 1e-6},
        flops=lambda s: float(s["N"]),
        bytes_moved=lambda s, d: 8.0 * s["N"],
    ))
