"""History order and "previous commit" follow ancestry, on a generated git repository (SQLite and PostgreSQL):
nightly runs, a side branch, and a bisect that runs older commits last.

Run order: m0 m2 m4 m11 f1 m7 m9 m8 (f1 on a side branch forked at m4); the real change is at m8. In time order
the bisect's runs and the side branch made three bogus verdicts out of one change: slowdowns "at" m11 and m9, and
the real one at m8 missed.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import update

from harness.analysis.cache import analyse
from harness.analysis.history import history
from harness.analysis.regressions import regressions
from harness.record import query
from harness.record.models import Commit
from harness.record.query import SeriesKey
from harness.record.store import record_ancestry
from harness.spec import git as spec_git
from testkit.analysis import T0
from testkit.lineage import BROKEN, STEP_SERIES, bisect_history

STEPPED = SeriesKey(STEP_SERIES[0], STEP_SERIES[1], "float32", "B=1,D=32,H=1,S=128", "chip-a")
BROKEN_BENCH = SeriesKey(BROKEN[0], BROKEN[1], "float32", "B=1,D=32,H=1,S=64", "chip-a")


@pytest.fixture
def lineage(db, tmp_path):
    h = bisect_history(db, tmp_path / "repo")
    names = {sha: f"m{i}" for i, sha in enumerate(h.main)} | {h.side: "f1"}
    return h, names


def verdicts(db, names, **kwargs) -> list[tuple]:
    return [(e.kind, names[e.head_sha], names.get(e.base_sha), e.kernel, e.variant)
            for e in regressions(db, **kwargs)]


def test_history_follows_the_first_parent_line_then_the_side_branch(db, lineage):
    _, names = lineage
    by_key = {h.key: h for h in history(db, "chip-a")}
    stepped = by_key[STEPPED]
    assert [names[p.sha] for p in stepped.points] == ["m0", "m2", "m4", "m7", "m8", "m9", "m11", "f1"]
    assert [p.branch for p in stepped.points] == ["main", "main", "main", "", "", "", "main", "feature"]
    (flag,) = stepped.change_points
    assert (flag.kind, flag.index, names[flag.sha]) == ("step", 4, "m8") and 1.2 < flag.ratio < 1.3
    # f1 follows the line without being compared with m11: no change point where the side branch starts.
    assert all(h.change_points == () for key, h in by_key.items() if key not in (STEPPED, BROKEN_BENCH))
    recent = history(db, "chip-a", last=3, change_points=False)
    # The line's last 3 commits, and the side branch run since the oldest of their runs (m11's).
    assert [names[p.sha] for p in by_key_of(recent)[STEPPED].points] == ["m8", "m9", "m11", "f1"]
    json.dumps([h.to_dict() for h in by_key.values()], allow_nan=False)


def by_key_of(histories):
    return {h.key: h for h in histories}


def test_regressions_compare_each_commit_with_its_nearest_ancestor_run(db, lineage):
    _, names = lineage
    assert verdicts(db, names) == [("correctness", "m8", "m7", *BROKEN), ("performance", "m8", "m7", *STEP_SERIES[:2])]
    assert verdicts(db, names, last=3) == verdicts(db, names)  # m8 in the window, judged against m7 (outside it)
    assert verdicts(db, names, last=2) == []  # m9 and m11 (and f1): each like its previous commit


def test_without_parents_the_same_runs_are_judged_in_commit_time_order(db, lineage):
    h, names = lineage
    made = [*h.main[:5], h.side, *h.main[5:]]  # the order the commits were made: f1 after m4, before m5
    with db.session() as session:  # as a database from before parents were recorded; commit times a minute apart
        session.execute(update(Commit).values(parents=None))
        for minute, sha in enumerate(made):
            session.execute(update(Commit).where(Commit.sha == sha).values(committed_at=T0 + timedelta(minutes=minute)))
    stepped = by_key_of(history(db, "chip-a", change_points=False))[STEPPED]
    # not the run order (m0 m2 m4 m11 f1 m7 m9 m8): ancestry cannot tell, commit time can (issue 37)
    assert [names[p.sha] for p in stepped.points] == ["m0", "m2", "m4", "f1", "m7", "m8", "m9", "m11"]
    # the step is found, but m7 placed before m8 by commit time only: not a confirmed slowdown
    unproven = [("correctness", "m8", "m7", *BROKEN), ("unproven", "m8", "m7", *STEP_SERIES[:2])]
    assert verdicts(db, names) == unproven
    assert [(e.kind, names[e.head_sha]) for e in analyse(db, ["chip-a"])[1]] == [("correctness", "m8"),
                                                                                ("unproven", "m8")]
    assert not query.chip_order_proven(db, "chip-a")
    assert query.guessed_commits(db, "chip-a")
    # the clone proves the order (its parents healed): the same step is confirmed again, on both paths
    record_ancestry(db, spec_git.identity(h.repo), h.repo)
    assert query.chip_order_proven(db, "chip-a")
    confirmed = [("correctness", "m8", "m7", *BROKEN), ("performance", "m8", "m7", *STEP_SERIES[:2])]
    assert verdicts(db, names) == confirmed
    assert [(e.kind, names[e.head_sha]) for e in analyse(db, ["chip-a"])[1]] == [("correctness", "m8"),
                                                                                ("performance", "m8")]
