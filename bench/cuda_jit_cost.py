"""What does a CUDA source variant cost to start in a fresh process, and does MLX load a compiled kernel from disk?

Each child process imports MLX and the kernels, builds one benchmark's inputs per case, then times the variant's
first call (MLX's NVRTC compile, plus the launch), its next calls, and the host cost of a launch (200 calls enqueued
back to back, one synchronize: microseconds per call). The children share one ``MLX_PTX_CACHE_DIR``, so if MLX kept
a compiled custom kernel on disk, the later children's first calls would show it.

Two checks, each in processes of its own (MLX keeps a module per name for the life of a process):

- ``proof``: kernels/cuda_compile.prefill writes, where MLX's disk cache looks and under the module name MLX used to
  build, a kernel that adds 2 where MLX's source adds 1: MLX's output shows which one it ran. The files MLX itself
  wrote to that folder are listed too (MLX 0.32.4, measured on the H200: it ran its own, wrote nothing for the custom
  kernel, and every child paid the compile: see kernels/cuda_compile.py);
- ``--identical``: every CUDA source variant's output in two processes, bit for bit (a race or an uninitialised
  read shows as a difference).

Usage: python bench/cuda_jit_cost.py [--children 3] [--identical] [--out jit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = [("flash_prefill", "cuda_mma_bq64_bk64", {"B": 1, "H": 8, "S_q": 256, "S_kv": 256, "D": 64}),
         ("quant_decode", "cuda_splitk", {"B": 1, "H_q": 32, "H_kv": 8, "S_kv": 1024, "D": 128}),
         ("flash_prefill", "sdpa", {"B": 1, "H": 8, "S_q": 256, "S_kv": 256, "D": 64})]
IDENTICAL_SHAPES = {"flash_prefill": {"B": 1, "H": 4, "S_q": 200, "S_kv": 328, "D": 128},
                    "quant_decode": {"B": 2, "H_q": 32, "H_kv": 8, "S_kv": 1000, "D": 128},
                    "quant_decode_layers": {"NL": 3, "B": 2, "H_q": 32, "H_kv": 8, "S_kv": 600, "D": 128}}


def launch_us(fn, calls: int = 200) -> float:
    import mlx.core as mx

    start = time.perf_counter()
    for _ in range(calls):
        mx.async_eval(fn())
    mx.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def timing_child() -> dict:
    t0 = time.perf_counter()
    import mlx.core as mx

    from kernels import REGISTRY, cuda_compile
    from kernels.base import run_variant

    out = {"import_s": time.perf_counter() - t0, "cache": str(cuda_compile.mlx_cache_dir()), "cases": []}  # pins it
    for kernel_name, variant, shape in CASES:
        kernel = REGISTRY[kernel_name]
        inputs = kernel.make_inputs(kernel.normalize_shape(shape), "float16", 0)
        calls = []
        for _ in range(3):
            start = time.perf_counter()
            mx.eval(run_variant(kernel.variants[variant], inputs))
            mx.synchronize()
            calls.append(time.perf_counter() - start)
        fn = kernel.variants[variant].fn
        out["cases"].append({"variant": variant, "calls_s": calls,
                             "launch_us": launch_us(lambda fn=fn, inputs=inputs: fn(**inputs))})
    return out


def proof_child() -> dict:
    """MLX's source adds 1; the module prefilled under MLX's (pre-#4273) module name adds 2. Which did MLX run?"""
    import mlx.core as mx

    from kernels import cuda_compile

    body = "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n    out[i] = x[i] + {};"
    kernel = cuda_compile.CudaKernel("harness_prefill_proof", ["x"], ["out"], body.format("1.0f"))
    x = mx.zeros((32,), dtype=mx.float32)
    name, _ = kernel._mlx_kernel((("float32",), ("float32",)))
    module = f"custom_kernel_{name}"
    directory = cuda_compile.mlx_cache_dir()
    for suffix in (".ptx", ".txt"):
        (directory / f"{module}{suffix}").unlink(missing_ok=True)
    source = cuda_compile.kernel_source("", body.format("2.0f"), [("x", "float32")], [("out", "float32")], [])
    cuda_compile.prefill(directory, module, source)
    prefilled = {p.name for p in directory.iterdir()}
    (out,) = kernel(inputs=[x], output_shapes=[(32,)], output_dtypes=[mx.float32], grid=(32, 1, 1),
                    threadgroup=(32, 1, 1))
    value = float(out[0])
    return {"value": value, "mlx_loaded_the_prefilled_module": value == 2.0,
            "mlx_wrote": sorted(p.name for p in directory.iterdir() if p.name not in prefilled)}


def outputs_child(path: str) -> dict:
    """Every CUDA source variant's output (float32) into an .npz, for the parent to compare across processes."""
    import mlx.core as mx
    import numpy as np

    from kernels import REGISTRY
    from kernels.base import run_variant
    from kernels.flash_cuda_mma import mma_dynamic_variants

    arrays = {}
    for kernel_name, shape in IDENTICAL_SHAPES.items():
        kernel = REGISTRY[kernel_name]
        variants = [v for v in kernel.variants.values() if v.backend == "cuda"]
        if kernel_name == "flash_prefill":
            variants += [v for v in mma_dynamic_variants() if v.name not in kernel.variants]
        for dtype in ("float16", "bfloat16"):
            inputs = kernel.make_inputs(kernel.normalize_shape(shape), dtype, 0)
            for variant in variants:
                out = run_variant(variant, inputs)
                arrays[f"{kernel_name}|{variant.name}|{dtype}"] = np.array(out.astype(mx.float32))
    np.savez(path, **arrays)
    return {"outputs": len(arrays)}


def child(mode: str, arg: str) -> None:
    sys.path.insert(0, str(ROOT))
    result = {"timing": timing_child, "proof": proof_child}.get(mode)
    print(json.dumps(result() if result else outputs_child(arg)))


def spawn(mode: str, env: dict[str, str], arg: str = "") -> tuple[dict, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", mode, arg], capture_output=True, text=True,
                          check=False, env={**os.environ, **env})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": done.stderr[-1500:]}, wall
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def timing_children(count: int, env: dict[str, str], label: str) -> list[dict]:
    results = []
    for i in range(count):
        row, wall = spawn("timing", env)
        row["process_wall_s"] = wall
        results.append(row)
        for case in row.get("cases", []):
            calls = ", ".join(f"{c * 1e3:.1f}" for c in case["calls_s"])
            print(f"{label} child {i}: {case['variant']:20s} calls [{calls}] ms, launch {case['launch_us']:.1f} us",
                  flush=True)
        print(f"{label} child {i}: import {row.get('import_s', float('nan')):.2f} s, process {wall:.2f} s "
              f"{row.get('error', '')}", flush=True)
    return results


def identical() -> list[dict]:
    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        first, _ = spawn("outputs", {}, f"{folder}/first.npz")
        second, _ = spawn("outputs", {}, f"{folder}/second.npz")
        if "error" in first or "error" in second:
            print("identical: a child failed", first.get("error", ""), second.get("error", ""), flush=True)
            return [{"error": first.get("error", "") + second.get("error", "")}]
        a, b = np.load(f"{folder}/first.npz"), np.load(f"{folder}/second.npz")
        rows = []
        for key in a.files:
            diff = float(np.max(np.abs(a[key] - b[key])))
            rows.append({"case": key, "max_abs_diff": diff})
            print(f"identical: {key:60s} max|process 1 - process 2| = {diff:.3g}", flush=True)
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("jit-cost.json"))
    parser.add_argument("--identical", action="store_true",
                        help="also compare every CUDA source variant's output in two processes, bit for bit")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    report: dict = {}
    with tempfile.TemporaryDirectory() as proof_cache, tempfile.TemporaryDirectory() as cache:
        report["proof"], _ = spawn("proof", {"MLX_PTX_CACHE_DIR": proof_cache})
        print("proof:", report["proof"], flush=True)
        report["children"] = timing_children(args.children, {"MLX_PTX_CACHE_DIR": cache}, "fresh process")
        report["identical"] = identical() if args.identical else []
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
