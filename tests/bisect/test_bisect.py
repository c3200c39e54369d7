"""`harness bisect`: the pure k-ary search on synthetic oracles, the perf classifier on synthetic samples, the
outcome of stored runs, and end to end through the real CLI on a generated repository with a planted slowdown,
an uninstallable commit and a planted correctness break."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.bisect import perf as bisect_perf
from harness.bisect.perf import Measured, RunTrials
from harness.bisect.prober import PerfProber
from harness.bisect.probes import (
    BisectRequest,
    Series,
    answers,
    correctness_outcome,
    find_series,
    normalize_shape,
    perf_outcome,
)
from harness.bisect.search import Classification, max_rounds_needed, search, split_points
from harness.core.errors import HarnessError
from harness.record.runs import StoredJob
from testkit.paths import ROOT

# ---------------------------------------------------------------------------------------------------------------
# The search, on synthetic oracles
# ---------------------------------------------------------------------------------------------------------------


def shas(n: int) -> list[str]:
    return [f"c{i:04d}" for i in range(n)]


def oracle(commits: list[str], culprit: int, skip: set[int] = frozenset(), calls: list | None = None):
    """Commits at index >= culprit are bad; those in ``skip`` cannot be tested."""
    index = {sha: i for i, sha in enumerate(commits)}

    def probe(batch):
        if calls is not None:
            calls.append(list(batch))
        out = {}
        for sha in batch:
            i = index[sha]
            out[sha] = Classification("skip", "does not install") if i in skip else \
                Classification("bad" if i >= culprit else "good")
        return out

    return probe


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 33])
def test_the_culprit_is_exact_at_every_position(n: int):
    commits = shas(n)
    for culprit in range(n):
        result = search(commits, oracle(commits, culprit))
        assert (result.status, result.culprit) == ("found", commits[culprit])
        assert result.last_good == (commits[culprit - 1] if culprit else None)
        assert result.skipped == () and result.probes == sum(len(r.probes) for r in result.history)


@pytest.mark.parametrize("probes", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [2, 5, 10, 64, 100, 1024])
def test_k_ary_rounds_stay_within_log_base_p_plus_one(n: int, probes: int):
    commits = shas(n)
    bound = max_rounds_needed(n, probes)
    assert bound == (0 if n == 1 else int(np.ceil(np.log(n) / np.log(probes + 1) - 1e-9)))
    positions = range(n) if n <= 100 else range(0, n, 7)
    for culprit in positions:
        calls: list = []
        result = search(commits, oracle(commits, culprit, calls=calls), probes_per_round=probes)
        assert result.culprit == commits[culprit]
        assert result.rounds == len(calls) <= bound
        assert all(len(batch) <= probes for batch in calls)


def test_split_points_cut_the_range_into_near_equal_parts():
    assert split_points(-1, 1023, 2) == [511]
    points = split_points(-1, 1023, 5)
    parts = np.diff([-1, *points, 1023])
    assert len(points) == 4 and parts.max() - parts.min() <= 1 and parts.max() == 205


def test_skips_move_the_probe_and_are_listed():
    commits = shas(8)  # culprit 5; the first split point (3) does not install
    calls: list = []
    result = search(commits, oracle(commits, 5, skip={3}, calls=calls))
    assert result.culprit == commits[5]
    assert calls[0] == [commits[3]] and calls[1][0] in (commits[2], commits[4])  # the nearest unknown commit
    assert result.skipped == ((commits[3], "does not install"),)


def test_skips_that_hide_the_culprit_give_the_range():
    commits = shas(10)
    result = search(commits, oracle(commits, 5, skip={3, 4, 5}))
    assert result.status == "hidden" and result.culprit is None
    assert result.candidates == tuple(commits[3:7])  # 2 is good, 6 is bad: the first bad is any of 3..6
    assert result.last_good == commits[2] and {sha for sha, _ in result.skipped} == set(commits[3:6])
    # The bad endpoint itself may be among the candidates.
    result = search(commits, oracle(commits, 9, skip={7, 8}))
    assert result.status == "hidden" and result.candidates == tuple(commits[7:10])


def test_every_commit_skipped_and_max_rounds():
    commits = shas(6)
    result = search(commits, oracle(commits, 3, skip=set(range(5))), probes_per_round=2)
    assert result.status == "hidden" and result.candidates == tuple(commits)
    result = search(shas(64), oracle(shas(64), 40), max_rounds=2)
    assert result.status == "stopped" and result.rounds == 2 and shas(64)[40] in result.candidates
    assert len(result.candidates) == 16


def test_a_non_monotone_answer_is_noted_not_fatal():
    commits = shas(8)

    def probe(batch):  # round 1 probes 1, 3, 5: 3 is bad but 5 good again (a revert, or a flaky probe)
        return {sha: Classification("bad" if sha in (commits[3], commits[6], commits[7]) else "good") for sha in batch}

    result = search(commits, probe, probes_per_round=3)
    assert [sha for sha, _ in result.history[0].probes] == [commits[1], commits[3], commits[5]]
    assert result.culprit == commits[3]  # the oldest bad commit wins
    assert any("not monotone" in note for note in result.notes)


def test_the_probe_must_answer_every_commit():
    with pytest.raises(ValueError, match="did not classify"):
        search(shas(5), lambda batch: {})
    with pytest.raises(ValueError, match="no commits"):
        search([], lambda batch: {})


# ---------------------------------------------------------------------------------------------------------------
# Perf classification on trials, agreeing runs, repeats and confirmation, on synthetic runs
# ---------------------------------------------------------------------------------------------------------------


def trials_at(rng, levels, n: int = 10, cv: float = 0.01) -> list[tuple[float, ...]]:
    """One trial (process) of ``n`` lognormal samples around each level."""
    return [tuple(level * rng.lognormal(0.0, cv, n)) for level in levels]


def near(rng, level: float, k: int = 3, sd: float = 0.005) -> list[tuple[float, ...]]:
    """``k`` trials whose levels move ``sd`` around ``level`` (between-process noise)."""
    return trials_at(rng, level * np.exp(rng.normal(0.0, sd, k)))


def runs_of(level_of, *, trials: int = 3, run_sd: float = 0.01, seed: int = 0, calls: list | None = None):
    """A ``measure`` for PerfProber: one new run per commit and call, at ``level_of(sha, k)`` for its k-th run."""
    rng = np.random.default_rng(seed)
    made: dict[str, int] = {}

    def measure(batch):
        if calls is not None:
            calls.append(list(batch))
        out = {}
        for sha in batch:
            k = made[sha] = made.get(sha, 0) + 1
            level = level_of(sha, k)
            if level is None:
                out[sha] = Measured(skip="does not install", untimed=1)
                continue
            level *= rng.lognormal(0.0, run_sd)
            out[sha] = Measured((RunTrials(f"{sha}-run{k}", tuple(near(rng, level, trials))),))
        return out

    return measure


def test_classify_perf_on_trials_good_bad_intermediate():
    rng = np.random.default_rng(3)
    good, bad = near(rng, 1.0), near(rng, 1.2)
    assert bisect_perf.classify_perf(good, bad, near(rng, 1.2)).state == "bad"
    assert bisect_perf.classify_perf(good, bad, near(rng, 1.0)).state == "good"
    assert bisect_perf.classify_perf(good, bad, near(rng, 0.9)).state == "good"  # a speed-up before the slowdown
    middle = bisect_perf.classify_perf(good, bad, near(rng, 1.1, 6))
    assert middle.state == "inconclusive"
    assert middle.vs_good.verdict == "regressed" and middle.vs_bad.verdict == "improved"
    assert middle.vs_good.trials_head == 6 and middle.vs_good.trials_base == 3
    slower = bisect_perf.classify_perf(good, bad, near(rng, 1.6))  # slower than bad: what a loaded run looks like
    assert slower.state == "inconclusive" and slower.vs_bad.verdict == "regressed"
    assert bisect_perf.nearest_endpoint(good, bad, near(rng, 1.15)) == "bad"


def test_tight_samples_of_processes_that_disagree_are_not_a_confident_verdict():
    """(c) Each process is tight (0.1 % noise in its samples), but the processes land far apart: no verdict, where
    the old rule (pooled samples) was sure with a tiny p-value."""
    rng = np.random.default_rng(7)
    good, bad = trials_at(rng, [1.0, 1.0, 1.0], cv=0.001), trials_at(rng, [1.3, 1.3, 1.3], cv=0.001)
    spread = trials_at(rng, [1.0, 1.3, 1.15], cv=0.001)
    call = bisect_perf.classify_perf(good, bad, spread)
    assert call.state == "inconclusive"
    assert call.vs_good.verdict != "regressed" and call.vs_bad.verdict != "improved"
    assert call.vs_good.ci_low < 1.0 < call.vs_good.ci_high
    from scipy import stats as scipy_stats

    pooled_good, pooled_spread = np.concatenate(good), np.concatenate(spread)
    assert scipy_stats.mannwhitneyu(pooled_spread, pooled_good).pvalue < 1e-5
    assert np.median(pooled_spread) > 1.1 * np.median(pooled_good)
    # One process a side shows no spread at all: inconclusive, however tight its samples.
    one = bisect_perf.classify_perf(good[:1], bad[:1], trials_at(rng, [1.3], cv=0.001))
    assert one.state == "inconclusive" and one.vs_good.basis == "none" and one.vs_bad.basis == "none"
    # Through the prober, one run of such a commit (and no more allowed) is inconclusive, not bad.
    levels = {"g": [1.0] * 3, "b": [1.3] * 3, "x": [1.0, 1.3, 1.15]}

    def measure(batch):
        return {sha: Measured((RunTrials(f"{sha}{rng.integers(1 << 30)}", tuple(trials_at(rng, levels[sha],
                                                                                           cv=0.001))),))
                for sha in batch}

    prober = PerfProber(measure, "g", "b", max_runs=1)
    assert prober.confirm().verdict == "regressed" and prober.endpoints_settled
    got = prober(["x"])["x"]
    assert got.state == "inconclusive" and got.trials == 3 and "inconclusive after 1 run(s)" in got.reason


def test_perf_prober_repeats_undecided_probes_and_caps_them():
    calls: list = []
    levels = {"g": 1.0, "b": 1.2, "x": 1.0, "half": 1.1}
    prober = PerfProber(runs_of(lambda sha, k: levels.get(sha), calls=calls), "g", "b", max_runs=3)
    endpoints = prober.confirm()
    assert endpoints.verdict == "regressed" and prober.endpoints_settled and 1.15 < endpoints.ratio < 1.25
    assert calls == [["g", "b"], ["g", "b"], ["b"]]  # agreeing runs: two of good, of bad four but --max-runs 3
    assert endpoints.trials_base == 6 and endpoints.trials_head == 9
    got = prober(["x", "half", "broken"])
    assert got["x"].state == "good" and got["x"].runs == 1 and got["x"].run_ids == ("x-run1",)
    assert got["x"].trials == 3 and got["x"].vs_good.verdict == "unchanged" and got["x"].vs_bad.verdict == "improved"
    half = got["half"]
    assert half.state == "inconclusive" and half.runs == 3 and half.trials == 9 and half.nearer in ("good", "bad")
    assert "inconclusive after 3 run(s)" in half.reason and "a hint only" in half.reason
    assert half.vs_good.verdict == "regressed" and half.vs_bad.verdict == "improved"
    assert got["broken"] == Classification("skip", "does not install", runs=1)
    assert calls[3:] == [["x", "half", "broken"], ["half"], ["half"]] and prober.batches == 6


def test_a_commit_that_cannot_be_run_again_reaches_the_cap():
    """An undecided commit whose repeats cannot be made (the executor fails) counts each attempt to the cap."""
    first = runs_of(lambda sha, k: {"g": 1.0, "b": 1.2, "half": 1.1}[sha])
    asked: list = []

    def measure(batch):
        asked.extend(batch)
        return {sha: Measured(skip="cannot run: no node") if asked.count("half") > 1 and sha == "half" else
                first([sha])[sha] for sha in batch}

    prober = PerfProber(measure, "g", "b", max_runs=3)
    assert prober.confirm().verdict == "regressed"
    half = prober(["half"])["half"]
    assert half.state == "inconclusive" and half.runs == 1 and prober.new_counts["half"] == 3


def test_a_run_slower_than_the_others_is_set_aside_whichever_is_newer():
    """(b) Runs of one commit that disagree are not pooled: the one slower than the others beyond the run-to-run
    noise (a loaded machine, a stale noisy run) is set aside, newest or not."""
    rng = np.random.default_rng(13)
    clean = RunTrials("clean", tuple(near(rng, 1.0)))
    again = RunTrials("again", tuple(near(rng, 1.01)))
    loaded = RunTrials("loaded", tuple(near(rng, 2.0)), reused=True)
    for order in ([loaded, clean, again], [clean, again, loaded], [clean, loaded]):
        kept, aside = bisect_perf.agreeing_runs(order, band=0.05)
        assert [run.run_id for run in aside] == ["loaded"] and "loaded" not in {run.run_id for run in kept}
        assert aside[0].vs_kept.verdict == "regressed" and 1.9 < aside[0].vs_kept.ratio < 2.1
    kept, aside = bisect_perf.agreeing_runs([clean, again], band=0.05)  # 1 % apart: drift, pooled
    assert len(kept) == 2 and aside == ()


def test_stale_stored_runs_do_not_keep_their_answer_after_a_clean_rerun():
    """(b) The issue: stored runs of a commit from an earlier, loaded bisect (x2, the bad level) and one clean re-run.
    Pooled they said bad; now the stale runs are set aside and the clean run must be corroborated by a new one."""
    rng = np.random.default_rng(17)
    stored = {"x": (RunTrials("stale-1", tuple(near(rng, 2.0)), True), RunTrials("stale-2", tuple(near(rng, 1.95)),
                                                                                  True),
                    RunTrials("rerun", tuple(near(rng, 1.0)), True))}
    fresh = runs_of(lambda sha, k: {"g": 1.0, "b": 2.0, "x": 1.0}[sha], seed=2, run_sd=0.0)

    def measure(batch):  # the first request for x reads its stored runs, later ones make new runs
        out = dict(fresh([sha for sha in batch if sha not in stored]))
        out |= {sha: Measured(stored.pop(sha), reused=3) for sha in batch if sha in stored}
        return out

    prober = PerfProber(measure, "g", "b")
    assert prober.confirm().verdict == "regressed"
    got = prober(["x"])["x"]
    assert got.state == "good" and got.runs == 4 and set(got.run_ids) == {"rerun", "x-run1"}
    assert {a.run_id for a in got.set_aside} == {"stale-1", "stale-2"} and "set aside" in got.reason
    assert got.vs_good.trials_head == 6  # the stale runs' trials are not pooled
    assert prober.reused == 3 and prober.new_counts["x"] == 1


def test_confirmation_re_measures_the_bounds_and_moves_them():
    """A good commit whose only run was loaded looks bad and becomes the bound; re-measured, its clean runs are
    faster, the loaded run is set aside, and the search goes on to the true culprit, confirmed on 3 runs."""
    commits = [f"c{i}" for i in range(1, 9)]  # c8: the bad endpoint; the culprit is c6
    truth = {sha: 2.0 if int(sha[1:]) >= 6 else 1.0 for sha in commits} | {"g": 1.0}
    level = runs_of(lambda sha, k: truth[sha] * (2.0 if (sha, k) == ("c4", 1) else 1.0), seed=5)
    prober = PerfProber(level, "g", "c8")
    assert prober.confirm().verdict == "regressed"
    result = search(commits, prober, confirm=prober.confirm_bounds)
    assert (result.status, result.culprit, result.last_good) == ("found", "c6", "c5")
    first = result.history[0].probes[0][1]
    assert result.history[0].probes[0][0] == "c4" and first.state == "bad"  # the loaded run fooled the probe
    c4 = result.classifications["c4"]
    assert c4.state == "good" and c4.confirmed and [a.run_id for a in c4.set_aside] == ["c4-run1"]
    assert any("re-measured to confirm it is good" in note for note in result.notes)
    culprit = result.classifications["c6"]
    assert culprit.confirmed and len(culprit.run_ids) >= 3 and culprit.vs_good.verdict == "regressed"
    assert result.confirmations >= 2 and result.rounds == sum(not r.confirm for r in result.history)
    assert prober.confirm_alpha() < prober.alpha  # the bounds were re-checked at a Bonferroni level


def test_an_inconclusive_probe_inside_the_range_stops_the_search():
    """(a) No culprit is guessed: a probe still undecided at the cap stops the search with the range."""
    commits = shas(8)
    answers = {i: "good" for i in range(4)} | {4: "inconclusive"} | {i: "bad" for i in range(5, 8)}
    confirmed: list = []

    def probe(batch):
        return {sha: Classification(answers[commits.index(sha)]) for sha in batch}

    def confirm(batch):
        confirmed.append(list(batch))
        return probe(batch)

    result = search(commits, probe, confirm=confirm)
    assert result.status == "inconclusive" and result.culprit is None
    assert result.inconclusive == (commits[4],) and result.candidates == tuple(commits[4:6])
    assert result.last_good == commits[3] and confirmed == [[commits[3], commits[5]]]  # its bounds re-checked
    # An inconclusive commit the other probes of its round made irrelevant does not stop anything.
    answers[6] = "inconclusive"
    answers[4] = "bad"
    result = search(commits, probe, probes_per_round=3)
    assert result.status == "found" and result.culprit == commits[4]


def test_an_intermediate_level_is_inconclusive_at_the_cap_not_the_nearer_endpoint():
    """(a) Two steps (1.0 -> 1.1 -> 1.2): the probe at the middle level is neither; the bisect names no culprit."""
    commits = [f"c{i}" for i in range(1, 9)]
    prober = PerfProber(runs_of(lambda sha, k: 1.0 if sha == "g" else 1.1 if sha == "c3" else
                                1.2 if int(sha[1:]) > 3 else 1.0, seed=9), "g", "c8", max_runs=2)
    assert prober.confirm().verdict == "regressed"
    result = search(commits, prober, confirm=prober.confirm_bounds)
    assert [sha for r in result.history for sha, _ in r.probes] == ["c4", "c2", "c3", "c2", "c4"]
    assert result.status == "inconclusive" and result.culprit is None and result.inconclusive == ("c3",)
    assert result.candidates == ("c3", "c4") and result.last_good == "c2"
    c3 = result.classifications["c3"]
    assert c3.state == "inconclusive" and c3.runs == 2 and c3.nearer in ("good", "bad")
    assert c3.vs_good.verdict == "regressed" and c3.vs_bad.verdict == "improved"
    assert result.classifications["c4"].confirmed and result.classifications["c2"].confirmed


def test_endpoints_that_do_not_differ_are_measured_to_the_cap_then_reported():
    calls: list = []
    prober = PerfProber(runs_of(lambda sha, k: 1.0, run_sd=0.05, calls=calls), "g", "b", max_runs=3)
    verdict = prober.confirm()
    assert verdict.verdict != "regressed" and sum(len(batch) for batch in calls) <= 6


def test_run_floor_and_rough_sd():
    rng = np.random.default_rng(21)

    def group(levels):
        return [RunTrials(f"r{i}", tuple(near(rng, level, sd=0.0))) for i, level in enumerate(levels)]

    assert bisect_perf.run_floor([group([1.0])]) is None and bisect_perf.rough_run_sd([group([1.0])]) is None
    floor = bisect_perf.run_floor([group([1.0, 1.1]), group([2.0, 2.0, 2.2])])
    assert floor.runs == 4 and 0.04 < floor.sd < 0.09
    # A wild run hardly moves the rough sd, which decides what counts as drift.
    calm = [group([1.0, 1.05, 1.02]), group([1.0, 1.03, 1.01]), group([1.0, 1.04])]
    wild = [group([1.0, 1.05, 3.0, 2.5]), *calm[1:]]
    assert bisect_perf.rough_run_sd(calm) < 0.05 and bisect_perf.rough_run_sd(wild) < 0.06


# ---------------------------------------------------------------------------------------------------------------
# What a stored run says about a commit
# ---------------------------------------------------------------------------------------------------------------


def job(kind: str, key: str, status: str = "passed", *, kernel: str = "", name: str = "", variant: str = "default",
        dtype: str = "", shape_key: str = "", check: str = "", detail: str = "", job_id: int = 1) -> StoredJob:
    return StoredJob(job_id, "r", kind, key, kernel or key, name or key, variant, dtype, shape_key, check, status,
                  detail)


BENCH = job("benchmark", "benchmark/m:f/default/-/N=8", kernel="m:f", name="work", shape_key="N=8", job_id=7)


def test_normalize_shape():
    assert normalize_shape("S=128, B=1") == "B=1,S=128" and normalize_shape("N=256") == "N=256"
    assert normalize_shape(None) is None
    with pytest.raises(HarnessError, match="NAME=INT"):
        normalize_shape("N=big")


def test_find_series_by_function_name_and_ambiguity():
    other = job("benchmark", "benchmark/m:f/default/-/N=16", kernel="m:f", name="work", shape_key="N=16")
    request = BisectRequest("g", "b", kernel="work")
    with pytest.raises(HarnessError, match="2 series of 'work' match"):
        find_series([BENCH, other], request)
    request.shape = "N=8"
    assert find_series([BENCH, other], request) == Series("m:f", "default", "", "N=8")
    with pytest.raises(HarnessError, match="no benchmark of 'nope'"):
        find_series([BENCH], BisectRequest("g", "b", kernel="nope"))


def test_perf_outcome_skips_broken_commits():
    series = Series("m:f", "default", "", "N=8")
    assert perf_outcome([BENCH], series) == (7, "")
    install = job("install", "install", "failed", detail="install failed: `x` exited with status 1: no")
    assert perf_outcome([install, BENCH], series)[1].startswith("does not install: install failed")
    wrong = job("correctness", "correctness/m:f/default/float32/N=8/reference", "failed", kernel="m:f",
                detail="max error 3")
    assert perf_outcome([wrong, BENCH], series)[1].startswith("fails correctness:")
    unit = job("pytest", "pytest/unit", "failed", kernel="unit", name="unit", detail="1 failed")
    assert perf_outcome([unit, BENCH], series) == (7, "")  # not gated unless asked
    assert perf_outcome([unit, BENCH], series, gates=("unit",))[1].startswith("fails correctness: pytest/unit")
    crashed = job("benchmark", BENCH.key, "crashed", kernel="m:f", name="work", shape_key="N=8", detail="SIGSEGV")
    assert perf_outcome([crashed], series) == (None, "benchmark crashed: SIGSEGV")
    assert perf_outcome([], series)[1].startswith("no benchmark m:f")


def test_only_stored_runs_that_answer_are_reused():
    perf_request = BisectRequest("g", "b", kernel="work", shape="N=8")
    assert answers(perf_request)([BENCH])
    assert not answers(perf_request)([job("pytest", "pytest/unit", kernel="unit", name="unit")])  # another suite
    assert not answers(perf_request)([])  # a run that never got to its jobs
    assert answers(perf_request)([job("install", "install", "failed", detail="install failed: x")])
    correctness_request = BisectRequest("g", "b", kernel="unit", mode="correctness")
    assert answers(correctness_request)([job("pytest", "pytest/unit", "failed", kernel="unit", name="unit")])
    assert not answers(correctness_request)([BENCH])


def test_correctness_outcome():
    request = BisectRequest("g", "b", kernel="unit", mode="correctness")
    selection = job("pytest", "pytest/unit", "failed", kernel="unit", detail="1 failed")
    test_add = job("test", "test/unit/tests/t.py::test_add", "failed", kernel="unit", name="tests/t.py::test_add")
    test_mul = job("test", "test/unit/tests/t.py::test_mul", "passed", kernel="unit", name="tests/t.py::test_mul")
    verdict = correctness_outcome([selection, test_add, test_mul], request)
    assert verdict.state == "bad" and verdict.reason.startswith("test/unit/tests/t.py::test_add failed")
    request.check = "test_mul"
    assert correctness_outcome([selection, test_add, test_mul], request).state == "good"
    request.check = "tests/t.py::test_gone"
    assert correctness_outcome([selection, test_add], request).state == "skip"
    install = job("install", "install", "failed", detail="install failed: boom")
    assert correctness_outcome([install, selection], request).reason.startswith("does not install")
    timeout = job("correctness", "correctness/k/v/float32/N=1/reference", "timeout", kernel="k", variant="v",
                  check="reference")
    verdict = correctness_outcome([timeout], BisectRequest("g", "b", kernel="k", mode="correctness", variant="v"))
    assert verdict.state == "skip" and "timeout" in verdict.reason


# ---------------------------------------------------------------------------------------------------------------
# End to end: a generated repository, the real CLI
# ---------------------------------------------------------------------------------------------------------------

PACKAGE = '''import numpy as np

REPEATS = {repeats}


def work(x):
    for _ in range(REPEATS):
        y = np.sort(x)
    return y


def add(a, b):
    return a + b{bug}
'''

BENCH_MODULE = '''import numpy as np

import tinykern


def bench_work(N):
    x = np.random.default_rng(0).random(N)
    return lambda: tinykern.work(x)
'''

TESTS = '''import tinykern


def test_add():
    assert tinykern.add(2, 3) == 5
'''

# The install fails while the file BROKEN exists; it is a key file, so that commit gets its own environment.
SUITE = '''[suite]
name = "tinykern"

[install]
command = "test ! -e BROKEN"
key_files = ["BROKEN"]

[timing]
warmup_s = 0.02
warmup_calls = 2
min_sample_s = 0.005
samples = 10

[[pytest]]
name = "unit"
paths = ["tests"]
args = ["-p", "no:hypothesispytest"]

[[function]]
name = "work"
target = "tinykern.bench:bench_work"
grid.cpu = { N = [20000] }
grid.gpu = { N = [20000] }
'''


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(repo: Path) -> list[str]:
    """Eight commits: c2 sorts 4x as often (~4x slower: unambiguous even on a loaded 2-core machine, where whole
    runs can be 1.5x slower than the next), c3 does not install, c5 breaks add()."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "k@example.com")
    git(repo, "config", "user.name", "K")
    steps = [
        ("c0 initial", {"tinykern/__init__.py": PACKAGE.format(repeats=2, bug=""), "tinykern/bench.py": BENCH_MODULE,
                        "tests/test_ops.py": TESTS, "harness.toml": SUITE, "README": "0\n"}, ()),
        ("c1 docs", {"README": "1\n"}, ()),
        ("c2 sort 4x as often", {"tinykern/__init__.py": PACKAGE.format(repeats=8, bug="")}, ()),
        ("c3 break the install", {"BROKEN": "yes\n"}, ()),
        ("c4 fix the install", {}, ("BROKEN",)),
        ("c5 off by one", {"tinykern/__init__.py": PACKAGE.format(repeats=8, bug=" + 1")}, ()),
        ("c6 docs", {"README": "6\n"}, ()),
        ("c7 docs", {"README": "7\n"}, ()),
    ]
    shas = []
    for message, files, removed in steps:
        for name, text in files.items():
            path = repo / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for name in removed:
            (repo / name).unlink()
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", message)
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


class Bisector:
    def __init__(self, root: Path):
        self.root = root
        self.repo = root / "tinykern"
        self.db = root / "results.db"
        self.shas = make_repo(self.repo)

    def harness(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"), "COLUMNS": "200"}
        code = "import harness.cli.bisect; from harness.cli.main import main; main()"
        return subprocess.run([sys.executable, "-c", code, *args], cwd=self.root, env=env, capture_output=True,
                              text=True, timeout=600)

    def bisect(self, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
        done = self.harness("bisect", "--repo", str(self.repo), "--good", self.shas[0], "--bad", self.shas[7],
                            "--db", f"sqlite:///{self.db}", "--format", "json", *args)
        return done, (json.loads(done.stdout) if done.stdout.strip().startswith("{") else {})

    def runs(self) -> list[tuple[str, str]]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute("select r.id, c.sha from run r join `commit` c on c.id = r.commit_id").fetchall()


@pytest.fixture(scope="module")
def bisector(tmp_path_factory) -> Bisector:
    return Bisector(tmp_path_factory.mktemp("bisect"))


@pytest.fixture(scope="module")
def perf(bisector: Bisector) -> tuple[subprocess.CompletedProcess, dict]:
    return bisector.bisect("--kernel", "work", "--mode", "perf")


def test_perf_bisect_names_the_slowdown_and_skips_the_uninstallable_commit(bisector: Bisector, perf):
    done, report = perf
    assert done.returncode == 0, (done.stdout, done.stderr)
    shas = bisector.shas
    assert report["status"] == "found" and report["culprit"]["sha"] == shas[2]
    assert report["culprit"]["subject"] == "c2 sort 4x as often" and report["last_good"]["sha"] == shas[1]
    assert report["target"] == "tinykern.bench:bench_work [default, N=20000]"
    assert report["endpoints"]["verdict"] == "regressed" and report["endpoints"]["ratio"] > 2.0
    evidence = report["evidence"]
    assert evidence["verdict"] == "regressed" and 2.0 < evidence["ratio"] < 8.0 and evidence["ci_low"] > 1.5
    (skipped,) = report["skipped"]
    assert skipped["sha"] == shas[3] and skipped["subject"] == "c3 break the install"
    assert skipped["reason"].startswith("does not install: install failed: `test ! -e BROKEN` exited with status 1")
    probes = [line for line in report["history"] if line["step"] == "probe"]
    assert report["rounds"] == len({line["round"] for line in probes}) >= 3
    assert report["probes"] == len(probes) == len({line["sha"] for line in report["history"]})
    assert report["probes_per_round"] == 1 and report["reused_runs"] == 0
    # Every probe's evidence: its runs, trials (4 processes a run: one series, so the plan raises the suite's 3)
    # and both comparisons.
    for line in report["history"]:
        if line["state"] != "skip":
            assert line["trials"] == 4 * len(line["run_ids"]) and line["vs_good"]["trials_head"] == line["trials"]
            # inconclusive too: under load a probe's interval can exclude 1 and still straddle the band (then the
            # round repeats the probe; in CI one did, and the bisection still named the culprit)
            assert line["vs_good"]["verdict"] in ("regressed", "unchanged", "improved", "inconclusive")
            assert line["vs_bad"]["ci_low"] is not None and line["n"] == 10 * line["trials"]
    # The endpoints on two and four runs, and the culprit and the commit before it re-checked: the culprit on four.
    # (a run of an endpoint that the machine's load made slower than the others is set aside and listed, on this
    # shared 2-core machine that happens: then the endpoint keeps fewer)
    aside = {run["run_id"] for run in report["endpoint_set_aside"]}
    bad_runs = [run_id for run_id, sha in bisector.runs() if sha == shas[7]]
    assert len(report["endpoint_runs"]["good"]) >= 2 and len(bad_runs) >= 4
    assert set(report["endpoint_runs"]["bad"]) | (aside & set(bad_runs)) == set(bad_runs)
    confirmed = {line["sha"]: line for line in report["history"] if line["step"] == "confirm"}
    assert set(confirmed) == {shas[1], shas[2]} and report["confirmations"] == 1
    assert len(confirmed[shas[2]]["run_ids"]) >= 4 and len(confirmed[shas[1]]["run_ids"]) >= 2
    assert report["runs"] >= 6 + report["probes"] + 4
    # Every probe is a stored run: the endpoints and each probed commit, repeats included.
    stored = bisector.runs()
    assert len(stored) == report["runs"] == len(report["new_runs"])
    assert {sha for _, sha in stored} == {shas[0], shas[7]} | {line["sha"] for line in report["history"]}
    assert f"running {shas[3][:12]}" in done.stderr  # progress goes to stderr


def test_correctness_bisect_names_the_break_reusing_stored_runs(bisector: Bisector, perf):
    before = bisector.runs()
    done, report = bisector.bisect("--kernel", "unit", "--mode", "correctness")
    assert done.returncode == 0, (done.stdout, done.stderr)
    shas = bisector.shas
    assert report["status"] == "found" and report["culprit"]["sha"] == shas[5]
    assert report["last_good"]["sha"] == shas[4]
    assert report["detail"].startswith("test/unit/tests/test_ops.py::test_add failed: ")
    assert [skipped["sha"] for skipped in report["skipped"]] == [shas[3]]
    assert report["reused_runs"] >= 3  # both endpoints and the commits the perf bisect probed
    after = bisector.runs()
    assert len(after) - len(before) == len(report["new_runs"]) == report["runs"] - report["reused_runs"]


def test_a_repeated_bisect_reuses_the_stored_runs_and_text_output(bisector: Bisector, perf):
    before = bisector.runs()
    done = bisector.harness("bisect", "--repo", str(bisector.repo), "--good", bisector.shas[0], "--bad",
                            bisector.shas[7], "--db", f"sqlite:///{bisector.db}", "--kernel", "work")
    assert done.returncode == 0, (done.stdout, done.stderr)
    out = done.stdout
    # Every stored run of the endpoints and of the bounds is read again: 2 + 4 + 4 + 2 at least.  A repeat judges a
    # commit on all its stored runs at once (band and floor from all of them), so a run the first bisect kept can now
    # be set aside and the rule then asks for one more: on a quiet machine none is made, under load one was (CI).
    counts = re.search(r"(\d+) run\(s\) of which (\d+) reused", out)
    assert counts, out
    runs, reused = int(counts[1]), int(counts[2])
    after = bisector.runs()
    assert reused >= 12 and runs - reused == len(after) - len(before)
    assert set(before) <= set(after)
    assert f"culprit: {bisector.shas[2][:12]} 'c2 sort 4x as often'" in out
    assert f"skipped: {bisector.shas[3][:12]} 'c3 break the install': does not install" in out
    assert "OK: " in out and "0 reused" not in out


def test_no_regression_between_the_endpoints_exits_1(bisector: Bisector, perf):
    shas = bisector.shas
    done = bisector.harness("bisect", "--repo", str(bisector.repo), "--good", shas[2], "--bad", shas[7], "--db",
                            f"sqlite:///{bisector.db}", "--kernel", "work", "--format", "json", "--max-runs", "1",
                            "--min-effect", "0.5")  # same code: no run-to-run drift of a loaded machine counts
    assert done.returncode == 1, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["status"] == "no-regression" and "is not slower than the good commit" in report["message"]
    done = bisector.harness("bisect", "--repo", str(bisector.repo), "--good", shas[7], "--bad", shas[0], "--db",
                            f"sqlite:///{bisector.db}", "--kernel", "work")
    assert done.returncode == 2 and "is not an ancestor of bad" in done.stderr


# ---------------------------------------------------------------------------------------------------------------
# On a Ray cluster: two nodes of the chip, two probes per round, run at once
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.xdist_group("ray_bisect")
def test_ray_bisect_probes_two_commits_per_round_at_once(tmp_path_factory):
    from sqlalchemy import select

    from harness.bisect.run import run_bisect
    from harness.record.models import Run
    from harness.record.outbox import open_store
    from testkit.ray import restore_env, set_env, start_cluster

    tmp = tmp_path_factory.mktemp("ray-bisect")
    shas = make_repo(tmp / "tinykern")
    previous = set_env(tmp)
    cluster = start_cluster(["tiny-bisect", "tiny-bisect"])
    db_url = f"sqlite:///{tmp / 'results.db'}"
    lines: list[str] = []
    start = time.monotonic()
    try:
        request = BisectRequest(shas[0], shas[7], kernel="work", chip="tiny-bisect", repo=str(tmp / "tinykern"),
                                db_url=db_url, executor="ray", address=cluster.address)
        report = run_bisect(request, log=lambda line: lines.append(f"{time.monotonic() - start:.1f} {line}"))
    finally:
        cluster.shutdown()
        restore_env(previous)
    assert report.status == "found" and report.culprit.sha == shas[2], (report.message, lines)
    assert report.probes_per_round == 2 and report.round_bound == 2 and report.rounds <= 2
    rounds: dict[int, list[str]] = {}
    for line in report.history:
        rounds.setdefault(line.round, []).append(line.sha)
    assert len(rounds[1]) == 2  # k-ary: two probes in the first round
    db = open_store(db_url)
    try:
        with db.session() as session:
            assert {run.executor for run in session.scalars(select(Run))} == {"ray"}
    finally:
        db.close()
    # The round's two probes were dispatched together (one after the other, the second would start only when the
    # first run had ended: seconds later). Whether the runs themselves overlap depends on how long each node takes to
    # check its commit out on a loaded machine (in CI the second began 0.3 s after the first 3 s run ended), so the
    # dispatch is what is asserted.
    round_one = {sha[:12] for sha in rounds[1]}
    dispatched = [float(line.split()[0]) for line in lines
                  if line.split()[1:2] == ["running"] and line.split()[2] in round_one]
    assert len(dispatched) >= 2 and dispatched[1] - dispatched[0] < 1.0, lines
