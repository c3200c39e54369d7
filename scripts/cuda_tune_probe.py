"""How would compile settings move the mma flash kernels? ptxas's register/spill report per setting, one timing.

MLX 0.32.4 compiles a custom kernel itself and cannot load one compiled here (kernels/cuda_compile.py), so the
kernel that runs is always MLX's compile: ``__launch_bounds__`` and ``--maxrregcount`` cannot be timed through
``mx.fast.cuda_kernel``. For each setting -- as MLX compiles, ``__launch_bounds__(threads, 1|2)``,
``--maxrregcount`` -- the report compile (``cuda_compile.REPORT_OPTIONS``) gives ptxas's registers and spills of the
same source; each variant is timed once, as MLX compiles it, next to SDPA in the same process (median of pipelined
samples, the harness's timing protocol).

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
    """Point the mma kernels at fresh CudaKernel objects whose report compile uses these settings."""
    cuda_compile.REPORT_OPTIONS = ("--ptxas-options=-v", *options)
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
    os.environ[cuda_compile.REPORT_DIR_ENV] = reports = tempfile.mkdtemp(prefix="tune-probe-")
    variants = {v.name: v for v in flash_cuda_mma.mma_variants() + flash_cuda_mma.mma_dynamic_variants()}
    kernel = REGISTRY["flash_prefill"]
    shape = kernel.normalize_shape({"B": 1, "H": 32, "S_q": args.seq, "S_kv": args.seq, "D": args.dim})
    inputs = kernel.make_inputs(shape, "float16", 0)
    flops = kernel.flops(shape)
    sdpa = kernel.variants["sdpa"].fn
    rows = []
    for name in args.variants:
        fn = variants[name].fn
        row: dict = {"variant": name, "settings": {}}
        for setting in args.settings:
            use_setting(*SETTINGS[setting])
            before = set(Path(reports).glob("*.log"))
            try:
                fn(**inputs)  # the report compile runs before MLX's launch
            except Exception as error:  # noqa: BLE001 -- a setting the kernel cannot launch with is a result
                row["settings"][setting] = {"error": str(error)[:300]}
                continue
            row["settings"][setting] = {"ptxas": ptxas_report(Path(reports), before),
                                        "failure": cuda_compile.REPORT_FAILURES.get(fn.__name__, "")}
            print(f"{name:26s} {setting:12s} {' | '.join(row['settings'][setting]['ptxas'])}", flush=True)
        median, iqr = median_of(lambda fn=fn: fn(**inputs))
        sdpa_median, _ = median_of(lambda: sdpa(**inputs))
        row.update(median_ms=median * 1e3, iqr_rel=iqr, tflops=flops / median / 1e12,
                   speed_vs_sdpa=sdpa_median / median, sdpa_ms=sdpa_median * 1e3,
                   report_failures="; ".join(cuda_compile.REPORT_FAILURES.values()))
        rows.append(row)
        print(f"{name:26s} as MLX compiles: {row['median_ms']:.3f} ms ({iqr:.1%}) {row['tflops']:.0f} TFLOP/s "
              f"x{row['speed_vs_sdpa']:.3f} of SDPA ({row['sdpa_ms']:.3f} ms)", flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
