"""A chip's page shows one suite of one repository at its tip: the newest commit of the branch by ancestry, not the
most recently started run (a bisect probe of an older commit, a re-measurement), and fills the jobs its run lacks
from runs of that suite and repository only, never from another repository's run on the chip."""

from __future__ import annotations

import numpy as np

from harness.analysis.site_inputs import SHOWN_KINDS, _shown_runs
from harness.record import query
from testkit.analysis import checks, grid_results
from testkit.lineage import add_commit, git, new_repo, record_run


def run(db, repo, rev: str, suite: str, results, minutes: float) -> str:
    return record_run(db, repo, rev, "chip-a", results, minutes=minutes, suite=suite)


def test_the_tip_by_ancestry_of_one_suite_and_repository_filled_from_its_own_runs(db, tmp_path):
    rng = np.random.default_rng(9)
    repo = new_repo(tmp_path / "kernels")
    shas = [add_commit(repo, f"m{i}") for i in range(4)]
    full = grid_results(rng, n=4, trials=1) + checks()
    git(repo, "checkout", "-q", shas[0])
    m0 = run(db, repo, "HEAD", "builtin", full, 0)  # detached: a sha run, like a probe; fills nothing below
    git(repo, "checkout", "-q", "main")
    m3 = run(db, repo, "main", "builtin", grid_results(rng, n=4, trials=1), 10)  # partial: no correctness jobs
    probe = run(db, repo, shas[1], "builtin", full, 20)  # a bisect probe of an older commit, started last
    other = new_repo(tmp_path / "throwaway")
    add_commit(other, "x0")
    only_there = checks({("rmsnorm", "fused_only_there"): "passed"})
    thrown = run(db, other, "main", "builtin", only_there, 5)  # another repository's run, older than the tip
    tip, same = query.chip_tip(db, "chip-a")
    assert tip == m3 and set(same) == {m0, m3, probe} and thrown not in same
    shown = _shown_runs(db, [{"key": "chip-a"}], None)["chip-a"]
    assert shown.id == m3
    sources = {job["run_id"] for job in shown.jobs}
    assert thrown not in sources and sources <= {m0, m3, probe}
    assert any(job["kind"] == "correctness" for job in shown.jobs)  # filled from the same repository's runs
    assert not any(job["variant"] == "fused_only_there" for job in shown.jobs if job["kind"] in SHOWN_KINDS)


def test_a_chip_without_runs_has_no_tip(db):
    assert query.chip_tip(db, "no-such-chip") == (None, [])
