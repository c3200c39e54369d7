"""Does the device clock time a short kernel steadily where pipelined timing follows the host? (not a test; CUDA)

One process, one kernel: causal SDPA fp16 D=128, ``s1024`` (B=1 H=16 S=1024, host-paced when pipelined on an H200),
``s2048`` (H=32 S=2048, device-paced), each also with 5 % more keys (``...k5``, the planted variant of
bench/h200_trials/planted_variants.py). Prints one JSON line: the device-clock time per call (median of 15
slopes between spans of 4 and 12 queued calls, harness/execute/device_clock.py, hold 2 ms), its spread (IQR /
median), and the harness's pipelined time and backlog in the same process. Run it in fresh processes:

    for p in 1 2 3 4 5; do for k in s1024 s1024k5 s2048 s2048k5; do python bench/device_clock_probe.py $k; done; done
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.execute import device_clock  # noqa: E402
from harness.execute.timing import TimingProtocol, measure_mlx, relative_spread  # noqa: E402

KERNELS = {"s1024": (1024, 16, False), "s1024k5": (1024, 16, True), "s2048": (2048, 32, False),
           "s2048k5": (2048, 32, True)}


def main() -> int:
    import mlx.core as mx

    if len(sys.argv) != 2 or sys.argv[1] not in KERNELS:
        raise SystemExit(f"usage: device_clock_probe.py {{{','.join(KERNELS)}}}")
    if (reason := device_clock.unavailable_reason()) is not None:
        raise SystemExit(f"error: {reason}")
    seq, heads, keys5 = KERNELS[sys.argv[1]]
    q, k, v = (mx.random.normal((1, heads, seq, 128), key=sub).astype(mx.float16)
               for sub in mx.random.split(mx.random.key(0), 3))
    if keys5:
        extra = seq // 40
        k, v = mx.concatenate([k[:, :, :extra], k], axis=2), mx.concatenate([v[:, :, :extra], v], axis=2)
    mx.eval(q, k, v)

    def fn():
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=128**-0.5, mask="causal")

    span = device_clock.mlx_span(lambda: mx.async_eval(fn()))
    for _ in range(3):
        span(12, 0.002)
    slopes = [(span(12, 0.002)[0] - span(4, 0.002)[0]) / 8 for _ in range(15)]
    m = measure_mlx(fn, TimingProtocol(samples=5, mode="pipelined"))
    print(json.dumps({"k": sys.argv[1], "device_us": round(statistics.median(slopes) * 1e6, 2),
                      "spread": round(relative_spread(slopes), 4),
                      "pipelined_us": round(statistics.median(m.samples) * 1e6, 1), "backlog": m.backlog_calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
