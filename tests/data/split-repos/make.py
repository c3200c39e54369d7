"""How tests/data/split-repos/split-151bd17.db was made: with the harness AT COMMIT 151bd17 (before commits were
keyed by repository identity), so that the migration is tested on a database written by that code.

    git -C /work/main worktree add /tmp/old151 151bd17
    cd /tmp/old151 && PYTHONPATH=/tmp/old151 python $WORKTREE/tests/data/split-repos/make.py OUT.db

One generated repository c0..c4 (main line), run from four checkouts, as four machines would:
- A: origin https://github.com/o/r.git, runs c0 and c2 (chip-a); commits between runs kept as links;
- B: origin git@GitHub.COM:o/r (another spelling, host case), runs c1 and c3 (chip-a), c2 again (chip-b);
- L: a clone without a remote (keyed by its folder name ``r-local``), runs c4;
- F: a fork https://github.com/fork/r.git (another repository by the new rule), runs c2;
- X: an unrelated repository without a remote, folder ``other`` (one commit), runs its commit.
"""

import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

import harness
from harness.record import store
from testkit.analysis import grid_results
from testkit.lineage import add_commit, git, new_repo, record_run

assert "old151" in harness.__file__, harness.__file__


def clone(source: Path, path: Path, remote: str | None) -> Path:
    subprocess.run(["git", "clone", "-q", str(source), str(path)], check=True)
    if remote is None:
        git(path, "remote", "remove", "origin")
    else:
        git(path, "remote", "set-url", "origin", remote)
    return path


def main(out: str) -> None:
    rng = np.random.default_rng(7)
    db = store.open_database(f"sqlite:///{out}")
    with TemporaryDirectory() as tmp:
        root = Path(tmp)
        upstream = new_repo(root / "upstream")
        shas = [add_commit(upstream, f"c{i}") for i in range(5)]
        a = clone(upstream, root / "a" / "r", "https://github.com/o/r.git")
        b = clone(upstream, root / "b" / "r", "git@GitHub.COM:o/r")
        local = clone(upstream, root / "r-local", None)
        fork = clone(upstream, root / "f" / "r", "https://github.com/fork/r.git")
        other = new_repo(root / "other")
        other_sha = add_commit(other, "x0")
        minutes = 0

        def run(repo: Path, sha: str, chip: str = "chip-a") -> None:
            nonlocal minutes
            results = grid_results(rng, n=4, trials=1, series=(("swiglu", "unfused"),))
            record_run(db, repo, sha, chip, results, minutes=minutes)
            minutes += 10

        run(a, shas[0])
        run(b, shas[1])
        run(a, shas[2])
        run(b, shas[3])
        run(b, shas[2], "chip-b")
        run(local, shas[4])
        run(fork, shas[2])
        run(other, other_sha)
    db.close()
    print(out, timedelta(minutes=minutes))


if __name__ == "__main__":
    main(sys.argv[1])
