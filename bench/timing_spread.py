"""How steady is each timing mode? The spread of a kernel's median between fresh processes, per mode.

For each kernel and each timing mode (per-call, pipelined, auto: harness/execute/timing.py), this starts
``--processes`` FRESH Python processes one after another (this script again, with a hidden ``--child`` flag), in
rounds (round r runs every kernel x mode once) so slow drift of the machine hits every setting alike. Each process
builds the kernel's inputs, times it with the harness's own protocol (``measure_mlx``, the default protocol with
``--samples`` samples) and reports its samples. Printed per kernel x mode, and written with every process's record
to ``--json``:

- median ms/call: the median of the process medians;
- between %: the spread between processes, the standard deviation of the log process medians (x 100: about the
  coefficient of variation); this is what a regression verdict across runs has to beat;
- within %: the spread inside one process, the median over processes of IQR / median of its samples;
- auto chose: how often the mode ``auto`` picked each mode (its pilot spreads are in the JSON);
- round trip us: the median host round trip (a trivial ``mx.eval`` + ``mx.synchronize()``).

Kernels (GPU sizes; ``--cpu`` shrinks them, and uses float32, since MLX's CPU float16 is emulated and slow):

- ``sdpa2048``, ``sdpa8192``: causal ``mx.fast.scaled_dot_product_attention``, B=1 H=32 D=128 float16, S=2048 and
  8192 (``--cpu``: H=2, S=128 and 256); ``sdpa1024``: the same at S=1024 with H=16, a kernel of about 25 us whose
  pipelined timing can follow the host's pace (``--cpu``: S=64);
- ``matmul4096``: a 4096^2 float16 matmul (``--cpu``: 256^2);
- ``chain50``: 50 tiny elementwise ops on 1024 elements, launch-bound (the same with ``--cpu``).

Works with MLX's CUDA backend (mlx >= 0.32) and on the CPU:

    python bench/timing_spread.py [--processes 8] [--samples 10] [--kernels sdpa2048,chain50]
                                    [--modes per-call,pipelined,auto] [--json out.json] [--cpu]
                                    [--affinities "all;8-9"] [--groups 1,16]

``--groups``: each process issues that many calls per ``mx.async_eval`` (time reported per call). On the H200
(``bench/results/h200-timing-spread-groups.json``) grouping 16 calls cut causal SDPA at S=2048 from 91 to 75 us a
call (MLX's cost per evaluation, paid on the device too) but left S=1024 (H=16) host-paced: 17-29 us, 19 % between
processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.execute.timing import TimingProtocol, measure_mlx, relative_spread  # noqa: E402

KERNELS = ("sdpa1024", "sdpa2048", "sdpa8192", "matmul4096", "chain50")
SDPA_SIZES = {"sdpa1024": (1024, 16, 64), "sdpa2048": (2048, 32, 128), "sdpa8192": (8192, 32, 256)}  # S, H, --cpu S
MODES = ("per-call", "pipelined", "auto")


def build(kernel: str, cpu: bool):
    """The kernel's zero-argument MLX function, its inputs evaluated, and a label of its sizes."""
    import mlx.core as mx

    dtype = mx.float32 if cpu else mx.float16
    name = str(dtype).rsplit(".", 1)[-1]
    key = mx.random.key(0)
    if kernel.startswith("sdpa"):
        seq, heads, cpu_seq = SDPA_SIZES[kernel]
        seq, heads, dim = (cpu_seq, 2, 128) if cpu else (seq, heads, 128)
        q, k, v = (mx.random.normal((1, heads, seq, dim), key=sub).astype(dtype) for sub in mx.random.split(key, 3))
        mx.eval(q, k, v)
        scale = dim**-0.5

        def fn():
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")

        return fn, f"B=1 H={heads} S={seq} D={dim} {name} causal"
    if kernel == "matmul4096":
        n = 256 if cpu else 4096
        a, b = (mx.random.normal((n, n), key=sub).astype(dtype) for sub in mx.random.split(key, 2))
        mx.eval(a, b)
        return (lambda: a @ b), f"{n}x{n} @ {n}x{n} {name}"
    if kernel == "chain50":
        x = mx.random.normal((1024,), key=key).astype(dtype)
        mx.eval(x)

        def fn():
            y = x
            for i in range(50):
                y = y * 0.999 if i % 2 else y + 0.001
            return y

        return fn, f"50 elementwise ops on 1024 {name}"
    raise SystemExit(f"unknown kernel {kernel!r}: one of {', '.join(KERNELS)}")


def child(args: argparse.Namespace) -> None:
    """One fresh process: time one kernel in one mode, print one JSON line."""
    cpus = parse_cpus(args.cpus)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    import mlx.core as mx

    if args.cpu:
        mx.set_default_device(mx.cpu)
    start = time.perf_counter()
    one, sizes = build(args.kernel, args.cpu)
    group = args.group

    def fn():  # `group` calls issued with one async_eval: the host's cost per eval is paid once per group
        return [one() for _ in range(group)] if group > 1 else one()

    m = measure_mlx(fn, TimingProtocol(samples=args.samples, mode=args.mode))
    m_samples = [s / group for s in m.samples]
    try:
        device = mx.device_info().get("device_name", "")
    except Exception:  # noqa: BLE001 - informational only
        device = ""
    print(json.dumps({"kernel": args.kernel, "requested": args.mode, "mode": m.mode, "sizes": sizes,
                      "device": f"{mx.default_device()} {device}".strip(), "samples": m_samples, "inner": m.inner,
                      "group": group, "median_s": statistics.median(m_samples), "within": relative_spread(m_samples),
                      "round_trip_s": m.round_trip_s, "pilot_spread_pipelined": m.pilot_spread_pipelined,
                      "pilot_spread_per_call": m.pilot_spread_per_call, "warmup_s": m.warmup_s,
                      "process_s": time.perf_counter() - start, "affinity": sorted(os.sched_getaffinity(0)),
                      "backlog_calls": m.backlog_calls}))


def parse_cpus(text: str) -> set[int] | None:
    """"5" or "5,6" or "4-7" -> the CPU numbers; "all" (not pinned) -> None. ValueError for anything else."""
    if text == "all":
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def run_child(kernel: str, mode: str, cpus: str, group: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--kernel", kernel, "--mode", mode,
               "--samples", str(args.samples), "--cpus", cpus, "--group", str(group)] + (["--cpu"] if args.cpu else [])
    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{kernel} {mode}: the child failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def summarize_setting(records: list[dict]) -> dict:
    medians = [r["median_s"] for r in records]
    logs = [math.log(m) for m in medians]
    pilots = [r for r in records if r["pilot_spread_pipelined"] is not None]
    return {
        "median_ms": 1e3 * statistics.median(medians),
        "between_pct": 100 * statistics.stdev(logs) if len(logs) > 1 else 0.0,
        "within_pct": 100 * statistics.median(r["within"] for r in records),
        "modes_used": dict(Counter(r["mode"] for r in records)),
        "round_trip_us": 1e6 * statistics.median(r["round_trip_s"] for r in records),
        "pilot_pipelined_pct": 100 * statistics.median(r["pilot_spread_pipelined"] for r in pilots) if pilots else None,
        "pilot_per_call_pct": 100 * statistics.median(r["pilot_spread_per_call"] for r in pilots) if pilots else None,
        "inner": statistics.median(r["inner"] for r in records),
        "process_s": statistics.median(r["process_s"] for r in records),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--processes", type=int, default=8, help="fresh processes per kernel x mode (default 8)")
    parser.add_argument("--samples", type=int, default=10, help="samples per process (default 10)")
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset of " + ", ".join(KERNELS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    parser.add_argument("--cpu", action="store_true", help="run on MLX's CPU device, with small sizes and float32")
    parser.add_argument("--json", type=Path, help="also write the summary and every process's record here")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="a process is killed after this long")
    parser.add_argument("--affinities", default="all",
                        help="semicolon-separated CPU sets each process is pinned to, each a setting of its own: "
                             "'all' (not pinned), '5', '5,6', '4-7' (default all)")
    parser.add_argument("--groups", default="1",
                        help="comma-separated numbers of calls issued with one mx.async_eval, each a setting of its "
                             "own (default 1: one call per async_eval, the harness's protocol); the time is per call")
    parser.add_argument("--cpus", default="all", help=argparse.SUPPRESS)
    parser.add_argument("--group", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    kernels, modes = args.kernels.split(","), args.modes.split(",")
    for name in kernels:
        if name not in KERNELS:
            parser.error(f"unknown kernel {name!r}: one of {', '.join(KERNELS)}")
    for name in modes:
        if name not in MODES:
            parser.error(f"unknown mode {name!r}: one of {', '.join(MODES)}")
    start = time.perf_counter()
    affinities = args.affinities.split(";")
    for cpus in affinities:
        try:
            parse_cpus(cpus)  # a bad set fails here, before any process starts
        except ValueError:
            parser.error(f"bad CPU set {cpus!r}: 'all', or CPU numbers and ranges such as '5', '5,6', '4-7'")
    try:
        groups = [int(g) for g in args.groups.split(",")]
    except ValueError:
        groups = [0]
    if min(groups) < 1:
        parser.error(f"bad --groups {args.groups!r}: comma-separated whole numbers of at least 1, such as '1,8'")
    records: dict[tuple[str, str, str, int], list[dict]] = {(k, m, c, g): [] for k in kernels for m in modes
                                                             for c in affinities for g in groups}
    for round_ in range(args.processes):  # rounds: drift of the machine hits every setting alike
        for kernel in kernels:
            for mode in modes:
                for cpus in affinities:
                    for group in groups:
                        records[kernel, mode, cpus, group].append(run_child(kernel, mode, cpus, group, args))
        print(f"round {round_ + 1}/{args.processes} done ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    first = next(iter(records.values()))[0]
    print(f"device: {first['device']}; {args.processes} processes per setting, {args.samples} samples each, "
          f"default protocol otherwise")
    header = (f"{'kernel':<11} {'mode':<9} {'cpus':<6} {'group':>5} {'ms/call':>9} {'between%':>8} {'within%':>7} "
              f"{'inner':>6} {'auto chose':<22} {'pilot p/c %':>11} {'rt us':>6}")
    print(header)
    print("-" * len(header))
    results = []
    for (kernel, mode, cpus, group), recs in records.items():
        s = summarize_setting(recs)
        chose = " ".join(f"{m}x{n}" for m, n in sorted(s["modes_used"].items())) if mode == "auto" else ""
        pilot = (f"{s['pilot_pipelined_pct']:.1f}/{s['pilot_per_call_pct']:.1f}"
                 if s["pilot_pipelined_pct"] is not None else "-")
        print(f"{kernel:<11} {mode:<9} {cpus:<6} {group:>5} {s['median_ms']:>9.4f} {s['between_pct']:>8.2f} "
              f"{s['within_pct']:>7.2f} {s['inner']:>6g} {chose:<22} {pilot:>11} {s['round_trip_us']:>6.1f}")
        results.append({"kernel": kernel, "mode": mode, "cpus": cpus, "group": group, "sizes": recs[0]["sizes"], **s,
                        "processes": recs})
    print(f"total {time.perf_counter() - start:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"device": first["device"], "processes": args.processes,
                                         "samples": args.samples, "cpu": args.cpu, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
