"""The committed example bundles (``testkit.paths.EXAMPLES``) imported together, as a user would, without a
clone: each carries only its own commit, so nothing links them by ancestry. Under one repository name
(``--repo-name``) they give one history per chip in commit-time order, said to be "order not proven by ancestry"
on the history pages, and each run is compared with the run before it (a compare page) instead of with nothing."""

from __future__ import annotations

import re

from sqlalchemy import select

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
