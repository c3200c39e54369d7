"""Commit ancestry in the store, on a generated git repository (SQLite and PostgreSQL): parents and branches are
recorded, the commits between runs are kept, "previous" is the nearest ancestor with runs on the chip, databases
from before parents were recorded keep working and heal, and the branch reaches the commit row from every path."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from sqlalchemy import select, update

from harness.core.chip import ChipIdentity
from harness.record import ancestry, outbox, query, store
from harness.record.models import Commit, Run
from harness.spec import git as spec_git
from harness.spec import target as spec_target
from testkit.analysis import T0, grid_results
from testkit.lineage import add_commit, bisect_history, git, insert_rows, migrate_to, new_repo, record_run


def stored_commits(db) -> dict[str, tuple[list[str] | None, str, int]]:
    """sha -> (parents, branch, runs)."""
    with db.session() as session:
        commits = session.scalars(select(Commit)).all()
        runs = {c.id: 0 for c in commits}
        for commit_id in session.scalars(select(Run.commit_id)):
            runs[commit_id] += 1
        return {c.sha: (c.parents, c.branch, runs[c.id]) for c in commits}


def test_parents_branches_and_the_commits_between_runs_are_stored(db, tmp_path):
    h = bisect_history(db, tmp_path / "repo")
    commits = stored_commits(db)
    m = h.main
    assert commits[m[8]][0] == [m[7]] and commits[h.side][0] == [m[4]] and commits[m[0]][0] == []
    # Never run, kept as links (sha and parents only) so that every walk stays in the database.
    assert {sha for sha, (_, _, runs) in commits.items() if runs == 0} == {m[1], m[3], m[5], m[6], m[10]}
    assert set(commits) == {*m, h.side}
    assert commits[m[10]] == ([m[9]], "", 0)
    branches = {run.id: run.branch for run in query.runs(db)}
    named = {name: branches[run_id] for name, run_id in h.runs.items()}
    assert named == {"m0": "main", "m2": "main", "m4": "main", "m11": "main", "f1": "feature",
                     "m7": "", "m9": "", "m8": ""}  # a bisect probe runs a detached sha
    assert commits[m[11]][1] == "main" and commits[h.side][1] == "feature" and commits[m[8]][1] == ""
    with db.session() as session:  # a probe of a link commit completes its row
        m7 = session.scalar(select(Commit).where(Commit.sha == m[7]))
        assert m7.message == "m7" and m7.author == "K" and m7.committed_at is not None


def test_previous_run_is_the_nearest_ancestor_with_runs_on_the_chip(db, tmp_path):
    h = bisect_history(db, tmp_path / "repo")
    name_of = {run_id: name for name, run_id in h.runs.items()}
    previous = {name: name_of.get(query.previous_run_id(db, run_id)) for name, run_id in h.runs.items()}
    # Run order m0 m2 m4 m11 f1 m7 m9 m8: time order would give f1 -> m11, m7 -> f1, m8 -> m9, m11 -> m4.
    assert previous == {"m0": None, "m2": "m0", "m4": "m2", "m11": "m9", "f1": "m4", "m7": "m4", "m9": "m8",
                        "m8": "m7"}
    # On another chip only m0 and m11 ran: the walk crosses commits with runs on chip-a only.
    rng = np.random.default_rng(1)
    first = record_run(db, h.repo, h.main[0], "chip-b", grid_results(rng), minutes=100)
    last = record_run(db, h.repo, h.main[11], "chip-b", grid_results(rng), minutes=110)
    assert query.previous_run_id(db, last) == first and query.previous_run_id(db, first) is None
    again = record_run(db, h.repo, h.main[8], "chip-a", grid_results(rng), minutes=120)  # m8 run again
    assert query.previous_run_id(db, again) == h.runs["m7"]
    assert query.previous_run_id(db, "no-such-run") is None


def test_a_merge_walks_first_parents_then_the_others(db, tmp_path):
    repo = new_repo(tmp_path / "repo")
    rng = np.random.default_rng(2)
    add_commit(repo, "root")
    git(repo, "checkout", "-q", "-b", "side")
    side = add_commit(repo, "side work")
    git(repo, "checkout", "-q", "main")
    add_commit(repo, "main work")  # never run
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    side_run = record_run(db, repo, side, "chip-a", grid_results(rng), minutes=0)
    merge_run = record_run(db, repo, "main", "chip-a", grid_results(rng), minutes=10)
    assert query.previous_run_id(db, merge_run) == side_run  # nothing on the first-parent line: the other parent
    first_parent = git(repo, "rev-parse", "HEAD^1")
    later = record_run(db, repo, first_parent, "chip-a", grid_results(rng), minutes=20)
    assert query.previous_run_id(db, merge_run) == later  # the first-parent line wins once it has a run
    assert query.previous_run_id(db, later) is None  # its only ancestor (root) never ran


def test_without_parents_previous_is_the_run_before_in_time(db):
    ident = ChipIdentity(key="chip-a", backend="cpu", device_name="A", architecture="x86_64")
    ids = []
    for minutes, sha in ((0, "b" * 40), (10, "a" * 40), (20, "c" * 40)):
        run_id = store.create_run(db, ident=ident, facts={}, commit={"sha": sha}, suite="s", dirty=False,
                                  executor="local", planned_jobs=0)
        with db.session() as session:
            session.get(Run, run_id).started_at = T0 + timedelta(minutes=minutes)
        ids.append(run_id)
    assert [query.previous_run_id(db, run_id) for run_id in ids] == [None, ids[0], ids[1]]
    assert stored_commits(db)["a" * 40][0] is None  # unknown, not "no parents"


def test_arrange_keeps_the_time_order_of_commits_with_unknown_parents():
    keys = [("r", sha) for sha in "abcde"]
    graph = {key: None for key in keys}
    # Branch labels (old rows have them) change nothing while no parents are known: e stays last, on the line.
    arranged = ancestry.arrange(keys, graph, [{"main"}, {"main"}, set(), {"main"}, {"feature"}])
    assert arranged.order == [0, 1, 2, 3, 4] and arranged.line == [0] * 5 and arranged.previous == [-1, 0, 1, 2, 3]
    # Healed commits after old ones: the line goes through the old commits in time order.
    graph.update({("r", "f"): ("x",), ("r", "x"): ("e",), ("r", "g"): ("f",)})
    arranged = ancestry.arrange([*keys, ("r", "g"), ("r", "f")], graph, [set()] * 5 + [{"main"}, {"main"}])
    assert arranged.order == [0, 1, 2, 3, 4, 6, 5] and arranged.previous[6] == 4 and arranged.previous[5] == 6


def test_a_database_at_revision_0001_upgrades_keeps_working_and_heals(db_url, tmp_path):
    repo = new_repo(tmp_path / "repo")
    shas = [add_commit(repo, f"c{i}") for i in range(5)]
    engine = store.make_engine(db_url)
    migrate_to(engine, "0001")
    insert_rows(engine, "chip", [{"id": 1, "key": "chip-a", "backend": "cpu", "device_name": "A",
                                  "architecture": "x86_64", "memory_bytes": None, "gpu_cores": None, "record": {}}])
    name = spec_git.origin(repo)
    old = {4: 0, 0: 2, 2: 4}  # commit index -> its run's start (minutes): c4 first, as after a bisect
    insert_rows(engine, "commit", [{"id": i + 1, "repo": name, "sha": shas[i], "message": f"c{i}", "author": "K",
                                    "committed_at": None, "branch": "main"} for i in (0, 2, 4)])
    insert_rows(engine, "run", [{"id": f"old{i}", "commit_id": i + 1, "chip_id": 1, "machine_id": None,
                                 "suite": "s", "dirty": False, "executor": "local", "status": "passed",
                                 "started_at": T0 + timedelta(minutes=old[i]), "finished_at": None,
                                 "peak_flops": None, "peak_bytes_per_s": None, "planned_jobs": 0, "options": {}}
                                for i in (0, 2, 4)])
    engine.dispose()

    db = outbox.open_store(db_url)  # migrates to the newest revision
    try:
        views = {v.id: v for v in query.runs(db)}
        assert set(views) == {"old0", "old2", "old4"} and {v.branch for v in views.values()} == {"main"}
        assert all(parents is None for parents, _, _ in stored_commits(db).values())  # unknown
        assert query.previous_run_id(db, "old0") == "old4"  # time order, as before
        assert query.previous_run_id(db, "old2") == "old0" and query.previous_run_id(db, "old4") is None

        add_commit(repo, "c5")
        new = record_run(db, repo, "main", "chip-a", [], minutes=30)  # the repository is seen again
        commits = stored_commits(db)
        assert commits[shas[0]][0] == [] and commits[shas[2]][0] == [shas[1]] and commits[shas[4]][0] == [shas[3]]
        assert commits[shas[1]] == ([shas[0]], "", 0) and commits[shas[3]] == ([shas[2]], "", 0)  # links added
        assert query.previous_run_id(db, new) == "old4"
        assert query.previous_run_id(db, "old4") == "old2" and query.previous_run_id(db, "old0") is None
        assert store.record_ancestry(db, name, repo) == (0, 0)  # idempotent
    finally:
        db.close()


def test_commits_of_another_repository_with_the_same_name_are_left_alone(db, tmp_path):
    repo = new_repo(tmp_path / "repo")
    add_commit(repo, "c0")
    ident = ChipIdentity(key="chip-a", backend="cpu", device_name="A", architecture="x86_64")
    store.create_run(db, ident=ident, facts={}, commit={"sha": "f" * 40, "repo": spec_git.origin(repo)}, suite="s",
                     dirty=False, executor="local", planned_jobs=0)
    store.create_run(db, ident=ident, facts={}, commit={"sha": "unversioned", "repo": spec_git.origin(repo)},
                     suite="s", dirty=False, executor="local", planned_jobs=0)
    record_run(db, repo, "main", "chip-a", [], minutes=1)
    commits = stored_commits(db)
    assert commits["f" * 40][0] is None and commits["unversioned"][0] is None and len(commits) == 3


def test_the_branch_is_the_one_the_commit_was_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    repo = new_repo(tmp_path / "repo")
    first = add_commit(repo, "c0")
    git(repo, "checkout", "-q", "-b", "feature")
    tip = add_commit(repo, "c1")
    assert spec_git.branch_name(repo) == "feature"
    assert spec_git.resolve(repo, "HEAD").branch == "feature"
    assert spec_git.resolve(repo, "main").branch == "main"
    assert spec_git.resolve(repo, "refs/heads/main").branch == "main"
    assert spec_git.resolve(repo, first).branch == ""  # a sha, even one HEAD's branch contains
    assert spec_git.resolve(repo, tip).parents == (first,) and spec_git.resolve(repo, first).parents == ()
    # A detached worktree (every checked-out run): the branch comes from what was asked for, not from the tree.
    target = spec_target.checkout_target(str(repo), "main", "repo")
    assert target.commit["branch"] == "main" and target.commit["sha"] == first
    assert spec_target.checkout_target(str(repo), tip, "repo").commit["branch"] == ""
    assert spec_target.checkout_target(str(repo), tip, "repo", branch="feature").commit["branch"] == "feature"
    assert spec_target.resolve_target(str(repo), None).commit["branch"] == "feature"
    assert spec_target.resolve_target(str(repo), tip).commit["branch"] == ""
    git(repo, "checkout", "-q", "--detach", "main")
    assert spec_git.resolve(repo).branch == "" and spec_target.resolve_target(str(repo), None).commit["branch"] == ""


def test_a_cluster_source_carries_the_branch(tmp_path, monkeypatch):
    from harness.cluster.driver import prepare_source

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    repo = new_repo(tmp_path / "repo")
    first = add_commit(repo, "c0")
    git(repo, "checkout", "-q", "-b", "feature")
    add_commit(repo, "c1")
    assert prepare_source(str(repo), None).commit["branch"] == "feature"
    assert prepare_source(str(repo), "main").commit["branch"] == "main"
    assert prepare_source(str(repo), first).commit["branch"] == ""
    url = f"file://{repo}"
    source = prepare_source(url, "main")
    assert source.commit["branch"] == "main" and source.commit["parents"] == []
    assert prepare_source(url, first).commit["branch"] == ""


def test_a_link_commit_is_completed_and_unknown_parents_filled_when_it_is_run(db, tmp_path):
    h = bisect_history(db, tmp_path / "repo")
    with db.session() as session:
        session.execute(update(Commit).where(Commit.sha == h.main[11]).values(parents=None))
    rng = np.random.default_rng(4)
    record_run(db, h.repo, h.main[10], "chip-b", grid_results(rng), minutes=200)
    commits = stored_commits(db)
    assert commits[h.main[11]][0] == [h.main[10]] and commits[h.main[10]][2] == 1
