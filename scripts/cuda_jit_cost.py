"""Where does a CUDA source variant's per-process start go? Time its first call in fresh processes.

Each child process imports MLX and the kernels, builds one benchmark's inputs, then times the variant's first call
(JIT compile or cache load, plus the launch) and its second call, and counts the files in MLX's PTX cache
directory (``$MLX_PTX_CACHE_DIR``, default ``<tmp>/mlx/<version>/ptx``) before and after. Run N children one after
another: if the first call stays slow in every child although the cache holds the kernel, the cost is not NVRTC.

The children run once with the harness's cubin cache off (``HARNESS_CUDA_CACHE=off``: MLX compiles in every
process) and once with a fresh cache directory (the first child compiles, the others load;
``kernels/cuda_compile.py``). ``--identical`` also checks, in one process, that every CUDA source variant gives
bit-identical output through both paths.

Usage: python scripts/cuda_jit_cost.py [--children 3] [--identical] [--out jit.json]
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


def child() -> None:
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    import mlx.core as mx

    from kernels import REGISTRY
    from kernels.base import run_variant

    cache = Path(os.environ.get("MLX_PTX_CACHE_DIR") or Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "ptx")
    from kernels import cuda_compile

    out = {"import_s": time.perf_counter() - t0, "cache": str(cache), "cases": []}
    for kernel_name, variant, shape in CASES:
        kernel = REGISTRY[kernel_name]
        inputs = kernel.make_inputs(kernel.normalize_shape(shape), "float16", 0)
        before = len(list(cache.glob("*"))) if cache.exists() else 0
        calls = []
        for _ in range(3):
            start = time.perf_counter()
            mx.eval(run_variant(kernel.variants[variant], inputs))
            mx.synchronize()
            calls.append(time.perf_counter() - start)
        after = len(list(cache.glob("*"))) if cache.exists() else 0
        out["cases"].append({"variant": variant, "calls_s": calls, "cache_files_before": before,
                             "cache_files_after": after})
    out["fallbacks"] = dict(cuda_compile.FALLBACKS)
    print(json.dumps(out))


def identical() -> list[dict]:
    """Every CUDA source variant of the registry through mx.fast.cuda_kernel and through the cubin cache."""
    sys.path.insert(0, str(ROOT))
    import mlx.core as mx

    from kernels import REGISTRY, cuda_compile
    from kernels.base import run_variant
    from kernels.flash_cuda_mma import mma_dynamic_variants

    shapes = {"flash_prefill": {"B": 1, "H": 4, "S_q": 200, "S_kv": 328, "D": 128},
              "quant_decode": {"B": 2, "H_q": 32, "H_kv": 8, "S_kv": 1000, "D": 128},
              "quant_decode_layers": {"NL": 3, "B": 2, "H_q": 32, "H_kv": 8, "S_kv": 600, "D": 128}}
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for kernel_name, shape in shapes.items():
            kernel = REGISTRY[kernel_name]
            variants = [v for v in kernel.variants.values() if v.backend == "cuda"]
            if kernel_name == "flash_prefill":
                variants += mma_dynamic_variants()
            for dtype in ("float16", "bfloat16"):
                inputs = kernel.make_inputs(kernel.normalize_shape(shape), dtype, 0)
                for variant in variants:
                    outs = {}
                    for mode in ("off", cache):
                        os.environ[cuda_compile.CACHE_ENV] = mode
                        out = run_variant(variant, inputs)
                        mx.eval(out)
                        outs[mode] = out
                    diff = float(mx.max(mx.abs(outs["off"].astype(mx.float32) - outs[cache].astype(mx.float32))))
                    rows.append({"kernel": kernel_name, "variant": variant.name, "dtype": dtype, "max_abs_diff": diff,
                                 "fallback": cuda_compile.FALLBACKS.get(variant.name, "")})
                    print(f"{kernel_name:20s} {variant.name:28s} {dtype:9s} max|cached - mlx| = {diff:.3g}", flush=True)
    os.environ.pop(cuda_compile.CACHE_ENV, None)
    print("fallbacks:", json.dumps(cuda_compile.FALLBACKS), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("jit-cost.json"))
    parser.add_argument("--identical", action="store_true",
                        help="also check every CUDA source variant's output through both paths, bit for bit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    report = {"identical": identical() if args.identical else []}
    with tempfile.TemporaryDirectory() as cache:
        for mode in ("off", cache):
            report["cache_off" if mode == "off" else "cache_on"] = children(args.children, mode)
    args.out.write_text(json.dumps(report, indent=1))


def children(count: int, cache_mode: str) -> list[dict]:
    results = []
    env = {**os.environ, "HARNESS_CUDA_CACHE": cache_mode}
    label = "cache off" if cache_mode == "off" else "cache on"
    for i in range(count):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, check=False,
                              env=env)
        wall = time.perf_counter() - start
        ok = done.returncode == 0
        row = json.loads(done.stdout.strip().splitlines()[-1]) if ok else {"error": done.stderr[-800:]}
        row["process_wall_s"] = wall
        results.append(row)
        for case in row.get("cases", []):
            calls = ", ".join(f"{c * 1e3:.1f}" for c in case["calls_s"])
            print(f"{label} child {i}: {case['variant']:20s} calls [{calls}] ms, cache files "
                  f"{case['cache_files_before']} -> {case['cache_files_after']}", flush=True)
        print(f"{label} child {i}: import {row.get('import_s', float('nan')):.2f} s, process {wall:.2f} s "
              f"{row.get('error', '')} fallbacks {row.get('fallbacks')}", flush=True)
    return results


if __name__ == "__main__":
    main()
