"""Side by side: `harness report` of two checkouts after one new run, on copies of one database, rounds alternating.

A noisy shared machine moves a single timing by more than the change under test (on the 2-core machines here, the
same report took 9 s at a session's start and 15 s an hour later). This script measures two trees in the same
minutes instead: each tree gets its own copy of a filled database (``tools/bench_report.py``'s, e.g. one kept with
``--db``) and its own output folder; a full report warms each tree's analysis cache and site manifest (the code
version is part of every cache key, so the trees do not share them); then, per round, each tree reports once with
nothing new, the same new run is added to both copies (``bench_report.add_run``), and each reports again, the
order alternating between rounds (each tree adds the run with its own code: a tree may migrate the database to
a schema the other does not know). Every report is ``python -m harness report --timings`` in a fresh process, run
from the tree's folder (its ``harness`` package), with its bytecode compiled first as a user's install has it.
Prints each report's wall and CPU seconds, then the medians per tree.

    git archive <commit> | tar -x -C /tmp/base        # the baseline tree
    python bench/ab_report.py --db /tmp/big0.db /tmp/base .  --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_report  # noqa: E402


def report(tree: Path, db: Path, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, its children included) of one report of ``tree`` in a fresh process."""
    wall, cpu, done = bench_report.timed(
        [sys.executable, "-m", "harness", "report", "--db", f"sqlite:///{db}", "--out", str(out), "--timings"],
        cwd=tree, env={**os.environ, "PYTHONHASHSEED": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    if done.returncode != 0:
        raise SystemExit(f"{tree}: report failed\n{done.stdout}\n{done.stderr}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2, type=Path, help="two checkouts (their harness/ folders are run)")
    parser.add_argument("--db", required=True, type=Path, help="a filled database (tools/bench_report.py --db)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, help="folder for the copies (default: a temporary one)")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    for tree in trees:
        if not (tree / "harness").is_dir():
            parser.error(f"{tree}: no harness/ folder (a checkout of the project?)")
    if not args.db.is_file():
        parser.error(f"--db {args.db}: no such file (fill one with tools/bench_report.py --db PATH --keep-db)")
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        dbs, outs = [work / f"tree{i}.db" for i in (0, 1)], [work / f"site{i}" for i in (0, 1)]
        for tree, db, out in zip(trees, dbs, outs, strict=True):
            bench_report.compile_tree(tree)
            shutil.copyfile(args.db, db)
            wall, cpu = report(tree, db, out)
            print(f"{tree}: warmed (full report {wall:.2f} s, CPU {cpu:.2f} s)", flush=True)
        print(f"reference loop (machine speed): {bench_report.reference_loop_s():.3f} s")
        after: list[list[tuple[float, float]]] = [[], []]
        nothing: list[list[float]] = [[], []]
        for round_ in range(args.rounds):
            for i in (0, 1):
                nothing[i].append(report(trees[i], dbs[i], outs[i])[0])
            for tree, db in zip(trees, dbs, strict=True):  # each tree's own code: see add_run_by
                bench_report.add_run_by(tree, f"sqlite:///{db}")
            for i in ((0, 1) if round_ % 2 == 0 else (1, 0)):
                wall, cpu = report(trees[i], dbs[i], outs[i])
                after[i].append((wall, cpu))
                print(f"round {round_}: {trees[i]} after one new run {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
        for i in (0, 1):
            walls = [wall for wall, _ in after[i]]
            print(f"{trees[i]}: after one new run median {statistics.median(walls):.2f} s (min {min(walls):.2f}), "
                  f"CPU {statistics.median(cpu for _, cpu in after[i]):.2f} s; nothing new median "
                  f"{statistics.median(nothing[i]):.2f} s")


if __name__ == "__main__":
    main()
