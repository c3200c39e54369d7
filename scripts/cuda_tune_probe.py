"""How do compile settings move the mma flash kernels? ptxas's register/spill report, then timings side by side.

The kernels are compiled by kernels/cuda_compile.py (which MLX then loads), so a probe can add NVRTC options and
``__launch_bounds__`` that ``mx.fast.cuda_kernel`` cannot express. For each setting -- as MLX compiles,
``__launch_bounds__(threads, 1|2)``, ``--maxrregcount`` -- each variant is timed at one shape next to SDPA in the
same process (median of pipelined samples, the harness's timing protocol).

Usage: python scripts/cuda_tune_probe.py [--variants cuda_mma_bq64_bk64 ...] [--seq 8192] [--dim 128]
       [--out probe.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_flash_bench import median_of  # noqa: E402

from kernels import REGISTRY, cuda_compile, flash_cuda_mma  # noqa: E402

SETTINGS = {"as-mlx": ((), None), "bounds-1": ((), 1), "bounds-2": ((), 2),
            "maxrreg-128": (("--maxrregcount=128",), None), "maxrreg-168": (("--maxrregcount=168",), None)}


def use_setting(options: tuple[str, ...], min_blocks: int | None) -> None:
    """Point the mma kernels at fresh CudaKernel objects compiled with these settings."""
    cuda_compile.EXTRA_OPTIONS = ("--ptxas-options=-v", *options)
    flash_cuda_mma._kernel = functools.cache(functools.partial(flash_cuda_mma.mma_kernel, min_blocks=min_blocks))


def ptxas_report(directory: Path, since: set[Path]) -> list[str]:
    """The 'Used N registers' / spill lines of the logs written since ``since``."""
    lines = []
    for log in sorted(set(directory.glob("*.log")) - since):
        lines += [line.strip() for line in log.read_text().splitlines()
                  if re.search(r"registers|spill", line)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+",
                        default=["cuda_mma_bq64_bk64", "cuda_mma_bq128_bk64_r32", "cuda_mma_bq128_bk32_r32"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("tune-probe.json"))
    args = parser.parse_args()
    variants = {v.name: v for v in flash_cuda_mma.mma_variants() + flash_cuda_mma.mma_dynamic_variants()}
    kernel = REGISTRY["flash_prefill"]
    shape = kernel.normalize_shape({"B": 1, "H": 32, "S_q": args.seq, "S_kv": args.seq, "D": args.dim})
    inputs = kernel.make_inputs(shape, "float16", 0)
    flops = kernel.flops(shape)
    sdpa = kernel.variants["sdpa"].fn
    rows = []
    cache = os.environ["MLX_PTX_CACHE_DIR"]  # set before MLX was imported (main's caller, below)
    for setting in args.settings:
        use_setting(*SETTINGS[setting])
        for name in args.variants:
            before = set(Path(cache).glob("*.log"))
            fn = variants[name].fn
            try:
                median, iqr = median_of(lambda fn=fn: fn(**inputs))
            except Exception as error:  # noqa: BLE001 -- a setting the kernel cannot launch with is a result
                rows.append({"setting": setting, "variant": name, "error": str(error)[:300]})
                print(f"{setting:12s} {name:26s} error {str(error)[:200]}", flush=True)
                continue
            sdpa_median, _ = median_of(lambda: sdpa(**inputs))
            row = {"setting": setting, "variant": name, "median_ms": median * 1e3, "iqr_rel": iqr,
                   "tflops": flops / median / 1e12, "speed_vs_sdpa": sdpa_median / median,
                   "sdpa_ms": sdpa_median * 1e3, "ptxas": ptxas_report(Path(cache), before),
                   "fallbacks": "; ".join(cuda_compile.FALLBACKS.values())}
            rows.append(row)
            print(f"{setting:12s} {name:26s} {row['median_ms']:.3f} ms ({iqr:.1%}) {row['tflops']:.0f} TFLOP/s "
                  f"x{row['speed_vs_sdpa']:.3f} of SDPA ({row['sdpa_ms']:.3f} ms) | {' | '.join(row['ptxas'])}",
                  flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if "MLX_PTX_CACHE_DIR" not in os.environ:  # MLX reads it once: start over in a process that has it
        os.environ["MLX_PTX_CACHE_DIR"] = tempfile.mkdtemp(prefix="tune-probe-")
        os.execv(sys.executable, [sys.executable, *sys.argv])
    main()
