"""Where does a CUDA source variant's per-process start go? Time its first call in fresh processes.

Each child process imports MLX and the kernels, builds one benchmark's inputs, then times the variant's first call
(JIT compile or cache load, plus the launch) and its second call, and counts the files in MLX's PTX cache
directory (``$MLX_PTX_CACHE_DIR``, default ``<tmp>/mlx/<version>/ptx``) before and after. Run N children one after
another: if the first call stays slow in every child although the cache holds the kernel, the cost is not NVRTC.

Usage: python scripts/cuda_jit_cost.py [--children 3] [--out jit.json]
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
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("jit-cost.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    results = []
    for i in range(args.children):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        ok = done.returncode == 0
        row = json.loads(done.stdout.strip().splitlines()[-1]) if ok else {"error": done.stderr[-800:]}
        row["process_wall_s"] = wall
        results.append(row)
        for case in row.get("cases", []):
            calls = ", ".join(f"{c * 1e3:.1f}" for c in case["calls_s"])
            print(f"child {i}: {case['variant']:20s} calls [{calls}] ms, cache files "
                  f"{case['cache_files_before']} -> {case['cache_files_after']}", flush=True)
        print(f"child {i}: import {row.get('import_s', float('nan')):.2f} s, process {wall:.2f} s "
              f"{row.get('error', '')}", flush=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
