"""Test plugin: a deliberately mis-masked flash variant and a toy kernel whose variants crash, hang or raise.

Loaded by suites through ``plugins = ["broken_kernels"]``, exactly as a user's own plugin would be.
"""

from __future__ import annotations

import os
import time

import numpy as np

from kernels import REGISTRY
from kernels.base import Kernel, Variant, register
from kernels.flash_prefill import _flash_attention_impl


def _flash_without_mask(q, k, v, scale):
    return _flash_attention_impl(q, k, v, scale, 16, 16, faults=frozenset({"no_causal_mask"}))


def _flash_head_aligned(q, k, v, scale):
    return _flash_attention_impl(q, k, v, scale, 8, 16, faults=frozenset({"head_aligned"}))


flash = REGISTRY["flash_prefill"]
for variant in (Variant("broken_no_mask", _flash_without_mask, {"BQ": 16, "BK": 16}),
                Variant("broken_head_aligned", _flash_head_aligned, {"BQ": 8, "BK": 16})):
    if variant.name not in flash.variants:
        flash.add_variant(variant)


def _toy_inputs(shape, dtype, seed):
    import mlx.core as mx

    return {"x": mx.random.normal((shape["N"],), key=mx.random.key(seed))}


def _double(x):
    return x * 2


def _abort(x):
    os.abort()


def _hang(x):
    time.sleep(3600)


def _raise(x):
    raise RuntimeError("kernel exploded on purpose")


def _print_then_abort(x):
    print("about to crash: last words of the job", flush=True)
    os.abort()


def _needs_cuda():
    return "CUDA not available"


if "toy" not in REGISTRY:
    register(Kernel(
        name="toy", description="doubles a vector; other variants crash, hang or raise", default_variant="double",
        variants={"double": Variant("double", _double), "abort": Variant("abort", _abort),
                  "hang": Variant("hang", _hang), "raise": Variant("raise", _raise),
                  "last_words": Variant("last_words", _print_then_abort),
                  "cuda_only": Variant("cuda_only", _double, backend="cuda", requires=_needs_cuda)},
        normalize_shape=lambda s: {"N": int(s["N"])},
        make_inputs=_toy_inputs,
        reference=lambda inputs: 2 * np.array(inputs["x"], dtype=np.float64),
        tolerance={"float32": 1e-6, "float16": 1e-3},
        flops=lambda s: float(s["N"]),
        bytes_moved=lambda s, d: 8.0 * s["N"],
    ))
