"""A repository is known by its identity, not by the checkout that ran it: remote spellings normalise to one
``host/owner/name``, a repository without a remote is its root commit, a database written at 151bd17 with rows
split by checkout is merged in place (SQLite and PostgreSQL), bundles keyed the old way land on the same rows, and
``--repo-name`` overrides the identity."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import MetaData, create_engine, event, func, select

from harness.record import bundle, identity, query, store
from harness.record.bundle import importer
from harness.record.models import Commit, Run
from harness.spec import git as spec_git
from testkit.analysis import grid_results
from testkit.lineage import add_commit, git, insert_rows, migrate_to, new_repo, record_run

SPLIT_DB = Path(__file__).resolve().parents[1] / "data" / "split-repos" / "split-151bd17.db"  # made by make.py


@pytest.mark.parametrize("url", [
    "https://github.com/o/r.git", "https://github.com/o/r", "https://github.com/o/r/", "git@github.com:o/r.git",
    "git@GitHub.COM:o/r", "ssh://git@github.com/o/r.git", "ssh://git@github.com:22/o/r",
    "https://user:token@github.com/o/r.git", "git://github.com/o/r", "github.com/o/r"])
def test_every_spelling_of_a_remote_is_one_identity(url):
    assert spec_git.remote_key(url) == "github.com/o/r"


@pytest.mark.parametrize("text", ["/home/k/r", "r", "main", "file:///srv/r.git", "./r", ""])
def test_a_path_or_folder_name_is_no_remote(text):
    assert spec_git.remote_key(text) is None
    assert not spec_git.is_identity(text) or text.startswith("root:")


def clone(source: Path, path: Path, remote: str | None) -> Path:
    subprocess.run(["git", "clone", "-q", str(source), str(path)], check=True)
    if remote is None:
        git(path, "remote", "remove", "origin")
    else:
        git(path, "remote", "set-url", "origin", remote)
    return path


def test_checkouts_of_one_repository_have_one_identity(tmp_path):
    upstream = new_repo(tmp_path / "up")
    first = add_commit(upstream, "c0")
    add_commit(upstream, "c1")
    a = clone(upstream, tmp_path / "a" / "r", "https://github.com/o/r.git")
    b = clone(upstream, tmp_path / "b" / "elsewhere", "git@github.com:o/r")
    bare = clone(upstream, tmp_path / "c" / "r", None)
    assert spec_git.identity(a) == spec_git.identity(b) == "github.com/o/r"
    assert spec_git.resolve(b, "HEAD").repo == "github.com/o/r"
    assert spec_git.identity(bare) == f"root:{first}" == spec_git.identity(upstream)


def test_the_plan_keeps_forks_apart_and_joins_loose_keys_by_shared_commits():
    s = [f"{i:040x}" for i in range(1, 8)]
    rows = [
        (1, "https://github.com/o/r.git", s[0], []), (2, "git@github.com:o/r", s[0], []),
        (3, "https://github.com/fork/r", s[1], [s[0]]),  # a fork: its own repository
        (4, "/home/a/r", s[0], []), (5, "/home/a/r", s[2], [s[0]]),  # o/r and fork/r both hold s0
        (6, "repo", s[3], [s[2]]), (7, "main", s[4], [s[3]]),  # linked to each other only
        (8, "root:" + s[5], s[5], []), (9, "xx", s[6], [s[5]]),  # a root identity names its group
    ]
    moves = identity.plan(rows)
    assert moves[1] == moves[2] == "github.com/o/r" and moves[3] == "github.com/fork/r"
    assert 4 not in moves and 5 not in moves  # its shas meet two remote identities, none alone: left as it was
    assert moves[6] == moves[7] == "/home/a/r"  # one group with the rows left under /home/a/r: its smallest key
    assert moves[9] == "root:" + s[5] and 8 not in moves


def rows_of(path: Path) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str, str | None]]]:
    """(run id -> (sha, chip key), commit rows (repo, sha, parents)) read with sqlite3 alone."""
    with sqlite3.connect(path) as connection:
        runs = {rid: (sha, chip) for rid, sha, chip in connection.execute(
            'SELECT run.id, c.sha, chip.key FROM run JOIN "commit" c ON c.id = run.commit_id '
            "JOIN chip ON chip.id = run.chip_id")}
        commits = list(connection.execute('SELECT repo, sha, parents FROM "commit"'))
    return runs, commits


def check_merged(before_runs, runs, commits) -> None:
    assert runs == before_runs  # every run kept, with its commit's sha and its chip
    by_repo: dict[str, set[str]] = {}
    for repo, sha, parents in commits:
        assert sha not in by_repo.get(repo, set())  # one row per (repository, sha)
        by_repo.setdefault(repo, set()).add(sha)
        assert parents is not None
    assert set(by_repo) == {"github.com/o/r", "github.com/fork/r", "other"}
    assert len(by_repo["github.com/o/r"]) == 5 and len(by_repo["github.com/fork/r"]) == 1


def test_a_database_written_at_151bd17_with_split_rows_is_merged_in_place(tmp_path):
    path = tmp_path / "split.db"
    shutil.copy(SPLIT_DB, path)
    before_runs, before = rows_of(path)
    assert len(before) == 9 and len({sha for _, sha, _ in before}) == 6  # c1 and c2 twice, c2 three times
    db = store.open_database(f"sqlite:///{path}")
    try:
        runs, commits = rows_of(path)
        check_merged(before_runs, runs, commits)
        # the merged history reads as one: c3 (run on B) follows c2 (run on A) on chip-a
        names = {sha: rid for rid, (sha, chip) in runs.items() if chip == "chip-a"}
        shas = [sha for _, sha, parents in sorted(commits, key=lambda c: len(c[2])) if _ == "github.com/o/r"]
        assert query.previous_run_id(db, names[shas[4]]) == names[shas[3]]
    finally:
        db.close()
    again = store.open_database(f"sqlite:///{path}")  # at the head: nothing more to do
    again.close()
    assert rows_of(path) == (runs, commits)


def test_the_same_database_copied_into_postgresql_is_merged_alike(pg_url, tmp_path):
    engine = store.make_engine(pg_url)
    migrate_to(engine, "0006")
    source = create_engine(f"sqlite:///{SPLIT_DB}")
    metadata = MetaData()
    metadata.reflect(source)
    with source.connect() as connection:
        for table in ("chip", "machine", "commit", "run", "job", "sample", "trial_summary"):
            rows = [dict(row) for row in connection.execute(select(metadata.tables[table])).mappings()]
            if rows:
                insert_rows(engine, table, rows)
    source.dispose()
    engine.dispose()
    before_runs, _ = rows_of(SPLIT_DB)
    db = store.open_database(pg_url)
    try:
        with db.session() as session:
            runs = {rid: (sha, chip) for rid, sha, chip in session.execute(
                select(Run.id, Commit.sha, Run.chip.property.mapper.class_.key)
                .join(Commit, Commit.id == Run.commit_id).join(Run.chip))}
            commits = [(c.repo, c.sha, c.parents) for c in session.scalars(select(Commit))]
        check_merged(before_runs, runs, commits)
    finally:
        db.close()


def test_an_old_bundle_keyed_by_a_remote_spelling_or_a_folder_lands_on_the_same_rows(db, tmp_path):
    upstream = new_repo(tmp_path / "up")
    shas = [add_commit(upstream, f"c{i}") for i in range(3)]
    a = clone(upstream, tmp_path / "a" / "r", "https://github.com/o/r.git")
    rng = np.random.default_rng(3)
    record_run(db, a, shas[0], "chip-a", grid_results(rng, n=4, trials=1), minutes=0)
    # a bundle from a database at 151bd17: the same commits keyed by another spelling and by a folder name
    old = store.open_database(f"sqlite:///{tmp_path / 'old.db'}")
    run_b = record_run(old, a, shas[1], "chip-a", grid_results(rng, n=4, trials=1), minutes=10)
    run_c = record_run(old, a, shas[2], "chip-a", grid_results(rng, n=4, trials=1), minutes=20)
    with old.session() as session:
        for commit in session.scalars(select(Commit)):
            commit.repo = "git@github.com:o/r.git" if commit.sha != shas[2] else "/Users/k/src/r"
    bundle.export_bundle(old, tmp_path / "old.bundle")
    old.close()
    bundle.import_bundle(db, tmp_path / "old.bundle")
    with db.session() as session:
        stored = session.execute(select(Commit.repo, Commit.sha)).all()
    assert sorted(stored) == sorted(("github.com/o/r", sha) for sha in shas)
    assert query.previous_run_id(db, run_c) == run_b


def test_repo_name_overrides_the_identity_of_an_imported_bundle(db, tmp_path):
    upstream = new_repo(tmp_path / "up")
    sha = add_commit(upstream, "c0")
    other = store.open_database(f"sqlite:///{tmp_path / 'other.db'}")
    record_run(other, upstream, sha, "chip-a", grid_results(np.random.default_rng(4), n=4, trials=1), minutes=0)
    bundle.export_bundle(other, tmp_path / "b.bundle")
    other.close()
    bundle.import_bundle(db, tmp_path / "b.bundle", repo_name="example.org/team/kernels")
    with db.session() as session:
        assert session.execute(select(Commit.repo, Commit.sha)).all() == [("example.org/team/kernels", sha)]


def test_the_merge_runs_only_when_an_import_brings_a_repository_key_not_stored(db, tmp_path, monkeypatch):
    """The merge reads every commit row: an import under keys already stored skips it, a new spelling runs it."""
    upstream = new_repo(tmp_path / "up")
    shas = [add_commit(upstream, f"c{i}") for i in range(3)]
    a = clone(upstream, tmp_path / "a" / "r", "https://github.com/o/r.git")
    rng = np.random.default_rng(7)
    source = store.open_database(f"sqlite:///{tmp_path / 'source.db'}")
    runs = [record_run(source, a, sha, "chip-a", grid_results(rng, n=4, trials=1), minutes=10 * i)
            for i, sha in enumerate(shas)]
    for i, run_id in enumerate(runs):
        bundle.export_bundle(source, tmp_path / f"{i}.bundle", run_ids=[run_id])
    with source.session() as session:  # the last run's commits as an older harness keyed them: a checkout path
        for commit in session.scalars(select(Commit)):
            commit.repo = "/Users/k/src/r"
    bundle.export_bundle(source, tmp_path / "path.bundle", run_ids=[runs[2]])
    source.close()
    merges = []
    monkeypatch.setattr(importer, "unify", lambda connection: merges.append(1) or identity.unify(connection))
    bundle.import_bundle(db, tmp_path / "0.bundle")
    assert len(merges) == 1  # github.com/o/r: new
    bundle.import_bundle(db, tmp_path / "1.bundle")
    assert len(merges) == 1  # the same key: no merge
    bundle.import_bundle(db, tmp_path / "path.bundle")
    assert len(merges) == 2  # a new spelling: merged into the identity's rows
    bundle.import_bundle(db, tmp_path / "2.bundle")
    assert len(merges) == 2
    with db.session() as session:
        stored = session.execute(select(Commit.repo, Commit.sha)).all()
    assert sorted(stored) == sorted(("github.com/o/r", sha) for sha in shas)
    assert query.previous_run_id(db, runs[2]) == runs[1]


def test_adopting_reads_no_commit_row_when_every_stored_key_is_an_identity(db, tmp_path):
    upstream = new_repo(tmp_path / "up")
    sha = add_commit(upstream, "c0")
    record_run(db, upstream, sha, "chip-a", grid_results(np.random.default_rng(8), n=4, trials=1), minutes=0)
    statements: list[str] = []

    def seen(connection, cursor, statement, *args) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        assert store.adopt(db, "github.com/o/other", upstream) == 0
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    assert statements and not [s for s in statements if "sha" in s]  # the keys only, not the rows


def test_rows_of_a_checkout_without_a_remote_join_its_identity_when_a_clone_is_seen(db, tmp_path):
    upstream = new_repo(tmp_path / "up")
    shas = [add_commit(upstream, f"c{i}") for i in range(3)]
    rng = np.random.default_rng(6)
    first = record_run(db, upstream, shas[1], "chip-a", grid_results(rng, n=4, trials=1), minutes=0)
    with db.session() as session:  # as 151bd17 stored it: the folder name
        for commit in session.scalars(select(Commit)):
            commit.repo = "up"
    last = record_run(db, upstream, shas[2], "chip-a", grid_results(rng, n=4, trials=1), minutes=10)
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(Commit).where(Commit.repo == "up")) == 0
        assert {c.repo for c in session.scalars(select(Commit))} == {f"root:{shas[0]}"}
    assert query.previous_run_id(db, last) == first


def test_the_edge_of_a_shallow_clone_has_unknown_parents_not_none(tmp_path):
    upstream = new_repo(tmp_path / "up")
    shas = [add_commit(upstream, f"c{i}") for i in range(4)]
    subprocess.run(["git", "clone", "-q", "--depth", "2", f"file://{upstream}", str(tmp_path / "ci")], check=True)
    assert spec_git.resolve(tmp_path / "ci", "HEAD").parents == (shas[2],)
    assert spec_git.resolve(tmp_path / "ci", "HEAD~1").parents is None  # git shows it as a root: it is not
    assert spec_git.ancestry(tmp_path / "ci", [shas[3]], 10) == {shas[3]: (shas[2],)}
