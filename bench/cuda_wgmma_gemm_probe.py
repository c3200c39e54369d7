"""Do the wgmma building blocks of kernels/flash_cuda_wgmma.py compute what the PTX ISA says? One tiny kernel a case.

Each case is one warpgroup (128 threads) computing a 64 x N product with ``wgmma.mma_async`` (sm_90a: MLX 0.32.4
compiles for it on the H200; ptxas's report comes from kernels/cuda_compile.py's report compile with
``arch_suffix="a"``) on fresh random fp16/bf16 data, compared with numpy in
float64 on the same rounded inputs: relative error ||out - ref|| / ||ref|| (f32 accumulation of exact 16-bit
products: expect ~1e-6; PASS under 1e-3), NaN count, and the first wrong (row, column) positions. The kernel first
fills its whole output with NaN (a __syncthreads before the fragment stores), so an element the accumulator map
misses stays NaN. The kernels use the helpers, descriptor encoder and fragment maps of kernels/flash_cuda_wgmma.py
itself (``WGMMA_HEADER``), so a PASS here vouches for the code the flash kernel runs.

Cases, simplest first (see ``CASES``; what each verifies is in its ``what``):

- ``a_*``   m64n64k16, A and B K-major in shared memory, no swizzle (core matrices of 8 rows x 16 bytes); the
  ``_swapped`` case exchanges LBO and SBO and is a diagnostic: exactly one of the pair should pass;
- ``b_*``   the 128-byte (and 64-byte) swizzle, one k16 step and a whole 64-wide atom row in 4 steps;
- ``c_*``   A from registers (the m64k16 A fragment map), B from shared memory;
- ``d_*``   a K loop (K = 128 = head dim over two column blocks) in two commit groups, ``wait_group 1`` then 0,
  accumulators poisoned with NaN and the first wgmma with scale-d = 0;
- ``e_*``   B MN-major (imm-trans-b = 1, as V in O += P V), n = 64, then n = 128 over two swizzle atoms (LBO =
  the atom stride; its ``_swapped`` diagnostic exchanges LBO and SBO), A from registers with n = 128 and K = 64
  (O += P V at BK = 64, D = 128), and n = 32 with the 64-byte swizzle; ``f_*``: K-major B with n = 128;
- ``flash_*`` the flash kernel's candidate variants against the float64 causal reference at small odd shapes.

Every case runs in its own process (a bad descriptor can fault the CUDA context; the next case starts clean), with
``--ptxas-options=-v``: the compile log (registers, spills, wgmma serialisation warnings) is kept per case.
Prints one line per case, a summary table last, and writes everything to --out (JSON).

Usage: python bench/cuda_wgmma_gemm_probe.py [--out wgmma-gemm.json] [--cases a_ss_interleave ...] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import flash_cuda_wgmma as wg  # noqa: E402

TOLERANCE = 1e-3
STARTED = time.time()
FLASH_TOLERANCE = 2e-2  # P is rounded to 16 bits before P V, as in every flash kernel


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    n: int = 64
    k: int = 16
    layout: str = "sw128"      # shared-memory layout of A (when in smem) and B: interleave | sw128 | sw64
    a_src: str = "smem"        # smem | regs
    b_major: str = "K"         # K (B is N x K, K contiguous) | MN (B is K x N, N contiguous: transposed)
    groups: int = 1            # commit groups the k steps are split into
    poison_acc: bool = False   # accumulators start as NaN and the first wgmma has scale-d = 0
    swap: bool = False         # LBO and SBO exchanged (diagnostic)
    dtype: str = "float16"
    expect: str = "pass"       # pass | diagnostic (one of a pair is expected to fail)


CASES = [
    Case("a_ss_interleave", "m64n64k16, A/B K-major in smem, no swizzle: descriptor bit fields (start, LBO = "
         "K-adjacent core matrices, SBO = 8-row groups), the f32 accumulator fragment map", layout="interleave"),
    Case("a_ss_interleave_swapped", "diagnostic: as a_ss_interleave with LBO and SBO exchanged; should FAIL if the "
         "PTX ISA's definitions hold (then a_ss_interleave passes)", swap=True, expect="diagnostic",
         layout="interleave"),
    Case("b_ss_sw128", "m64n64k16, 128B swizzle (Swizzle<3,4,3>, 1024-aligned tiles, LBO 'assumed 1', SBO 1024): one "
         "k16 step at the start of the atom row"),
    Case("b_ss_sw128_k64", "K = 64 = one 128-byte atom row as 4 k16 steps, descriptor start +32 bytes each (how the "
         "kernel walks the head dim inside an atom)", k=64),
    Case("b_ss_sw64_k32", "64B swizzle (Swizzle<2,4,3>, SBO 512), K = 32 in 2 steps: the D = 32 layout", k=32,
         layout="sw64"),
    Case("c_rs_sw128", "A from registers (m64k16 A fragment: 4 x .b32 per thread), B K-major 128B-swizzled in smem",
         a_src="regs"),
    Case("d_kloop_d128", "K = 128 over two 64-wide column blocks (Q/K tiles at D = 128), 8 k16 steps in 2 commit "
         "groups, wait_group 1 then 0; accumulators NaN-poisoned, first wgmma scale-d = 0", k=128, groups=2,
         poison_acc=True),
    Case("d_kloop_d128_bf16", "d_kloop_d128 in bf16", k=128, groups=2, poison_acc=True, dtype="bfloat16"),
    Case("e_ss_mn_n64", "B MN-major (imm-trans-b = 1; B stored K x N, N contiguous, as V) with n = 64 (one atom), "
         "K = 16", b_major="MN"),
    Case("e_ss_mn_n128", "B MN-major with n = 128: two 64-wide atoms along N, LBO = the atom stride (K rows x 128 "
         "bytes), SBO = 8 K rows (1024); K = 16, A from smem", n=128, b_major="MN"),
    Case("e_ss_mn_n128_swapped", "diagnostic: as e_ss_mn_n128 with LBO and SBO exchanged; should FAIL if the PTX "
         "ISA's MN-major definitions hold (if it passes instead, exchange PV_LBO and PV_SBO in the kernel)", n=128,
         b_major="MN", swap=True, expect="diagnostic"),
    Case("e_rs_mn_n128", "O += P V as the kernel does it at BK = 64, D = 128: A from registers, B MN-major, n = 128 "
         "over two atoms (LBO = atom stride along N, SBO = 8 K rows), K = 64 in 4 steps", n=128, k=64, a_src="regs",
         b_major="MN"),
    Case("e_rs_mn_n128_bf16", "e_rs_mn_n128 in bf16", n=128, k=64, a_src="regs", b_major="MN", dtype="bfloat16"),
    Case("e_rs_mn_n32_sw64", "O += P V at D = 32: 64B swizzle, n = 32, K = 64", n=32, k=64, a_src="regs",
         b_major="MN", layout="sw64"),
    Case("f_ss_n128", "S = Q K^T at BK = 128, D = 128: K-major B with n = 128 rows, K = 128, accumulators poisoned, "
         "first scale-d = 0", n=128, k=128, groups=2, poison_acc=True),
]
FLASH_VARIANTS = [v.name for v in wg.wgmma_variants()]


# --------------------------------------------------------------------------- one GEMM case: the kernel source

# Core matrix (r/8, c/8) of the no-swizzle K-major tile at (c/8) * LBO + (r/8) * SBO, LBO = rows/8 * 128, SBO = 128
# (PTX ISA canonical K-major no-swizzle ((8,m),(T,2k)):((1T,SBO),(1,LBO)): 8 rows of 16 bytes each).
INTERLEAVE_OFF = "(c / 8) * (rows / 8 * 128) + (r / 8) * 128 + (r % 8) * 16 + (c % 8) * 2"
PROBE_HEADER = f"__device__ __forceinline__ int probe_il_off(int r, int c, int rows) {{ return {INTERLEAVE_OFF}; }}\n"


def layout_swb(layout: str) -> int:
    return {"interleave": 0, "sw128": 128, "sw64": 64}[layout]


def layout_offset(layout: str, r: int, c: int, rows: int) -> int:
    """Byte offset where the kernel stores element (r, c) of a tile with ``rows`` strided rows (c contiguous)."""
    if layout == "interleave":
        return wg._py(INTERLEAVE_OFF, r=r, c=c, rows=rows)
    return wg.tile_offset(r, c, rows, layout_swb(layout))


def tile_bytes(layout: str, rows: int, cols: int) -> int:
    """Shared memory a tile takes: a swizzled row is a whole atom row (swb bytes) even when K = 16 uses 32 of them."""
    swb = layout_swb(layout)
    return rows * cols * 2 if not swb else -(-cols // (swb // 2)) * rows * swb


def _off(layout: str, r: str, c: str, rows: int) -> str:
    """C twin of :func:`layout_offset`."""
    if layout == "interleave":
        return f"probe_il_off({r}, {c}, {rows})"
    return f"wg_tile_off<{layout_swb(layout)}>({r}, {c}, {rows})"


def kmajor_desc_args(case: Case, rows: int, ks: int) -> tuple[int, int, int, int]:
    """(start offset, LBO, SBO, swizzle bytes) of the K-major tile (``rows`` x K) at k16 step ``ks``."""
    if case.layout == "interleave":
        lbo, sbo = rows // 8 * 128, 128   # K-adjacent core matrices / 8-row groups
        if case.swap:
            lbo, sbo = sbo, lbo
        return 2 * ks * (rows // 8) * 128, lbo, sbo, 0
    swb = layout_swb(case.layout)
    c0 = 16 * ks
    return (c0 // (swb // 2)) * rows * swb + (c0 % (swb // 2)) * 2, 16, 8 * swb, swb


def mn_desc_args(case: Case, ks: int) -> tuple[int, int, int, int]:
    """(start offset, LBO, SBO, swizzle bytes) of the MN-major B tile (K rows x N, N contiguous) at k16 step ks:
    LBO = the stride of swizzle atoms along N (K rows of swb bytes), SBO = 8 K rows."""
    swb = layout_swb(case.layout)
    lbo, sbo = case.k * swb, 8 * swb
    if case.swap:
        lbo, sbo = sbo, lbo
    return ks * 16 * swb, lbo, sbo, swb


def _desc_c(base: str, args: tuple[int, int, int, int]) -> str:
    start, lbo, sbo, swb = args
    return f"wg_desc({base} + {start}, {lbo}, {sbo}, {wg.SWIZZLE_MODE[swb]}u)"


def gemm_source(case: Case) -> tuple[str, int]:
    """The kernel body and its dynamic shared memory (bytes)."""
    n, k = case.n, case.k
    b_rows, b_cols = (n, k) if case.b_major == "K" else (k, n)
    a_bytes = -(-tile_bytes(case.layout, 64, k) // 1024) * 1024  # B starts on a 1024-byte boundary too
    b_bytes = tile_bytes(case.layout, b_rows, b_cols)
    steps = k // 16
    per_group = -(-steps // case.groups)
    lines = [
        "    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];",
        "    unsigned char* sm = wg_smem_raw + ((1024u - (fa2_smem(wg_smem_raw) & 1023u)) & 1023u);",
        f"    unsigned char* a_s = sm; unsigned char* b_s = sm + {a_bytes};",
        "    const int tid = threadIdx.x;",
        "    const T tag = T(0.0f);",
        f"    for (int i = tid; i < {64 * n}; i += 128) c[i] = __int_as_float(0x7fc00000);  // poison: NaN",
    ]
    if case.a_src == "smem":
        lines.append(f"    for (int i = tid; i < {64 * k}; i += 128) "
                     f"*reinterpret_cast<T*>(a_s + {_off(case.layout, f'i / {k}', f'i % {k}', 64)}) = a[i];")
    lines += [
        f"    for (int i = tid; i < {b_rows * b_cols}; i += 128) "
        f"*reinterpret_cast<T*>(b_s + {_off(case.layout, f'i / {b_cols}', f'i % {b_cols}', b_rows)}) = b[i];",
        "    wg_fence_proxy();",
        "    __syncthreads();",
        f"    float d[{n // 2}];",
        "    #pragma unroll",
        f"    for (int i = 0; i < {n // 2}; ++i) d[i] = {'__int_as_float(0x7fc00000)' if case.poison_acc else '0.0f'};",
        "    const unsigned a_addr = fa2_smem(a_s), b_addr = fa2_smem(b_s);",
    ]
    if case.a_src == "regs":  # the m64k16 A fragment of each k step, straight from global memory
        lines.append(f"    unsigned ar[{steps}][4];")
        for ks in range(steps):
            for j in range(4):
                lines.append(f"    ar[{ks}][{j}] = *reinterpret_cast<const unsigned*>(a + wg_a_row(tid, {j}) * {k} + "
                             f"{16 * ks} + wg_a_col(tid, {j}, 0));")
        lines.append(f"    wg_fence_regs<{4 * steps}>(&ar[0][0]);")
    lines += [f"    wg_fence_regs<{n // 2}>(d);", "    wg_fence();"]
    tb = 0 if case.b_major == "K" else 1
    for ks in range(steps):
        scale_d = 0 if (case.poison_acc and ks == 0) else 1
        db = _desc_c("b_addr", kmajor_desc_args(case, b_rows, ks) if case.b_major == "K" else mn_desc_args(case, ks))
        if case.a_src == "smem":
            da = _desc_c("a_addr", kmajor_desc_args(case, 64, ks))
            lines.append(f"    wg_ss<0, {tb}>(d, {da}, {db}, {scale_d}, tag, WgN<{n}>());")
        else:
            lines.append(f"    wg_rs<{tb}>(d, ar[{ks}], {db}, {scale_d}, tag, WgN<{n}>());")
        if (ks + 1) % per_group == 0 or ks == steps - 1:
            lines.append("    wg_commit();")
    if -(-steps // per_group) > 1:
        lines.append("    wg_wait<1>();  // the first group is done, the second may still run")
    lines.append("    wg_wait<0>();")
    lines += [
        f"    wg_fence_regs<{n // 2}>(d);",
        "    __syncthreads();  // the NaN poison of every thread is written before the fragment stores",
        "    #pragma unroll",
        f"    for (int i = 0; i < {n // 2}; ++i) c[wg_acc_row(tid, i) * {n} + wg_acc_col(tid, i)] = d[i];",
    ]
    return "\n".join(lines) + "\n", a_bytes + b_bytes + wg.ALIGN_PAD


# --------------------------------------------------------------------------- child: run one case

def _compile_log(prefix: str) -> str:
    """The NVRTC/ptxas logs of the kernels this process compiled (``--ptxas-options=-v``: registers, spills)."""
    from kernels import cuda_compile

    logs = sorted(cuda_compile.report_dir().glob(f"custom_kernel_{prefix}*.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(f"{p.name}: {p.read_text()[-2000:]}" for p in logs if p.stat().st_mtime >= STARTED - 1)


def _compare(out, ref) -> dict:
    import numpy as np

    bad = ~np.isfinite(out) | (np.abs(out - ref) > 1e-2 * max(float(np.abs(ref).max()), 1e-30))
    finite = np.isfinite(out)
    diff = np.where(finite, out - ref, 0.0)
    rel = float(np.linalg.norm(diff) / max(float(np.linalg.norm(ref)), 1e-30))
    rows, cols = np.nonzero(bad.reshape(-1, ref.shape[-1]))  # flash: rows are the flattened (b, h, query)
    return {"rel_err": rel, "nan": int((~finite).sum()), "n_bad": int(bad.sum()), "size": int(ref.size),
            "first_bad": [[int(r), int(c)] for r, c in zip(rows[:8], cols[:8], strict=True)]}


def run_gemm(case: Case, seed: int) -> dict:
    import mlx.core as mx
    import numpy as np

    from kernels import cuda_compile

    dt = getattr(mx, case.dtype)
    rng = np.random.default_rng(seed)
    a = mx.array(rng.standard_normal((64, case.k)).astype(np.float32)).astype(dt)
    b_shape = (case.n, case.k) if case.b_major == "K" else (case.k, case.n)
    b = mx.array(rng.standard_normal(b_shape).astype(np.float32)).astype(dt)
    source, smem = gemm_source(case)
    name = f"wgmma_probe_{case.name}"
    kernel = cuda_compile.CudaKernel(name, ["a", "b"], ["c"], source, wg.WGMMA_HEADER + PROBE_HEADER, True, smem,
                                     arch_suffix="a")
    (c,) = kernel(inputs=[a, b], template=[("T", dt)], grid=(128, 1, 1), threadgroup=(128, 1, 1),
                  output_shapes=[(64, case.n)], output_dtypes=[mx.float32])
    mx.eval(c)
    a64 = np.array(a.astype(mx.float32), dtype=np.float64)
    b64 = np.array(b.astype(mx.float32), dtype=np.float64)
    ref = a64 @ (b64.T if case.b_major == "K" else b64)
    res = _compare(np.array(c, dtype=np.float64), ref)
    res["passed"] = res["nan"] == 0 and res["rel_err"] < TOLERANCE
    res["smem_bytes"] = smem
    res["compile_log"] = _compile_log(name)
    res["report_failure"] = cuda_compile.REPORT_FAILURES.get(name, "")
    return res


FLASH_SHAPES = [((1, 2, 200, 300, 128), "float16"), ((1, 2, 130, 130, 64), "float16"),
                ((1, 1, 77, 150, 32), "float16"), ((2, 1, 190, 257, 128), "bfloat16")]


def run_flash(variant_name: str, seed: int) -> dict:
    import math

    import mlx.core as mx
    import numpy as np

    from kernels import cuda_compile, flash_prefill

    variant = {v.name: v for v in wg.wgmma_variants()}[variant_name]
    shapes = []
    passed = True
    for i, ((B, H, S_q, S_kv, D), dtype) in enumerate(FLASH_SHAPES):
        rng = np.random.default_rng(seed + i)
        dt = getattr(mx, dtype)
        q, k, v = (mx.array(rng.standard_normal((B, H, s, D)).astype(np.float32)).astype(dt)
                   for s in (S_q, S_kv, S_kv))
        poison = mx.full((B, H, S_q, D), float("nan"), dtype=dt)  # likely reused as the output's buffer
        mx.eval(q, k, v, poison)
        del poison
        out = variant.fn(q=q, k=k, v=v, scale=1.0 / math.sqrt(D))
        mx.eval(out)
        ref = flash_prefill.reference({"q": q, "k": k, "v": v, "scale": 1.0 / math.sqrt(D)})
        res = _compare(np.array(out.astype(mx.float32), dtype=np.float64), ref)
        res.update(shape=[B, H, S_q, S_kv, D], dtype=dtype, passed=res["nan"] == 0 and res["rel_err"] < FLASH_TOLERANCE)
        passed &= res["passed"]
        shapes.append(res)
    worst = max(shapes, key=lambda r: (r["nan"], r["rel_err"]))
    return {"passed": passed, "rel_err": worst["rel_err"], "nan": worst["nan"], "n_bad": worst["n_bad"],
            "first_bad": worst["first_bad"], "shapes": shapes, "compile_log": _compile_log("flash_prefill_wgmma"),
            "report_failure": "; ".join(f"{k}: {v}" for k, v in cuda_compile.REPORT_FAILURES.items())}


def child(name: str, seed: int) -> None:
    from kernels import cuda_compile

    cuda_compile.REPORT_OPTIONS = ("--ptxas-options=-v",)
    start = time.perf_counter()
    try:
        cases = {c.name: c for c in CASES}
        res = run_gemm(cases[name], seed) if name in cases else run_flash(name.removeprefix("flash_"), seed)
    except Exception as exc:  # noqa: BLE001 - the error text is the evidence
        res = {"passed": False, "error": f"{type(exc).__name__}: {exc}"[:3000]}
    res["seconds"] = time.perf_counter() - start
    print("RESULT " + json.dumps(res, default=str), flush=True)


# --------------------------------------------------------------------------- parent: every case in its own process

def run_case(name: str, seed: int, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--seed", str(seed)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {"passed": False, "error": f"timed out after {timeout} s (a hang: a wait that never completes?)"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"passed": False, "error": f"no result, exit {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("wgmma-gemm.json"))
    parser.add_argument("--cases", nargs="*", default=[], help="case names (default: all, flash last)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [c.name for c in CASES] + [f"flash_{v}" for v in FLASH_VARIANTS]
    if args.child:
        child(args.child, args.seed)
        return
    if args.list:
        for case in CASES:
            print(f"{case.name}: {case.what}")
        for v in FLASH_VARIANTS:
            print(f"flash_{v}: {v} against the float64 causal reference at {[s for s, _ in FLASH_SHAPES]}")
        return
    selected = [n for n in names if not args.cases or n in args.cases]
    import mlx.core as mx

    report: dict = {"device": mx.device_info() if hasattr(mx, "device_info") else {}, "seed": args.seed,
                    "tolerance": TOLERANCE, "flash_tolerance": FLASH_TOLERANCE, "cases": []}
    expect = {c.name: c.expect for c in CASES}
    for i, name in enumerate(selected):
        res = run_case(name, args.seed + i, args.timeout)
        res.update(case=name, expect=expect.get(name, "pass"),
                   what=next((c.what for c in CASES if c.name == name), "flash kernel vs float64 reference"))
        # a diagnostic case is expected to fail: as_expected says whether the PTX ISA's reading held
        res["as_expected"] = "error" not in res and bool(res.get("passed")) == (res["expect"] == "pass")
        report["cases"].append(res)
        detail = res.get("error") or (f"rel_err {res.get('rel_err', float('nan')):.2e} nan {res.get('nan')} "
                                      f"bad {res.get('n_bad')} first_bad {res.get('first_bad')}")
        print(f"{verdict(res)} {name}: {detail[:400]}", flush=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))  # after every case: a crash keeps the rest
    report["all_as_expected"] = all(r["as_expected"] for r in report["cases"])
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print("\ncase                          verdict          rel_err    nan   seconds  registers (ptxas)")
    for res in report["cases"]:
        regs = ",".join(sorted(set(re.findall(r"Used (\d+) registers", res.get("compile_log", "")))))
        print(f"{res['case']:<30}{verdict(res):<17}{res.get('rel_err', float('nan')):<11.2e}"
              f"{res.get('nan', '-')!s:<6}{res.get('seconds', float('nan')):<9.1f}{regs or '-'}")
    print(f"all as expected: {report['all_as_expected']}")


def verdict(res: dict) -> str:
    if "error" in res:
        return "ERROR"  # did not compile, crashed or hung: neither a pass nor an expected failure
    if res["expect"] == "pass":
        return "PASS" if res.get("passed") else "FAIL"
    return "FAIL (expected)" if not res.get("passed") else "PASS (UNEXPECTED)"


if __name__ == "__main__":
    main()
