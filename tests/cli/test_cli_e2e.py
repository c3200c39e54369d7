"""End to end through the real CLI: a tiny suite into a temporary SQLite DB, then the rows and the HTML."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testkit.e2e import git, harness, rows, write_suite
from testkit.paths import PLUGINS


def test_run_stores_every_result_and_renders_the_report(repo: Path):
    suite = write_suite(repo, '["sdpa", "flash_bq8_bk16"]')
    done = harness("run", "--suite", str(suite), cwd=repo)
    assert done.returncode == 0, done.stderr
    db, report = repo / "harness-out" / "results.db", repo / "harness-out" / "report" / "index.html"
    assert "4 passed, 0 failed, 0 skipped, 0 crashed" in done.stdout  # the results on stdout
    assert str(report.resolve()) in done.stdout.replace("\n", "")
    head = git(repo, "rev-parse", "HEAD")
    ((sha, message, dirty, status, peak),) = rows(db, "select c.sha, c.message, r.dirty, r.status, r.peak_flops "
                                                      "from run r join `commit` c on c.id = r.commit_id")
    assert (sha, message, dirty, status) == (head, "add <b>suite</b>", 0, "complete") and peak > 0
    statuses = dict(rows(db, "select key, status from job"))
    assert len(statuses) == 2 + 4 + 2 and set(statuses.values()) == {"passed"}
    bench = rows(db, "select j.variant, j.n_samples, j.median_s, j.pct_peak, count(s.id), j.trials, "
                     "count(distinct s.trial), j.timing_mode from job j "
                     "join sample s on s.job_id = j.id where j.kind = 'benchmark' group by j.id")
    assert {b[0] for b in bench} == {"sdpa", "flash_bq16_bk32"}
    # 5 samples in each of 4 trials (fresh job processes; two series, so the plan raises the suite's 3 to 4),
    # every trial timed in the mode the first one chose
    assert all(n == 20 and count == 20 and median > 0 and pct > 0 and trials == distinct == 4
               and mode in ("pipelined", "per-call") for _, n, median, pct, count, trials, distinct, mode in bench)
    chip_pages = list(report.parent.glob("chip-*.html"))
    assert len(chip_pages) == 1
    html = chip_pages[0].read_text()
    assert "flash_bq16_bk32" in html and 'id="variants"' in html and "×" in html
    assert "add &lt;b&gt;suite&lt;/b&gt;" in html and "<b>suite</b>" not in html

    (repo / "suite.toml").write_text((repo / "suite.toml").read_text() + "\n# local edit\n")
    again = harness("run", "--suite", str(suite), "--no-report", cwd=repo)
    assert again.returncode == 0, again.stderr
    assert rows(db, "select count(*), sum(dirty) from run") == [(2, 1)]  # a new run, flagged dirty

    rerender = harness("report", "--db", f"sqlite:///{db}", "--out", str(repo / "again"), cwd=repo)
    assert rerender.returncode == 0 and (repo / "again" / "index.html").exists()


def test_the_suite_fails_deliberately_broken_variants(repo: Path):
    suite = write_suite(repo, '["sdpa", "broken_no_mask", "broken_head_aligned"]', plugins='["broken_kernels"]')
    (repo / "broken_kernels.py").write_text((PLUGINS / "broken_kernels.py").read_text())
    done = harness("run", "--suite", str(suite), "--no-report", cwd=repo)
    assert done.returncode == 1
    db = repo / "harness-out" / "results.db"
    outcome = {(v, c): s for v, c, s in rows(db, "select variant, check_name, status from job "
                                                 "where kind = 'correctness'")}
    assert outcome[("sdpa", "reference")] == outcome[("sdpa", "causal_perturb")] == "passed"
    assert outcome[("broken_no_mask", "reference")] == "failed"
    assert outcome[("broken_no_mask", "causal_perturb")] == "failed"
    assert outcome[("broken_head_aligned", "reference")] == "failed"
    assert "failed" in done.stderr


def test_an_older_commit_runs_from_a_clean_worktree(repo: Path, tmp_path: Path):
    suite = write_suite(repo, '["sdpa"]')
    first = git(repo, "rev-parse", "HEAD")
    (repo / "other.txt").write_text("x")
    git(repo, "add", "other.txt")
    git(repo, "commit", "-qm", "second")
    env_cache = tmp_path / "cache"
    os.environ["HARNESS_CACHE"] = str(env_cache)
    try:
        done = harness("run", "--suite", str(suite), "--commit", first[:8], "--no-report", cwd=repo)
    finally:
        del os.environ["HARNESS_CACHE"]
    assert done.returncode == 0, done.stderr
    db = repo / "harness-out" / "results.db"
    assert rows(db, "select c.sha, r.dirty from run r join `commit` c on c.id = r.commit_id") == [(first, 0)]


def test_chips_prints_the_identity_as_json(tmp_path: Path):
    done = harness("chips", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0
    ident = json.loads(done.stdout)
    assert ident["backend"] in ("cpu", "cuda", "metal") and ident["key"] and ident["machine"]["hostname"]


@pytest.mark.parametrize("args, message", [
    (["run", "--suite", "missing.toml"], "cannot read suite"),
    (["run", "--db", "nonsense://"], "cannot use database"),
    (["run", "--commit", "doesnotexist"], "does not exist"),
    (["chips", "--format", "yaml"], "--format must be text or json"),
])
def test_user_errors_are_one_line_without_traceback(repo: Path, args, message):
    write_suite(repo, '["sdpa"]')
    done = harness(*args, cwd=repo)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
