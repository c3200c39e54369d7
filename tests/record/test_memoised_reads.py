"""``Store.memoised``: within it the memoised reads (a run set's samples, the commit graph) are made once each and
give what a plain read gives; outside it, and after it, every call reads."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.errors import HarnessError
from harness.core.job import JobResult
from harness.record import ancestry, query, store
from testkit.analysis import add_run, bench_job, grid_results, sha_of, timings


@pytest.fixture
def db(db):
    rng = np.random.default_rng(5)
    for i in range(4):
        add_run(db, "chip-a", i, grid_results(rng, trials=2), minutes=10 * i)
    return db


def _counted(monkeypatch, module, name: str) -> list[int]:  # noqa: ANN001 - a module
    """Counts the calls of ``module.name`` (one entry per call)."""
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - passes everything on
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _runs(db) -> list[str]:  # noqa: ANN001 - the store
    return [query.resolve_ref(db, sha_of(i)).runs["chip-a"][-1] for i in range(4)]


def _plain(found: dict) -> dict:
    return {key: ([array.tolist() for array in value.trials], value.runs) for key, value in sorted(found.items())}


def test_within_memoised_a_run_sets_samples_and_the_commit_graph_are_read_once(db, monkeypatch):
    runs = _runs(db)
    expected = _plain(query.series_trials(db, [runs[3]]))
    expected_history = query.history_run_ids(db, [runs[3]])
    reads = _counted(monkeypatch, query.series, "_series_trials")
    graphs = _counted(monkeypatch, ancestry, "load_graph")
    with db.memoised():
        first = query.series_trials(db, [runs[3]])
        first.clear()  # a caller's own dict: the memo keeps its answer
        assert _plain(query.series_trials(db, [runs[3]])) == expected and len(reads) == 1
        query.series_trials(db, runs[2:])  # another run set: read
        assert len(reads) == 2
        assert query.history_run_ids(db, [runs[3]]) == expected_history == query.history_run_ids(db, [runs[3]])
        query.history_medians(db, [runs[2]])
        assert len(graphs) == 1
    query.series_trials(db, [runs[3]])
    query.history_run_ids(db, [runs[3]])
    assert len(reads) == 3 and len(graphs) == 2  # outside: every call reads


def test_a_sample_written_after_the_memoised_block_is_read(db):
    run = _runs(db)[3]
    job = bench_job("swiglu", "unfused", {"B": 2, "H": 1, "S": 64, "D": 32})  # a series the run lacks
    with db.memoised():
        before = set(query.series_trials(db, [run]))
        store.record_result(db, run, job, JobResult(job.key, "passed", samples=timings(
            np.random.default_rng(1), 4e-3), inner=1))
        assert set(query.series_trials(db, [run])) == before  # within: the first answer
    after = set(query.series_trials(db, [run]))
    assert len(after - before) == 1 and before < after


def test_within_memoised_a_chips_arrangement_is_read_once(db, monkeypatch):
    """The chip keys, the proven order and the windowed histories ask a chip's arrangement again and again: within
    ``memoised`` it is read once and gives what a plain read gives."""
    from harness.record import analysis_cache

    expected = (analysis_cache.arrangement(db, "chip-a"), analysis_cache.arrangement(db, "chip-a", last=2),
                query.guessed_commits(db, "chip-a"))
    reads = _counted(monkeypatch, query.history, "_arrangement_of")
    with db.memoised():
        assert (analysis_cache.arrangement(db, "chip-a"), analysis_cache.arrangement(db, "chip-a", last=2),
                query.guessed_commits(db, "chip-a")) == expected
        assert query.chip_order_proven(db, "chip-a") and len(reads) == 1
        analysis_cache.arrangement(db, "chip-a", include_dirty=True)  # dirty runs included: another arrangement
        assert len(reads) == 2
    analysis_cache.arrangement(db, "chip-a")
    assert len(reads) == 3  # outside: every call reads


def test_within_memoised_refs_previous_runs_history_runs_and_run_prints_are_read_once(db, monkeypatch):
    """A report's compare pages, noise meters and variant cells resolve the same runs and ask the same previous runs,
    history runs and run fingerprints: within ``memoised`` each is read once (the commit graph shared with the
    history runs'), gives what a plain read gives, and a caller changing its answer changes no later one."""
    from harness.analysis.cache import RunPrints
    from harness.record import analysis_cache

    runs = _runs(db)
    expected = (query.resolve_ref(db, sha_of(3), "chip-a"), query.previous_run(db, runs[3]),
                query.history_run_ids(db, [runs[3]]), analysis_cache.run_prints(db, runs))
    refs = _counted(monkeypatch, query.refs, "_resolve_ref")
    previous = _counted(monkeypatch, query.order, "_previous_run")
    graphs = _counted(monkeypatch, ancestry, "load_graph")
    prints = _counted(monkeypatch, analysis_cache, "run_prints")
    with db.memoised():
        first = query.resolve_ref(db, sha_of(3), "chip-a")
        first.runs.clear()
        assert query.resolve_ref(db, sha_of(3), "chip-a") == expected[0] and len(refs) == 1
        query.resolve_ref(db, sha_of(2), "chip-a")
        assert len(refs) == 2
        assert query.previous_run(db, runs[3]) == expected[1] == query.previous_run(db, runs[3])
        ids = query.history_run_ids(db, [runs[3]])
        ids.clear()
        assert query.history_run_ids(db, [runs[3]]) == expected[2]
        assert len(previous) == 1 and len(graphs) == 1
        assert RunPrints(db)(runs) == expected[3] == RunPrints(db)(runs[1:]) | RunPrints(db)(runs[:1])
        assert len(prints) == 1
    query.resolve_ref(db, sha_of(3), "chip-a")
    query.previous_run(db, runs[3])
    RunPrints(db)(runs)
    assert len(refs) == 3 and len(previous) == 2 and len(prints) == 2  # outside: every call reads


def test_within_memoised_the_samples_above_a_watermark_are_read_once_per_watermark(db, monkeypatch):
    """Each chip's cached rows ask which of its runs gained samples above the watermark they were stamped with (one
    for all, after a report): within ``memoised`` the samples above it are read once, each caller gets its own runs
    only, and a caller changing its answer changes no later one."""
    from harness.record import analysis_cache

    runs = _runs(db)
    with db.session() as session:
        top = max(analysis_cache._samples_above(session, 0).values())
    watermark = top - 5  # the newest run's last samples are above it
    run_commit = {run: i for i, run in enumerate(runs)}
    expected = analysis_cache.touched_since(db, run_commit, watermark)
    assert list(expected) == [runs[3]] and expected[runs[3]] == top
    reads = _counted(monkeypatch, analysis_cache, "_samples_above")
    with db.memoised():
        first = analysis_cache.touched_since(db, run_commit, watermark)
        first.clear()
        assert analysis_cache.touched_since(db, run_commit, watermark) == expected
        assert analysis_cache.touched_since(db, {runs[0]: 0}, watermark) == {}  # another chip's runs: none
        assert len(reads) == 1
        assert analysis_cache.touched_since(db, run_commit, 0).keys() == set(runs)  # another watermark: read
        assert len(reads) == 2
    analysis_cache.touched_since(db, run_commit, watermark)
    assert len(reads) == 3  # outside: every call reads


def _answers(db, refs) -> list:  # noqa: ANN001 - the store
    out = []
    for ref, chip in refs:
        try:
            out.append(query.resolve_ref(db, ref, chip))
        except HarnessError as exc:
            out.append(str(exc))
    return out


def test_prefetched_refs_are_what_resolve_ref_reads_one_by_one_and_read_nothing_more(db, monkeypatch):
    """A report's compare pages resolve their refs in one go (``query.prefetch_refs``): the same answers as one by
    one, errors included (left to ``resolve_ref``), and none of the exact refs read again."""
    from sqlalchemy import update

    from harness.record.models import Run
    from harness.record.query import refs as refs_module

    rng = np.random.default_rng(7)
    add_run(db, "chip-b", 1, grid_results(rng, trials=1), minutes=11)
    add_run(db, "chip-b", 2, grid_results(rng, trials=1), minutes=21, dirty=True)
    settling = add_run(db, "chip-b", 2, grid_results(rng, trials=1), minutes=22)
    with db.session() as session:
        session.execute(update(Run).where(Run.id == settling).values(settling=True))
    runs = _runs(db)
    refs = [(sha_of(i), chip) for i in range(4) for chip in ("chip-a", "chip-b", None)]
    refs += [(run, chip) for run in runs for chip in ("chip-a", "chip-b", None)]
    refs += [(settling, "chip-b"), (settling, None), (sha_of(9), None), (runs[0][:8], "chip-a"), (sha_of(1), "chip-z")]
    expected = _answers(db, refs)
    assert any(isinstance(answer, str) for answer in expected)  # some are refused: left to resolve_ref
    with db.memoised():
        query.prefetch_refs(db, refs)
        reads = _counted(monkeypatch, refs_module, "_resolve_ref")
        assert _answers(db, refs) == expected
    exact = [answer for (ref, _), answer in zip(refs, expected, strict=True) if not isinstance(answer, str)
             and len(ref) >= 32]
    assert exact and len(reads) == len(refs) - len(exact)  # only the prefix and the refused ones are read
