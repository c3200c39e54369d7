"""How often `harness compare RUN1 RUN2` calls two runs of one commit changed, under random load (not a test).

A repository holding one small suite (testkit.e2e.NOISE_SUITE: two variants of one benchmark) is run ``--pairs``
times twice with `harness run`, while ``--burners`` processes load the CPU in random on/off phases of 0.2-2 s
(testkit.load), as on a shared CI runner; each pair is then compared run against run (`harness compare FIRST
SECOND`), each pair in a database of its own (no history: no between-run floor). The code is the same: every
verdict should be unchanged or inconclusive. A run-level shift (the load of one whole run) is what one run against
one run cannot measure: this counts how often it is called a change.

Run: ``python bench/runs_null_under_load.py --pairs 10 --burners 2 [--phase 5 20]`` (about 12 s a pair on 2
cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.e2e import NOISE_SUITE, harness, new_repo  # noqa: E402
from testkit.load import random_load  # noqa: E402

FLAGS = ("regressed", "improved")


def run_once(repo: Path, db: Path) -> str:
    done = harness("run", "--suite", "suite.toml", "--no-report", "--db", f"sqlite:///{db}", cwd=repo)
    if done.returncode != 0:
        raise SystemExit(f"harness run failed ({done.returncode}): {done.stderr[-800:]}")
    with sqlite3.connect(db) as conn:
        (run_id,) = conn.execute("select id from run order by started_at desc limit 1").fetchone()
    return run_id


def compare(repo: Path, db: Path, first: str, second: str) -> list[dict]:
    done = harness("compare", first, second, "--db", f"sqlite:///{db}", "--format", "json", cwd=repo)
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness compare failed ({done.returncode}): {done.stderr[-800:]}")
    return json.loads(done.stdout)["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="pairs of runs of one commit")
    parser.add_argument("--burners", type=int, default=2, help="background processes loading the CPU at random")
    parser.add_argument("--phase", type=float, nargs=2, default=(0.2, 2.0), metavar=("MIN_S", "MAX_S"),
                        help="each burner's busy or idle phases last MIN_S-MAX_S seconds (default 0.2 2; a phase "
                             "longer than a run, e.g. 5 20, shifts whole runs, as another job on a CI runner does)")
    args = parser.parse_args()
    rows: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="runs-null-") as scratch:
        repo = Path(scratch) / "repo"
        new_repo(repo, {"suite.toml": NOISE_SUITE}, "noise suite")
        with random_load(args.burners, phase_s=tuple(args.phase)):
            for number in range(args.pairs):
                db = Path(scratch) / f"pair-{number}.db"  # no history: the two runs are all there is
                first, second = run_once(repo, db), run_once(repo, db)
                found = compare(repo, db, first, second)
                rows += found
                print(f"pair {number + 1}/{args.pairs}: " + ", ".join(
                    f"{r['key']['variant']} {r['verdict']} x{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                    f" ({r['basis']}, {r['trials_base']}+{r['trials_head']} trials)" for r in found), flush=True)
    counts = Counter(r["verdict"] for r in rows)
    flagged = sum(counts[v] for v in FLAGS)
    print(f"\n{args.pairs} pairs of `harness run` of one commit, {len(rows)} series compared run against run, "
          f"{args.burners} random on/off burner(s) (phases of {args.phase[0]:g}-{args.phase[1]:g} s) on "
          f"{os.cpu_count()} cores, {time.perf_counter() - started:.0f} s")
    print(f"{flagged} flagged ({100 * flagged / max(1, len(rows)):.1f} %): "
          + ", ".join(f"{counts[v]} {v}" for v in ("regressed", "improved", "inconclusive", "unchanged", "broken")))


if __name__ == "__main__":
    main()
