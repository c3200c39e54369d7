"""Analysis on SQLite and PostgreSQL: planted regressions, gating, variant verdicts, history, the regression list."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from harness.analysis import regressions as regressions_module
from harness.analysis.cache import analyse
from harness.analysis.compare import compare, resolve_side
from harness.analysis.history import history
from harness.analysis.regressions import regressions
from harness.analysis.variants import tuning_drift, variant_matrix
from harness.core import defaults
from harness.core.errors import HarnessError
from harness.core.status import CODE_FAILURES
from harness.record import outbox, query, store
from harness.record.query import SeriesKey
from harness.stats import runshift, trials
from testkit.analysis import add_run, checks, grid_results, sha_of
from testkit.pg import scratch_database

SLOW_SERIES = ("swiglu", "fused_gateup", 1)
SLOW_KEY = SeriesKey("swiglu", "fused_gateup", "float32", "B=1,D=32,H=1,S=128", "chip-a")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def history_store(request, tmp_path_factory):
    """One history database per backend, shared (read-only) by the history and regression tests."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'results.db'}"
        else:
            url = stack.enter_context(scratch_database(request.getfixturevalue("pg_server")))
        handle = outbox.open_store(url)
        history_db(handle)
        yield handle
        handle.close()


def two_commits(db, head_factors=None, head_statuses=None, seed=1):
    """Commit 1 and commit 2 on both chips; head factors / correctness statuses apply to chip A only."""
    rng = np.random.default_rng(seed)
    for chip in ("chip-a", "chip-b"):
        add_run(db, chip, 1, grid_results(rng) + checks(), minutes=0)
    for chip in ("chip-a", "chip-b"):
        on_a = chip == "chip-a"
        add_run(db, chip, 2, grid_results(rng, head_factors if on_a else None)
                + checks(head_statuses if on_a else None), minutes=10)


def test_a_planted_regression_is_the_only_change_and_fails_the_compare(db):
    two_commits(db, head_factors={SLOW_SERIES: 1.10})
    report = compare(db, sha_of(1), sha_of(2))
    assert len(report.rows) == 16 and report.only_base == report.only_head == 0
    flagged = [row for row in report.rows if row.verdict in ("regressed", "improved")]
    assert [(row.key, row.verdict) for row in flagged] == [(SLOW_KEY, "regressed")]
    (row,) = flagged
    assert 1.05 < row.ratio < 1.15 and row.ci_low > 1.02 and row.p_adjusted < 0.05
    assert row.n_base == row.n_head == 30 and row.trials_base == row.trials_head == 3
    assert report.rows[0] == row  # changes first
    assert report.counts["regressed"] == 1 and sum(report.counts.values()) == 16
    assert report.exit_code == 1 and not report.correctness_failures
    json.dumps(report.to_dict(), allow_nan=False)
    assert report.to_dict()["exit_code"] == 1 and report.to_dict()["rows"][0]["key"]["chip"] == "chip-a"


def test_a_null_commit_pair_is_unchanged(db):
    two_commits(db)
    report = compare(db, sha_of(1)[:8], sha_of(2)[:8])
    assert report.counts["regressed"] == report.counts["improved"] == report.counts["broken"] == 0
    assert report.counts["unchanged"] >= 14 and report.exit_code == 0


def test_loaded_histories_are_reloaded_when_the_database_changes(db):
    two_commits(db)
    assert {len(h.points) for h in history(db, "chip-b", change_points=False)} == {2}
    add_run(db, "chip-b", 3, grid_results(np.random.default_rng(9)), minutes=20)
    assert {len(h.points) for h in history(db, "chip-b", change_points=False)} == {3}


def test_a_correctness_failure_breaks_that_kernel_on_that_chip_only(db):
    # The slowdown would be a regression, but flash_prefill is wrong on chip A in head: no timing verdict there.
    two_commits(db, head_factors={("flash_prefill", "flash_bq16_bk32", 0): 1.3},
                head_statuses={("flash_prefill", "flash_bq16_bk32"): "failed"})
    report = compare(db, sha_of(1), sha_of(2))
    verdicts = {row.key: row.verdict for row in report.rows}
    broken = {key for key, verdict in verdicts.items() if verdict == "broken"}
    assert broken == {key for key in verdicts if key.kernel == "flash_prefill" and key.chip == "chip-a"}
    assert len(broken) == 4
    assert all(verdicts[key] not in ("broken", "regressed") for key in verdicts if key.chip == "chip-b")
    (failure,) = report.correctness_failures
    assert (failure.chip, failure.kernel, failure.variant, failure.check, failure.status) == (
        "chip-a", "flash_prefill", "flash_bq16_bk32", "reference", "failed")
    assert "tolerance" in failure.detail and failure.sha == sha_of(2)
    assert report.exit_code == 1 and report.counts["regressed"] == 0
    only_b = compare(db, sha_of(1), sha_of(2), chip="chip-b")
    assert only_b.exit_code == 0 and not only_b.correctness_failures and {r.key.chip for r in only_b.rows} == {
        "chip-b"}


def test_sides_resolve_commits_prefixes_and_runs(db):
    rng = np.random.default_rng(0)
    first = add_run(db, "chip-a", 1, grid_results(rng), minutes=0)
    second = add_run(db, "chip-a", 1, grid_results(rng), minutes=1)
    add_run(db, "chip-b", 1, grid_results(rng), minutes=2, dirty=True)
    side = resolve_side(db, sha_of(1)[:6])
    assert side.kind == "commit" and side.sha == sha_of(1) and side.runs == {"chip-a": (first, second),
                                                                             "chip-b": side.runs["chip-b"]}
    assert side.dirty_runs == 1 and len(side.run_ids) == 3
    assert resolve_side(db, sha_of(1), chip="chip-a").runs == {"chip-a": (first, second)}
    run_side = resolve_side(db, second)
    assert run_side.kind == "run" and run_side.runs == {"chip-a": (second,)} and run_side.sha == sha_of(1)
    assert resolve_side(db, second[:10]).runs == {"chip-a": (second,)}
    # pooled: commit vs itself is trivially identical; run vs run compares the runs
    same = compare(db, sha_of(1), sha_of(1), chip="chip-a")
    assert {row.ratio for row in same.rows} == {1.0} and same.counts["unchanged"] == 8
    runs = compare(db, first, second)
    assert len(runs.rows) == 8 and all(row.n_base == row.n_head == 30 and row.trials_base == row.trials_head == 3
                                       for row in runs.rows)
    add_run(db, "chip-a", 0xABCD, [], minutes=3, linked=False)  # sha abcdc0ffee..., shares no prefix with 0001c0ffee
    with pytest.raises(HarnessError, match="no commit or run 'deadbeef'"):
        resolve_side(db, "deadbeef")
    with pytest.raises(HarnessError, match="commit abcdc0ffeec0 has no runs on chip 'chip-b'"):
        resolve_side(db, "abcd", chip="chip-b")
    with pytest.raises(HarnessError, match="unknown chip 'chip-z'"):
        resolve_side(db, sha_of(1), chip="chip-z")
    with pytest.raises(HarnessError, match="not 'chip-b'"):
        resolve_side(db, first, chip="chip-b")


def test_prefixes_shared_by_two_commits_are_ambiguous(db):
    add_run(db, "chip-a", 0x12340, [], minutes=0, linked=False)
    add_run(db, "chip-a", 0x12341, [], minutes=1, linked=False)
    with pytest.raises(HarnessError, match="'1234' is ambiguous: commit 12340c0ffeec, commit 12341c0ffeec"):
        resolve_side(db, "1234")
    assert resolve_side(db, "12341").sha == sha_of(0x12341)
    with pytest.raises(HarnessError, match="at least 4 characters"):
        resolve_side(db, "123")


def test_a_commit_stored_without_runs_does_not_make_a_prefix_ambiguous(db):
    """Ancestry stores the commits between run commits, with no runs: a prefix still names the one that ran."""
    add_run(db, "chip-a", 0x56780, [], minutes=0, linked=False)
    with db.session() as session:
        store.get_or_create_commit(session, sha_of(0x56781))
    assert resolve_side(db, "5678").sha == sha_of(0x56780)
    with pytest.raises(HarnessError, match="commit 56781c0ffeec has no runs"):
        resolve_side(db, "56781")


def variant_runs(db, commit: int, minutes: float, factors: dict[str, float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for chip, factor in factors.items():
        add_run(db, chip, commit, grid_results(rng, {("flash_prefill", "flash_bq16_bk32", 0): factor})
                + checks(), minutes=minutes)


def test_a_variant_winning_on_one_chip_and_losing_on_another_is_divergent(db):
    variant_runs(db, 1, 0, {"chip-a": 0.8, "chip-b": 1.25}, seed=3)
    matrix = variant_matrix(db)
    assert set(matrix.runs) == {"chip-a", "chip-b"} and set(matrix.shas.values()) == {sha_of(1)}
    assert len(matrix.cells) == 8  # 2 kernels x 1 non-default variant x 2 shapes x 2 chips
    (divergent,) = matrix.divergent
    assert (divergent.kernel, divergent.variant, divergent.dtype, divergent.shape_key) == (
        "flash_prefill", "flash_bq16_bk32", "float32", "B=1,D=32,H=1,S=64")
    assert (divergent.winning_chip, divergent.losing_chip) == ("chip-a", "chip-b")
    assert divergent.win.outcome == "win" and 0.75 < divergent.win.ratio < 0.85 and divergent.win.ci_high < 0.98
    assert divergent.lose.outcome == "lose" and 1.18 < divergent.lose.ratio < 1.32 and divergent.lose.ci_low > 1.02
    assert divergent.win.default_variant == "sdpa" and divergent.win.p_adjusted < 0.05
    assert matrix.best_for("flash_prefill", "float32", "B=1,D=32,H=1,S=64", "chip-a") == "flash_bq16_bk32"
    assert matrix.best_for("flash_prefill", "float32", "B=1,D=32,H=1,S=64", "chip-b") == "sdpa"
    assert matrix.best_for("swiglu", "float32", "B=1,D=32,H=1,S=128", "chip-b") == "unfused"
    best_a = [b for b in matrix.best if b.chip == "chip-a" and b.variant == "flash_bq16_bk32"]
    assert len(best_a) == 1 and best_a[0].evidence == divergent.win
    json.dumps(matrix.to_dict(), allow_nan=False)


def test_a_variant_whose_correctness_failed_is_broken_not_a_winner(db):
    rng = np.random.default_rng(4)
    add_run(db, "chip-a", 1, grid_results(rng, {("flash_prefill", "flash_bq16_bk32", 0): 0.8})
            + checks({("flash_prefill", "flash_bq16_bk32"): "crashed"}), minutes=0)
    matrix = variant_matrix(db, commit=sha_of(1))
    outcomes = {(c.kernel, c.shape_key): c.outcome for c in matrix.cells}
    assert outcomes[("flash_prefill", "B=1,D=32,H=1,S=64")] == "broken"
    assert outcomes[("flash_prefill", "B=1,D=32,H=1,S=128")] == "broken"
    assert {b.variant for b in matrix.best if b.kernel == "flash_prefill"} == {"sdpa"}
    assert len(matrix.correctness_failures) == 1


def test_tuning_drift_names_the_changed_best_variant_with_evidence(db):
    variant_runs(db, 1, 0, {"chip-a": 0.8, "chip-b": 1.0}, seed=5)
    variant_runs(db, 2, 10, {"chip-a": 1.0, "chip-b": 1.0}, seed=6)
    assert variant_matrix(db).shas == {"chip-a": sha_of(2), "chip-b": sha_of(2)}  # latest runs
    (drift,) = tuning_drift(db, sha_of(1), sha_of(2))
    assert (drift.kernel, drift.chip, drift.shape_key, drift.before, drift.after) == (
        "flash_prefill", "chip-a", "B=1,D=32,H=1,S=64", "flash_bq16_bk32", "sdpa")
    assert drift.before_evidence.outcome == "win" and drift.after_evidence is None
    json.dumps(drift.to_dict(), allow_nan=False)


STEP_AT = 7


def history_db(db, commits: int = 14, broken_at=(10, 11), seed: int = 7):
    """``commits`` commits on chip A, inserted in shuffled order; flash_prefill/sdpa shape 0 is 25 % slower from
    STEP_AT on; flash_prefill/flash_bq16_bk32 fails correctness at ``broken_at``; a dirty run of the last commit
    is 3x slower and must not count."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(commits)
    for i in order.tolist():
        factors = {("flash_prefill", "sdpa", 0): 1.25} if i >= STEP_AT else {}
        statuses = {("flash_prefill", "flash_bq16_bk32"): "failed"} if i in broken_at else {}
        add_run(db, "chip-a", i, grid_results(rng, factors) + checks(statuses), minutes=10 * i)
    add_run(db, "chip-a", commits - 1, grid_results(rng, {(k, v, s): 3.0 for k in ("swiglu", "flash_prefill")
                                                          for v in ("sdpa", "unfused") for s in (0, 1)}),
            minutes=10 * commits, dirty=True)
    # Commit 3 is run twice: its samples pool (20 per series).
    add_run(db, "chip-a", 3, grid_results(rng), minutes=10 * 3 + 1)


def trials_by_cell(db, chip: str) -> dict[tuple[str, SeriesKey], list[tuple[str, np.ndarray]]]:
    """Straight from the database: (commit sha, series) -> [(run id, samples)] per (run, trial), runs in start order."""
    from sqlalchemy import select

    from harness.record.models import Chip, Commit, JobRecord, Run, Sample

    with db.session() as session:
        rows = session.execute(
            select(Commit.sha, JobRecord.kernel, JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, Run.id,
                   Sample.trial, Sample.seconds)
            .select_from(Sample).join(JobRecord).join(Run).join(Chip).join(Commit)
            .where(Chip.key == chip, Run.dirty.is_(False), JobRecord.kind == "benchmark")
            .order_by(Run.started_at, Run.id, Sample.trial, Sample.idx)).all()
    grouped: dict[tuple[str, SeriesKey], dict[tuple[str, int], list[float]]] = {}
    for sha, kernel, variant, dtype, shape_key, run_id, trial, seconds in rows:
        cell = grouped.setdefault((sha, SeriesKey(kernel, variant, dtype, shape_key, chip)), {})
        cell.setdefault((run_id, trial), []).append(seconds)
    return {cell: [(run_id, np.array(values)) for (run_id, _), values in trials_of.items()]
            for cell, trials_of in grouped.items()}


def test_chip_history_groups_each_cell_by_run_and_trial(history_store):
    data = query.chip_history(history_store, "chip-a")
    expected = trials_by_cell(history_store, "chip-a")
    medians = data.trial_medians()
    n_series = len(data.series)
    assert len(expected) == int((data.counts > 0).sum()) == 14 * 8
    for (sha, key), want in expected.items():
        cell = [c[1] for c in data.commits].index(sha) * n_series + data.series.index(key)
        got = data.trials(cell)
        assert [g.tolist() for g in got] == [sorted(values.tolist()) for _, values in want]
        first, count = int(data.trial_offsets.ravel()[cell]), int(data.trial_counts.ravel()[cell])
        assert medians[first:first + count].tolist() == [float(np.median(values)) for _, values in want]
        runs = data.trial_runs[first:first + count]
        assert np.all(np.diff(runs) >= 0) and len(set(runs.tolist())) == len({run for run, _ in want})
        assert data.samples(cell).tolist() == sorted(np.concatenate([values for _, values in want]).tolist())
        assert count == (6 if sha == sha_of(3) else 3)  # commit 3 ran twice: two runs of three trials
    assert np.array_equal(data.trial_cells(), np.repeat(np.arange(data.counts.size), data.trial_counts.ravel()))


def test_history_orders_commits_by_first_run_pools_runs_and_flags_the_step(history_store):
    db = history_store
    histories = history(db, "chip-a")
    assert len(histories) == 8 and all(h.key.chip == "chip-a" for h in histories)
    by_key = {h.key: h for h in histories}
    stepped = by_key[SeriesKey("flash_prefill", "sdpa", "float32", "B=1,D=32,H=1,S=64", "chip-a")]
    assert [p.sha for p in stepped.points] == [sha_of(i) for i in range(14)]
    assert [p.n for p in stepped.points] == [30, 30, 30, 60] + [30] * 10
    point = stepped.points[0]
    assert point.ci_low < point.median < point.ci_high and point.message == "commit 0" and point.branch == "main"
    assert 0.9e-3 < point.median < 1.1e-3 and point.started_at is not None
    # A point is the median of its trials' medians (one per process, over all its runs), its interval their range
    by_cell = trials_by_cell(db, "chip-a")
    for i in (0, 3):
        medians = [float(np.median(values)) for _, values in by_cell[(sha_of(i), stepped.key)]]
        assert stepped.points[i].median == pytest.approx(float(np.median(medians)), rel=1e-12)
    medians = [float(np.median(values)) for _, values in by_cell[(sha_of(0), stepped.key)]]
    assert (point.ci_low, point.ci_high) == (min(medians), max(medians))
    (flag,) = stepped.change_points
    assert (flag.kind, flag.index, flag.sha) == ("step", STEP_AT, sha_of(STEP_AT)) and 1.2 < flag.ratio < 1.3
    flat = by_key[SeriesKey("swiglu", "unfused", "float32", "B=1,D=32,H=1,S=128", "chip-a")]
    assert flat.change_points == () and max(p.median for p in flat.points) < 2.3e-3  # dirty run left out
    with_dirty = history(db, "chip-a", kernel="swiglu", include_dirty=True, change_points=False)
    assert {h.key.kernel for h in with_dirty} == {"swiglu"} and len(with_dirty) == 4
    assert max(p.median for h in with_dirty for p in h.points) > 2.5e-3
    json.dumps([h.to_dict() for h in histories], allow_nan=False)
    recent = history(db, "chip-a", last=5, change_points=False)
    assert {tuple(p.sha for p in h.points) for h in recent} == {tuple(sha_of(i) for i in range(9, 14))}
    with pytest.raises(HarnessError, match="unknown chip"):
        history(db, "nope")


def _commit_order_and_failures(db, chip: str) -> tuple[list[str], set[tuple[str, str]]]:
    from sqlalchemy import select

    from harness.record.models import Chip, Commit, JobRecord, Run

    with db.session() as session:
        rows = session.execute(
            select(Commit.sha, JobRecord.kernel, JobRecord.status, JobRecord.kind, Run.started_at)
            .select_from(JobRecord).join(Run).join(Chip).join(Commit)
            .where(Chip.key == chip, Run.dirty.is_(False))).all()
    first: dict[str, object] = {}
    failing: set[tuple[str, str]] = set()
    for sha, kernel, status, kind, started in rows:
        first[sha] = min(first.get(sha, started), started)
        if kind == "correctness" and status in CODE_FAILURES:
            failing.add((sha, kernel))
    return sorted(first, key=lambda sha: first[sha]), failing


def brute_force_regressions(db, chip: str) -> list[tuple]:
    """compare_trials of every commit against each series' previous point, straight from the database in time order:
    each side's trials per (run, trial), the floor from the series' newest HISTORY_RUNS runs before the base (a
    run's level: exp(mean log trial median)), BH across the commit's grid, failing kernels broken, flags of single
    runs without a floor held unless they stand out from the commit's common shift."""
    order, failing = _commit_order_and_failures(db, chip)
    cells = trials_by_cell(db, chip)
    found = []
    for at, (before, after) in enumerate(zip(order, order[1:], strict=False)):
        keys = [key for sha, key in cells if sha == after and (before, key) in cells]
        floors, runs, history_runs = {}, {}, {}
        for key in keys:
            levels = []
            for sha in reversed(order[:at]):  # the points before the base, newest first
                per_run: dict[str, list[float]] = {}
                for run_id, values in cells.get((sha, key), []):
                    per_run.setdefault(run_id, []).append(float(np.log(np.median(values))))
                levels.extend(float(np.exp(np.mean(logs))) for logs in reversed(per_run.values()))
            floor = runshift.history_floor(levels[:defaults.HISTORY_RUNS])
            history_runs[key] = len(levels[:defaults.HISTORY_RUNS])
            if floor is not None:
                floors[key] = floor
            runs[key] = tuple(len({run for run, _ in cells[(sha, key)]}) for sha in (before, after))
        pairs = {key: ([v for _, v in cells[(before, key)]], [v for _, v in cells[(after, key)]]) for key in keys}
        broken = {key for key in keys if (after, key.kernel) in failing}
        for key, c in trials.compare_trials(pairs, floors=floors, runs=runs, broken=broken, separate_runs=True,
                                            history_runs=history_runs).items():
            if c.verdict == "regressed":
                found.append((key, before, after, c.ratio, c.ci_low, c.ci_high, c.p_adjusted))
    return sorted(found, key=lambda item: (item[2], item[0]))


def pooled_sample_regressions(db, chip: str) -> list[tuple]:
    """A rule of one process's samples: Mann-Whitney of every commit's pooled samples against the previous commit's,
    BH across the commit's grid, a slower median (a superset of what the old rule, which also asked for a bootstrap
    interval beyond the band, flagged)."""
    from scipy import stats as scipy_stats

    order, _ = _commit_order_and_failures(db, chip)
    pooled = {cell: np.concatenate([values for _, values in per_trial])
              for cell, per_trial in trials_by_cell(db, chip).items()}
    found = []
    for before, after in zip(order, order[1:], strict=False):
        pairs = {key: (pooled[(before, key)], values) for (sha, key), values in pooled.items()
                 if sha == after and (before, key) in pooled}
        if not pairs:
            continue
        keys = list(pairs)
        p_values = [scipy_stats.mannwhitneyu(pairs[k][1], pairs[k][0], alternative="two-sided").pvalue for k in keys]
        adjusted = scipy_stats.false_discovery_control(p_values)
        found.extend((key, before, after) for key, p in zip(keys, adjusted, strict=True)
                     if p < 0.05 and np.median(pairs[key][1]) > np.median(pairs[key][0]))
    return found


def same_regressions(got: list[tuple], expected: list[tuple]) -> bool:
    """Same series and commits, the same numbers up to the order of floating-point sums."""
    return len(got) == len(expected) and all(
        g[:3] == e[:3] and g[3:] == pytest.approx(e[3:], rel=1e-9) for g, e in zip(got, expected, strict=True))


def test_regressions_match_compare_trials_and_list_new_correctness_failures_first(history_store):
    db = history_store
    found = regressions(db)
    correctness = [e for e in found if e.kind == "correctness"]
    performance = [e for e in found if e.kind == "performance"]
    assert found == correctness + performance
    (failure,) = correctness  # failing at commits 10 and 11: listed once, at 10
    assert (failure.head_sha, failure.base_sha, failure.kernel, failure.variant, failure.status) == (
        sha_of(10), sha_of(9), "flash_prefill", "flash_bq16_bk32", "failed")
    got = sorted(((e.key, e.base_sha, e.head_sha, e.ratio, e.ci_low, e.ci_high, e.p_adjusted) for e in performance),
                 key=lambda item: (item[2], item[0]))
    assert same_regressions(got, brute_force_regressions(db, "chip-a"))
    step = [e for e in performance if e.head_sha == sha_of(STEP_AT)]
    assert [(e.kernel, e.variant, e.shape_key) for e in step] == [("flash_prefill", "sdpa", "B=1,D=32,H=1,S=64")]
    (e,) = step
    assert 1.2 < e.ratio < 1.3 and e.ci_low > 1.02 and e.p_adjusted < 0.05 and e.base_sha == sha_of(6)
    # 3 trials of 10 samples a side; six earlier runs give the series a history floor, which decides here
    assert e.n_base == e.n_head == 30 and e.trials_base == e.trials_head == 3
    assert e.basis == "history" and 0 < e.noise < 0.05 and 0 < e.detectable < 0.2
    assert e.base_median == pytest.approx(1e-3, rel=0.05) and e.head_median == pytest.approx(1.25e-3, rel=0.05)
    assert regressions(db, chip="chip-a") == found
    window = regressions(db, "chip-a", last=STEP_AT)  # commits 7..13, judged against 6..12
    assert window == [e for e in found if e.head_sha >= sha_of(STEP_AT)]
    assert [e for e in regressions(db, last=3) if e.kind == "performance"] == [
        e for e in performance if e.head_sha >= sha_of(11)]
    json.dumps([e.to_dict() for e in found], allow_nan=False)


def noisy_many_change_history(db, chip: str = "chip-b", commits: int = 10, seed: int = 11) -> None:
    """Commits with random changes of all sizes, 1 to 3 trials a job (1 at the first two commits: no spread to go
    on), 6 or 10 samples a trial."""
    rng = np.random.default_rng(seed)
    for i in range(commits):
        factors = {(k, v, s): float(np.exp(rng.normal(0, 0.15))) for k, v in
                   (("flash_prefill", "sdpa"), ("swiglu", "unfused"), ("swiglu", "fused_gateup")) for s in (0, 1)}
        add_run(db, chip, i, grid_results(rng, factors, n=int(rng.choice([6, 10])), cv=0.03,
                                          trials=1 if i < 2 else int(rng.choice([1, 2, 3]))), minutes=i)


def test_regressions_screen_agrees_with_compare_trials_on_a_noisy_many_change_grid(db):
    """Many commits with random changes of all sizes: the screen must not lose a confirmed regression. (Seed 14:
    without a floor every flag must stand out from the scatter of its run's other series, which change too; this
    seed confirms 4, the default 1.)"""
    noisy_many_change_history(db, seed=14)
    performance = [e for e in regressions(db, "chip-b") if e.kind == "performance"]
    expected = brute_force_regressions(db, "chip-b")
    assert len(expected) >= 3
    assert {e.basis for e in performance} == {"trials", "history"}
    assert same_regressions(sorted(((e.key, e.base_sha, e.head_sha, e.ratio, e.ci_low, e.ci_high, e.p_adjusted)
                                    for e in performance), key=lambda item: (item[2], item[0])), expected)


def test_the_screen_computes_the_very_p_values_of_compare_trials(db):
    """Every commit's whole grid through compare_trials: the screen's adjusted p-values and intervals are the same."""
    noisy_many_change_history(db)
    data = query.chip_history(db, "chip-b")
    judged = regressions_module._judge(data, set(), alpha=0.05)
    bases = set()
    for commit in np.unique(judged.pairs.head_commit).tolist():
        for i, c in judged.family(commit, min_effect=0.02, alpha=0.05).items():
            bases.add(c.basis)
            if c.basis == "none":
                assert np.isnan(judged.screened.p_adjusted[i])
            else:
                assert judged.screened.p_adjusted[i] == pytest.approx(c.p_adjusted, rel=1e-9)
                assert judged.screened.ci_low[i] == pytest.approx(c.ci_low, rel=1e-9)
    assert bases == {"trials", "history", "none"}


def test_between_process_noise_is_not_a_regression_but_a_step_is(db):
    """Each trial at its own level (4 % between processes, 0.3 % within): the old rule, Mann-Whitney + bootstrap on
    the pooled samples, calls identical code regressed at several commits; trials do not, and a planted 30 % step is
    still listed."""
    rng = np.random.default_rng(0)
    for i in range(12):
        add_run(db, "chip-a", i, grid_results(rng, {SLOW_SERIES: 1.3} if i >= 10 else {}, cv=0.003, between=0.04)
                + checks(), minutes=10 * i)
    performance = [e for e in regressions(db, "chip-a") if e.kind == "performance"]
    assert [(e.key, e.base_sha, e.head_sha) for e in performance] == [(SLOW_KEY, sha_of(9), sha_of(10))]
    (step,) = performance
    assert 1.2 < step.ratio < 1.45 and step.ci_low > 1.02 and step.p_adjusted < 0.05
    assert step.basis in ("trials", "history") and step.trials_base == step.trials_head == 3
    assert step.n_base == step.n_head == 30
    old_rule = pooled_sample_regressions(db, "chip-a")
    false_alarms = [found for found in old_rule if found != (SLOW_KEY, sha_of(9), sha_of(10))]
    assert len(false_alarms) >= 5


def _timed_as(results, mode: str):
    for _, result in results:
        result.mode = mode
    return results


def test_a_change_of_timing_mode_is_never_listed_as_a_regression(db):
    """Per-call timing adds the host round trip: a series timed per-call at one commit and pipelined at the next
    looks 30 % slower or faster with no change in the kernel. The regression list, like ``harness compare``, must
    not call that regressed (it did: 10 'confirmed slowdowns' between the H200 example runs)."""
    rng = np.random.default_rng(3)
    add_run(db, "chip-a", 0, _timed_as(grid_results(rng), "pipelined") + checks(), minutes=0)
    add_run(db, "chip-a", 1, _timed_as(grid_results(rng, {SLOW_SERIES: 1.3}), "per-call") + checks(), minutes=10)
    assert [e for e in regressions(db, "chip-a") if e.kind == "performance"] == []
    _, cached, _ = analyse(db, ["chip-a"])  # the report's path (the analysis cache) judges alike
    assert [e for e in cached if e.kind == "performance"] == []
    add_run(db, "chip-a", 2, _timed_as(grid_results(rng), "per-call") + checks(), minutes=20)
    add_run(db, "chip-a", 3, _timed_as(grid_results(rng, {SLOW_SERIES: 1.3}), "per-call") + checks(), minutes=30)
    found = [(e.key, e.base_sha, e.head_sha) for e in regressions(db, "chip-a") if e.kind == "performance"]
    assert found == [(SLOW_KEY, sha_of(2), sha_of(3))]  # alike on both sides: still judged
