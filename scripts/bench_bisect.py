"""Rounds and probes of `harness bisect`'s search on synthetic histories (no database, no runs).

1,024 commits after the good endpoint with one step (default +10 %) at a random commit; every measurement of a
commit draws ``--samples`` lognormal samples (CV ``--cv``) around its level, exactly as a probe run would return
them; inconclusive probes are measured again and pooled (adaptive repeats, ``--max-runs`` runs per commit).
Serial (one probe per round) and k-ary (``--probes`` per round, run at once on a cluster).

    python scripts/bench_bisect.py [--commits 1024] [--positions 20] [--step 0.10] [--cv 0.02] [--samples 10]

Targets: the exact culprit every time, <= 12 rounds serial, <= 6 rounds with 4 probes per round.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.bisect.search import Measured, PerfProber, max_rounds_needed, search  # noqa: E402


def simulate(n: int, culprit: int, *, step: float, cv: float, samples: int, probes: int, max_runs: int,
             seed: int) -> dict:
    """One bisection: commits c0 (good endpoint) .. cn (bad endpoint), slower by ``step`` from c``culprit`` on."""
    rng = np.random.default_rng(seed)
    shas = [f"{i:040x}" for i in range(n + 1)]
    index = {sha: i for i, sha in enumerate(shas)}
    sigma = math.sqrt(math.log1p(cv * cv))  # lognormal with this coefficient of variation

    def measure(batch):
        return {sha: Measured(tuple(1e-3 * (1 + step * (index[sha] >= culprit))
                                    * rng.lognormal(0.0, sigma, samples))) for sha in batch}

    prober = PerfProber(measure, shas[0], shas[-1], max_runs=max_runs)
    endpoints = prober.confirm()
    if endpoints is None or endpoints.verdict != "regressed":
        return {"exact": False, "rounds": 0, "probes": 0, "runs": prober.runs, "batches": prober.batches, "weak": 0,
                "repeated": 0, "unconfirmed": 1}
    result = search(shas[1:], prober, probes_per_round=probes)
    return {"exact": result.culprit == shas[culprit], "rounds": result.rounds, "probes": result.probes,
            "runs": prober.runs, "batches": prober.batches,
            "weak": sum(c.weak for c in result.classifications.values()),
            "repeated": sum(c.runs > 1 for c in result.classifications.values()), "unconfirmed": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1024)
    parser.add_argument("--positions", type=int, default=20, help="random culprit positions")
    parser.add_argument("--step", type=float, default=0.10)
    parser.add_argument("--cv", type=float, default=0.02)
    parser.add_argument("--samples", type=int, default=10, help="samples per probe run")
    parser.add_argument("--max-runs", type=int, default=3, help="runs per commit at most (adaptive repeats)")
    parser.add_argument("--probes", type=int, nargs="+", default=[1, 4], help="probes per round to try")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    positions = np.random.default_rng(args.seed).integers(1, args.commits + 1, size=args.positions).tolist()
    print(f"{args.commits} commits, one {args.step:+.0%} step at {args.positions} random commits, noise CV "
          f"{args.cv:.0%}, {args.samples} samples per run, at most {args.max_runs} runs per commit")
    ok = True
    for probes in args.probes:
        start = time.perf_counter()
        results = [simulate(args.commits, culprit, step=args.step, cv=args.cv, samples=args.samples, probes=probes,
                            max_runs=args.max_runs, seed=args.seed * 1000 + k)
                   for k, culprit in enumerate(positions)]
        seconds = time.perf_counter() - start
        rounds = [r["rounds"] for r in results]
        exact = sum(r["exact"] for r in results)
        bound = max_rounds_needed(args.commits, probes)
        print(f"{probes} probe(s) per round: exact culprit {exact}/{len(results)}; rounds max {max(rounds)} "
              f"(mean {statistics.mean(rounds):.1f}, bound ceil(log_{probes + 1} {args.commits}) = {bound}); "
              f"probes mean {statistics.mean(r['probes'] for r in results):.1f}; runs incl. endpoints and repeats "
              f"mean {statistics.mean(r['runs'] for r in results):.1f}; sequential measurement steps mean "
              f"{statistics.mean(r['batches'] for r in results):.1f}; commits repeated "
              f"{sum(r['repeated'] for r in results)}, weak {sum(r['weak'] for r in results)}; endpoints not "
              f"confirmed {sum(r['unconfirmed'] for r in results)}; "
              f"{1e3 * seconds / len(results):.0f} ms per bisection")
        target = 12 if probes == 1 else 6
        ok &= exact == len(results) and max(rounds) <= target
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
