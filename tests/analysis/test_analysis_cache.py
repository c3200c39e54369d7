"""The report's analysis cache (harness.analysis.cache) on SQLite and PostgreSQL: with the cache, cold or warm, the
histories and the regression list are those computed from the samples alone, bit for bit; a new run recomputes
its commit and chip only; new, deleted, reaped, re-dated, dirtied runs, a later trial of a stored job and imported
bundles invalidate what they touch; corrupted or missing rows are recomputed; a cache written by another process
renders the same pages."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError

from harness.analysis import cache, site_evidence, site_inputs
from harness.analysis.history import detect_many
from harness.core.job import JobResult
from harness.pipeline import report
from harness.record import analysis_cache, bundle, outbox, query, store
from harness.record.models import AnalysisCache, Chip, Commit, Run, Sample
from harness.stats import changepoints, policy
from testkit.analysis import add_run, bench_job, checks, grid_results, sha_of, timings
from testkit.migrations import downgraded
from testkit.paths import ROOT
from testkit.sql import TableRows, captured_statements, copy_rows, job_read_plan, table_rows

CHIPS = ("chip-a", "chip-b")
STEP_AT = 7


@pytest.fixture
def sqlite_db(sqlite_url):
    handle = outbox.open_store(sqlite_url)
    yield handle
    handle.close()


def finished(db: store.Store, run_id: str) -> str:
    store.finish_run(db, run_id, "complete")
    return run_id


_BUILT: dict[tuple[str, int], TableRows] = {}  # (backend, commits) -> what ``build`` wrote, copied from then on


def build(db: store.Store, commits: int = 12) -> None:
    """Two chips; on chip A a 25 % step at STEP_AT in one series and a kernel failing correctness at two commits;
    1 to 3 trials a job; commit 3 run twice on chip A; a dirty run on chip B. Every run finished.

    Written through the record path once per backend and size in a test process, then copied row for row (the
    same database, 5-10x faster: the suite's time)."""
    key = (db.engine.dialect.name, commits)
    if key in _BUILT:
        copy_rows(db, _BUILT[key])
        return
    _write(db, commits)
    _BUILT[key] = table_rows(db)


def _write(db: store.Store, commits: int) -> None:
    rng = np.random.default_rng(5)
    for i in range(commits):
        factors = {("flash_prefill", "sdpa", 0): 1.25} if i >= STEP_AT else {}
        failing = {("flash_prefill", "flash_bq16_bk32"): "failed"} if i in (8, 9) else None
        add_run(db, "chip-a", i, grid_results(rng, factors, trials=1 + i % 3) + checks(failing), minutes=10 * i)
        add_run(db, "chip-b", i, grid_results(rng, trials=3) + checks(), minutes=10 * i + 1)
    add_run(db, "chip-a", 3, grid_results(rng), minutes=35)
    add_run(db, "chip-b", 5, grid_results(rng, {("swiglu", "unfused", 1): 1.5}), minutes=56, dirty=True)
    with db.session() as session:
        session.execute(update(Run).values(finished_at=Run.started_at, status="complete"))


def analysed(db: store.Store, **options) -> tuple[str, str, cache.CacheStats]:
    histories, regressions, found = cache.analyse(db, query.chip_keys(db), **options)
    return repr(histories), repr(regressions), found  # repr: nan == nan, every float to the last bit


def assert_same_as_uncached(db: store.Store, **options) -> cache.CacheStats:
    """The cached analysis (run twice: as found, then warm) equals the uncached one; the first run's stats."""
    query.history._CACHE.clear()  # its in-process key misses a trial appended to a stored job: read the samples again
    plain = analysed(db, use_cache=False, **options)[:2]
    first = analysed(db, **options)
    assert first[:2] == plain
    warm = analysed(db, **options)
    assert warm[:2] == plain
    for chip in query.chip_keys(db):
        assert warm[2].cells[chip][1] == 0 and warm[2].families[chip][1] == 0
        if options.get("change_points", True):
            assert warm[2].changes[chip][1] == 0
    return first[2]


def test_detect_many_is_detect_change_points():
    rng = np.random.default_rng(3)
    histories = []
    for n in (0, 3, 5, 6, 7, 12, 40, 40, 40, 120, 300, 700):
        for _ in range(3):
            values = np.exp(rng.normal(0.0, rng.choice([1e-4, 0.01, 0.05]), n))
            if n > 10:
                at = int(rng.integers(3, n - 3))
                values[at:] *= rng.choice([1.0, 1.1, 1.3, 0.7])
                start = int(rng.integers(0, n - 9))
                values[start:start + 9] *= np.linspace(1.0, rng.choice([1.0, 1.2]), 9)
                values[rng.integers(0, n, 2)] = rng.choice([np.nan, 0.0, -1.0, np.inf])
            histories.append(values)
    ramp = np.r_[np.ones(20), np.linspace(1.0, 1.5, 20), np.full(20, 1.5)]
    histories += [np.ones(30), np.full(30, 2e-3), np.r_[np.ones(15), 1.5 * np.ones(15)],
                  ramp * np.exp(rng.normal(0.0, 0.005, ramp.size))]
    for min_effect, alpha in ((policy.DEFAULT_MIN_EFFECT, policy.DEFAULT_ALPHA), (0.05, 0.01)):
        expected = [changepoints.detect_change_points(h, min_effect=min_effect, alpha=alpha) for h in histories]
        assert detect_many(histories, min_effect=min_effect, alpha=alpha) == expected
    assert sum(len(found) for found in expected) >= 10 and {cp.kind for f in expected for cp in f} == {"step",
                                                                                                       "drift"}


def test_cached_analysis_is_the_uncached_one_cold_and_warm(db):
    build(db)
    first = assert_same_as_uncached(db)
    assert first.cells == {"chip-a": (0, 12), "chip-b": (0, 12)} and first.write_errors == 0
    histories, regressions, _ = cache.analyse(db, CHIPS)
    stepped = [h for h in histories["chip-a"] if h.key.variant == "sdpa" and h.change_points]
    assert [(f.kind, f.index) for h in stepped for f in h.change_points] == [("step", STEP_AT)]
    assert {e.kind for e in regressions} == {"correctness", "performance"}
    for options in ({"last": 5}, {"include_dirty": True}, {"change_points": False}, {"min_effect": 0.05}):
        assert_same_as_uncached(db, **options)
    assert_same_as_uncached(db)  # the windowed and dirty rows did not disturb the plain ones


def test_commits_that_measured_different_series_are_assembled_as_uncached(db):
    """Commits whose runs measured different series (a kernel's run alone, one without a shape) are put together
    per group of commits with the same series: the same histories and regressions as without the cache."""
    build(db)
    rng = np.random.default_rng(11)
    grid = grid_results(rng)
    add_run(db, "chip-a", 12, [(job, result) for job, result in grid if job.kernel == "flash_prefill"], minutes=121)
    add_run(db, "chip-a", 13, [(job, result) for job, result in grid if job.key != grid[0][0].key], minutes=131)
    add_run(db, "chip-a", 14, grid_results(rng), minutes=141)
    with db.session() as session:
        session.execute(update(Run).values(finished_at=Run.started_at, status="complete"))
    assert_same_as_uncached(db)


def test_a_new_run_recomputes_its_commit_on_its_chip_only(db):
    build(db)
    analysed(db)
    finished(db, add_run(db, "chip-a", 12, grid_results(np.random.default_rng(9), {("swiglu", "unfused", 0): 1.3}),
                         minutes=200))
    found = assert_same_as_uncached(db)
    assert found.cells == {"chip-a": (12, 1), "chip-b": (12, 0)}
    assert found.changes["chip-b"] == (8, 0) and found.changes["chip-a"][1] == 8  # every series has a new point
    assert found.families == {"chip-a": (12, 1), "chip-b": (12, 0)}
    _, regressions, _ = cache.analyse(db, CHIPS)
    assert any(e.head_sha.startswith("000c") and e.variant == "unfused" for e in regressions)


def test_a_new_run_searches_one_window_a_series(db, monkeypatch):
    """Histories longer than a window (6 commits here): after a new run only each series' newest window is searched,
    the others' changes come from the cache, and the result is the uncached one."""
    from harness.analysis import history

    whole = changepoints.windows
    monkeypatch.setattr(changepoints, "windows", lambda n, window=None: whole(n, 6))
    build(db)
    analysed(db)
    finished(db, add_run(db, "chip-a", 12, grid_results(np.random.default_rng(9), {("swiglu", "unfused", 0): 1.3}),
                         minutes=200))
    searched: list[int] = []
    search = history.detect_windows
    monkeypatch.setattr(history, "detect_windows", lambda windows, **kw: searched.extend(map(len, windows)) or search(
        windows, **kw))
    plain = analysed(db, use_cache=False)[:2]
    searched.clear()
    found = analysed(db)
    assert found[:2] == plain
    assert found[2].changes == {"chip-a": (0, 8), "chip-b": (8, 0)} and searched == [6] * 8
    assert analysed(db)[:2] == plain and searched == [6] * 8  # nothing new: nothing searched


def test_a_report_of_the_last_commits_leaves_the_whole_historys_windows_alone(db, monkeypatch):
    """Each set of options keeps its own change-point windows (6 commits here): a ``--last`` or dirty analysis in
    between does not delete those of the whole history, so after a new run the next plain report still searches one
    window a series."""
    from harness.analysis import history

    whole = changepoints.windows
    monkeypatch.setattr(changepoints, "windows", lambda n, window=None: whole(n, 6))
    build(db)
    analysed(db)
    analysed(db, include_dirty=True)
    analysed(db, last=5)
    finished(db, add_run(db, "chip-a", 12, grid_results(np.random.default_rng(9)), minutes=200))
    searched: list[int] = []
    search = history.detect_windows
    monkeypatch.setattr(history, "detect_windows", lambda windows, **kw: searched.extend(map(len, windows)) or search(
        windows, **kw))
    assert analysed(db)[2].changes == {"chip-a": (0, 8), "chip-b": (8, 0)} and searched == [6] * 8


def test_a_run_still_being_written_is_recomputed_every_time_and_never_stored(db):
    """Samples of an unfinished run may still come (and on PostgreSQL commit with ids below a watermark already
    read): its commit's cells are computed afresh each time, never stored."""
    build(db, commits=8)
    analysed(db)
    run_id = add_run(db, "chip-b", 8, grid_results(np.random.default_rng(4), trials=1), minutes=300)
    plain = analysed(db, use_cache=False)[:2]
    for _ in range(2):
        histories, regressions, found = analysed(db)
        assert (histories, regressions) == plain and found.cells["chip-b"] == (8, 1)
        assert found.unfinished["chip-b"] == 1
    with db.session() as session:
        commit_id = session.scalar(select(Commit.id).where(Commit.sha == sha_of(8)))
        assert str(commit_id) not in set(session.scalars(select(AnalysisCache.name).where(
            AnalysisCache.kind == "cells", AnalysisCache.chip == "chip-b")))
    job = bench_job("swiglu", "unfused", {"B": 1, "H": 1, "S": 64, "D": 32})
    store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=timings(np.random.default_rng(3), 3e-3),
                                                   inner=1, trial=1))
    finished(db, run_id)
    found = assert_same_as_uncached(db)
    assert found.cells["chip-b"] == (8, 1) and found.unfinished["chip-b"] == 0


def _run_of(db: store.Store, chip: str, commit: int) -> str:
    with db.session() as session:
        return session.scalars(select(Run.id).join(Chip, Run.chip_id == Chip.id)
                               .join(Commit, Run.commit_id == Commit.id)
                               .where(Chip.key == chip, Commit.sha == sha_of(commit))).first()


def test_a_later_trial_of_a_stored_job_is_seen(db):
    """A trial appended to a stored job adds samples and no job: the sample watermark finds its commit."""
    build(db)
    analysed(db)
    job = bench_job("swiglu", "unfused", {"B": 1, "H": 1, "S": 64, "D": 32})
    store.record_result(db, _run_of(db, "chip-a", 11), job, JobResult(
        job.key, "passed", samples=timings(np.random.default_rng(1), 4e-3), inner=1, trial=7))
    found = assert_same_as_uncached(db)
    assert found.cells["chip-a"] == (11, 1) and found.cells["chip-b"] == (12, 0)


@pytest.mark.parametrize("change", ["delete", "reap", "redate", "dirty", "parents"])
def test_changed_runs_invalidate_what_they_touch(sqlite_db, change):
    db = sqlite_db
    build(db)
    analysed(db)
    run_id = _run_of(db, "chip-a", 4)
    with db.session() as session:
        run = session.get(Run, run_id)
        if change == "delete":
            session.delete(run)
        elif change == "reap":
            run.status, run.finished_at = store.ABANDONED, run.started_at
        elif change == "redate":  # now the commit's first run comes after commit 6's
            run.started_at = run.started_at.replace(hour=3)
        elif change == "dirty":
            run.dirty = True
        else:  # parents recorded later: the history order follows them, 4 before 3
            chain = [0, 1, 2, 4, 3, *range(5, 12)]
            for commit in session.scalars(select(Commit)):
                at = chain.index(int(commit.sha[:4], 16))
                commit.parents = [sha_of(chain[at - 1])] if at else []
    found = assert_same_as_uncached(db)
    if change in ("delete", "dirty"):
        assert found.cells["chip-a"] == (11, 0)  # the commit has no (clean) run left
    elif change != "parents":
        assert found.cells["chip-a"] == (11, 1)
    assert found.cells["chip-b"] == (12, 0)


def test_a_new_run_reads_the_correctness_rows_of_its_commit_only(db, monkeypatch):
    build(db)
    analysed(db)
    reads: list[tuple[str, object]] = []
    rows_of = analysis_cache.correctness_rows

    def recorded(store, chip, *, include_dirty=False, commits=None):  # noqa: ANN001, ANN202 - the real signature
        reads.append((chip, None if commits is None else sorted(commits)))
        return rows_of(store, chip, include_dirty=include_dirty, commits=commits)

    monkeypatch.setattr(analysis_cache, "correctness_rows", recorded)
    failing = {("flash_prefill", "flash_bq16_bk32"): "failed"}
    finished(db, add_run(db, "chip-a", 12, grid_results(np.random.default_rng(9)) + checks(failing), minutes=200))
    with db.session() as session:
        new_commit = session.scalar(select(Run.commit_id).order_by(Run.started_at.desc()).limit(1))
    found = assert_same_as_uncached(db)  # the failure at the new commit is found as without the cache
    assert reads == [("chip-a", [new_commit])]  # chip B's analysis is reused whole; the warm run reads nothing
    assert found.families["chip-a"][1] == 1
    _, regressions, _ = cache.analyse(db, CHIPS)
    assert any(e.kind == "correctness" and e.head_sha.startswith("000c") for e in regressions)


def test_the_chips_of_a_full_analysis_are_computed_in_processes_of_their_own(db, monkeypatch, tmp_path, caplog):
    """Each chip to compute goes to a forked process (a core each) where several are: the same results as in
    one process, its analysis stored; a process that fails leaves its chip to the caller's."""
    from harness.core import fork

    build(db)
    pids = tmp_path / "pids"
    compute = cache.chips._analyse_chip

    def recorded(store, chip, read, options):  # noqa: ANN001, ANN202 - the function's own
        with pids.open("a") as out:
            out.write(f"{chip} {os.getpid()}\n")
        return compute(store, chip, read, options)

    monkeypatch.setattr(cache.chips, "_analyse_chip", recorded)
    monkeypatch.setattr(fork, "can_fork", lambda: True)
    found = assert_same_as_uncached(db)  # cold: both chips computed, each in its own process
    assert found.cells == {"chip-a": (0, 12), "chip-b": (0, 12)} and found.write_errors == 0
    computed = dict(line.split() for line in pids.read_text().splitlines())
    assert set(computed) == {"chip-a", "chip-b"} and str(os.getpid()) not in computed.values()
    assert len(set(computed.values())) == 2

    def fails_in_a_child(store, chip, read, options):  # noqa: ANN001, ANN202
        if chip == "chip-b" and os.getpid() != parent:
            raise RuntimeError("no analysis there")
        return compute(store, chip, read, options)

    parent = os.getpid()
    monkeypatch.setattr(cache.chips, "_analyse_chip", fails_in_a_child)
    analysis_cache.clear(db)
    assert_same_as_uncached(db)
    assert "analysis of chip-b: its process failed (RuntimeError: no analysis there); analysed here" in caplog.text


def test_imported_bundles_are_new_runs(db, tmp_path):
    build(db)
    analysed(db)
    other = outbox.open_store(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        finished(other, add_run(other, "chip-b", 30, grid_results(np.random.default_rng(2),
                                                                  {("swiglu", "unfused", 1): 1.4}), minutes=500))
        path = tmp_path / "b.bundle"
        bundle.export_bundle(other, path)
    finally:
        other.close()
    bundle.import_bundle(db, path)
    found = assert_same_as_uncached(db)
    assert found.cells == {"chip-a": (12, 0), "chip-b": (12, 1)}


def test_corrupted_or_missing_rows_are_recomputed(db):
    build(db)
    analysed(db)
    with db.session() as session:
        rows = session.scalars(select(AnalysisCache).where(AnalysisCache.chip == "chip-a")).all()
        kinds = {}
        for row in rows:
            kinds[row.kind] = kinds.get(row.kind, 0) + 1
            if row.kind == "cells" and row.name in ("1", "2"):
                row.payload = row.payload[:-9]  # truncated
            elif row.kind == "cells" and row.name == "3":
                row.payload = row.payload[:-8] + b"\x00" * 8  # flipped bytes: the checksum fails
            elif row.kind in ("changes", "families", "correctness", "series", "stamps") and kinds[row.kind] == 1:
                row.payload = b"{not json"
            elif row.kind == "cells" and row.name == "4":
                session.delete(row)
            elif row.kind == "chip":  # else the chip's whole analysis is reused and the rows above are not read
                row.payload = row.payload[:-3] + b"\xff" * 3
    assert set(kinds) == {"cells", "series", "changes", "families", "correctness", "stamps", "chip"}
    assert_same_as_uncached(db)


def test_a_chip_none_of_whose_runs_changed_is_reused_whole(db, monkeypatch):
    """Its histories and regressions come from one stored row: no cell, change point or family is read or
    computed; a new run on the other chip does not disturb it; a corrupted row is recomputed."""
    build(db)
    analysed(db)
    finished(db, add_run(db, "chip-a", 12, grid_results(np.random.default_rng(9)), minutes=200))
    plain = analysed(db, use_cache=False)[:2]
    loads = []
    real = cache.cells.load_cells
    monkeypatch.setattr(cache.chips, "load_cells", lambda store, chip, *a, **k: loads.append(chip) or real(
        store, chip, *a, **k))
    histories, regressions, found = analysed(db)
    assert (histories, regressions) == plain
    assert loads == ["chip-a"] and found.chips_reused == 1  # chip-b, unchanged, reused whole
    loads.clear()
    assert analysed(db)[:2] == plain and loads == [] and "chips reused whole 2" in analysed(db)[2].summary()
    with db.session() as session:
        row = session.scalars(select(AnalysisCache).where(AnalysisCache.chip == "chip-b",
                                                          AnalysisCache.kind == "chip")).one()
        row.payload = row.payload[:40]
    assert analysed(db)[:2] == plain and loads == ["chip-b"]


def test_a_failed_write_leaves_the_results_alone(db, monkeypatch):
    build(db, commits=8)

    def fail(*args, **kwargs):
        raise OperationalError("INSERT", {}, Exception("attempt to write a readonly database"))

    monkeypatch.setattr(analysis_cache, "write_entries", fail)
    plain = analysed(db, use_cache=False)
    histories, regressions, found = analysed(db)
    assert (histories, regressions) == plain[:2] and found.write_errors > 0


def _pages(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): re.sub(r" · generated [^<]*", "", p.read_text())
            for p in sorted(folder.rglob("*.html"))}


def test_a_cache_written_by_another_process_renders_the_same_pages(db, tmp_path):
    build(db, commits=9)
    done = subprocess.run([sys.executable, "-m", "harness", "report", "--db", db.url, "--out", str(tmp_path / "a")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with db.session() as session:
        assert session.scalar(select(AnalysisCache.id).limit(1)) is not None  # that process stored its analysis
    found = analysed(db)[2]
    assert all(reused and not computed for reused, computed in found.cells.values())
    report.build_report(db, tmp_path / "b")  # reads what the other process stored
    plain = site_inputs.load_site(db, cache=False)  # then as build_report goes on
    plain.evidence = site_evidence.load_evidence(db, plain.latest, plain.regressions)
    report.render(plain, tmp_path / "c")
    a, b, c = (_pages(tmp_path / name) for name in "abc")
    assert a == b == c and len(a) > 5


def test_the_migration_adds_and_drops_the_table(sqlite_url):
    from sqlalchemy import inspect

    outbox.open_store(sqlite_url).close()
    with downgraded(sqlite_url, "0003") as engine:
        assert "analysis_cache" not in inspect(engine).get_table_names()
    db = outbox.open_store(sqlite_url)
    try:
        assert "analysis_cache" in inspect(db.engine).get_table_names()
        with db.session() as session:
            session.execute(update(AnalysisCache).values(key="x"))  # the table is usable
    finally:
        db.close()


def test_report_no_cache_stores_nothing_and_renders_the_same_pages(db, tmp_path):
    build(db, commits=6)
    report = [sys.executable, "-m", "harness", "report", "--db", db.url]
    done = subprocess.run([*report, "--no-cache", "--out", str(tmp_path / "plain")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with db.session() as session:
        assert session.scalar(select(AnalysisCache.id).limit(1)) is None  # computed from the samples, kept nowhere
    done = subprocess.run([*report, "--out", str(tmp_path / "cached")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    with db.session() as session:
        assert session.scalar(select(AnalysisCache.id).limit(1)) is not None
    assert _pages(tmp_path / "plain") == _pages(tmp_path / "cached")


def test_the_rows_of_a_chip_reused_run_after_run_check_only_the_samples_written_since(db, monkeypatch):
    """New runs on chip A, one report after each: chip B's whole analysis (``chip``) and its jobs (``jobs``) are
    reused each time, and their watermarks follow the samples (``analysis_cache.stamp``), so each check reads the
    samples written since the last report only -- not every sample since those rows were written, more at each run.
    The results stay the uncached ones."""
    build(db)
    chips = query.chip_keys(db)
    analysed(db)
    cache.job_catalogue(db, chips, site_inputs.SHOWN_KINDS)
    checked: list[tuple[str, int]] = []
    touched = analysis_cache.touched_since
    chip_b = set(analysis_cache.chip_state(db, "chip-b", include_dirty=True).run_commit)
    monkeypatch.setattr(analysis_cache, "touched_since", lambda store, runs, watermark: checked.append(
        (bool(set(runs) & chip_b), watermark)) or touched(store, runs, watermark))
    for commit in (12, 13):
        with db.session() as session:
            before = session.scalar(select(func.max(Sample.id)))
        finished(db, add_run(db, "chip-a", commit, grid_results(np.random.default_rng(commit)), minutes=200 + commit))
        checked.clear()
        assert analysed(db)[2].chips_reused == 1
        cache.job_catalogue(db, chips, site_inputs.SHOWN_KINDS)
        assert [w for of_b, w in checked if of_b] == [before, before]  # chip B's chip and jobs rows
    with db.session() as session:
        top = session.scalar(select(func.max(Sample.id)))
    assert stamped_watermarks(db, "chip-b", ["chip", "jobs"]) == {"chip": top, "jobs": top}
    assert_same_as_uncached(db)


def stamped_watermarks(db, chip: str, kinds: list[str]) -> dict[str, int | None]:
    """The chip's rows of ``kinds``: their watermarks as stamped (``analysis_cache.entry_keys``), by kind."""
    with db.session() as session:
        names = session.execute(select(AnalysisCache.kind, AnalysisCache.name).where(
            AnalysisCache.chip == chip, AnalysisCache.kind.in_(kinds))).all()
    return {kind: analysis_cache.entry_keys(db, chip, kind, [name])[name][1] for kind, name in names}


def test_a_stamp_leaves_its_row_as_written_and_a_new_write_drops_it(db):
    """A stamp raises a row's watermark without writing the row again (its payload: a chip's whole analysis, 16 MB
    at 1,000 commits); it counts only under the row's key, and the row written again has its own watermark."""
    entry = analysis_cache.Entry("k1", b"x" * 1000, 10)
    analysis_cache.write_entries(db, "chip-z", "chip", {"all": entry})

    def row() -> tuple:
        with db.session() as session:
            return session.execute(select(AnalysisCache.watermark, AnalysisCache.updated_at, AnalysisCache.payload)
                                   .where(AnalysisCache.chip == "chip-z")).one()

    written = row()
    analysis_cache.stamp(db, "chip-z", "chip", "all", "k1", 25)
    assert row() == written  # the row itself: not written again
    assert analysis_cache.entry_keys(db, "chip-z", "chip", ["all"]) == {"all": ("k1", 25)}
    assert analysis_cache.read_entries(db, "chip-z", "chip")["all"] == analysis_cache.Entry("k1", b"x" * 1000, 25)
    analysis_cache.stamp(db, "chip-z", "chip", "all", "other key", 40)  # not the row's key: not its watermark
    assert analysis_cache.entry_keys(db, "chip-z", "chip", ["all"]) == {"all": ("k1", 10)}
    analysis_cache.stamp(db, "chip-z", "chip", "all", "k1", 30)
    analysis_cache.write_entries(db, "chip-z", "chip", {"all": analysis_cache.Entry("k1", b"y", 12)})
    assert analysis_cache.entry_keys(db, "chip-z", "chip", ["all"]) == {"all": ("k1", 12)}  # its own, not the stamp's
    analysis_cache.stamp(db, "chip-z", "chip", "all", "k1", 50)
    assert analysis_cache.clear(db, "chip-z") == 1
    analysis_cache.write_entries(db, "chip-z", "chip", {"all": analysis_cache.Entry("k1", b"y", 12)})
    assert analysis_cache.entry_keys(db, "chip-z", "chip", ["all"]) == {"all": ("k1", 12)}  # cleared with it


def test_the_job_catalogue_is_the_uncached_one_and_reads_again_only_a_changed_chip(db, monkeypatch):
    """``job_catalogue`` (the chip pages' units, the variant matrix's series) equals the two reads of the whole job
    table, cold and warm; a new run reads its chip again, alone, and of it the new run's jobs alone; a later trial
    that gives a stored job its first median time (a job with no sample yet: unmeasured) is seen (the chip read
    whole)."""
    build(db)
    chips = query.chip_keys(db)

    def both() -> tuple[cache.JobCatalogue, cache.JobCatalogue]:
        return (cache.job_catalogue(db, chips, site_inputs.SHOWN_KINDS),
                cache.job_catalogue(db, chips, site_inputs.SHOWN_KINDS, use_cache=False))

    read: list[tuple[str, list[str] | None]] = []
    original = analysis_cache.chip_jobs

    def reading(target: store.Store, chip: str, kinds: Collection[str], *, runs: Collection[str] | None = None
                ) -> list:
        read.append((chip, None if runs is None else sorted(runs)))
        return original(target, chip, kinds, runs=runs)

    monkeypatch.setattr(analysis_cache, "chip_jobs", reading)
    cached, plain = both()
    assert cached == plain and read == [(chip, None) for chip in chips]
    assert both()[0] == plain and read == [(chip, None) for chip in chips]  # warm: nothing read
    job = bench_job("swiglu", "unfused", {"B": 1, "H": 1, "S": 999, "D": 32})  # a new series, not measured yet
    run_id = add_run(db, "chip-b", 12, [(job, JobResult(job.key, "failed", detail="no sample", trial=0))],
                     minutes=500)
    finished(db, run_id)
    read.clear()
    cached, plain = both()
    assert cached == plain and read == [("chip-b", [run_id])]
    assert plain.series[query.SeriesKey("swiglu", "unfused", "float32", job.labels.shape_key, "chip-b")] is False
    store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=timings(np.random.default_rng(2),
                                                                                      1e-3), inner=1, trial=1))
    read.clear()
    cached, plain = both()
    assert plain.series[query.SeriesKey("swiglu", "unfused", "float32", job.labels.shape_key, "chip-b")] is True
    assert cached == plain and read == [("chip-b", None)]


@pytest.mark.parametrize("read", ["commit_timing_modes", "correctness_statuses", "failing_correctness_jobs"])
def test_the_reads_of_a_chip_use_the_job_index(sqlite_db, read, monkeypatch):
    """A chip's jobs are read through its runs first, then their jobs by index (``query.commit_timing_modes``, the
    regression families' modes a few commits at a time; the correctness rows): joined the other way, SQLite scanned
    the whole job table on every call."""
    build(sqlite_db)
    with captured_statements(sqlite_db, monkeypatch) as statements:
        with sqlite_db.session() as session:
            commit_ids = session.scalars(select(Commit.id).limit(2)).all()
        if read == "commit_timing_modes":
            assert query.commit_timing_modes(sqlite_db, "chip-a", commit_ids)
        else:
            assert getattr(query, read)(sqlite_db, "chip-a")  # chip A fails a check at two commits
    plan = job_read_plan(sqlite_db, statements)
    assert not any(step.startswith("SCAN job") for step in plan), plan


def test_run_prints_name_each_runs_highest_sample(db):
    """``analysis_cache.run_prints`` ends with each run's highest sample id (per job from the index, then the run's
    highest), 0 for a run without samples."""
    from harness.record.models import JobRecord, Sample

    build(db)
    with db.session() as session:
        runs = session.scalars(select(Run.id)).all()
        expected = {run: max((sample_id for (sample_id,) in session.execute(
            select(Sample.id).join(JobRecord, Sample.job_id == JobRecord.id).where(JobRecord.run_id == run))),
            default=0) for run in runs}
    empty = add_run(db, "chip-b", 13, [], minutes=700)
    found = analysis_cache.run_prints(db, [*runs, empty])
    assert {run: found[run][-1] for run in runs} == expected and found[empty][-1] == 0


def _newest_truth(db: store.Store) -> dict[str, int]:
    """Each run's highest sample id, every sample read (0: none)."""
    from harness.record.models import JobRecord

    with db.session() as session:
        found = dict(session.execute(select(JobRecord.run_id, func.max(Sample.id))
                                     .join(Sample, Sample.job_id == JobRecord.id).group_by(JobRecord.run_id)).all())
        return {run: int(found.get(run) or 0) for run in session.scalars(select(Run.id))}


def _newest_printed(db: store.Store) -> dict[str, int]:
    """The highest sample id of every run as ``run_prints`` names it, within one report's ``memoised``."""
    with db.session() as session:
        runs = session.scalars(select(Run.id)).all()
    with db.memoised():
        return {run: found[-1] for run, found in analysis_cache.run_prints(db, runs).items()}


@pytest.mark.parametrize("change", ["a later trial", "a new run", "a run still writing", "the top sample deleted",
                                    "an unreadable row"])
def test_the_newest_samples_kept_across_reports_are_each_runs_highest(db, change, monkeypatch):
    """The finished runs' highest sample ids are kept in the cache (``newest_samples``) and brought up to date from
    the samples written since: after a later trial of an old run's job, a new run, a run still writing, the highest
    sample deleted (its id may be taken again) or an unreadable row, ``run_prints`` names each run's highest sample
    as every sample shows it -- and a second report reads no run from its jobs again."""
    build(db, commits=6)
    assert _newest_printed(db) == _newest_truth(db)  # every run read from its jobs, then kept
    rng = np.random.default_rng(4)
    job = bench_job("swiglu", "unfused", {"B": 1, "H": 1, "S": 64, "D": 32})
    if change == "a later trial":
        store.record_result(db, _run_of(db, "chip-a", 2), job, JobResult(
            job.key, "passed", samples=timings(rng, 4e-3), inner=1, trial=7))
    elif change == "a new run":
        finished(db, add_run(db, "chip-b", 6, grid_results(rng), minutes=900))
    elif change == "a run still writing":
        add_run(db, "chip-a", 6, grid_results(rng), minutes=900)  # not finished: read from its jobs every time
        with db.session() as session:
            session.execute(update(Run).where(Run.finished_at.is_(None)).values(status="running"))
    elif change == "the top sample deleted":
        from sqlalchemy import delete

        with db.session() as session:
            session.execute(delete(Sample).where(Sample.id == session.scalar(select(func.max(Sample.id)))))
        store.record_result(db, _run_of(db, "chip-b", 1), job, JobResult(  # the id taken again, another run's
            job.key, "passed", samples=timings(rng, 4e-3), inner=1, trial=3))
    else:
        with db.session() as session:
            session.execute(update(AnalysisCache).where(AnalysisCache.kind == "newest-samples")
                            .values(payload=b"[1, 2"))
    assert _newest_printed(db) == _newest_truth(db)
    read_whole: list = []
    real = analysis_cache._newest_by_jobs
    monkeypatch.setattr(analysis_cache, "_newest_by_jobs", lambda s, runs: read_whole.extend(runs) or real(s, runs))
    assert _newest_printed(db) == _newest_truth(db)
    with db.session() as session:
        still_writing = set(session.scalars(select(Run.id).where(Run.finished_at.is_(None))))
    assert set(read_whole) == still_writing  # the finished runs came from the kept row
    assert not still_writing or change == "a run still writing"


def test_the_noise_rows_are_the_uncached_ones_and_a_new_run_recomputes_its_chip_only(db):
    """``NoiseRows`` (the chip pages' noise meters) equals ``noise.chip_noise_rows``, field by field and type by
    type, cold and warm; after a new run on one chip only that chip's rows are computed again."""
    from harness.analysis.noise import chip_noise_rows

    build(db)
    latest, _ = query.latest_runs(db)

    def rows(noise: cache.NoiseRows) -> dict[str, str]:
        found = {chip: repr(noise(chip, runs)) for chip, runs in sorted(query.latest_runs(db)[0].items())}
        noise.flush()
        return found

    plain = {chip: repr(chip_noise_rows(db, runs)) for chip, runs in sorted(latest.items())}
    assert "NoiseRow(" in plain["chip-a"]
    cold, warm = cache.NoiseRows(db), cache.NoiseRows(db)
    assert rows(cold) == plain and cold.reused == 0
    assert rows(warm) == plain and warm.reused == len(latest)
    finished(db, add_run(db, "chip-b", 12, grid_results(np.random.default_rng(3)), minutes=500))
    plain = {chip: repr(chip_noise_rows(db, runs)) for chip, runs in sorted(query.latest_runs(db)[0].items())}
    after = cache.NoiseRows(db)
    assert rows(after) == plain and after.reused == 1 and set(after.computed) == {"chip-b"}


def test_the_clean_state_is_read_once_with_the_dirty_runs(db):
    """``clean_state`` of ``chip_state(include_dirty=True)`` is ``chip_state(include_dirty=False)`` (a dirty run
    and a run not finished among them), and ``analyse`` given those states equals the uncached analysis."""
    build(db)
    add_run(db, "chip-b", 12, grid_results(np.random.default_rng(4)), minutes=600)  # not finished
    add_run(db, "chip-b", 12, grid_results(np.random.default_rng(6)), minutes=610, dirty=True)
    for chip in query.chip_keys(db):
        every = analysis_cache.chip_state(db, chip, include_dirty=True)
        clean = analysis_cache.chip_state(db, chip)
        derived = analysis_cache.clean_state(every)
        assert (derived.watermark, derived.runs, derived.run_commit, derived.unfinished, derived.open) == (
            clean.watermark, clean.runs, clean.run_commit, clean.unfinished, clean.open)
    assert analysis_cache.chip_state(db, "chip-b", include_dirty=True).dirty
    states = {chip: analysis_cache.chip_state(db, chip, include_dirty=True) for chip in query.chip_keys(db)}
    plain = analysed(db, use_cache=False)[:2]
    assert analysed(db, states=states)[:2] == plain
    assert analysed(db, states=states)[:2] == plain


def test_the_code_version_covers_the_compiled_search_and_the_distributions():
    """Both compute cached results (change points, verdicts): an edit to either must change every key."""
    from harness.analysis import segment_search
    from harness.stats import distributions

    files = cache.common.source_files()
    assert Path(segment_search.__file__) in files and Path(distributions.__file__) in files


def test_the_code_version_covers_every_module_of_a_package():
    """``harness.record.query`` is a package: an edit to any of its modules (the chip history's arrays, the samples'
    layout), not only to its ``__init__``, must change every key."""
    from pathlib import Path

    folder = Path(query.__file__).parent
    assert set(folder.glob("*.py")) <= set(cache.common.source_files())
    assert Path(query.history.__file__) in cache.common.source_files()


def _job_ids_summed(db: store.Store) -> dict[str, tuple[int, int, int, int]]:
    """Every run's count, min, max and sum of job ids, straight from the table."""
    from sqlalchemy import func

    from harness.record.models import JobRecord

    with db.session() as session:
        return {run: (n, low, high, total) for run, n, low, high, total in session.execute(
            select(JobRecord.run_id, func.count(JobRecord.id), func.min(JobRecord.id), func.max(JobRecord.id),
                   func.sum(JobRecord.id)).group_by(JobRecord.run_id))}


def _job_statements(db: store.Store, monkeypatch, read) -> list[str]:  # noqa: ANN001 - a callable of no arguments
    """The SQL statements on the job table that ``read()`` makes (through SQLAlchemy or the DBAPI cursor)."""
    with captured_statements(db, monkeypatch) as statements:
        read()
    return [s for s, _ in statements if re.search(r"\bFROM job\b", s)]


def test_the_job_id_summaries_read_only_the_jobs_added_since(db, monkeypatch):
    """Every run's job-id summary (what the runs' fingerprints hold) is kept in the cache: after a new run and a job
    added to an old run, only the jobs above the highest id summed are read, no aggregate of every job, and the
    summaries are those of the table."""
    build(db)
    assert analysis_cache.job_id_summaries(db) == _job_ids_summed(db)  # summed, then kept
    add_run(db, "chip-b", 12, grid_results(np.random.default_rng(8)) + checks(), minutes=900)
    job = bench_job("swiglu", "unfused", {"B": 3, "H": 1, "S": 64, "D": 32})  # a job added to an old run
    store.record_result(db, _run_of(db, "chip-a", 2), job, JobResult(
        job.key, "passed", samples=timings(np.random.default_rng(2), 4e-3), inner=1))
    found: list[dict] = []
    statements = _job_statements(db, monkeypatch, lambda: found.append(analysis_cache.job_id_summaries(db)))
    assert found[0] == _job_ids_summed(db)
    assert statements and not any("GROUP BY" in s or "sum(" in s.lower() for s in statements), statements
    again = _job_statements(db, monkeypatch, lambda: found.append(analysis_cache.job_id_summaries(db)))
    assert found[1] == found[0] and not any("GROUP BY" in s for s in again)


@pytest.mark.parametrize("change", ["a job deleted", "the newest job deleted and another written"])
def test_job_id_summaries_that_do_not_add_up_are_summed_anew(db, change):
    """The harness deletes no job, but a hand can: a table whose count does not add up, or whose newest summed job
    is now another run's (SQLite gives a deleted newest id to the next job), is summed again; the fingerprints
    then see the change, as they did when every run was summed on every read."""
    from sqlalchemy import delete, func

    from harness.record.models import JobRecord

    build(db)
    before = analysis_cache.job_id_summaries(db)
    with db.session() as session:
        newest = session.scalar(select(func.max(JobRecord.id)))
        doomed = newest if change != "a job deleted" else session.scalar(select(func.min(JobRecord.id)))
        session.execute(delete(JobRecord).where(JobRecord.id == doomed))
    if change != "a job deleted":  # into a run of the other chip than the deleted job's
        with db.session() as session:
            owner = next(run for run, (_, _, high, _) in before.items() if high == newest)
            chip = session.scalar(select(Chip.key).join(Run, Run.chip_id == Chip.id).where(Run.id == owner))
        other = _run_of(db, "chip-b" if chip == "chip-a" else "chip-a", 1)
        job = bench_job("swiglu", "unfused", {"B": 5, "H": 1, "S": 64, "D": 32})
        store.record_result(db, other, job, JobResult(job.key, "passed", samples=timings(
            np.random.default_rng(3), 4e-3), inner=1))
    assert analysis_cache.job_id_summaries(db) == _job_ids_summed(db) != before
    assert_same_as_uncached(db)


def test_the_compiled_search_loads_while_the_stored_chips_are_read_only_for_a_chip_never_analysed(db, monkeypatch):
    """For a chip with no stored analysis (every window of every series to search), the change-point search's
    compiled code starts loading in a thread of its own (numba: ~0.5 s) before the other chip's stored analysis is
    read, and no thread of it outlives the analysis; after a new run (one window a series to search: numpy's
    search is done before numba would be loaded) and with nothing to compute it is not loaded. The results are the
    uncached ones."""
    import threading

    from harness.analysis import segment_search

    build(db)
    analysed(db)
    finished(db, add_run(db, "chip-a", 12, grid_results(np.random.default_rng(9)), minutes=200))
    plain = analysed(db, use_cache=False)[:2]
    order: list[str] = []
    warm_up, stored = segment_search.warm_up_in_background, cache.chips._stored_chip
    monkeypatch.setattr(segment_search, "warm_up_in_background", lambda: order.append("warm-up") or warm_up())
    monkeypatch.setattr(cache.chips, "_stored_chip", lambda store, chip, *a: order.append(f"read {chip}") or stored(
        store, chip, *a))
    threads = threading.active_count()
    assert analysed(db)[:2] == plain
    assert order == ["read chip-b"]
    analysis_cache.clear(db, "chip-a")
    order.clear()
    assert analysed(db)[:2] == plain
    assert order == ["warm-up", "read chip-b"] and threading.active_count() == threads
    order.clear()
    assert analysed(db)[:2] == plain
    assert order == ["read chip-a", "read chip-b"]


def test_a_search_after_its_warm_up_is_the_plain_one_and_no_thread_is_left():
    import threading

    from harness.analysis import segment_search
    from harness.analysis.history import _optimal_segments_many

    if not segment_search.available():
        pytest.skip("numba is not importable here")
    values = np.random.default_rng(3).normal(size=(3, 60)).cumsum(axis=1)
    penalty = np.full(3, 2.0)
    segment_search.warm_up_in_background()
    compiled = _optimal_segments_many(values, 2 * penalty, penalty, min_segment=3, min_drift_length=8)
    assert threading.active_count() == 1 or not any(t.name == "segment-search-warm-up" and t.is_alive()
                                                    for t in threading.enumerate())
    plain = _optimal_segments_many(values, 2 * penalty, penalty, min_segment=3, min_drift_length=8, compiled=False)
    assert all(np.array_equal(a, b) for a, b in zip(compiled, plain, strict=True))


def test_deferred_cache_writes_are_stored_only_when_made(db):
    """``analyse(deferred_writes=[...])`` stores nothing of a chip it computes itself: the rows it hands back
    (``ChipRows``, picklable: another process may store them) store them, and the analysis after them reuses
    them."""
    build(db, commits=8)
    analysed(db)
    finished(db, add_run(db, "chip-a", 8, grid_results(np.random.default_rng(9)), minutes=300))
    plain = analysed(db, use_cache=False)[:2]

    def rows() -> dict:
        with db.session() as session:
            return dict(session.execute(select(AnalysisCache.name, AnalysisCache.key).where(
                AnalysisCache.chip == "chip-a", AnalysisCache.kind.in_(["chip", "families"]))).all())

    before = rows()
    deferred: list = []
    histories, regressions, found = cache.analyse(db, query.chip_keys(db), deferred_writes=deferred)
    computed = [rows for rows in deferred if rows.writes.rows]
    assert (repr(histories), repr(regressions)) == plain and found.chips_reused == 1 and len(computed) == 1
    assert rows() == before
    pickle.loads(pickle.dumps(computed[0])).store(db)
    assert rows() != before
    again = analysed(db)
    assert again[:2] == plain and again[2].chips_reused == 2


def test_a_reused_chips_watermark_is_raised_by_whoever_stores_the_deferred_rows(db):
    """A chip reused as stored gets its watermark raised (``analysis_cache.stamp``: the next check reads only the
    samples written since); with ``deferred_writes`` that write is handed back too, not made by the analysis (the
    report's forked analysis would make it on the way to its history pages)."""
    build(db, commits=8)
    analysed(db)
    finished(db, add_run(db, "chip-a", 8, grid_results(np.random.default_rng(9)), minutes=300))

    def watermark() -> int:
        return stamped_watermarks(db, "chip-b", ["chip"])["chip"]

    before = watermark()
    deferred: list = []
    _, _, found = cache.analyse(db, query.chip_keys(db), deferred_writes=deferred)
    assert found.chips_reused == 1 and watermark() == before
    stamps = [rows for rows in deferred if rows.chip == "chip-b"]
    assert len(stamps) == 1 and stamps[0].stamps and not stamps[0].writes.rows
    for rows in deferred:
        pickle.loads(pickle.dumps(rows)).store(db)
    assert watermark() > before
    assert watermark() == analysis_cache.chip_state(db, "chip-b").watermark


def test_the_reports_analysis_stores_its_cache_rows_itself(db, tmp_path, monkeypatch):
    """The report's forked analysis stores the chip's rows (16 MB at 1,000 commits) itself, while it draws its
    history pages, not in the report's process (which would unpickle and write them on top of its own work); they
    are stored by the time the report returns."""
    from harness.core import fork
    from harness.render import history as render_pages

    if not fork.can_fork() or not db.shared_by_processes:
        pytest.skip("the report forks no analysis here")
    build(db, commits=8)
    report.build_report(db, tmp_path / "site")
    finished(db, add_run(db, "chip-a", 8, grid_results(np.random.default_rng(9)), minutes=300))
    events = tmp_path / "events"
    flush, render = cache.common.flush, render_pages.HistoryPages.render

    def noted(what: str):  # noqa: ANN202
        with events.open("a") as out:
            out.write(f"{what} {os.getpid()}\n")

    monkeypatch.setattr(cache.chips, "flush", lambda store, chip, *a: noted(f"rows {chip}") or flush(store, chip, *a))
    monkeypatch.setattr(render_pages.HistoryPages, "render", lambda self: (render(self), noted("pages"))[0])
    report.build_report(db, tmp_path / "site")
    lines = [line.split() for line in events.read_text().splitlines()]
    assert {line[0] for line in lines} == {"pages", "rows"}
    assert {line[-1] for line in lines} == {lines[0][-1]} != {str(os.getpid())}  # all in the analysis' process
    with db.session() as session:  # stored by the time the report returned
        assert session.scalar(select(AnalysisCache.watermark).where(AnalysisCache.chip == "chip-a",
                                                                    AnalysisCache.kind == "chip"))
        key = session.scalar(select(AnalysisCache.key).where(AnalysisCache.chip == "chip-a",
                                                             AnalysisCache.kind == "chip"))
    if db.engine.dialect.name == "sqlite":  # and copied into the file by the analysis' process, not left in the log
        alone = tmp_path / "alone.db"
        shutil.copyfile(db.engine.url.database, alone)
        with sqlite3.connect(alone) as conn:
            assert conn.execute("SELECT key FROM analysis_cache WHERE chip = 'chip-a' AND kind = 'chip'"
                                ).fetchone() == (key,)
    assert analysed(db)[2].chips_reused == 2
