"""Synthetic result databases for the analysis tests: runs with planted changes, written through the real store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from sqlalchemy import insert, select

from harness.core.chip import ChipIdentity
from harness.core.job import JobResult, KernelJob
from harness.record import store
from harness.record.models import Commit, Run

CHIP_A = ChipIdentity(key="chip-a", backend="cpu", device_name="A", architecture="x86_64")
CHIP_B = ChipIdentity(key="chip-b", backend="cpu", device_name="B", architecture="arm64")
CHIPS = {"chip-a": CHIP_A, "chip-b": CHIP_B}
SHAPES = ({"B": 1, "H": 1, "S": 64, "D": 32}, {"B": 1, "H": 1, "S": 128, "D": 32})
SERIES = (("flash_prefill", "sdpa"), ("flash_prefill", "flash_bq16_bk32"), ("swiglu", "unfused"),
          ("swiglu", "fused_gateup"))
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def sha_of(i: int) -> str:
    return f"{i:04x}" + "c0ffee" * 6


def bench_job(kernel: str, variant: str, shape: dict[str, int], dtype: str = "float32") -> KernelJob:
    return KernelJob.of("benchmark", kernel, variant, shape, dtype, name="bench")


def check_job(kernel: str, variant: str, check: str = "reference", dtype: str = "float32") -> KernelJob:
    shape = {"B": 1, "H": 1, "S_q": 13, "S_kv": 37, "D": 32}
    return KernelJob.of("correctness", kernel, variant, shape, dtype, check, name="check")


def timings(rng: np.random.Generator, median: float, n: int = 10, cv: float = 0.02) -> list[float]:
    return (median * np.exp(rng.normal(0.0, cv, n))).tolist()


def parents_of(commit: int) -> list[str]:
    """The parents of ``sha_of(commit)`` in the synthetic histories: one line, commit ``commit - 1`` before it."""
    return [sha_of(commit - 1)] if commit > 0 else []


def link_commits(db: store.Store, commit: int) -> None:
    """Store the commits before ``sha_of(commit)`` that are not stored (sha and parents, no runs), as
    ``store.record_ancestry`` stores the commits between runs: ancestry orders the synthetic line (proven)."""
    with db.session() as session:
        stored = set(session.scalars(select(Commit.sha).where(Commit.repo == "")))
        missing = [{"repo": "", "sha": sha_of(k), "message": "", "author": "", "branch": "", "committed_at": None,
                    "parents": parents_of(k)} for k in range(commit) if sha_of(k) not in stored]
        if missing:
            session.execute(insert(Commit.__table__), missing)


def add_run(db: store.Store, chip: str, commit: int, results: list[tuple[KernelJob, JobResult]], *, minutes: float,
            dirty: bool = False, message: str = "", linked: bool = True) -> str:
    """One run of commit ``sha_of(commit)`` on ``chip`` that started ``minutes`` after T0; the commits are one line
    (``link_commits``), so ancestry proves their order (``linked`` False: not stored, for a test of a commit numbered
    in the ten thousands that needs no order)."""
    if linked:
        link_commits(db, commit)
    run_id = store.create_run(db, ident=CHIPS[chip], facts={"hostname": f"host-{chip}"},
                              commit={"sha": sha_of(commit), "message": message or f"commit {commit}",
                                      "branch": "main", "parents": parents_of(commit)},
                              suite="synthetic", dirty=dirty, executor="local", planned_jobs=len(results))
    with db.session() as session:
        session.get(Run, run_id).started_at = T0 + timedelta(minutes=minutes)
    for job, result in results:
        store.record_result(db, run_id, job, result)
    return run_id


def grid_results(rng: np.random.Generator, factors: dict[tuple[str, str, int], float] | None = None, *,
                 n: int = 10, cv: float = 0.02, series=SERIES, trials: int = 3,
                 between: float = 0.01) -> list[tuple[KernelJob, JobResult]]:
    """Every (kernel, variant, shape) benchmark at 1 ms x factor; ``factors`` keys: (kernel, variant, shape idx).
    Each job is measured in ``trials`` trials (job processes), each with its own level: lognormal ``between``
    (log sd) around the median, as real processes differ; ``n`` samples of lognormal ``cv`` within each."""
    factors = factors or {}
    out = []
    for kernel, variant in series:
        for s, shape in enumerate(SHAPES):
            job = bench_job(kernel, variant, shape)
            median = 1e-3 * (1 + s) * factors.get((kernel, variant, s), 1.0)
            for trial in range(trials):
                level = median * float(np.exp(rng.normal(0.0, between)))
                out.append((job, JobResult(job.key, "passed", samples=timings(rng, level, n, cv), inner=1,
                                           trial=trial)))
    return out


def checks(statuses: dict[tuple[str, str], str] | None = None) -> list[tuple[KernelJob, JobResult]]:
    """Correctness jobs of every (kernel, variant) of SERIES and ``statuses``, passed unless ``statuses`` says so."""
    statuses = statuses or {}
    out = []
    for kernel, variant in dict.fromkeys([*SERIES, *statuses]):
        job = check_job(kernel, variant)
        status = statuses.get((kernel, variant), "passed")
        detail = "max error 0.5 > tolerance 1e-3" if status == "failed" else ""
        out.append((job, JobResult(job.key, status, detail=detail, max_error=0.5 if detail else 1e-6,
                                   tolerance=1e-3)))
    return out
