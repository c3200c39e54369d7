"""How often `harness compare --settle` gets a one-benchmark repository right under random load (not a test).

A repository of one numpy benchmark (testkit.e2e's abkern): c0; c1 sorts twice as often (a ~2x slowdown); c2 an
empty commit on c1 (identical code). Each try, in a database of its own (no history: the cold start of a pull-request
gate), `harness run`s c0, c1 and c2 once each, then `harness compare c0 c1 --settle` (should be regressed, exit 1)
and `harness compare c1 c2 --settle` (should flag nothing, exit 0), while ``--burners`` processes load the CPU in
random on/off phases (testkit.load). Without --settle one run a side of a one-series suite is always inconclusive
(held: nothing tells a change from a shift of the whole run).

Run: ``python bench/settle_under_load.py --tries 10 --burners 2`` (about a minute a try on 2 busy cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.e2e import AB_BENCH, AB_PACKAGE, AB_SUITE, commit, git, harness, new_repo  # noqa: E402
from testkit.load import random_load  # noqa: E402

FLAGS = ("regressed", "improved")


def settle_repo(path: Path) -> list[str]:
    """c0; c1 sorts twice as often (~2x slower); c2 an empty commit (identical code to c1). Their shas."""
    shas = [new_repo(path, {"abkern/__init__.py": AB_PACKAGE.format(repeats=1), "abkern/bench.py": AB_BENCH,
                            "harness.toml": AB_SUITE.format(), "README": "0\n"}, "c0"),
            commit(path, {"abkern/__init__.py": AB_PACKAGE.format(repeats=2)}, "c1 sort twice")]
    git(path, "commit", "-q", "--allow-empty", "-m", "c2 empty")
    return [*shas, git(path, "rev-parse", "HEAD")]


def run_commit(repo: Path, db: str, sha: str, cwd: Path) -> None:
    done = harness("run", "--repo", str(repo), "--commit", sha, "--db", db, "--no-report", cwd=cwd)
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness run failed ({done.returncode}): {done.stderr[-800:]}")


def compare(db: str, base: str, head: str, repo: Path, cwd: Path, *extra: str) -> tuple[int, dict, float]:
    started = time.perf_counter()
    done = harness("compare", base, head, "--db", db, "--format", "json", "--repo", str(repo), "--settle", *extra,
                   cwd=cwd)
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness compare failed ({done.returncode}): {done.stderr[-800:]}")
    return done.returncode, json.loads(done.stdout), time.perf_counter() - started


def settling_runs(db_file: Path) -> int:
    with sqlite3.connect(db_file) as conn:
        return conn.execute("select count(*) from run where settling").fetchone()[0]


def one_try(scratch: Path, number: int, budget: str) -> tuple[tuple[int, str], tuple[int, str], float]:
    repo = scratch / f"repo-{number}"
    shas = settle_repo(repo)
    db_file = scratch / f"try-{number}.db"
    db = f"sqlite:///{db_file}"
    for sha in shas:
        run_commit(repo, db, sha, scratch)
    plain = harness("compare", shas[0], shas[1], "--db", db, "--format", "json", cwd=scratch)
    (row_plain,) = json.loads(plain.stdout)["rows"]
    code_slow, slow, seconds_slow = compare(db, shas[0], shas[1], repo, scratch, "--budget", budget)
    code_same, same, seconds_same = compare(db, shas[1], shas[2], repo, scratch, "--budget", budget)
    (row_slow,), (row_same,) = slow["rows"], same["rows"]
    print(f"try {number + 1}: 2x slower, stored runs alone {row_plain['verdict']} x{row_plain['ratio']:.3f}; "
          f"settled -> {row_slow['verdict']} x{row_slow['ratio']:.3f} exit {code_slow} "
          f"({row_slow['trials_base']}+{row_slow['trials_head']} trials, {seconds_slow:.0f} s); identical -> "
          f"{row_same['verdict']} x{row_same['ratio']:.3f} exit {code_same} ({row_same['trials_base']}+"
          f"{row_same['trials_head']} trials, {seconds_same:.0f} s); {settling_runs(db_file)} settling runs stored",
          flush=True)
    return (code_slow, row_slow["verdict"]), (code_same, row_same["verdict"]), seconds_slow + seconds_same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--burners", type=int, default=2, help="background processes loading the CPU at random")
    parser.add_argument("--budget", default="120s", help="harness compare --settle --budget")
    args = parser.parse_args()
    slow_ok = same_ok = 0
    same_verdicts: dict[str, int] = {}
    settle_s = 0.0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="settle-") as scratch, random_load(args.burners):
        for number in range(args.tries):
            (code_slow, verdict_slow), (code_same, verdict_same), seconds = one_try(Path(scratch), number,
                                                                                    args.budget)
            slow_ok += code_slow == 1 and verdict_slow == "regressed"
            same_ok += code_same == 0 and verdict_same not in FLAGS
            same_verdicts[verdict_same] = same_verdicts.get(verdict_same, 0) + 1
            settle_s += seconds
    print(f"\n{args.tries} tries, {args.burners} random on/off burner(s) on {os.cpu_count()} cores, "
          f"{time.perf_counter() - started:.0f} s ({settle_s:.0f} s in compare --settle)")
    print(f"~2x slowdown, one run a side: regressed with exit 1 in {slow_ok}/{args.tries}")
    print(f"identical code (empty commit): exit 0, nothing flagged in {same_ok}/{args.tries} ("
          + ", ".join(f"{verdict} {count}" for verdict, count in sorted(same_verdicts.items())) + ")")


if __name__ == "__main__":
    main()
