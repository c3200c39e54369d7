"""The variant matrix's cells from the analysis cache (``harness.analysis.cache.VariantCells``): each chip's
measured cells are reused while its cells' runs did not change, and the matrix is the one computed from the
samples alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import select

from harness.analysis import cache, variants
from harness.core.job import JobResult
from harness.record import query, store
from harness.record.models import AnalysisCache
from testkit.analysis import add_run, bench_job, grid_results, sha_of, timings


@pytest.fixture
def db(db):
    """Two chips, two commits each; the fused variant 20 % faster on chip-a, 20 % slower on chip-b."""
    rng = np.random.default_rng(11)
    for i in range(2):
        add_run(db, "chip-a", i, grid_results(rng, {("swiglu", "fused_gateup", 0): 0.8}, trials=3), minutes=10 * i)
        add_run(db, "chip-b", i, grid_results(rng, {("swiglu", "fused_gateup", 0): 1.2}, trials=3),
                minutes=10 * i + 5)
    return db


def text(matrix) -> str:
    return json.dumps(matrix.to_dict(), sort_keys=True)  # nan == nan, every float as written


def cached_matrix(db) -> tuple[str, cache.VariantCells]:
    cells = cache.VariantCells(db)
    matrix = variants.variant_matrix(db, measure=cells)
    cells.flush()
    return text(matrix), cells


def _runs_read(monkeypatch) -> list[tuple[str, ...]]:
    read: list[tuple[str, ...]] = []
    original = query.series._series_trials

    def counted(store_, run_ids):  # noqa: ANN001, ANN202 - the function's own
        read.append(tuple(run_ids))
        return original(store_, run_ids)

    monkeypatch.setattr(query.series, "_series_trials", counted)
    return read


def test_cached_cells_give_the_matrix_of_the_samples_and_are_reused(db):
    plain = text(variants.variant_matrix(db))
    assert '"outcome": "win"' in plain and '"outcome": "lose"' in plain
    first, cells = cached_matrix(db)
    assert first == plain and cells.reused == 0
    again, cells = cached_matrix(db)
    assert again == plain and cells.reused == 2


def test_a_new_run_on_one_chip_reads_only_that_chips_samples(db, monkeypatch):
    cached_matrix(db)
    new_run = add_run(db, "chip-a", 2, grid_results(np.random.default_rng(4), trials=3), minutes=40)
    read = _runs_read(monkeypatch)
    after, cells = cached_matrix(db)
    assert cells.reused == 1 and read == [(new_run,)]
    monkeypatch.undo()
    assert after == text(variants.variant_matrix(db))


def test_a_later_trial_of_a_compared_run_measures_its_chip_again(db):
    cached_matrix(db)
    run = query.resolve_ref(db, sha_of(1)).runs["chip-b"][-1]
    job = bench_job("swiglu", "unfused", {"B": 1, "H": 1, "S": 64, "D": 32})
    store.record_result(db, run, job, JobResult(job.key, "passed", samples=timings(
        np.random.default_rng(2), 9e-3), inner=1, trial=7))  # a later trial: samples, no new job
    after, cells = cached_matrix(db)
    assert cells.reused == 1 and after == text(variants.variant_matrix(db))


def test_an_unreadable_row_is_measured_again(db):
    expected, _ = cached_matrix(db)
    with db.session() as session:
        for row in session.scalars(select(AnalysisCache).where(AnalysisCache.kind == "variants")):
            row.payload = row.payload[:-3]
    again, cells = cached_matrix(db)
    assert again == expected and cells.reused == 0


def test_a_stored_row_holds_every_measured_value_exactly(db):
    cells = {cell: runs for cell, runs in variants._cell_runs(
        variants._presence(db, None, variants.default_variants()), variants.default_variants(), pooled=False).items()
        if cell[4] == "chip-a"}
    keys, measured = variants.measure_cells(db, "chip-a", cells, variants.default_variants())
    found = cache.pages._measured_in(cache.pages._measured_out(keys, measured))
    assert found is not None and found[0] == keys and keys
    for name in ("trials_base", "trials_head", "samples_base", "samples_head", "df", "effect", "variance"):
        assert np.array_equal(getattr(found[1], name), getattr(measured, name), equal_nan=True), name
    assert [(b.tolist(), h.tolist()) for b, h in found[1].logs] == [(b.tolist(), h.tolist()) for b, h in measured.logs]
