"""The report's compare pages from the analysis cache (``harness.analysis.cache.ComparePages``): a pair's
``harness compare`` report is reused while nothing it reads changed, and computed again when something did."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import select

from harness.analysis import cache, compare
from harness.core.job import JobResult
from harness.record import store
from harness.record.models import AnalysisCache
from testkit.analysis import add_run, bench_job, grid_results, sha_of, timings


@pytest.fixture
def db(db):
    """The shared store with six runs of chip-a: a 30 % step of one series at commit 4."""
    rng = np.random.default_rng(3)
    for i in range(6):
        factors = {("flash_prefill", "sdpa", 0): 1.3} if i >= 4 else {}
        add_run(db, "chip-a", i, grid_results(rng, factors, trials=3), minutes=10 * i)
    return db


def text(report) -> str:
    return json.dumps(report.to_dict(), sort_keys=True)  # nan == nan, every float as written


def pairs() -> list[tuple[str, str]]:
    return [(sha_of(3), sha_of(4)), (sha_of(1), sha_of(2))]


def test_a_reused_report_is_the_computed_one_and_rows_of_pairs_not_shown_go(db):
    first = cache.ComparePages(db)
    computed = [first.compare(base, head, "chip-a") for base, head in pairs()]
    first.flush()
    assert first.reused == 0 and [text(r) for r in computed] == [
        text(compare.compare(db, base, head, chip="chip-a")) for base, head in pairs()]
    assert any(row.verdict == "regressed" for row in computed[0].rows)
    again = cache.ComparePages(db)
    assert [text(again.compare(base, head, "chip-a")) for base, head in pairs()] == [text(r) for r in computed]
    assert again.reused == 2
    again.flush()
    only_one = cache.ComparePages(db)
    only_one.compare(*pairs()[0], "chip-a")
    only_one.flush()
    with db.session() as session:
        assert len(session.scalars(select(AnalysisCache).where(AnalysisCache.kind == "compare")).all()) == 1
    plain = cache.ComparePages(db, use_cache=False)
    assert text(plain.compare(*pairs()[0], "chip-a")) == text(computed[0]) and plain.reused == 0


def test_a_new_run_of_a_later_commit_keeps_an_older_pair_and_a_later_trial_recomputes_it(db):
    first = cache.ComparePages(db)
    first.compare(*pairs()[1], "chip-a")
    first.flush()
    add_run(db, "chip-a", 6, grid_results(np.random.default_rng(9), trials=3), minutes=60)  # not in its history
    later = cache.ComparePages(db)
    later.compare(*pairs()[1], "chip-a")
    later.flush()
    assert later.reused == 1
    job = bench_job("swiglu", "unfused", {"B": 1, "H": 1, "S": 64, "D": 32})
    head_run = compare.resolve_side(db, sha_of(2), "chip-a").run_ids[0]
    store.record_result(db, head_run, job, JobResult(job.key, "passed", samples=timings(
        np.random.default_rng(1), 4e-3), inner=1, trial=5))  # a later trial: samples, no new job
    after = cache.ComparePages(db)
    report = after.compare(*pairs()[1], "chip-a")
    assert after.reused == 0 and text(report) == text(compare.compare(db, *pairs()[1], chip="chip-a"))


def test_an_unreadable_row_is_computed_again(db):
    first = cache.ComparePages(db)
    expected = text(first.compare(*pairs()[0], "chip-a"))
    first.flush()
    with db.session() as session:
        for row in session.scalars(select(AnalysisCache).where(AnalysisCache.kind == "compare")):
            row.payload = row.payload[:-5]
    again = cache.ComparePages(db)
    assert text(again.compare(*pairs()[0], "chip-a")) == expected and again.reused == 0


def test_commit_refs_reuse_the_stored_compare_of_the_same_runs_named_by_run_ids(db):
    """A report compares the chip page's newest run with the run before it (by run ids), and a regression found
    later compares the same two runs by their commits: the second is the first's row, with its own sides."""
    base_run, head_run = (compare.resolve_side(db, sha, "chip-a").run_ids[0] for sha in pairs()[0])
    first = cache.ComparePages(db)
    by_runs = first.compare(base_run, head_run, "chip-a")
    first.flush()
    later = cache.ComparePages(db)
    by_commits = later.compare(*pairs()[0], "chip-a")
    assert later.reused == 1
    assert text(by_commits) == text(compare.compare(db, *pairs()[0], chip="chip-a"))
    assert by_commits.base.kind == "commit" and by_runs.base.kind == "run" and by_commits.rows == by_runs.rows


def test_prefetched_pages_read_each_chips_rows_once_and_reuse_them_as_before(db, monkeypatch):
    from harness.record import analysis_cache

    first = cache.ComparePages(db)
    computed = [text(first.compare(base, head, "chip-a")) for base, head in pairs()]
    first.flush()
    reads: list[tuple] = []
    original = analysis_cache.read_entries
    monkeypatch.setattr(analysis_cache, "read_entries", lambda *a, **k: reads.append(a[1:]) or original(*a, **k))
    with db.memoised():
        again = cache.ComparePages(db)
        again.prefetch([(base, head, "chip-a") for base, head in pairs()])
        assert [text(again.compare(base, head, "chip-a")) for base, head in pairs()] == computed
    compares = [read for read in reads if read[1] == "compare"]
    assert again.reused == 2 and compares == [("chip-a", "compare")]  # one read of the chip's rows, not one a page


def test_a_reports_content_digest_stands_for_its_rows_and_changes_with_them(db):
    """A compare page is fingerprinted by ``ComparePages.content`` instead of its rows' text: the same for a report
    computed and for the same report reused, another where its order is not proven (other verdicts), another where
    a later trial changed its rows; none for a report it did not make (or made without the cache)."""
    from harness.render.evidence import compare_input
    from harness.render.fingerprint import Fingerprint
    from reports import evidence as evidence_pages

    first = cache.ComparePages(db)
    computed = first.compare(*pairs()[0], "chip-a")
    first.flush()
    again = cache.ComparePages(db)
    reused = again.compare(*pairs()[0], "chip-a")
    assert again.reused == 1 and text(reused) == text(computed)
    content = first.content(computed, True)
    assert content and again.content(reused, True) == content and again.content(reused, False) != content
    assert again.content(computed, True) == "" and cache.ComparePages(db, use_cache=False).content(reused, True) == ""

    def page_print(report, content: str) -> str:  # a compare page's fingerprint, as write_evidence takes it
        from harness.analysis.site_evidence import CompareView

        view = CompareView("chip-a", report, True, (), (), None, {}, content)
        page = evidence_pages.ComparePage("p.html", view, [], "base", "head")
        return Fingerprint(*compare_input(page)).hexdigest()

    assert page_print(reused, content) == page_print(computed, content)
    assert page_print(reused, content) != page_print(reused, "")  # without a digest: by the rows' text
    changed = compare.for_order(reused, False)
    assert page_print(changed, again.content(reused, False)) != page_print(reused, content)
    job = bench_job("flash_prefill", "sdpa", {"B": 1, "H": 1, "S": 64, "D": 32})
    head_run = compare.resolve_side(db, sha_of(4), "chip-a").run_ids[0]
    store.record_result(db, head_run, job, JobResult(job.key, "passed", samples=timings(
        np.random.default_rng(1), 9e-3), inner=1, trial=7))  # a later trial: other rows, the same runs
    later = cache.ComparePages(db)
    recomputed = later.compare(*pairs()[0], "chip-a")
    assert later.reused == 0 and text(recomputed) != text(reused)
    assert later.content(recomputed, True) != content
