"""One chip, runs of two repositories (and two suites of one): ``harness report`` groups the index by repository,
and the chip page shows one suite of one repository while listing the others with their tip runs."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np

from harness.record import outbox, store
from harness.record.models import Run
from harness.spec import git as spec_git
from reports.render import chip_page_name
from testkit.analysis import CHIPS, T0, checks, grid_results
from testkit.lineage import add_commit, new_repo


def _run(db, repo: Path, suite: str, results, minutes: float) -> tuple[str, str]:
    row = spec_git.resolve(repo, "main").as_row()
    run_id = store.create_run(db, ident=CHIPS["chip-a"], facts={"hostname": "h"}, commit=row, suite=suite,
                              dirty=False, executor="local", planned_jobs=len(results))
    with db.session() as session:
        session.get(Run, run_id).started_at = T0 + timedelta(minutes=minutes)
    for job, result in results:
        store.record_result(db, run_id, job, result)
    return run_id, row["repo"]


def test_the_index_groups_by_repository_and_the_chip_page_lists_its_other_suites(tmp_path):
    rng = np.random.default_rng(3)
    kernels, other = new_repo(tmp_path / "repo-a"), new_repo(tmp_path / "repo-b")
    add_commit(kernels, "k0")
    add_commit(other, "x0")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = outbox.open_store(url)
    try:
        shown, repo_a = _run(db, kernels, "builtin", grid_results(rng, n=4, trials=1) + checks(), 10)
        smoke, _ = _run(db, kernels, "smoke", checks(), 12)  # fewer jobs: not the suite the page shows
        there = checks({("rmsnorm", "fused_only_there"): "failed"})
        thrown, repo_b = _run(db, other, "builtin", there, 5)
    finally:
        db.close()
    assert repo_a != repo_b
    done = subprocess.run([sys.executable, "-m", "harness", "report", "--db", url, "--out", "site",
                           "--no-change-points"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    index = (site / "index.html").read_text(encoding="utf-8")
    sections = index.split('<h2 class="repo-section"')[1:]
    assert len(sections) == 2
    assert repo_a in sections[0] and repo_b in sections[1]  # the chip's own repository first
    assert shown[:8] in sections[0] and thrown[:8] in sections[1] and smoke[:8] not in sections[1]
    page = (site / chip_page_name("chip-a")).read_text(encoding="utf-8")
    own, _, rest = page.partition('<h2 id="other-suites">Other suites and repositories on this chip</h2>')
    assert rest, "the chip page has no other-suites section"
    assert shown in own and "fused_only_there" not in own  # its own suite's jobs only
    table = rest.split("</table>")[0]
    rows = table.split("<tr>")[2:]
    assert len(rows) == 2
    by_run = {run_id: row for row in rows for run_id in (smoke, thrown) if run_id[:8] in row}
    assert set(by_run) == {smoke, thrown}
    assert repo_a in by_run[smoke] and "smoke" in by_run[smoke]
    assert repo_b in by_run[thrown] and "builtin" in by_run[thrown]
    failed = [cell for cell in by_run[thrown].split("<td") if 'class="num"' in cell]
    assert [cell.split(">")[1].split("<")[0] for cell in failed] == [str(len(there) - 1), "1", str(len(there))]
