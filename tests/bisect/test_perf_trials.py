"""`harness bisect --mode perf` through its driver (:func:`harness.bisect.run.run_bisect`) on a real store and a real
git repository, with synthetic runs: the test's ``run_one`` writes each probe run's trials (3 processes of 10
samples) at the level the test says, so the statistics meet every situation of the issue without timing
anything -- a probe undecided at the cap (status inconclusive, exit 1, the range and the evidence), stale stored
runs that disagree with a clean re-run, the JSON evidence of each probe -- plus the per-trial read side
(:func:`harness.record.runs.job_trials`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.bisect.probes import BisectRequest
from harness.bisect.report import BisectReport
from harness.bisect.run import run_bisect
from harness.cli.bisect import print_report
from harness.core import chip as chip_id
from harness.core.job import JobResult, KernelJob
from harness.record import runs, store
from testkit.e2e import commit, new_repo

BENCH = KernelJob.of("benchmark", "k", "default", {"N": 8}, "float32", name="work")


class Synthetic:
    """A repository of ``n`` commits after a good one and a store whose runs are written at chosen levels."""

    def __init__(self, root: Path, n: int, level, *, run_sd: float = 0.01, trials: int = 3):
        self.repo = root / "repo"
        self.shas = [new_repo(self.repo, {"README": "0\n"}, "c0")]
        for i in range(1, n + 1):
            self.shas.append(commit(self.repo, {"README": f"{i}\n"}, f"c{i}"))
        self.url = f"sqlite:///{root / 'results.db'}"
        self.db = store.open_database(self.url)
        self.ident = chip_id.detect()
        self.level = level  # (commit index, its k-th run) -> level (seconds per call)
        self.rng = np.random.default_rng(0)
        self.run_sd, self.trials = run_sd, trials
        self.made: dict[int, int] = {}

    def write(self, index: int, level: float) -> str:
        sha = self.shas[index]
        run_id = store.create_run(self.db, ident=self.ident, facts={"hostname": "h"},
                                  commit={"sha": sha, "message": f"c{index}"}, suite="s", dirty=False,
                                  executor="local", planned_jobs=1)
        level *= self.rng.lognormal(0.0, self.run_sd)
        for trial in range(self.trials):
            samples = list(level * self.rng.lognormal(0.0, 0.005) * self.rng.lognormal(0.0, 0.01, 10))
            store.record_result(self.db, run_id, BENCH, JobResult(BENCH.key, "passed", samples=samples, trial=trial))
        return run_id

    def run_one(self, sha: str) -> str:
        index = self.shas.index(sha)
        k = self.made[index] = self.made.get(index, 0) + 1
        return self.write(index, self.level(index, k))

    def bisect(self, **options) -> BisectReport:
        request = BisectRequest(self.shas[0], self.shas[-1], kernel="k", repo=str(self.repo), db_url=self.url,
                                **options)
        return run_bisect(request, run_one=self.run_one)

    def close(self) -> None:
        self.db.close()


@pytest.fixture
def synthetic(tmp_path: Path):
    made: list[Synthetic] = []

    def make(n: int, level, **options) -> Synthetic:
        made.append(Synthetic(tmp_path, n, level, **options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def test_job_trials_groups_samples_per_trial(tmp_path: Path):
    db = store.open_database(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        run_id = store.create_run(db, ident=chip_id.detect(), facts={}, commit={"sha": "a" * 40, "message": "m"},
                                  suite="s", dirty=False, executor="local", planned_jobs=1)
        store.record_result(db, run_id, BENCH, JobResult(BENCH.key, "passed", samples=[3.0, 1.0], trial=0))
        store.record_result(db, run_id, BENCH, JobResult(BENCH.key, "passed", samples=[2.0, 5.0, 4.0], trial=1))
        (row,) = runs.job_rows(db, [run_id])[run_id]
        assert runs.job_trials(db, [row.job_id, 999]) == {row.job_id: {0: [3.0, 1.0], 1: [2.0, 5.0, 4.0]}, 999: {}}
        assert sorted(runs.job_samples(db, [row.job_id])[row.job_id]) == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert runs.job_trials(db, []) == {}
    finally:
        db.close()


def test_a_probe_inconclusive_at_the_cap_names_the_range_and_exits_1(synthetic, capsys):
    """(a) Two steps, 1 -> 1.1 -> 1.2 ms: the commit in the middle is neither good nor bad. The old rule classified
    it by the nearer endpoint ("weak") and named a culprit with exit 0; now the bisect stops with the range."""
    repo = synthetic(8, lambda i, k: 1e-3 * (1.0 if i < 3 else 1.1 if i == 3 else 1.2))
    report = repo.bisect(max_runs=2)
    assert report.status == "inconclusive" and report.exit_code == 1 and report.culprit is None
    shas = repo.shas
    assert [ref.sha for ref in report.candidates] == shas[3:5] and [ref.sha for ref in report.inconclusive] == [shas[3]]
    assert report.last_good.sha == shas[2]
    assert f"one of 2 commits {shas[3][:12]}..{shas[4][:12]}" in report.message and "no culprit named" in report.message
    assert "1.1" in report.message or "1.09" in report.message  # the evidence: its ratio to good
    data = json.loads(json.dumps(report.to_dict()))
    assert data["status"] == "inconclusive" and data["exit_code"] == 1 and data["culprit"] is None
    (line,) = [line for line in data["history"] if line["sha"] == shas[3]]
    assert line["state"] == "inconclusive" and line["runs"] == 2 and line["trials"] == 6 and len(line["run_ids"]) == 2
    assert line["vs_good"]["verdict"] == "regressed" and line["vs_bad"]["verdict"] == "improved"
    assert line["vs_good"]["ci_low"] > 1.0 and line["vs_bad"]["ci_high"] < 1.0
    assert line["vs_good"]["trials_head"] == 6 and line["nearer"] in ("good", "bad")
    assert all(len(item["run_ids"]) >= 1 and item["vs_good"] is not None for item in data["history"])
    assert len(data["endpoint_runs"]["good"]) == 2 and len(data["endpoint_runs"]["bad"]) == 2  # --max-runs 2
    assert data["endpoints"]["trials_base"] == 6 and data["floor"]["df"] >= 2
    print_report(report)
    out = capsys.readouterr().out
    assert "INCONCLUSIVE: " in out and "culprit undecided: one of 2 commits" in out and "OK:" not in out


def test_stale_runs_that_disagree_with_a_clean_rerun_are_set_aside(synthetic):
    """(b) The issue's reuse case: commit 3 (truly fast, the first probe) has two stored runs from a loaded machine
    (2x, the bad level) and one clean re-run. Pooled, they kept the wrong answer; now they are set aside, the clean
    run is corroborated by a new one, and the culprit is exact."""
    repo = synthetic(6, lambda i, k: 1e-3 * (1.0 if i < 4 else 2.0))
    stale = [repo.write(3, 2.0e-3), repo.write(3, 2.0e-3)]
    rerun = repo.write(3, 1.0e-3)
    report = repo.bisect()
    assert report.status == "found" and report.culprit.sha == repo.shas[4] and report.exit_code == 0
    line = [line for line in report.history if line.sha == repo.shas[3]][0]
    assert line.round == 1 and line.step == "probe"
    assert line.state == "good" and rerun in line.run_ids and not set(stale) & set(line.run_ids)
    assert {item.run_id for item in line.set_aside} == set(stale) and "set aside" in line.reason
    assert all(item.vs_kept.verdict == "regressed" and item.vs_kept.ratio > 1.8 for item in line.set_aside)
    assert line.runs == 4 and len(line.run_ids) == 2 and line.trials == 6  # three stored, one new to corroborate
    assert report.reused_runs == 3
    culprit = [line for line in report.history if line.sha == repo.shas[4]][-1]
    assert culprit.confirmed and len(culprit.run_ids) >= 4 and culprit.vs_good.verdict == "regressed"
    assert report.evidence.verdict == "regressed" and report.evidence.trials_head >= 12


def test_a_loaded_run_at_a_bound_is_caught_by_the_confirmation(synthetic):
    """A truly fast commit whose only run was loaded (2x) becomes the culprit's bound; re-measured, it is good and
    the bisect goes on to the true culprit."""
    repo = synthetic(8, lambda i, k: 1e-3 * (2.0 if i >= 6 else 1.0) * (2.0 if (i, k) == (4, 1) else 1.0))
    report = repo.bisect()
    assert report.status == "found" and report.culprit.sha == repo.shas[6] and report.exit_code == 0
    fooled = [line for line in report.history if line.sha == repo.shas[4]]
    assert fooled[0].state == "bad" and fooled[-1].state == "good" and fooled[-1].step == "confirm"
    assert any("re-measured to confirm" in note for note in report.notes) and report.confirmations >= 2
