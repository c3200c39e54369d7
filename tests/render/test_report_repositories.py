"""One chip, runs of two repositories (and two suites of one): ``harness report`` groups the index by repository,
and the chip page shows one suite of one repository while listing the others with their tip runs."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from harness.record import outbox
from harness.spec import git as spec_git
from reports.render import chip_page_name
from testkit.analysis import checks, grid_results
from testkit.lineage import add_commit, new_repo, record_run


def _run(db, repo: Path, suite: str, results, minutes: float) -> tuple[str, str]:
    run_id = record_run(db, repo, "main", "chip-a", results, minutes=minutes, suite=suite)
    return run_id, spec_git.resolve(repo, "main").as_row()["repo"]


@dataclass
class Site:
    path: Path
    repo_a: str
    repo_b: str
    shown: str
    smoke: str
    thrown: str
    n_there: int


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    tmp_path = tmp_path_factory.mktemp("repositories")
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
    done = harness(tmp_path, "report", "--db", url, "--out", "site", "--no-change-points")
    assert done.returncode == 0, done.stderr
    return Site(tmp_path / "site", repo_a, repo_b, shown, smoke, thrown, len(there))


def harness(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_the_index_has_one_section_per_repository(site):
    index = (site.path / "index.html").read_text(encoding="utf-8")
    sections = index.split('<h2 class="repo-section"')[1:]
    assert len(sections) == 2
    assert site.repo_a in sections[0] and site.repo_b in sections[1]  # the chip's own repository first
    assert site.shown[:8] in sections[0] and site.thrown[:8] in sections[1] and site.smoke[:8] not in sections[1]


def test_the_chip_page_shows_its_suite_and_lists_the_other_suites_and_repositories(site):
    page = (site.path / chip_page_name("chip-a")).read_text(encoding="utf-8")
    own, _, rest = page.partition('<h2 id="other-suites">Other suites and repositories on this chip</h2>')
    assert rest, "the chip page has no other-suites section"
    assert site.shown in own and "fused_only_there" not in own  # its own suite's jobs only
    rows = rest.split("</table>")[0].split("<tr>")[2:]
    assert len(rows) == 2
    by_run = {run_id: row for row in rows for run_id in (site.smoke, site.thrown) if run_id[:8] in row}
    assert set(by_run) == {site.smoke, site.thrown}
    assert site.repo_a in by_run[site.smoke] and "smoke" in by_run[site.smoke]
    assert site.repo_b in by_run[site.thrown] and "builtin" in by_run[site.thrown]
    counts = [cell.split(">")[1].split("<")[0] for cell in by_run[site.thrown].split("<td") if 'class="num"' in cell]
    assert counts == [str(site.n_there - 1), "1", str(site.n_there)]  # passed, failed, jobs


def test_one_repository_keeps_the_index_without_repository_sections(tmp_path):
    repo = new_repo(tmp_path / "repo-a")
    add_commit(repo, "k0")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = outbox.open_store(url)
    try:
        _run(db, repo, "builtin", checks(), 10)
        smoke, _ = _run(db, repo, "smoke", checks()[:2], 12)  # fewer jobs: listed, not shown
    finally:
        db.close()
    assert harness(tmp_path, "report", "--db", url, "--out", "site", "--no-change-points").returncode == 0
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'class="repo-section"' not in index and "<h2>Chips</h2>" in index
    page = (tmp_path / "site" / chip_page_name("chip-a")).read_text(encoding="utf-8")
    table = page.partition('id="other-suites-table"')[2].split("</table>")[0]
    assert smoke[:8] in table and "<td>smoke</td>" in table
