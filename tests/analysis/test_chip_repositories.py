"""Two generated repositories run on one chip label into one database: the chip's histories, its regression list
and its column of the variant matrix follow the repository (and suite) its page shows (``query.chip_tips``' first),
never the other repository's runs, although those are newer and slower."""

from __future__ import annotations

import numpy as np

from harness.analysis.cache import analyse
from harness.analysis.history import history
from harness.analysis.regressions import regressions
from harness.analysis.variants import variant_matrix
from harness.record import query
from testkit.analysis import grid_results
from testkit.lineage import STEP_SERIES, add_commit, new_repo, record_run


def test_a_chip_history_holds_the_runs_of_the_repository_and_suite_its_page_shows(db, tmp_path):
    rng = np.random.default_rng(11)
    kernels, other = new_repo(tmp_path / "kernels"), new_repo(tmp_path / "other")
    shown_shas, other_shas, shown_runs = [], [], []
    for i in range(4):  # the page's repository: runs made for its branch
        shown_shas.append(add_commit(kernels, f"k{i}"))
        shown_runs.append(record_run(db, kernels, "main", "chip-a", grid_results(rng), minutes=10 * i,
                                     suite="builtin"))
    for i in range(3):  # another repository on the same chip label, by sha (no branch), later, slower from b1 on
        other_shas.append(add_commit(other, f"b{i}"))
        record_run(db, other, other_shas[-1], "chip-a", grid_results(rng, {STEP_SERIES: 1.5} if i else None),
                   minutes=100 + 10 * i, suite="builtin")
    smoke = grid_results(rng, {STEP_SERIES: 1.5}, series=[STEP_SERIES[:2]])  # fewer jobs: not the page's suite
    record_run(db, kernels, "main", "chip-a", smoke, minutes=200, suite="smoke")
    tip = query.chip_tips(db, "chip-a")[0]
    assert (tip.suite, tip.run_id) == ("builtin", shown_runs[-1])

    for series in history(db, "chip-a", change_points=False):
        assert {point.sha for point in series.points} <= set(shown_shas), series.key
    assert len(query.chip_history(db, "chip-a").commits) == len(shown_shas)
    for found in (regressions(db), analyse(db, ["chip-a"])[1]):
        assert not [e for e in found if e.head_sha in other_shas or e.base_sha in other_shas]
        assert not [e for e in found if e.kind != "correctness"]  # the other's step and the smoke run: left out
    cells = [cell for cell in variant_matrix(db).cells if cell.chip == "chip-a"]
    assert cells and {cell.sha for cell in cells} == {shown_shas[-1]}
    assert {run for cell in cells for run in cell.run_ids} == {shown_runs[-1]}
