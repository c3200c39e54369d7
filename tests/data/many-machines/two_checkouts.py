"""Before/after of issue 37 on two checkouts of one repository (remotes https .git vs git@), as two machines: runs c0,
c2 (A) and c1, c3 (B) into their own SQLite files, exported, imported into a third; then c4 (8x slower) from A there.
Prints commit rows, each run's previous run, and the compare of c3 vs c4.

    python tests/data/many-machines/two_checkouts.py CODE_DIR OUT   # CODE_DIR: a harness checkout (151bd17, this)
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path


def main(code: str, out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # this checkout: testkit
    from testkit.e2e import AB_BENCH, AB_PACKAGE, AB_SUITE, commit, git, new_repo

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    def harness(*args: str) -> str:
        env = {**os.environ, "PYTHONPATH": code, "HARNESS_CACHE": str(out / "cache"), "COLUMNS": "1000"}
        done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=out, env=env, capture_output=True,
                              text=True)
        return done.stdout + done.stderr

    up = out / "up"
    shas = [new_repo(up, {"abkern/__init__.py": AB_PACKAGE.format(repeats=1), "abkern/bench.py": AB_BENCH,
                          "harness.toml": AB_SUITE.format(), "README": "0\n"}, "c0")]
    shas += [commit(up, {"README": f"{i}\n"}, f"c{i}") for i in (1, 2, 3)]
    shas.append(commit(up, {"abkern/__init__.py": AB_PACKAGE.format(repeats=8)}, "c4 slow"))
    checkouts = {}
    for name, remote in (("a", "https://github.com/o/abkern.git"), ("b", "git@github.com:o/abkern")):
        checkouts[name] = out / name / "abkern"
        subprocess.run(["git", "clone", "-q", str(up), str(checkouts[name])], check=True)
        git(checkouts[name], "remote", "set-url", "origin", remote)
    runs = {}

    def run(i: int, where: str, db: str) -> str:
        text = harness("run", "--repo", str(checkouts[where]), "--commit", shas[i], "--db", db, "--chip-label",
                       "cpu-x", "--no-report")
        runs[f"c{i}"] = re.search(r"run ([0-9a-f]{32})", text).group(1)
        return text

    for i, where in ((0, "a"), (1, "b"), (2, "a"), (3, "b")):
        run(i, where, f"sqlite:///{out / where / 'r.db'}")
    shared = f"sqlite:///{out / 'shared.db'}"
    for where in "ab":
        harness("export", "--db", f"sqlite:///{out / where / 'r.db'}", "-o", str(out / f"{where}.bundle"))
        harness("import", str(out / f"{where}.bundle"), "--db", shared)
    last = run(4, "a", shared)
    print("end of harness run c4:", [line for line in last.splitlines() if "previous run" in line][:1])
    with sqlite3.connect(out / "shared.db") as connection:
        rows = connection.execute('SELECT repo, count(*), count(DISTINCT sha) FROM "commit" GROUP BY repo').fetchall()
    print("commit rows (repo, rows, shas):", rows)
    sys.path.insert(0, code)
    for module in [m for m in sys.modules if m.startswith("harness")]:
        del sys.modules[module]
    from harness.record import outbox, query

    db = outbox.open_store(shared)
    name = {run_id: label for label, run_id in runs.items()}
    print("previous run:", {label: name.get(query.previous_run_id(db, run_id)) for label, run_id in runs.items()})
    db.close()
    text = harness("compare", shas[3], shas[4], "--db", shared)
    print("compare c3 c4:", [line for line in text.splitlines()
                             if re.search(r"regressed|unchanged|inconclusive|not proven", line)][:4])


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
