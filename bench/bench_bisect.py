"""Rounds, probes and wrong answers of `harness bisect`'s search on synthetic histories (no database, no runs).

1,024 commits after the good endpoint with one step at a random commit.  Every run of a commit gives ``--trials``
trials (independent processes), each ``--samples`` lognormal samples (CV ``--cv``) around the trial's level,
exactly as a probe run would return them; the prober classifies on trials, repeats undecided probes (at most
``--max-runs`` new runs per commit) and confirms the culprit's bounds (``--confirm-runs`` agreeing runs).
Serial (one probe per round) and k-ary (``--probes`` per round, run at once on a cluster).

Scenarios:

* ``quiet``: a quiet machine, the levels of trials move 0.5 % (sd) and runs do not move at all; a
  ``--step`` (+10 %) slowdown.  Targets: the exact culprit every time, <= 12 rounds serial, <= 6 rounds with 4
  probes per round.
* ``noisy +100%`` / ``noisy +10%``: a shared runner, as in the issue that named a wrong commit 5 times out of 5:
  each run's level moves with a between-run sd drawn per bisection from 4-10 %, and a run is loaded (x1.5-3, all
  its trials) with probability ``--load`` (10 %).  Target: no wrong culprit with exit 0 ("confidently wrong");
  inconclusive answers (exit 1, the range named) are the honest outcome when the noise is as large as the step.

    python bench/bench_bisect.py [--commits 1024] [--positions 20] [--noisy-positions 100] [--load 0.1] [--step 0.10]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.bisect.perf import Measured, RunTrials  # noqa: E402
from harness.bisect.prober import DEFAULT_CONFIRM_RUNS, DEFAULT_MAX_RUNS, PerfProber  # noqa: E402
from harness.bisect.search import max_rounds_needed, search  # noqa: E402


@dataclass(frozen=True)
class Noise:
    name: str
    step: float  # the slowdown at the culprit (+0.10 = 10 % slower)
    cv: float = 0.02  # samples within a trial
    trial_sd: float = 0.005  # between the trials (processes) of one run
    run_sd: tuple[float, float] = (0.0, 0.0)  # between runs: sd drawn uniformly from this range per bisection
    load: float = 0.0  # probability that a run is loaded
    load_factor: tuple[float, float] = (1.5, 3.0)


def simulate(n: int, culprit: int, noise: Noise, *, samples: int, trials: int, probes: int, max_runs: int,
             confirm_runs: int, seed: int) -> dict:
    """One bisection: commits c0 (good endpoint) .. cn (bad endpoint), slower by ``noise.step`` from c``culprit``."""
    rng = np.random.default_rng(seed)
    shas = [f"{i:040x}" for i in range(n + 1)]
    index = {sha: i for i, sha in enumerate(shas)}
    sigma = math.sqrt(math.log1p(noise.cv * noise.cv))  # lognormal with this coefficient of variation
    run_sd = rng.uniform(*noise.run_sd)
    made = [0]
    loaded = [0]

    def one_run(sha: str) -> RunTrials:
        level = 1e-3 * (1 + noise.step * (index[sha] >= culprit)) * rng.lognormal(0.0, run_sd) if run_sd else \
            1e-3 * (1 + noise.step * (index[sha] >= culprit))
        if rng.random() < noise.load:
            level *= rng.uniform(*noise.load_factor)
            loaded[0] += 1
        made[0] += 1
        return RunTrials(f"run{made[0]}", tuple(tuple(level * rng.lognormal(0.0, noise.trial_sd)
                                                      * rng.lognormal(0.0, sigma, samples)) for _ in range(trials)))

    def measure(batch):
        return {sha: Measured((one_run(sha),)) for sha in batch}

    prober = PerfProber(measure, shas[0], shas[-1], max_runs=max_runs, confirm_runs=confirm_runs)
    endpoints = prober.confirm()
    base = {"runs": prober.runs, "batches": prober.batches, "loaded": loaded[0], "rounds": 0, "probes": 0,
            "confirmations": 0, "repeated": 0, "set_aside": 0}
    if endpoints is None or not prober.endpoints_settled or endpoints.verdict != "regressed":
        return {**base, "outcome": "endpoints"}
    result = search(shas[1:], prober, probes_per_round=probes, confirm=prober.confirm_bounds)
    truth = shas[culprit]
    if result.status == "found":
        outcome = "exact" if result.culprit == truth else "wrong"
    else:
        outcome = "range" if truth in result.candidates else "range-misses"
    return {"outcome": outcome, "rounds": result.rounds, "probes": result.probes, "runs": prober.runs,
            "batches": prober.batches, "loaded": loaded[0], "confirmations": result.confirmations,
            "repeated": sum(c.runs > 1 for c in result.classifications.values()),
            "set_aside": sum(len(c.set_aside) for c in result.classifications.values())}


def run_scenario(noise: Noise, positions: list[int], args: argparse.Namespace, probes: int) -> tuple[dict, str]:
    start = time.perf_counter()
    results = [simulate(args.commits, culprit, noise, samples=args.samples, trials=args.trials, probes=probes,
                        max_runs=args.max_runs, confirm_runs=args.confirm_runs, seed=args.seed * 1000 + k)
               for k, culprit in enumerate(positions)]
    seconds = time.perf_counter() - start
    counts = {key: sum(r["outcome"] == key for r in results)
              for key in ("exact", "wrong", "range", "range-misses", "endpoints")}
    rounds = [r["rounds"] for r in results if r["outcome"] != "endpoints"] or [0]
    line = (f"  {probes} probe(s) per round, {len(results)} bisections: exact culprit {counts['exact']}, WRONG "
            f"culprit with exit 0 {counts['wrong']}, inconclusive {counts['range']} (range holds the culprit) + "
            f"{counts['range-misses']} (range misses it), endpoints unsettled {counts['endpoints']}; rounds max "
            f"{max(rounds)} (mean {statistics.mean(rounds):.1f}, bound {max_rounds_needed(args.commits, probes)}); "
            f"confirmations mean {statistics.mean(r['confirmations'] for r in results):.1f}; runs mean "
            f"{statistics.mean(r['runs'] for r in results):.1f} (loaded mean "
            f"{statistics.mean(r['loaded'] for r in results):.1f}); sequential steps mean "
            f"{statistics.mean(r['batches'] for r in results):.1f}; commits repeated "
            f"{sum(r['repeated'] for r in results)}, runs set aside {sum(r['set_aside'] for r in results)}; "
            f"{1e3 * seconds / len(results):.0f} ms per bisection")
    return {**counts, "rounds": max(rounds)}, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1024)
    parser.add_argument("--positions", type=int, default=20, help="random culprit positions (quiet scenario)")
    parser.add_argument("--noisy-positions", type=int, default=100, help="random culprit positions (noisy)")
    parser.add_argument("--step", type=float, default=0.10, help="the quiet scenario's step")
    parser.add_argument("--cv", type=float, default=0.02)
    parser.add_argument("--samples", type=int, default=10, help="samples per trial")
    parser.add_argument("--trials", type=int, default=3, help="trials (processes) per run")
    parser.add_argument("--max-runs", type=int, default=DEFAULT_MAX_RUNS, help="new runs per commit at most")
    parser.add_argument("--confirm-runs", type=int, default=DEFAULT_CONFIRM_RUNS, help="runs the culprit needs")
    parser.add_argument("--load", type=float, default=0.10, help="noisy: probability that a run is loaded")
    parser.add_argument("--probes", type=int, nargs="+", default=[1, 4], help="probes per round to try")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    quiet_positions = rng.integers(1, args.commits + 1, size=args.positions).tolist()
    noisy_positions = rng.integers(1, args.commits + 1, size=args.noisy_positions).tolist()
    scenarios = [
        (Noise("quiet", args.step, cv=args.cv), quiet_positions),
        (Noise("noisy +100%", 1.0, cv=args.cv, run_sd=(0.04, 0.10), load=args.load), noisy_positions),
        (Noise("noisy +10%", 0.10, cv=args.cv, run_sd=(0.04, 0.10), load=args.load), noisy_positions),
    ]
    print(f"{args.commits} commits, one step at a random commit; {args.trials} trials of {args.samples} samples "
          f"(CV {args.cv:.0%}) per run; at most {args.max_runs} new runs per commit, {args.confirm_runs} agreeing "
          "runs to confirm")
    ok = True
    for noise, positions in scenarios:
        print(f"{noise.name}: step {noise.step:+.0%}, between-trial sd {noise.trial_sd:.1%}, between-run sd "
              f"{noise.run_sd[0]:.0%}-{noise.run_sd[1]:.0%}, loaded runs {noise.load:.0%} (x{noise.load_factor[0]}-"
              f"{noise.load_factor[1]})")
        for probes in args.probes:
            counts, line = run_scenario(noise, positions, args, probes)
            print(line)
            ok &= counts["wrong"] == 0
            if noise.name == "quiet":
                ok &= counts["exact"] == len(positions) and counts["rounds"] <= (12 if probes == 1 else 6)
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
