"""How often `harness compare --ab` calls identical code changed, on this machine under random load (not a test).

A repository of one numpy benchmark (testkit.e2e.ab_repo): its commit c1 changes only the README. `harness compare
--ab c0 c1` runs ``--pairs`` times while ``--burners`` processes load the CPU in random on/off phases of 0.2-2 s
(testkit.load), as on a shared CI runner. Every verdict should be unchanged or inconclusive.

Printed side by side, on the trials the sessions recorded:

- the verdicts `harness compare --ab` gave (the rank check on: a lone series is judged on its own trials, and the
  plan gives it 4 a side);
- the t-test alone on the same 4 + 4 trials, and on the first 3 + 3 of them (the rule before the rank check, with
  the suite's 3 trials): what the rank check prevents.

Run: ``python bench/ab_null_under_load.py --pairs 20 --burners 2`` (about 15 s a pair on 2 cores).
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.record import query  # noqa: E402
from harness.record.store import open_database  # noqa: E402
from harness.stats import trials  # noqa: E402
from testkit.e2e import ab_repo, harness  # noqa: E402
from testkit.load import random_load  # noqa: E402

FLAGS = ("regressed", "improved")


def compare_ab(folder: Path, base: str, head: str, repo: Path, db: Path) -> dict:
    done = harness("compare", "--ab", base, head, "--repo", str(repo), "--db", f"sqlite:///{db}", "--format", "json",
                   cwd=folder, env={"HARNESS_CACHE": str(folder / "cache")})
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness compare --ab failed ({done.returncode}): {done.stderr[-800:]}")
    (row,) = json.loads(done.stdout)["rows"]
    return {"exit": done.returncode, "verdict": row["verdict"], "ratio": row["ratio"]}


def session_trials(db: Path) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """Per A/B session, oldest first: (base trials, head trials) of its one series, in the order they ran."""
    with sqlite3.connect(db) as conn:
        runs = conn.execute("select id, options from run order by started_at").fetchall()
    store = open_database(f"sqlite:///{db}", must_exist=True)
    try:
        sessions: dict[str, dict[str, list[np.ndarray]]] = {}
        for run_id, options in runs:
            opts = json.loads(options)
            (series,) = query.series_trials(store, [run_id]).values()
            sessions.setdefault(opts["ab_session"], {})[opts["ab_side"]] = series.trials
    finally:
        store.close()
    return [(pair["base"], pair["head"]) for pair in sessions.values() if {"base", "head"} <= pair.keys()]


def t_only(base: list[np.ndarray], head: list[np.ndarray]) -> str:
    return trials.compare_trials({0: (base, head)}, same_session=True, rank_check=False)[0].verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="A/B sessions of identical code")
    parser.add_argument("--burners", type=int, default=2, help="background processes loading the CPU at random")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ab-null-") as scratch:
        folder = Path(scratch)
        repo = folder / "abkern"
        c0, c1, _ = ab_repo(repo)
        db = folder / "ab.db"
        verdicts: list[dict] = []
        started = time.perf_counter()
        with random_load(args.burners):
            for number in range(args.pairs):
                verdicts.append(compare_ab(folder, c0, c1, repo, db))
                print(f"pair {number + 1}/{args.pairs}: {verdicts[-1]['verdict']} x{verdicts[-1]['ratio']:.3f} "
                      f"(exit {verdicts[-1]['exit']})", flush=True)
        elapsed = time.perf_counter() - started
        pairs = session_trials(db)
    shown = Counter(v["verdict"] for v in verdicts)
    four = Counter(t_only(base, head) for base, head in pairs)
    three = Counter(t_only(base[:3], head[:3]) for base, head in pairs)
    sizes = Counter(f"{len(base)}+{len(head)}" for base, head in pairs)

    def line(label: str, counts: Counter) -> str:
        flagged = sum(counts[v] for v in FLAGS)
        return (f"{label:44} {flagged:3d} flagged ({100 * flagged / max(1, sum(counts.values())):5.1f} %)   "
                + ", ".join(f"{counts[v]} {v}" for v in ("regressed", "improved", "inconclusive", "unchanged")))

    print(f"\n{args.pairs} A/B sessions of identical code (c0 vs a README-only c1), {args.burners} random on/off "
          f"burner(s) on {os.cpu_count()} cores, {elapsed:.0f} s; trials per side: {dict(sizes)}")
    print(line("harness compare --ab (rank check, 4 trials)", shown))
    print(line("t-test alone, same 4 + 4 trials", four))
    print(line("t-test alone, first 3 + 3 trials (before)", three))
    print(f"exit codes: {dict(Counter(v['exit'] for v in verdicts))}")


if __name__ == "__main__":
    main()
