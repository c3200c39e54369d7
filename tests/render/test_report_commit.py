"""`harness report --commit SHA`: the chip pages show that commit's runs, not each chip's latest run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from reports.render import chip_page_name
from testkit.paths import ROOT, recorded

H200 = "nvidia-h200-sm90"


def harness(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def benchmarks(page: Path) -> str:
    html = page.read_text()
    table = html[html.index('id="benchmarks"'):]
    return table[:table.index("</table>")]


def test_report_commit_shows_that_commits_runs_and_the_latest_report_hides_nothing(tmp_path):
    """The flash-only run (suite builtin-flash) is the later one: the latest report still shows quant_decode, as the
    chip page shows the full suite's tip (query.chip_tip), and mixes in nothing of the other suite's run (issue 37);
    --commit 62ac157 shows that commit's run; --commit 88a6d6f its flash run only."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    for bundle in ("h200-62ac157.bundle", "h200-88a6d6f-flash.bundle"):  # the flash-only run is the later one
        done = harness(tmp_path, "import", "--db", db, str(recorded(bundle)))
        assert done.returncode == 0, done.stderr
    latest = harness(tmp_path, "report", "--db", db, "--out", "latest", "--no-change-points")
    assert latest.returncode == 0, latest.stderr
    table = benchmarks(tmp_path / "latest" / chip_page_name(H200))
    assert "quant_decode" in table and "swiglu" in table and "from 88a6d6f" not in table
    chosen = harness(tmp_path, "report", "--db", db, "--out", "full", "--no-change-points", "--commit", "62ac157")
    assert chosen.returncode == 0, chosen.stderr
    page = tmp_path / "full" / chip_page_name(H200)
    assert "quant_decode" in benchmarks(page) and "62ac157" in page.read_text()
    assert "from 62ac157" not in benchmarks(page)  # that commit's own run: nothing taken from another
    flash = harness(tmp_path, "report", "--db", db, "--out", "flash", "--no-change-points", "--commit", "88a6d6f")
    assert flash.returncode == 0, flash.stderr
    assert "quant_decode" not in benchmarks(tmp_path / "flash" / chip_page_name(H200))
    unknown = harness(tmp_path, "report", "--db", db, "--commit", "0123456789")
    assert unknown.returncode == 2 and "0123456789" in unknown.stderr and "Traceback" not in unknown.stderr


def test_skipped_benchmarks_collapse_into_one_line_per_reason(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert harness(tmp_path, "import", "--db", db, str(recorded("h200-62ac157.bundle"))).returncode == 0
    done = harness(tmp_path, "report", "--db", db, "--out", "site", "--no-change-points")
    assert done.returncode == 0, done.stderr
    table = benchmarks(tmp_path / "site" / chip_page_name(H200))
    groups = re.findall(r'<tr class="skipped-group"><td colspan="5" class="skipped">(\d+) skipped: ([^<]*)</td>', table)
    assert groups and sum(int(n) for n, _ in groups) > 1 and len(groups) < sum(int(n) for n, _ in groups)
    assert '<td class="skipped">skipped' not in table  # no row per skipped job
