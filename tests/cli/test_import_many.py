"""`harness import` takes many bundles and glob patterns (a pattern that matches nothing is an error), and
`--repo PATH` reads the ancestry the bundles lack from a clone: bundles of an older harness, keyed by a checkout
path and without parents, are linked into one proven history."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from sqlalchemy import delete, select, update

from harness.record import bundle, outbox, query, store
from harness.record.models import Commit, Run
from testkit.analysis import grid_results
from testkit.e2e import harness
from testkit.lineage import add_commit, new_repo, record_run


def old_bundle(tmp_path: Path, repo: Path, sha: str, folder: str, minutes: float) -> tuple[Path, str]:
    """A bundle as an older harness wrote it on another machine: the run's commit only, keyed by the checkout's
    path, parents unknown."""
    db = store.open_database(f"sqlite:///{tmp_path / folder}.db")
    run_id = record_run(db, repo, sha, "chip-a", grid_results(np.random.default_rng(1), n=4, trials=1),
                        minutes=minutes)
    with db.session() as session:
        session.execute(delete(Commit).where(~Commit.id.in_(select(Run.commit_id))))
        session.execute(update(Commit).values(repo=f"/Users/{folder}/src/r", parents=None))
    path = tmp_path / "bundles" / folder / f"{sha[:7]}.bundle"
    bundle.export_bundle(db, path)
    db.close()
    return path, run_id


def test_many_bundles_by_glob_and_the_ancestry_read_from_a_clone(tmp_path):
    repo = new_repo(tmp_path / "r")
    shas = [add_commit(repo, f"c{i}") for i in range(4)]
    _, first = old_bundle(tmp_path, repo, shas[0], "a", 0)
    _, last = old_bundle(tmp_path, repo, shas[3], "b", 10)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)

    guessed = f"sqlite:///{tmp_path / 'guessed.db'}"
    done = harness("import", "--db", guessed, str(tmp_path / "bundles" / "**" / "*.bundle"), cwd=tmp_path)
    assert done.returncode == 0 and (done.stdout + done.stderr).count("imported ") == 2, done.stderr
    db = outbox.open_store(guessed)
    try:  # two checkout paths that share no commit: two repositories, nothing to compare with
        assert query.previous_run(db, last) == (None, True)
    finally:
        db.close()

    linked = f"sqlite:///{tmp_path / 'linked.db'}"
    done = harness("import", "--db", linked, str(tmp_path / "bundles" / "a" / "*.bundle"),
                   str(tmp_path / "bundles" / "b" / f"{shas[3][:7]}.bundle"), "--repo", str(clone), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    db = outbox.open_store(linked)
    try:
        assert query.previous_run(db, last) == (first, True)  # proven by the clone's ancestry
        with db.session() as session:
            assert set(session.scalars(select(Commit.repo))) == {f"root:{shas[0]}"}
            assert len(session.scalars(select(Commit.sha)).all()) == 4  # c1 and c2 stored as links
    finally:
        db.close()


def test_a_pattern_that_matches_nothing_is_an_error(tmp_path):
    done = harness("import", "--db", f"sqlite:///{tmp_path / 'x.db'}", str(tmp_path / "none" / "*.bundle"),
                   cwd=tmp_path)
    assert done.returncode != 0 and "no bundle matches" in done.stderr
    assert not (tmp_path / "x.db").exists()
