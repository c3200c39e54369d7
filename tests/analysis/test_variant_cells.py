"""The cross-chip variant matrix: which runs a cell compares, why a chip has no verdict, why nothing diverges.

Synthetic runs through the real store (SQLite and PostgreSQL): a variant and the default measured at shapes that
two chips share or not, partial runs that must not hide older series, skipped CUDA-only variants.
"""

from __future__ import annotations

import json

import numpy as np

from harness.analysis.variants import variant_matrix
from harness.core.job import JobResult
from testkit.analysis import add_run, bench_job, sha_of, timings

SHARED = {"B": 1, "H": 1, "S": 64, "D": 32}
ONLY_A = {"B": 1, "H": 1, "S": 128, "D": 32}
ONLY_B = {"B": 1, "H": 1, "S": 256, "D": 32}
FLASH = "flash_prefill"


def bench(rng: np.random.Generator, kernel: str, variant: str, shape: dict[str, int], seconds: float,
          trials: int = 3) -> list:
    """One benchmark job measured in ``trials`` job processes around ``seconds`` per call."""
    job = bench_job(kernel, variant, shape)
    return [(job, JobResult(job.key, "passed", samples=timings(rng, seconds * float(np.exp(rng.normal(0, 0.005))),
                                                               10, 0.01), inner=1, trial=trial))
            for trial in range(trials)]


def skipped(kernel: str, variant: str, shape: dict[str, int], reason: str) -> list:
    job = bench_job(kernel, variant, shape)
    return [(job, JobResult(job.key, "skipped", detail=reason))]


def flash_row(rng, shape, factor: float, variant: str = "flash_bq16_bk32") -> list:
    """sdpa at 1 ms and ``variant`` at ``factor`` ms, one shape."""
    return bench(rng, FLASH, "sdpa", shape, 1e-3) + bench(rng, FLASH, variant, shape, factor * 1e-3)


def test_a_variant_winning_on_one_chip_and_losing_on_the_other_at_a_shared_shape_is_divergent(db):
    rng = np.random.default_rng(1)
    add_run(db, "chip-a", 1, flash_row(rng, SHARED, 0.8) + flash_row(rng, ONLY_A, 0.8), minutes=0)
    add_run(db, "chip-b", 1, flash_row(rng, SHARED, 1.25) + flash_row(rng, ONLY_B, 1.0), minutes=1)
    matrix = variant_matrix(db)
    (divergent,) = matrix.divergent
    assert (divergent.variant, divergent.shape_key, divergent.winning_chip, divergent.losing_chip) == (
        "flash_bq16_bk32", "B=1,D=32,H=1,S=64", "chip-a", "chip-b")
    assert matrix.shared == 1 and "divergent" in matrix.divergence_note
    # The shapes measured on one chip only: the other chip has no verdict there, and says it never ran it.
    gaps = {(g.chip, g.shape_key): g for g in matrix.gaps}
    assert set(gaps) == {("chip-b", "B=1,D=32,H=1,S=128"), ("chip-a", "B=1,D=32,H=1,S=256")}
    assert gaps[("chip-b", "B=1,D=32,H=1,S=128")].reason == "never run on this chip"
    assert {c.sha for c in matrix.cells} == {sha_of(1)}
    json.dumps(matrix.to_dict(), allow_nan=False)


def test_without_a_shared_shape_the_matrix_says_no_variant_can_diverge(db):
    rng = np.random.default_rng(2)
    add_run(db, "chip-a", 1, flash_row(rng, ONLY_A, 0.8), minutes=0)
    add_run(db, "chip-b", 1, flash_row(rng, ONLY_B, 1.25), minutes=1)
    matrix = variant_matrix(db)
    assert not matrix.divergent and matrix.shared == 0
    assert matrix.divergence_note.startswith("no (kernel, dtype, shape) was measured on two chips")
    assert matrix.to_dict()["divergence_note"] == matrix.divergence_note


def test_shared_shapes_where_no_variant_diverges_say_how_many_were_compared(db):
    rng = np.random.default_rng(3)
    add_run(db, "chip-a", 1, flash_row(rng, SHARED, 0.8) + flash_row(rng, ONLY_A, 0.8), minutes=0)
    add_run(db, "chip-b", 1, flash_row(rng, SHARED, 0.8) + flash_row(rng, ONLY_A, 1.0), minutes=1)
    matrix = variant_matrix(db)
    assert not matrix.divergent and matrix.shared == 2
    assert matrix.divergence_note.startswith("measured on 2 shared (kernel, dtype, shape) row(s), no variant diverges")


def test_a_skipped_variant_is_a_gap_with_its_reason(db):
    rng = np.random.default_rng(4)
    add_run(db, "chip-a", 1, flash_row(rng, SHARED, 0.8) + flash_row(rng, SHARED, 0.9, "cuda_bq64_bk64"),
            minutes=0)
    add_run(db, "chip-b", 1, flash_row(rng, SHARED, 1.0)
            + skipped(FLASH, "cuda_bq64_bk64", SHARED, "variant cuda_bq64_bk64 needs CUDA: CUDA not available"),
            minutes=1)
    matrix = variant_matrix(db)
    (gap,) = matrix.gaps
    assert (gap.chip, gap.variant, gap.status) == ("chip-b", "cuda_bq64_bk64", "skipped")
    assert gap.reason == "skipped: the variant needs CUDA: CUDA not available"


def test_a_newer_partial_run_hides_no_series_and_commit_keeps_to_its_runs(db):
    """chip-a: a full run (flash and swiglu) at commit 1, then a flash-only run at commit 2; each cell comes from
    the newest run that measured both its variant and the default there."""
    rng = np.random.default_rng(5)
    # 4 trials: a family of 2 cells is not moderated, and a lone cell's win needs 4 trials a side (the rank check)
    full = flash_row(rng, SHARED, 0.8) + bench(rng, "swiglu", "unfused", SHARED, 1e-3, trials=4) + bench(
        rng, "swiglu", "fused_gateup", SHARED, 0.7e-3, trials=4)
    first = add_run(db, "chip-a", 1, full, minutes=0)
    second = add_run(db, "chip-a", 2, flash_row(rng, SHARED, 1.0), minutes=10)
    matrix = variant_matrix(db)
    cells = {c.kernel: c for c in matrix.cells}
    assert set(cells) == {FLASH, "swiglu"}
    assert cells[FLASH].run_ids == (second,) and cells[FLASH].sha == sha_of(2)
    assert cells[FLASH].outcome in ("tie", "inconclusive")  # the newer run's flash, not the older win
    assert cells["swiglu"].run_ids == (first,) and cells["swiglu"].sha == sha_of(1)
    assert cells["swiglu"].outcome == "win"
    assert matrix.runs == {"chip-a": (second, first)} and matrix.shas == {"chip-a": sha_of(2)}
    at_two = variant_matrix(db, commit=sha_of(2))
    assert {c.kernel for c in at_two.cells} == {FLASH} and at_two.runs == {"chip-a": (second,)}
    assert {c.kernel for c in variant_matrix(db, commit=sha_of(1)).cells} == {FLASH, "swiglu"}


def test_a_default_measured_only_in_another_run_gives_no_verdict_and_says_so(db):
    """A variant is only compared with a default measured in the same run (interleaved trials)."""
    rng = np.random.default_rng(6)
    add_run(db, "chip-a", 1, bench(rng, FLASH, "sdpa", SHARED, 1e-3), minutes=0)
    add_run(db, "chip-a", 2, bench(rng, FLASH, "flash_bq16_bk32", SHARED, 0.8e-3)
            + flash_row(rng, ONLY_A, 0.8), minutes=10)
    matrix = variant_matrix(db)
    assert {c.shape_key for c in matrix.cells} == {"B=1,D=32,H=1,S=128"}
    assert not matrix.gaps  # the shape without a verdict has one on no chip: not a row of the matrix


def test_a_chip_measured_less_often_is_not_looked_for_past_every_newer_run_of_the_others(db, monkeypatch):
    """Chip B ran once, chip A twenty times since: the matrix finds B's cells in B's own newest run, reading a few
    runs of each chip, not the twenty newer runs of A first (each chip's runs are read newest first on their own);
    the matrix is the one those runs give."""
    from harness.record import query

    rng = np.random.default_rng(7)
    add_run(db, "chip-b", 1, flash_row(rng, SHARED, 1.25), minutes=0)
    for commit in range(1, 21):
        add_run(db, "chip-a", commit, flash_row(rng, SHARED, 0.8), minutes=commit)
    read: list[str] = []
    measured, presence = query.measured_series, query.job_presence

    def counted_measured(store, *, run_ids=None):  # noqa: ANN001, ANN202 - the query's own
        read.extend(run_ids or [])
        return measured(store, run_ids=run_ids)

    def counted_presence(store, **kwargs):  # noqa: ANN001, ANN003, ANN202 - the query's own
        found = presence(store, **kwargs)
        read.extend({row.run_id for row in found})
        return found

    monkeypatch.setattr(query, "measured_series", counted_measured)
    monkeypatch.setattr(query, "job_presence", counted_presence)
    matrix = variant_matrix(db)
    assert {(c.chip, c.sha) for c in matrix.cells} == {("chip-a", sha_of(20)), ("chip-b", sha_of(1))}
    assert len(read) <= 4 and matrix.shared == 1
