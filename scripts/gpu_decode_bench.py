"""The CUDA decode-attention kernels on a GPU chip, in one run (the H200 figures of issue #19's closing note).

1. Correctness of every CUDA decode variant: each registered check of quant_decode / quant_decode_layers (reference,
   batch rows, causal tail, layer parity at NL 1/4/32, strides, distinct layers) in float32, float16 and bfloat16.
2. Speed, pipelined timing (kernels the harness times the same way):
   - request batching: at B = 1, 4, 32 (H_q 32, H_kv 8, S_kv 4096, D 128, 4 and 8 bits) each variant's time per
     request and its speed-up over dequant+SDPA (dequant_sdpa time / variant time);
   - layers: NL = 32 in one batched call against the per-layer loop of the same kernel and against the MLX loop.

Prints a table and writes JSON (--out). Usage: python scripts/gpu_decode_bench.py [--out decode.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.core.chip import detect  # noqa: E402
from harness.core.summary import summarize  # noqa: E402
from harness.execute.timing import TimingProtocol, measure_mlx  # noqa: E402
from kernels import REGISTRY  # noqa: E402
from kernels.base import run_variant  # noqa: E402

PROTOCOL = TimingProtocol(warmup_s=0.3, warmup_calls=3, min_sample_s=0.03, samples=10)
SINGLE, LAYERS = REGISTRY["quant_decode"], REGISTRY["quant_decode_layers"]
CHECK_SHAPES = {
    "quant_decode": [dict(B=1, H_q=4, H_kv=1, S_q=1, S_kv=1, D=64, bits=4, group=32),
                     dict(B=2, H_q=4, H_kv=4, S_q=1, S_kv=37, D=64, bits=8, group=64),
                     dict(B=1, H_q=8, H_kv=2, S_q=4, S_kv=45, D=32, bits=4, group=32),
                     dict(B=4, H_q=32, H_kv=8, S_q=1, S_kv=4096, D=128, bits=4, group=32)],
    "quant_decode_layers": [dict(NL=1, B=1, H_q=2, H_kv=1, S_kv=16, D=32),
                            dict(NL=4, B=2, H_q=2, H_kv=1, S_kv=16, D=32),
                            dict(NL=32, B=1, H_q=2, H_kv=1, S_kv=8, D=32),
                            dict(NL=32, B=1, H_q=32, H_kv=8, S_kv=2048, D=128)],
}


# Checks that build adversarial cases whose distinguishability shrinks as the cache grows (a causal tail of 4 keys
# in 4096, six slots' outputs averaging thousands of values): they refuse such shapes instead of judging them.
SMALL_SHAPE_CHECKS = {"causal_tail", "stride_adversarial", "layers_differ"}


def cuda_variants(kernel) -> list:
    return [v for v in kernel.variants.values() if v.backend == "cuda" and v.requires() is None]


def correctness() -> list[dict]:
    rows = []
    for kernel in (SINGLE, LAYERS):
        for variant in cuda_variants(kernel):
            for dtype in ("float32", "float16", "bfloat16"):
                for shape in CHECK_SHAPES[kernel.name]:
                    for check_name, check in kernel.checks.items():
                        if shape["S_kv"] >= 1024 and check_name in SMALL_SHAPE_CHECKS:
                            continue  # their own preconditions refuse long caches (the mask gap, the separation)
                        try:
                            res = check(kernel, variant, shape, dtype)
                            row = dict(passed=res.passed, error=res.max_error, tolerance=res.tolerance,
                                       detail=res.detail)
                        except Exception as exc:  # noqa: BLE001 - a crash is a failed check, reported
                            row = dict(passed=False, error=None, tolerance=None, detail=f"{type(exc).__name__}: {exc}")
                        rows.append(dict(kernel=kernel.name, variant=variant.name, dtype=dtype, check=check_name,
                                         shape=shape, **row))
                        mark = "ok  " if row["passed"] else "FAIL"
                        print(f"{mark} {kernel.name}/{variant.name} {dtype} {check_name} {shape}: {row['detail']}",
                              flush=True)
    return rows


def time_variant(kernel, variant, shape: dict, dtype: str) -> float:
    inputs = kernel.make_inputs(kernel.normalize_shape(shape), dtype, 0)
    return summarize(measure_mlx(lambda: run_variant(variant, inputs), PROTOCOL).samples).median


def against_default(kernel, shape: dict) -> list[tuple[str, float, float]]:
    """(variant, median, the default variant's median) for every variant that runs here, in float16."""
    base = time_variant(kernel, kernel.variants[kernel.default_variant], shape, "float16")
    return [(v.name, base if v.name == kernel.default_variant else time_variant(kernel, v, shape, "float16"), base)
            for v in kernel.variants.values() if not v.unsupported("float16")]


def speed(quick: bool) -> list[dict]:
    rows = []
    for bits in (4,) if quick else (4, 8):
        for b in (1, 4, 32):
            shape = dict(B=b, H_q=32, H_kv=8, S_q=1, S_kv=4096, D=128, bits=bits, group=32)
            for name, t, base in against_default(SINGLE, shape):
                rows.append(dict(kernel="quant_decode", variant=name, shape=shape, dtype="float16",
                                 median_s=t, per_request_s=t / b, speedup_vs_dequant_sdpa=base / t))
                print(f"quant_decode B={b:2d} bits={bits} {name:14s} {t * 1e6:9.1f} us  "
                      f"{t / b * 1e6:8.2f} us/request  x{base / t:.2f} vs dequant+SDPA", flush=True)
    shape = dict(NL=32, B=1, H_q=32, H_kv=8, S_kv=2048, D=128)
    for name, t, base in against_default(LAYERS, shape):
        rows.append(dict(kernel="quant_decode_layers", variant=name, shape=shape, dtype="float16",
                         median_s=t, speedup_vs_mlx_loop=base / t))
        print(f"quant_decode_layers NL=32 {name:22s} {t * 1e6:9.1f} us  x{base / t:.2f} vs the MLX loop", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("decode-bench.json"))
    parser.add_argument("--quick", action="store_true", help="4-bit only in the speed part")
    parser.add_argument("--skip-checks", action="store_true")
    args = parser.parse_args()
    chip = detect().to_dict()
    print(f"chip: {chip}", flush=True)
    checks = [] if args.skip_checks else correctness()
    failed = [r for r in checks if not r["passed"]]
    print(f"correctness: {len(checks) - len(failed)}/{len(checks)} passed", flush=True)
    result = dict(chip=chip, checks=checks, speed=speed(args.quick))
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
