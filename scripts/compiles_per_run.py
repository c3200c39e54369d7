"""How many times a run of the built-in suite's GPU plan compiles its CUDA source kernels (not a test).

MLX compiles an ``mx.fast.cuda_kernel`` once per process and template (1.4-2.7 s on the H200, nothing cached across
processes: reports/examples/h200-jit-cost.json). Counts, over 20 trial seeds, the sum over job processes (batches of
``defaults.ROUND_BATCH``) of the distinct templates they need: jobs shuffled one by one in each round (the plan
before compile groups) against ``plan.plan_trials`` (a round shuffles (kernel, variant, dtype) groups and keeps each
group's shapes together). The minimum is trials x templates.

    python scripts/compiles_per_run.py
"""

from __future__ import annotations

import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.core import defaults  # noqa: E402
from harness.core.job import Job  # noqa: E402
from harness.execute.local import batches  # noqa: E402
from harness.spec import plan  # noqa: E402
from harness.spec.suite import load_suite  # noqa: E402
from kernels import REGISTRY  # noqa: E402


def one_by_one(jobs: list[Job], seed: int) -> list[Job]:
    """The plan before compile groups: each round's jobs shuffled one by one."""
    rng = random.Random(seed)
    bench = [job for job in jobs if job.kind == "benchmark"]
    out = [job for job in jobs if job.kind != "benchmark"]
    for trial in range(max(job.trials for job in bench)):
        this_round = [replace(job, trial=trial) for job in bench if job.trials > trial]
        rng.shuffle(this_round)
        out.extend(this_round)
    return out


def template(job: Job) -> tuple:
    """What a source kernel is compiled for: the variant, the dtype and the shape keys its template takes."""
    shape = dict(job.shape)
    groups = shape.get("H_q", 0) // max(shape.get("H_kv", 1), 1)
    return job.kernel, job.variant, job.dtype, shape.get("D"), shape.get("bits"), shape.get("group"), groups


def is_source(job: Job) -> bool:
    return job.kind == "benchmark" and REGISTRY[job.kernel].variants[job.variant].backend == "cuda"


def compiles(planned: list[Job]) -> int:
    return sum(len({template(job) for job in batch if is_source(job)})
               for batch in batches(planned, defaults.ROUND_BATCH))


def main() -> None:
    jobs = plan.plan_suite(load_suite(str(ROOT / "jobs" / "builtin.toml")), "gpu")
    source = [job for job in jobs if is_source(job)]
    print(f"benchmark jobs {sum(job.kind == 'benchmark' for job in jobs)}, CUDA source {len(source)}, "
          f"templates {len({template(job) for job in source})}")
    for name, planner in (("one by one", one_by_one), ("by compile group", plan.plan_trials)):
        counts = [compiles(planner(jobs, seed)) for seed in range(20)]
        print(f"{name:>17}: compiles per run, median {statistics.median(counts)} (range {min(counts)}-{max(counts)})")


if __name__ == "__main__":
    main()
