"""Validate trial-level verdicts (harness.core.trials) against other rules on real and synthetic noise (not a test).

Rules compared, each deciding regressed / improved / unchanged (/ inconclusive) per series:

* trials: ``compare_trials`` -- t-test on log trial medians, variances moderated across the grid, history
  floor where given, BH across the grid, stats' decision rules (see harness.core.trials);
* old: ``stats.compare_grid`` on the pooled samples of each side (Mann-Whitney + bootstrap, BH) -- the rule
  the harness used before trials;
* asv: airspeed velocity's ``asv compare`` rule (``_is_result_better`` with ``statistics.is_different``):
  flagged when median(head) / median(base) is beyond ``--asv-factor`` (default 1.1, either way) AND a
  two-sided Mann-Whitney test on the pooled samples gives p < ``--asv-p`` (asv's ``p_threshold``,
  default 0.002 -- asv's own default, stricter than 0.05).  asv uses the normal approximation above 20
  samples a side, we use scipy's exact test when there are no ties (<= 100 a side); no multiplicity control,
  as in asv;
* MWU: two-sided Mann-Whitney on the pooled samples at p < 0.05, direction from the ratio of medians,
  no multiplicity control and no materiality band -- a plain significance test.

Sections:

(a) real null runs on an H200 (shared/data/h200-null: three runs of one commit; each run is one trial,
    one process per job): null pairs of 2 runs against 1 (runs = (2, 1), for each choice of head run) and
    of 1 run against 1; recall with the head's samples multiplied by 1.05 and 1.10 (every series shifted);
(b) two-level synthetic noise: per series a between-trial log sd drawn lognormal with median 4.0 % and
    p90 12.9 % (as measured between runs on the H200; sd of log sd = ln(12.9/4.0)/z_0.9 = 0.91), plus
    lognormal within-trial noise 2.6 % on 10 samples, R = 3 trials a side, grids of ``--grid-size``
    series.  Null grids give the false alarms; step grids plant a step in 10 % of the series and report
    the fraction of those called regressed.  Protocol rows: the H200 default; a quiet protocol (between-trial
    sd median 0.5 %, as measured for pipelined timing on the H200, same dispersion); a 10-run history floor
    on the base branch (each history run measured like a side: the mean log median of R trials); and a run
    effect shared by the trials of one side (sd equal to the series' between-trial sd) without and with the
    floor -- the case floors exist for;
(c) this CPU machine: two real `harness run`s of the built-in benchmark sections, at a copy of this checkout and
    at an empty commit on top of it (identical kernels), optionally under a background load that switches on and
    off at random (``--cpu-load N``); `harness compare` of the two runs, and every rule on the same trials.

Run: ``python tools/validate_stats.py`` (about 25 s for (a) and (b), plus the two runs of (c): a few minutes;
``--skip-cpu`` leaves (c) out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.core import stats, trials  # noqa: E402
from testkit.e2e import copy_checkout, git  # noqa: E402
from testkit.load import random_load  # noqa: E402
from testkit.suites import benchmark_sections  # noqa: E402

Array = npt.NDArray[np.float64]
TrialPair = tuple[list[Array], list[Array]]
Grid = dict[str, TrialPair]
Run = dict[str, Array]  # series key -> samples of one run
Case = tuple[Grid, "Context"]
FLAGGED = ("regressed", "improved")
METHODS = ("trials", "old", "asv", "MWU")

SAMPLES = 10
WITHIN_SD = 0.026
BETWEEN_MEDIAN, BETWEEN_P90 = 0.040, 0.129
QUIET_MEDIAN = 0.005
Z90 = 1.2815515655446004
HISTORY_RUNS = 10
PLANTED_FRACTION = 0.1
STEPS = (0.03, 0.05, 0.10)
SHIFTS = (1.05, 1.10)


# ---------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    floors: dict[str, trials.Floor] | None = None
    runs: dict[str, tuple[int, int]] | None = None
    separate_runs: bool = False  # the sides are separate runs, as `harness compare` of runs (trials.compare_trials)


def pooled(grid: Grid) -> dict[str, tuple[Array, Array]]:
    return {key: (np.concatenate(base), np.concatenate(head)) for key, (base, head) in grid.items()}


def mann_whitney(samples: Mapping[str, tuple[Array, Array]]) -> dict[str, float]:
    """Two-sided Mann-Whitney p per series, batched by sizes (stats' exact/asymptotic choice)."""
    by_sizes: dict[tuple[int, int], list[str]] = {}
    for key, (base, head) in samples.items():
        by_sizes.setdefault((base.size, head.size), []).append(key)
    p_values: dict[str, float] = {}
    for keys in by_sizes.values():
        base_rows = np.stack([samples[k][0] for k in keys])
        head_rows = np.stack([samples[k][1] for k in keys])
        p_values.update(zip(keys, stats.mann_whitney_pvalues(base_rows, head_rows).tolist(), strict=True))
    return p_values


def direction(ratio: float, flagged: bool) -> str:
    if not flagged:
        return "unchanged"
    return "regressed" if ratio > 1 else "improved"


def compare(grid: Grid, context: Context) -> dict[str, trials.TrialComparison]:
    return trials.compare_trials(grid, floors=context.floors, runs=context.runs, separate_runs=context.separate_runs)


def rule_trials(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    return {key: c.verdict for key, c in compare(grid, context).items()}


def rule_old(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    return {key: c.verdict for key, c in stats.compare_grid(pooled(grid)).items()}


def median_ratios(samples: Mapping[str, tuple[Array, Array]]) -> dict[str, float]:
    return {key: float(np.median(head) / np.median(base)) for key, (base, head) in samples.items()}


def rule_asv(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    samples = pooled(grid)
    p_values, ratios = mann_whitney(samples), median_ratios(samples)
    factor = args.asv_factor
    return {
        key: direction(ratio, (ratio > factor or ratio < 1 / factor) and p_values[key] < args.asv_p)
        for key, ratio in ratios.items()
    }


def rule_mwu(grid: Grid, context: Context, args: argparse.Namespace) -> dict[str, str]:
    samples = pooled(grid)
    p_values, ratios = mann_whitney(samples), median_ratios(samples)
    return {key: direction(ratio, p_values[key] < 0.05) for key, ratio in ratios.items()}


RULES: dict[str, Callable[[Grid, Context, argparse.Namespace], dict[str, str]]] = {
    "trials": rule_trials,
    "old": rule_old,
    "asv": rule_asv,
    "MWU": rule_mwu,
}


# ---------------------------------------------------------------------------
# Tallies and printing
# ---------------------------------------------------------------------------


@dataclass
class Tally:
    flagged: int = 0
    regressed: int = 0
    inconclusive: int = 0
    total: int = 0

    def add(self, verdicts: Sequence[str]) -> None:
        self.flagged += sum(v in FLAGGED for v in verdicts)
        self.regressed += sum(v == "regressed" for v in verdicts)
        self.inconclusive += sum(v == "inconclusive" for v in verdicts)
        self.total += len(verdicts)

    def pct(self, count: int) -> float:
        return 100.0 * count / self.total if self.total else math.nan

    def null_cell(self) -> str:
        unchanged = self.total - self.flagged - self.inconclusive
        return f"{self.pct(self.flagged):5.1f} {self.pct(self.inconclusive):5.1f} {self.pct(unchanged):5.1f}"


def run_rules(grid: Grid, context: Context, args: argparse.Namespace, keys: Sequence[str] | None = None) -> dict:
    """Verdicts of every rule, restricted to ``keys`` when given."""
    chosen = list(grid) if keys is None else list(keys)
    verdicts = {name: rule(grid, context, args) for name, rule in RULES.items()}
    return {name: [found[k] for k in chosen] for name, found in verdicts.items()}


def print_null_header(label: str) -> None:
    cells = " | ".join(f"{name:^17}" for name in METHODS)
    print(f"{label:<34} | {cells}")
    print(f"{'':<34} | " + " | ".join(f"{'flag  inc.  unch':>17}" for _ in METHODS))


def print_null_row(label: str, tallies: Mapping[str, Tally]) -> None:
    print(f"{label:<34} | " + " | ".join(f"{tallies[name].null_cell():>17}" for name in METHODS))


# ---------------------------------------------------------------------------
# (a) Real H200 null runs
# ---------------------------------------------------------------------------


def default_h200_dir() -> Path:
    return (Path(__file__).resolve().parents[1] / "../shared/data/h200-null").resolve()


def load_run(path: Path) -> Run:
    """Series key -> raw samples of one run (passed benchmark jobs), read-only."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "select j.key, s.seconds from job j join sample s on s.job_id = j.id "
            "where j.kind = 'benchmark' and j.status = 'passed' order by j.key, s.idx"
        ).fetchall()
    finally:
        connection.close()
    series: dict[str, list[float]] = {}
    for key, seconds in rows:
        series.setdefault(key, []).append(seconds)
    return {key: np.asarray(values, dtype=np.float64) for key, values in series.items()}


def h200_grids(runs: Sequence[Run], keys: Sequence[str], scale: float) -> list[Case]:
    """Null (or shifted, ``scale``) grids of two runs against one, one per choice of head run."""
    grids = []
    for head in range(3):
        base = [i for i in range(3) if i != head]
        grid = {k: ([runs[base[0]][k], runs[base[1]][k]], [runs[head][k] * scale]) for k in keys}
        grids.append((grid, Context(runs={k: (2, 1) for k in keys}, separate_runs=True)))
    return grids


def h200_single_grids(runs: Sequence[Run], keys: Sequence[str], scale: float) -> list[Case]:
    """Null (or shifted) grids of one run against one, for each pair of runs."""
    pairs = ((0, 1), (0, 2), (1, 2))
    return [({k: ([runs[b][k]], [runs[h][k] * scale]) for k in keys}, Context(separate_runs=True)) for b, h in pairs]


def tally_grids(grids: Sequence[Case], args: argparse.Namespace) -> dict[str, Tally]:
    tallies = {name: Tally() for name in METHODS}
    for grid, context in grids:
        for name, verdicts in run_rules(grid, context, args).items():
            tallies[name].add(verdicts)
    return tallies


def median_detectable(grids: Sequence[Case]) -> float:
    values = [c.detectable for grid, context in grids for c in compare(grid, context).values()]
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan


def section_a(args: argparse.Namespace) -> None:
    directory = Path(args.h200_dir) if args.h200_dir else default_h200_dir()
    paths = [directory / f"run{i}.db" for i in (1, 2, 3)]
    missing = [str(p) for p in paths if not p.is_file()]
    print("(a) Real null runs on an H200 (one commit, three runs; each run = one trial per series)")
    if missing:
        print(f"(a) skipped: {', '.join(missing)} not found (pass --h200-dir DIR)")
        return
    runs = [load_run(p) for p in paths]
    keys = sorted(set(runs[0]) & set(runs[1]) & set(runs[2]))
    print(f"    {len(keys)} series in all three runs; % of comparisons (flagged = regressed + improved)")
    print_null_header("null pairs")
    two = tally_grids(h200_grids(runs, keys, 1.0), args)
    print_null_row(f"2 runs vs 1 (3 x {len(keys)})", two)
    one = tally_grids(h200_single_grids(runs, keys, 1.0), args)
    print_null_row(f"1 run vs 1 (3 x {len(keys)})", one)
    all_keys = sorted(set(runs[0]) & set(runs[2]))
    whole = {k: ([runs[0][k]], [runs[2][k]]) for k in all_keys}
    print_null_row(f"run1 vs run3, all {len(all_keys)} series",
                   tally_grids([(whole, Context(separate_runs=True))], args))
    detectable = median_detectable(h200_grids(runs, keys, 1.0))
    print(f"    trials, 2 runs vs 1: median detectable change {detectable:.1%} (80 % power, before BH)")
    print()
    print("    recall: % called regressed with the head's samples x scale (every series shifted)")
    print(f"    {'scale':<30} | " + " | ".join(f"{name:>7}" for name in METHODS))
    for scale in SHIFTS:
        for label, make in (("2 runs vs 1", h200_grids), ("1 run vs 1", h200_single_grids)):
            tallies = tally_grids(make(runs, keys, scale), args)
            cells = " | ".join(f"{tallies[name].pct(tallies[name].regressed):6.1f}%" for name in METHODS)
            print(f"    x{scale:.2f}, {label:<23} | {cells}")


# ---------------------------------------------------------------------------
# (b) Synthetic two-level noise
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    label: str
    between_median: float
    run_effect: bool = False  # trials of one side share a run-level shift (sd = the series' between-trial sd)
    floor: bool = False  # a 10-run history floor on the base branch
    run_shift: float = 0.0  # sd of one shift of the head run shared by every series of the grid (a whole-run load)
    separate_runs: bool = False  # judged as `harness compare` of two single runs (a flag must stand out of the shift)


PROTOCOLS = (
    Protocol("H200-like: between-trial 4.0 %", BETWEEN_MEDIAN),
    Protocol("quiet: between-trial 0.5 %", QUIET_MEDIAN),
    Protocol("H200-like + 10-run floor", BETWEEN_MEDIAN, floor=True),
    Protocol("+ run effect, no floor", BETWEEN_MEDIAN, run_effect=True),
    Protocol("+ run effect + 10-run floor", BETWEEN_MEDIAN, run_effect=True, floor=True),
    Protocol("whole-run shift 8 %, trials only", BETWEEN_MEDIAN, run_shift=0.08),
    Protocol("whole-run shift 8 %, as compare", BETWEEN_MEDIAN, run_shift=0.08, separate_runs=True),
    Protocol("H200-like, as compare", BETWEEN_MEDIAN, separate_runs=True),
)


def between_sds(rng: np.random.Generator, median: float, n: int) -> Array:
    spread = math.log(BETWEEN_P90 / BETWEEN_MEDIAN) / Z90  # sd of log sd, 0.91
    return median * np.exp(rng.normal(0.0, spread, n))


def draw_side(rng: np.random.Generator, sd: float, protocol: Protocol, trials_per_side: int, shift: float) -> list:
    run_level = rng.normal(0.0, sd) if protocol.run_effect else 0.0
    levels = shift + run_level + rng.normal(0.0, sd, trials_per_side)
    return [1e-4 * np.exp(level + rng.normal(0.0, WITHIN_SD, SAMPLES)) for level in levels]


def history(rng: np.random.Generator, sd: float, protocol: Protocol, trials_per_side: int) -> trials.Floor | None:
    """The floor from 10 earlier base runs, each measured like a side (mean log median of its trials)."""
    medians = [
        math.exp(float(np.mean([np.log(np.median(t)) for t in draw_side(rng, sd, protocol, trials_per_side, 0.0)])))
        for _ in range(HISTORY_RUNS)
    ]
    return trials.history_floor(medians)


def synthetic_grid(
    rng: np.random.Generator, protocol: Protocol, size: int, step: float, trials_per_side: int
) -> tuple[Grid, Context, list[str]]:
    """A grid with ``step`` planted (log1p) in a random 10 % of the series; returns the planted keys."""
    sds = between_sds(rng, protocol.between_median, size)
    planted = set(rng.choice(size, size=int(PLANTED_FRACTION * size), replace=False).tolist()) if step else set()
    grid: Grid = {}
    floors: dict[str, trials.Floor] = {}
    whole_run = rng.normal(0.0, protocol.run_shift) if protocol.run_shift else 0.0
    for i, sd in enumerate(sds):
        key = f"s{i}"
        shift = (math.log1p(step) if i in planted else 0.0) + whole_run
        grid[key] = (
            draw_side(rng, sd, protocol, trials_per_side, 0.0),
            draw_side(rng, sd, protocol, trials_per_side, shift),
        )
        floor = history(rng, sd, protocol, trials_per_side) if protocol.floor else None
        if floor is not None:
            floors[key] = floor
    context = Context(floors=floors or None, runs={k: (1, 1) for k in grid} if floors else None,
                      separate_runs=protocol.separate_runs)
    return grid, context, [f"s{i}" for i in sorted(planted)]


def section_b(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    size, reps, per_side = args.grid_size, args.grids, args.trials
    print(
        f"(b) Synthetic two-level noise: {per_side} trials a side, {SAMPLES} samples a trial, within-trial "
        f"{WITHIN_SD:.1%}; between-trial sd lognormal (p90 / median = {BETWEEN_P90 / BETWEEN_MEDIAN:.2f})"
    )
    print(
        f"    nulls: {reps} grids x {size} series, % flagged / inconclusive; recall: % of the planted series "
        f"({PLANTED_FRACTION:.0%} of {reps} x {size}) called regressed"
    )
    steps = " ".join(f"{'rec' + format(s, '.0%'):>7}" for s in STEPS)
    print(f"    {'protocol':<31} {'rule':<6} | {'flag%':>6} {'inc%':>6} | {steps} | detectable")
    for protocol in PROTOCOLS:
        nulls = {name: Tally() for name in METHODS}
        detect: list[float] = []
        for _ in range(reps):
            grid, context, _ = synthetic_grid(rng, protocol, size, 0.0, per_side)
            for name, verdicts in run_rules(grid, context, args).items():
                nulls[name].add(verdicts)
            detect += [c.detectable for c in compare(grid, context).values()]
        recall = {(name, step): Tally() for name in METHODS for step in STEPS}
        for step in STEPS:
            for _ in range(reps):
                grid, context, planted = synthetic_grid(rng, protocol, size, step, per_side)
                for name, verdicts in run_rules(grid, context, args, planted).items():
                    recall[(name, step)].add(verdicts)
        for name in METHODS:
            tally = nulls[name]
            rec = " ".join(f"{recall[(name, s)].pct(recall[(name, s)].regressed):6.1f}%" for s in STEPS)
            det = f"{np.median(detect):6.1%}" if name == "trials" else ""
            label = protocol.label if name == METHODS[0] else ""
            print(
                f"    {label:<31} {name:<6} | {tally.pct(tally.flagged):5.2f}% {tally.pct(tally.inconclusive):5.1f}% "
                f"| {rec} | {det}"
            )


# ---------------------------------------------------------------------------
# (c) This CPU machine
# ---------------------------------------------------------------------------


def _harness(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "HARNESS_CACHE": str(cwd / "cache")}
    code = "from harness.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True)


def _cpu_grid(db_url: str, base_run: str, head_run: str) -> tuple[Grid, Context]:
    from harness.record import query  # the store layer loads only for this section
    from harness.record.store import open_database

    store = open_database(db_url, must_exist=True)
    try:
        base, head = query.series_trials(store, [base_run]), query.series_trials(store, [head_run])
    finally:
        store.close()
    keys = sorted(base.keys() & head.keys())
    grid = {str(key): (base[key].trials, head[key].trials) for key in keys}
    return grid, Context(runs={str(key): (1, 1) for key in keys}, separate_runs=True)


def section_c(args: argparse.Namespace) -> None:
    """Two `harness run`s of the built-in benchmark sections on this machine, at a base commit and at an empty head
    commit (identical kernels), then `harness compare` of the two runs and the other rules on the same trials."""
    if args.skip_cpu:
        print("(c) skipped (--skip-cpu)")
        return
    with tempfile.TemporaryDirectory(prefix="validate-cpu-") as scratch:
        folder = Path(scratch)
        repo = folder / "repo"
        repo.mkdir()
        base = copy_checkout(repo, "base")
        git(repo, "commit", "-q", "--allow-empty", "-m", "head: nothing changed")
        head = git(repo, "rev-parse", "HEAD")
        suite = folder / "benchmarks.toml"
        suite.write_text(benchmark_sections((ROOT / "jobs" / "builtin.toml").read_text()))
        db_url = f"sqlite:///{folder / 'cpu.db'}"
        started = time.perf_counter()
        with random_load(args.cpu_load):
            runs = []
            for sha in (base, head):
                done = _harness(folder, "run", "--repo", str(repo), "--commit", sha, "--suite", str(suite), "--db",
                                db_url, "--no-report")
                if done.returncode != 0:
                    print(f"(c) harness run at {sha[:12]} failed ({done.returncode}): {done.stderr[-500:]}")
                    return
                runs.append(re.search(r"run ([0-9a-f]{32})", done.stdout + done.stderr).group(1))
        elapsed = time.perf_counter() - started
        compared = _harness(folder, "compare", *runs, "--db", db_url, "--format", "json")
        report = json.loads(compared.stdout)
        grid, context = _cpu_grid(db_url, *runs)
    counts = report["counts"]
    total = sum(counts.values())
    flagged = counts["regressed"] + counts["improved"]
    print(f"(c) this CPU machine: the built-in benchmark sections, base {base[:12]} vs an empty head commit "
          f"{head[:12]} (identical kernels), {args.cpu_load} random on/off background burner(s), "
          f"two runs in {elapsed:.0f} s")
    print(f"    harness compare: exit {compared.returncode}, {total} series: "
          + ", ".join(f"{counts[v]} {v}" for v in ("regressed", "improved", "inconclusive", "unchanged", "broken"))
          + f" -> {100.0 * flagged / total if total else math.nan:.1f}% flagged")
    print_null_header("rule on the same trials")
    print_null_row(f"run vs run ({len(grid)} series)", tally_grids([(grid, context)], args))


# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h200-dir", help="folder with run1.db, run2.db, run3.db (default: ../shared/data/h200-null)")
    parser.add_argument("--seed", type=int, default=20241130, help="seed of the synthetic section")
    parser.add_argument("--grid-size", type=int, default=300, help="series per synthetic grid")
    parser.add_argument("--grids", type=int, default=5, help="synthetic grids per cell")
    parser.add_argument("--trials", type=int, default=3, help="trials per side in the synthetic section")
    parser.add_argument("--asv-factor", type=float, default=1.1, help="asv compare's --factor")
    parser.add_argument("--asv-p", type=float, default=0.002, help="asv's Mann-Whitney p_threshold")
    parser.add_argument("--skip-cpu", action="store_true", help="skip (c), the two real runs on this machine")
    parser.add_argument("--cpu-load", type=int, default=0, metavar="N",
                        help="(c) N background processes that load the CPU on and off at random during the runs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    print(
        f"Rules: trials = compare_trials; old = stats.compare_grid on pooled samples; asv = ratio of medians beyond "
        f"{args.asv_factor} and Mann-Whitney p < {args.asv_p}; MWU = Mann-Whitney p < 0.05 (pooled samples)\n"
    )
    section_a(args)
    print()
    section_b(args)
    print()
    section_c(args)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
