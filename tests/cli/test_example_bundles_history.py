"""The committed example bundles (``testkit.paths.EXAMPLES``) imported together, as a user would, without a
clone: each carries only its own commit, so nothing links them by ancestry. Under one repository name
(``--repo-name``) they give one history per chip in commit-time order, said to be "order not proven by ancestry"
on the history pages, and each run is compared with the run before it (a compare page) instead of with nothing."""

from __future__ import annotations

import re

from sqlalchemy import select

from harness.analysis.regressions import regressions
from harness.record import outbox, query
from harness.record.models import Commit
from testkit.e2e import harness
from testkit.paths import EXAMPLES

# Imported out of order on purpose. (h200-202d829's commit is the root of a copied checkout: another history.)
PROJECT = ["h200-3c1c045", "h200-62ac157", "h200-2d82df7"]
NAME = "example.org/ml/mlx-kernel-harness"


def test_example_bundles_under_one_name_give_one_history_ordered_by_commit_time_and_say_so(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    done = harness("import", "--db", db, "--repo-name", NAME, *(str(EXAMPLES / f"{b}.bundle") for b in PROJECT),
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    store = outbox.open_store(db)
    try:
        runs = {run.sha[:7]: run.id for run in query.runs(store)}
        with store.session() as session:
            rows = session.execute(select(Commit.repo, Commit.sha)).all()
        assert {repo for repo, _ in rows} == {NAME} and len(rows) == len({sha for _, sha in rows})
        # by commit time: 62ac157 (11-29) 2d82df7 (11-30) 3c1c045 (12-01)
        assert query.previous_run(store, runs["3c1c045"]) == (runs["2d82df7"], False)
        assert query.previous_run(store, runs["2d82df7"]) == (runs["62ac157"], False)
        assert query.previous_run(store, runs["62ac157"]) == (None, True)
        assert not query.chip_order_proven(store, "nvidia-h200-sm90")
    finally:
        store.close()
    site = tmp_path / "site"
    done = harness("report", "--db", db, "--out", str(site), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    page = next(site.glob("history-*--nvidia-h200-sm90.html")).read_text()
    assert query.NOT_PROVEN in page.lower() and "oldest → newest" not in page
    table = page[page.index('id="commits"'):]
    shown = re.findall(r'<code title="([0-9a-f]{40})">', table)
    assert [sha[:7] for sha in shown] == ["62ac157", "2d82df7", "3c1c045"]
    assert list(site.glob("compare-*.html"))  # the chip's run against the one before it


def test_slowdowns_against_a_previous_commit_placed_by_commit_time_are_not_confirmed(tmp_path):
    """All five bundles, no clone: 2d82df7's previous commit on the H200 is 202d829 by commit time alone (202d829
    is not even of its history). The series that are slower there are listed as "order not proven by ancestry",
    never as confirmed slowdowns; their compare page decides no change."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    done = harness("import", "--db", db, "--repo-name", NAME, *(str(p) for p in sorted(EXAMPLES.glob("*.bundle"))),
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    store = outbox.open_store(db)
    try:
        found = regressions(store)
    finally:
        store.close()
    slower = [e for e in found if e.kind != "correctness"]
    assert slower and {e.kind for e in slower} == {"unproven"}
    assert {(e.head_sha[:7], e.base_sha[:7]) for e in slower} == {("2d82df7", "202d829")}
    site = tmp_path / "site"
    done = harness("report", "--db", db, "--out", str(site), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    index = site.joinpath("index.html").read_text()
    assert re.search(r"\b0 confirmed slowdowns", index)
    assert f"{len(slower)} slowdowns whose order is not proven by ancestry" in index
    listed = site.joinpath("regressions.html").read_text()
    assert "0</strong> commits with confirmed slowdowns" in listed and 'id="unproven"' in listed
    assert "2d82df7" not in site.joinpath("regressions.atom").read_text()  # the feed alerts on confirmed ones only
    pair = [p.read_text() for p in site.glob("compare-*.html") if "2d82df774f90" in p.read_text()
            and "202d8296670c" in p.read_text()]
    assert pair and all('id="order-not-proven"' in page and ">0 regressed<" in page for page in pair)
