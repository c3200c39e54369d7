"""`harness compare` and `harness variants` through the real entry point: synthetic DBs, and two real runs."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness.cli.compare  # noqa: F401 - registers the verb (until harness.cli.main lists it)
import harness.cli.variants  # noqa: F401
from harness.cli.main import main
from harness.record import outbox, store
from testkit.analysis import add_run, checks, grid_results, sha_of
from testkit.e2e import NOISE_SUITE, git
from testkit.e2e import harness as run_harness
from testkit.paths import ROOT

REGISTER = "import harness.cli.compare, harness.cli.variants; from harness.cli.main import main; main()"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the real entry point in-process: (exit status, stdout, stderr)."""
    argv = sys.argv
    sys.argv = ["harness", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_subprocess(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", REGISTER, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def scaled(results: list, factor: float) -> list:
    """``grid_results`` with every sample ``factor`` times as long (a whole run shifted)."""
    for _, result in results:
        result.samples = [seconds * factor for seconds in result.samples]
    return results


@pytest.fixture
def planted(db_url):
    """Commit 1 -> 2 on two chips: swiglu/fused_gateup 10 % slower on chip A, flash_bq8_bk16 wrong on chip A;
    flash_prefill/flash_bq16_bk32 shape 0 wins on chip A (0.8) and loses on chip B (1.25) at both commits."""
    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(1)
    for commit in (1, 2):
        for chip in ("chip-a", "chip-b"):
            on_a = chip == "chip-a"
            factors = {("flash_prefill", "flash_bq16_bk32", 0): 0.8 if on_a else 1.25}
            if on_a and commit == 2:
                factors[("swiglu", "fused_gateup", 1)] = 1.10
            statuses = {("flash_prefill", "flash_bq8_bk16"): "failed"} if on_a and commit == 2 else None
            add_run(handle, chip, commit, grid_results(rng, factors) + checks(statuses), minutes=10 * commit)
    handle.close()
    return db_url


def test_compare_fails_on_a_regression_or_a_correctness_failure_and_prints_the_evidence(planted, capsys):
    code, out, _ = cli(capsys, "compare", sha_of(1)[:8], sha_of(2)[:8], "--db", planted)
    assert code == 1
    lines = out.splitlines()
    failures_at = next(i for i, line in enumerate(lines) if "Newly failing on head (1)" in line)
    changed_at = next(i for i, line in enumerate(lines) if "Changed series" in line)
    assert failures_at < changed_at  # correctness failures first
    assert "max error 0.5 > tolerance 1e-3" in out and "regressed" in out and "fused_gateup" in out
    assert "unchanged series not listed (--all lists them)" in out and out.rstrip().splitlines()[-1].startswith(
        "FAIL: 1 regressed")

    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", planted, "--format", "json")
    report = json.loads(out)
    assert code == report["exit_code"] == 1 and report["counts"]["regressed"] == 1
    assert report["counts"]["broken"] == 4 and len(report["correctness_failures"]) == 1
    (regressed,) = [row for row in report["rows"] if row["verdict"] == "regressed"]
    assert regressed["key"] == {"kernel": "swiglu", "variant": "fused_gateup", "dtype": "float32",
                                "shape_key": "B=1,D=32,H=1,S=128", "chip": "chip-a"}
    assert regressed["ci_low"] > 1.02 and regressed["n_base"] == regressed["n_head"] == 30
    assert regressed["trials_base"] == regressed["trials_head"] == 3 and regressed["basis"] == "trials"

    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", planted, "--chip", "chip-b", "--format",
                       "markdown", "--all")
    assert code == 0  # chip B has neither a regression nor a correctness failure
    assert out.startswith("### Benchmark comparison: OK")
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| verdict | chip | kernel |") and len(table) == 1 + 8  # header + every series
    assert all("chip-b" in row for row in table[1:]) and "| unchanged | chip-b | flash_prefill |" in out


def test_variants_lists_the_divergent_variant_first_with_both_cells(planted, capsys):
    code, out, _ = cli(capsys, "variants", "--db", planted)
    assert code == 0
    lines = out.splitlines()
    divergent_at = next(i for i, line in enumerate(lines) if "Divergent" in line)
    assert divergent_at < next(i for i, line in enumerate(lines) if line.startswith("chip-a:"))
    row = next(line for line in lines[divergent_at:] if "flash_bq16_bk32" in line)
    assert "chip-a" in row and "chip-b" in row and "0.8" in row and "1.2" in row
    code, out, _ = cli(capsys, "variants", "--db", planted, "--commit", sha_of(2)[:6], "--format", "json")
    matrix = json.loads(out)
    (divergent,) = matrix["divergent"]
    assert divergent["winning_chip"] == "chip-a" and divergent["win"]["outcome"] == "win"
    assert divergent["losing_chip"] == "chip-b" and divergent["lose"]["outcome"] == "lose"
    code, out, _ = cli(capsys, "variants", "--db", planted, "--format", "markdown")
    assert code == 0 and "#### Divergent: wins on one chip, loses on another (1)" in out


def test_host_paced_series_are_marked_in_compare_and_variants(tmp_path: Path, capsys):
    """A series whose device waited for the host's calls (its recorded backlog under the threshold) is marked in
    both verbs' tables and JSON, with one note saying what that means; the others are not."""
    db = f"sqlite:///{tmp_path / 'paced.db'}"
    handle = outbox.open_store(db)
    rng = np.random.default_rng(2)
    for commit in (1, 2):
        results = grid_results(rng)
        for job, result in results:
            result.mode = "pipelined"
            result.backlog_calls = 1.5 if (job.variant, job.shape["S"]) == ("flash_bq16_bk32", 64) else 18.0
        add_run(handle, "chip-a", commit, results, minutes=10 * commit)
    handle.close()
    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", db, "--format", "json")
    paced = [row["key"] for row in json.loads(out)["rows"] if row["host_paced"]]
    assert paced == [{"kernel": "flash_prefill", "variant": "flash_bq16_bk32", "dtype": "float32",
                      "shape_key": "B=1,D=32,H=1,S=64", "chip": "chip-a"}]
    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", db, "--all", "--format", "markdown")
    marked = [line for line in out.splitlines() if line.startswith("| ") and "host-paced" in line]
    assert len(marked) == 1 and "| flash_bq16_bk32 |" in marked[0] and "S=64" in marked[0]
    assert "1 series host-paced: the device waited for the host's calls" in out
    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", db)
    assert '[timing] mode = "device"' in " ".join(out.split())  # printed as text, not taken for markup
    code, out, _ = cli(capsys, "variants", "--db", db, "--format", "json")
    cells = {(c["variant"], c["shape_key"]): c["host_paced"] for c in json.loads(out)["cells"]}
    assert cells[("flash_bq16_bk32", "B=1,D=32,H=1,S=64")] and not cells[("flash_bq16_bk32", "B=1,D=32,H=1,S=128")]
    code, out, _ = cli(capsys, "variants", "--db", db, "--all")
    assert "1 cell(s) host-paced (the variant or its default)" in " ".join(out.split())
    import harness.cli.noise  # noqa: F401 - registers the verb
    code, out, _ = cli(capsys, "noise", sha_of(2), "--db", db, "--format", "json")
    assert code == 0 and [chip["host_paced"] for chip in json.loads(out)["chips"]] == [1]
    code, out, _ = cli(capsys, "noise", "--db", db, "--format", "markdown")
    header, row = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")][:2]
    assert row[header.index("host-paced")] == "1"


def one_run_db(tmp_path: Path) -> str:
    db = f"sqlite:///{tmp_path / 'results.db'}"
    handle = outbox.open_store(db)
    add_run(handle, "chip-a", 1, grid_results(np.random.default_rng(0)), minutes=0)
    handle.close()
    return db


def test_an_unknown_commit_is_one_line_and_exit_2(tmp_path: Path):
    done = cli_subprocess("compare", "deadbeef", sha_of(1), "--db", one_run_db(tmp_path), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: no commit or run 'deadbeef' in the database" and done.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["compare", "0001", "0001", "--format", "yaml"], "error: --format must be text, json or markdown, not 'yaml'"),
    (["compare", "0001", "0001", "--alpha", "0"], "error: --alpha must be in (0, 1), not 0.0"),
    (["variants", "--commit", "abc"], "error: no commit or run 'abc' (prefixes need at least 4 characters)"),
    (["compare", "0001", "0001", "--chip", "nope"], "error: unknown chip 'nope' (known: chip-a)"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, capsys, args, message):
    code, out, err = cli(capsys, *args, "--db", one_run_db(tmp_path))
    assert code == 2 and err.strip() == message and out == ""


def test_two_runs_of_one_commit_compare_as_a_null_pair_on_real_noise(tmp_path: Path, capsys):
    """`harness run` twice on one commit, then `harness compare RUN1 RUN2`: run 1's trials against run 2's.

    On this shared 2-core machine whole job processes shift by 1.2-4x with the background load (a job's ten
    samples span a few tens of milliseconds, one phase of the load), so the samples of one process say nothing of
    the noise that matters. Judged on those (the old model), this null pair came out "regressed" whenever the
    machine was busy. Judged on the spread between trials (job processes), 1 in 2 clean-clone CI runs still flagged
    it ("regressed" x1.19 [1.04, 1.35]; "improved" x0.87 and x0.80 [0.70, 0.93]): a load that lasts a whole run
    shifts all of its trials alike, and every series with them. With no history floor (2 runs of the commit; a floor
    needs 3) a flag must stand out from the run's common shift: nothing may be flagged, busy or not; "inconclusive"
    is allowed, and a held flag asks for the one base run that gives the floor.
    """
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "T")
    (tmp_path / "suite.toml").write_text(NOISE_SUITE)
    git(tmp_path, "add", "suite.toml")
    git(tmp_path, "commit", "-qm", "noise suite")
    db_file = tmp_path / "harness-out" / "results.db"
    db = f"sqlite:///{db_file}"
    busy = []
    for _ in range(2):
        busy.append(os.getloadavg()[0] / (os.cpu_count() or 1))
        done = run_harness("run", "--suite", "suite.toml", "--no-report", "--db", db, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    busy.append(os.getloadavg()[0] / (os.cpu_count() or 1))
    with sqlite3.connect(db_file) as conn:
        first, second = (r for (r,) in conn.execute("select id from run order by started_at"))
        stored = {(run, variant): median for run, variant, median in
                  conn.execute("select run_id, variant, median_s from job where kind = 'benchmark'")}
    commit = git(tmp_path, "rev-parse", "HEAD")

    code, out, _ = cli(capsys, "compare", commit, commit[:7], "--db", db, "--format", "json")
    pooled = json.loads(out)  # a commit with itself pools both runs on both sides: trivially identical
    assert code == 0 and pooled["counts"]["unchanged"] == 2 and {r["ratio"] for r in pooled["rows"]} == {1.0}
    assert pooled["base"]["runs"] == pooled["head"]["runs"]
    # 2 runs x 4 trials x 10 samples (two series: the plan raises the suite's 3 trials to 4, harness.spec.plan)
    assert all(r["n_base"] == 80 and r["trials_base"] == 8 for r in pooled["rows"])

    code, out, _ = cli(capsys, "compare", first, second, "--db", db, "--format", "json")
    report = json.loads(out)
    rows = report["rows"]
    assert [r["key"]["variant"] for r in sorted(rows, key=lambda r: r["key"]["variant"])] == [
        "flash_bq16_bk32", "sdpa"]
    for row in rows:  # run 1 against run 2, each with its own 4 trials of 10 samples
        assert row["n_base"] == row["n_head"] == 40 and row["trials_base"] == row["trials_head"] == 4
        assert row["base_median"] == pytest.approx(stored[(first, row["key"]["variant"])])
        assert row["head_median"] == pytest.approx(stored[(second, row["key"]["variant"])])
    evidence = [(r["key"]["variant"], r["verdict"], round(r["ratio"], 3), r["ci_low"], r["ci_high"],
                 r["p_adjusted"], r["basis"], r["noise"]) for r in rows]
    print(f"real-noise null pair (load/core {', '.join(f'{b:.2f}' for b in busy)}): {evidence}")
    changed = [r for r in rows if r["verdict"] in ("regressed", "improved")]
    assert not changed and code == report["exit_code"] == 0, evidence
    assert all(r["verdict"] == "inconclusive" for r in rows if r["more_runs_needed"])
    assert {r["more_runs_needed"] for r in rows} <= {0, 1}


def test_a_whole_run_shifted_by_load_is_held_and_a_kernel_that_stands_out_is_not(db_url, capsys):
    """One run a side, no history: the head run's every series x1.19 (a load that lasted the run, as in CI) is held
    as inconclusive with the run's shift and the base runs that settle it; one kernel x1.3 in a run whose other
    series did not move is a regression."""
    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(4)
    add_run(handle, "chip-a", 1, grid_results(rng, trials=4), minutes=0)
    add_run(handle, "chip-a", 2, scaled(grid_results(rng, trials=4), 1.19), minutes=10)
    add_run(handle, "chip-a", 3, grid_results(rng, {("swiglu", "unfused", 1): 1.3}, trials=4), minutes=20)
    handle.close()
    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", db_url, "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["counts"]["regressed"] == report["counts"]["improved"] == 0
    held = [row for row in report["rows"] if row["more_runs_needed"]]
    assert len(held) >= len(report["rows"]) // 2 and all(row["verdict"] == "inconclusive" for row in held)
    assert all(row["more_runs_needed"] == 2 and row["run_shift"] == pytest.approx(1.19, rel=0.03) for row in held)
    code, text, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", db_url)
    assert f"chip-a: {len(held)} change(s) held as inconclusive: one run a side and no history floor, and its " \
           "series moved together by x1.19" in " ".join(text.split()) and "2 more base runs" in text
    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(3), "--db", db_url, "--format", "json")
    (regressed,) = [row for row in json.loads(out)["rows"] if row["verdict"] != "unchanged"]
    assert code == 1 and regressed["verdict"] == "regressed" and regressed["key"]["variant"] == "unfused"


def test_a_held_row_states_the_runs_each_side_really_has(sqlite_url, capsys):
    """Two base runs of one commit, one head run shifted as a whole (x1.19): still held (no floor from 2 runs), and
    the note gives the real counts, not "one run a side"."""
    handle = outbox.open_store(sqlite_url)
    rng = np.random.default_rng(4)
    add_run(handle, "chip-a", 1, grid_results(rng, trials=4), minutes=0)
    add_run(handle, "chip-a", 1, grid_results(rng, trials=4), minutes=5)
    add_run(handle, "chip-a", 2, scaled(grid_results(rng, trials=4), 1.19), minutes=10)
    handle.close()
    code, out, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", sqlite_url, "--format", "json")
    held = [row for row in json.loads(out)["rows"] if row["more_runs_needed"]]
    assert code == 0 and held and all(row["verdict"] == "inconclusive" for row in held)
    _, text, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", sqlite_url)
    text = " ".join(text.split())
    assert f"chip-a: {len(held)} change(s) held as inconclusive: 2 base runs and 1 head run and no history floor" \
           in text and "one run a side" not in text
    assert "1 more base run gives the floor" in text


def test_one_run_against_one_run_hours_apart_is_marked(db_url, capsys):
    """Two single runs: their trials share one session each, so a shift of a whole run is not in the spread the
    verdict uses. 10 minutes apart says nothing; 5 hours apart, compare says so (text and JSON)."""
    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(2)
    add_run(handle, "chip-a", 1, grid_results(rng), minutes=0)
    add_run(handle, "chip-a", 2, grid_results(rng), minutes=10)
    add_run(handle, "chip-a", 3, grid_results(rng), minutes=310)
    handle.close()
    _, near, _ = cli(capsys, "compare", sha_of(1), sha_of(2), "--db", db_url)
    assert "measured" not in near
    _, far, _ = cli(capsys, "compare", sha_of(2), sha_of(3), "--db", db_url)
    assert "chip-a: one side is a single run measured 5.0 h from the other" in far
    _, out, _ = cli(capsys, "compare", sha_of(2), sha_of(3), "--db", db_url, "--format", "json")
    assert json.loads(out)["single_run_hours_apart"] == {"chip-a": pytest.approx(5.0)}


def test_the_end_of_a_run_lists_a_doubling_its_base_runs_spread_too_wide_to_tell(db_url, capsys):
    """Three base runs x3.5, x1.8 and x1 (a loaded machine), then a run at x6: the history floor's 2 df cannot make
    it significant. It is inconclusive with its noise and what would settle it, never "unchanged" (as in CI)."""
    from harness.cli.run import _print_verdicts

    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(5)
    for minutes, scale in ((0, 3.5), (10, 1.8), (20, 1.0)):
        results = scaled(grid_results(rng, trials=4), scale)
        store.finish_run(handle, add_run(handle, "chip-a", 1, results, minutes=minutes), "passed")
    head = add_run(handle, "chip-a", 2, scaled(grid_results(rng, trials=4), 6.0), minutes=30)
    handle.close()
    capsys.readouterr()
    _print_verdicts(db_url, head, sha_of(2))
    text = " ".join(capsys.readouterr().out.split())  # the end of a run's results: on stdout
    assert "unchanged" not in text and "regressed" not in text and "held" not in text, text
    assert "inconclusive swiglu/" in text, text
    assert "(history); to settle: more base runs (the spread between runs decides" in text, text


def loaded_run(rng: np.random.Generator) -> list:
    """``grid_results`` of identical code as a loaded 2-core machine gives them (testkit.load's random busy loops):
    the whole run shifted (sd 10 %) and each series in it once more (sd 5 %: a busy phase over its jobs)."""
    results = scaled(grid_results(rng, trials=4), float(np.exp(rng.normal(0.0, 0.10))))
    factors: dict = {}
    for job, result in results:
        factor = factors.setdefault(job.key, float(np.exp(rng.normal(0.0, 0.05))))
        result.samples = [seconds * factor for seconds in result.samples]
    return results


def test_two_base_runs_and_one_head_run_of_identical_code_under_load_flag_nothing(db_url, capsys):
    """A second base run of one commit is no measure of the between-run noise (a floor needs 3 runs): in CI it
    turned the hold off, and `compare BASE HEAD` called an untouched kernel "improved" x0.808 [0.678, 0.964]. With
    1, 2 or 3 base runs a series' run-level shift is measured (floor) or its flag held."""
    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(39)
    for pair in range(6):  # six comparisons: base commit 2p+1 run twice, head commit 2p+2 once
        for minutes in (0, 10):
            store.finish_run(handle, add_run(handle, "chip-a", 2 * pair + 1, loaded_run(rng),
                                             minutes=100 * pair + minutes), "passed")
        store.finish_run(handle, add_run(handle, "chip-a", 2 * pair + 2, loaded_run(rng), minutes=100 * pair + 20),
                         "passed")
    handle.close()
    flagged, held, codes = [], 0, set()
    for pair in range(6):
        code, out, _ = cli(capsys, "compare", sha_of(2 * pair + 1), sha_of(2 * pair + 2), "--db", db_url,
                           "--format", "json")
        rows = json.loads(out)["rows"]
        assert {(r["trials_base"], r["trials_head"]) for r in rows} == {(8, 4)}  # two base runs, one head run
        flagged += [(r["key"]["variant"], r["verdict"], round(r["ratio"], 3)) for r in rows
                    if r["verdict"] in ("regressed", "improved")]
        held += sum(r["more_runs_needed"] == 1 for r in rows)
        codes.add(code)
    assert not flagged and held and codes == {0}, flagged
