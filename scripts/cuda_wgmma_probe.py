"""Can an ``mx.fast.cuda_kernel`` reach Hopper's wgmma / TMA path? Compile tiny kernels and report what happens.

Each probe is one kernel whose body holds one Hopper-only PTX instruction (behind a never-taken branch, so nothing
runs): ``wgmma.fence`` (warpgroup MMA), ``cp.async.bulk.tensor`` (TMA) and ``setmaxnreg``. All three need the
arch-specific target ``sm_90a``; a JIT that compiles for plain ``sm_90`` rejects them in ptxas. A control probe
(``mma.sync``, sm_80+) must compile. Prints one line per probe and the first lines of any compiler error
(it names the target the JIT used). Usage: python scripts/cuda_wgmma_probe.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROBES = {
    "mma.sync (sm_80+, control)": 'asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 '
                                  '{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" : "+f"(c[0]), "+f"(c[1]), '
                                  '"+f"(c[2]), "+f"(c[3]) : "r"(a), "r"(a), "r"(a), "r"(a), "r"(a), "r"(a));',
    "wgmma.fence (sm_90a)": 'asm volatile("wgmma.fence.sync.aligned;" ::: "memory");',
    "setmaxnreg (sm_90a)": 'asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");',
    "cp.async.bulk.tensor / TMA (sm_90)": 'asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier'
                                          '::complete_tx::bytes [%0], [%1, {%2}], [%3];" :: "r"(0u), "l"(inp), '
                                          '"r"(0), "r"(0u) : "memory");',
}


def probe(name: str, body: str) -> dict:
    import mlx.core as mx

    source = f"""
    float c[4] = {{0.f, 0.f, 0.f, 0.f}};
    unsigned a = 0u;
    if (inp[0] == 12345.0f) {{  // never taken: the instruction only has to compile
        {body}
    }}
    out[threadIdx.x] = inp[threadIdx.x] + c[0] + (float)a;
"""
    try:
        kernel = mx.fast.cuda_kernel(name=f"probe_{abs(hash(name))}", input_names=["inp"], output_names=["out"],
                                     source=source)
        (out,) = kernel(inputs=[mx.zeros((128,))], grid=(128, 1, 1), threadgroup=(128, 1, 1),
                        output_shapes=[(128,)], output_dtypes=[mx.float32])
        mx.eval(out)
        return {"probe": name, "compiled": True, "error": ""}
    except Exception as exc:  # noqa: BLE001 - the error text is the evidence
        return {"probe": name, "compiled": False, "error": str(exc)[:2000]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("wgmma-probe.json"))
    args = parser.parse_args()
    import mlx.core as mx

    results = [probe(name, body) for name, body in PROBES.items()]
    for r in results:
        print(f"{'compiles' if r['compiled'] else 'REJECTED'}: {r['probe']}")
        if r["error"]:
            print("   " + "\n   ".join(r["error"].splitlines()[:8]))
    args.out.write_text(json.dumps({"device": mx.device_info(), "probes": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
