"""What does a launch through ``mx.fast.precompiled_cuda_kernel`` cost on the host, and does it grow with the cubin?

One process: a one-thread-per-element add kernel launched 2,000 times back to back (``mx.async_eval`` each, one
synchronize), microseconds per call, through ``mx.fast.cuda_kernel`` (MLX compiles it) and through
``mx.fast.precompiled_cuda_kernel`` with a cubin compiled here (kernels/cuda_compile.py's NVRTC) of the same kernel,
padded with an unused device array of 0 / 64 KB / 256 KB / 1 MB so that only the cubin's size changes. A launch
cost that grows with the cubin means MLX copies or hashes the image on every call. Also the cost of building the
lazy op alone (no evaluation). Needs a CUDA GPU.

Usage: python scripts/precompiled_launch_cost.py [--calls 2000] [--out launch.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BODY = "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < 1024) out[i] = x[i] + 1.0f;"
PADS = (0, 64 * 1024, 256 * 1024, 1024 * 1024)


def per_call_us(make, calls: int) -> float:
    import mlx.core as mx

    mx.eval(make())
    mx.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            mx.async_eval(make())
        mx.synchronize()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def build_us(make, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        make()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("launch.json"))
    args = parser.parse_args()
    import mlx.core as mx

    from kernels import cuda_compile

    x = mx.zeros((1024,), dtype=mx.float32)
    common = dict(inputs=[x], output_shapes=[(1024,)], output_dtypes=[mx.float32], grid=(1024, 1, 1),
                  threadgroup=(256, 1, 1))
    jit = mx.fast.cuda_kernel(name="launch_cost_add", input_names=["x"], output_names=["out"], source=BODY)
    rows = [{"path": "cuda_kernel", "launch_us": per_call_us(lambda: jit(**common)[0], args.calls),
             "build_us": build_us(lambda: jit(**common)[0], args.calls)}]
    print(json.dumps(rows[-1]), flush=True)
    home = cuda_compile.cuda_home()
    for pad in PADS:
        name = f"launch_cost_add_pad{pad}"
        header = f"__device__ char harness_pad[{pad}] = {{1}};\n" if pad else ""
        body = BODY + ("\n    if (i == 1 << 30) out[0] = harness_pad[i % " + str(pad) + "];" if pad else "")
        source = cuda_compile.kernel_source(header, body, [("x", "float32")], [("out", "float32")], [])
        cubin, _ = cuda_compile.nvrtc().compile(source.replace(cuda_compile.NAME_PLACEHOLDER, name),
                                                cuda_compile.device_arch(), f"{home}/include" if home else None)

        def launch(name=name, cubin=cubin):
            return mx.fast.precompiled_cuda_kernel(name=name, compiled_source=cubin, scalars=[], **common)[0]

        rows.append({"path": "precompiled_cuda_kernel", "pad_bytes": pad, "cubin_bytes": len(cubin),
                     "launch_us": per_call_us(launch, args.calls), "build_us": build_us(launch, args.calls)})
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"device": mx.device_info(), "calls": args.calls, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
