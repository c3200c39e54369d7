"""Measure flash prefill variants against SDPA on a GPU chip, in one run (the H200 figures of the closing note).

Prints, and writes as JSON: the chip identity, the calibrated matmul peak and copy bandwidth, each variant's
median time at the given shapes (causal, B=1, H=32), its TFLOP/s (causal work only), % of the calibrated peak
and its time as a ratio to SDPA's (SDPA time / variant time: 1.0 = as fast as SDPA), plus a correctness
spot-check of every CUDA variant and the cost of starting one job process.

Usage: python bench/gpu_flash_bench.py [--out results.json] [--seq 2048 8192] [--dims 64 128] [--only cuda_mma]
       [--candidates]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.core.chip import detect  # noqa: E402
from harness.execute.timing import TimingProtocol, measure_mlx  # noqa: E402
from harness.stats.summary import summarize
from kernels import REGISTRY  # noqa: E402

PROTOCOL = TimingProtocol(warmup_s=0.5, warmup_calls=3, min_sample_s=0.05, samples=10)


def median_of(fn) -> tuple[float, float]:
    m = measure_mlx(fn, PROTOCOL)
    s = summarize(m.samples)
    return s.median, s.iqr_rel


def calibrate() -> dict[str, float]:
    peaks = {}
    for name, sizes, key in (("calib_matmul", [4096, 8192], "matmul_flops"), ("calib_copy", [1 << 26, 1 << 28],
                                                                               "copy_bytes_per_s")):
        kernel = REGISTRY[name]
        best = 0.0
        for n in sizes:
            shape = kernel.normalize_shape({"N": n})
            inputs = kernel.make_inputs(shape, "float16", 0)
            fn = kernel.variants[kernel.default_variant].fn
            med, _ = median_of(lambda fn=fn, inputs=inputs: fn(**inputs))
            work = kernel.flops(shape) if key == "matmul_flops" else kernel.bytes_moved(shape, "float16")
            best = max(best, work / med)
        peaks[key] = best
    return peaks


def selected(name: str, only: list[str]) -> bool:
    """SDPA always (the baseline); other variants when no prefix is given or the name starts with one."""
    return name == "sdpa" or not only or any(name.startswith(prefix) for prefix in only)


def spot_check(only: list[str]) -> dict[str, str]:
    kernel = REGISTRY["flash_prefill"]
    out = {}
    shapes = [{"B": 1, "H": 2, "S_q": 1, "S_kv": 1, "D": 64}, {"B": 2, "H": 2, "S_q": 37, "S_kv": 101, "D": 128},
              {"B": 1, "H": 3, "S_q": 200, "S_kv": 200, "D": 32}]
    for name, variant in kernel.variants.items():
        if not name.startswith("cuda") or not selected(name, only):
            continue
        verdicts = []
        for dtype in ("float16", "bfloat16"):
            for shape in shapes:
                for check in ("reference", "causal_perturb", "masked_no_nan"):
                    try:
                        res = kernel.checks[check](kernel, variant, kernel.normalize_shape(shape), dtype)
                        if not res.passed:
                            verdicts.append(f"{dtype} {shape} {check}: {res.detail[:200]}")
                    except Exception as exc:  # noqa: BLE001 - reported, not raised
                        verdicts.append(f"{dtype} {shape} {check}: {type(exc).__name__}: {str(exc)[:300]}")
                        break  # e.g. the source does not compile: once is enough
        out[name] = "ok" if not verdicts else " | ".join(verdicts[:3])
    return out


def job_process_cost() -> float:
    start = time.perf_counter()
    code = "import harness.execute.worker, kernels, mlx.core as mx; mx.eval(mx.ones(4) + 1)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--skip-mlx", action="store_true", help="time only SDPA and the CUDA source variants")
    parser.add_argument("--only", nargs="*", default=[], metavar="PREFIX",
                        help="check and time only the variants whose name starts with a prefix (and SDPA)")
    parser.add_argument("--candidates", action="store_true",
                        help="also register the candidate mma tiles in dynamic shared memory that are not yet "
                             "part of the kernel (kernels.flash_cuda_mma.mma_dynamic_variants) and the wgmma tiles "
                             "not registered (kernels.flash_cuda_wgmma.wgmma_variants, sm_90a)")
    args = parser.parse_args()
    if args.candidates:
        from kernels import flash_cuda, flash_cuda_mma, flash_cuda_wgmma

        flash_cuda.register_variants(flash_cuda_mma.mma_dynamic_variants())
        flash_cuda.register_variants(flash_cuda_wgmma.wgmma_variants())

    import mlx.core as mx

    report: dict = {"chip": detect().to_dict(), "mx_fast_cuda_kernel_doc": (mx.fast.cuda_kernel.__doc__ or "")[:600]}
    report["job_process_s"] = job_process_cost()
    report["spot_check"] = spot_check(args.only)
    print(json.dumps(report["spot_check"], indent=1), flush=True)
    report["peaks"] = calibrate()
    print("peaks", report["peaks"], flush=True)
    kernel = REGISTRY["flash_prefill"]
    rows = []
    for D in args.dims:
        for S in args.seq:
            shape = kernel.normalize_shape({"B": 1, "H": 32, "S": S, "D": D})
            inputs = kernel.make_inputs(shape, args.dtype, 0)
            flops = kernel.flops(shape)
            base = None
            for name, variant in kernel.variants.items():
                if variant.unsupported(args.dtype) or not selected(name, args.only):
                    continue
                if name.startswith("flash_") and (S > 2048 or args.skip_mlx):
                    continue  # the op-by-op MLX variants are timed at S <= 2048 only (launch-bound there)
                try:
                    med, spread = median_of(lambda variant=variant, inputs=inputs: variant.fn(**inputs))
                except Exception as exc:  # noqa: BLE001
                    rows.append({"D": D, "S": S, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    continue
                if name == "sdpa":
                    base = med
                row = {"D": D, "S": S, "variant": name, "median_ms": med * 1e3, "iqr_rel": spread,
                       "tflops": flops / med / 1e12, "pct_peak": 100 * flops / med / report["peaks"]["matmul_flops"],
                       "speed_vs_sdpa": (base / med) if base else None}
                rows.append(row)
                print(json.dumps(row), flush=True)
    report["rows"] = rows
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
