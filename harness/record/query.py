"""Read side of the store: plain-data views of runs and results for the analysis and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.record.models import Chip, JobRecord, Run
from harness.record.store import Store


@dataclass
class RunView:
    id: str
    chip_key: str
    sha: str
    message: str
    branch: str
    dirty: bool
    suite: str
    status: str
    started_at: Any
    finished_at: Any
    peak_flops: float | None
    peak_bytes_per_s: float | None
    planned_jobs: int
    hostname: str
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in self.jobs:
            out[job["status"]] = out.get(job["status"], 0) + 1
        return out


JOB_FIELDS = ("key", "kind", "name", "kernel", "variant", "dtype", "shape", "shape_key", "check_name", "status",
              "detail", "output_tail", "max_error", "tolerance", "duration_s", "node", "attempts", "n_samples",
              "inner", "warmup_s", "median_s", "ci_low_s", "ci_high_s", "iqr_rel", "flops", "bytes_moved",
              "achieved_flops", "achieved_bytes_per_s", "pct_peak", "bound")


def _job_dict(record: JobRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in JOB_FIELDS}


def _run_view(session: Session, run: Run, with_jobs: bool) -> RunView:
    view = RunView(run.id, run.chip.key, run.commit.sha, run.commit.message, run.commit.branch, run.dirty, run.suite,
                   run.status, run.started_at, run.finished_at, run.peak_flops, run.peak_bytes_per_s,
                   run.planned_jobs, run.machine.hostname if run.machine else "")
    if with_jobs:
        records = session.scalars(select(JobRecord).where(JobRecord.run_id == run.id).order_by(JobRecord.id))
        view.jobs = [_job_dict(r) for r in records]
    return view


def chips(store: Store) -> list[dict[str, Any]]:
    with store.session() as session:
        return [{"key": c.key, "backend": c.backend, "device_name": c.device_name, "architecture": c.architecture,
                 "memory_bytes": c.memory_bytes, "gpu_cores": c.gpu_cores, "record": c.record}
                for c in session.scalars(select(Chip).order_by(Chip.key))]


def runs(store: Store, chip_key: str | None = None, with_jobs: bool = False) -> list[RunView]:
    """Runs, newest first (optionally of one chip)."""
    with store.session() as session:
        query = select(Run).join(Chip).order_by(Run.started_at.desc())
        if chip_key:
            query = query.where(Chip.key == chip_key)
        return [_run_view(session, run, with_jobs) for run in session.scalars(query)]


def latest_run(store: Store, chip_key: str) -> RunView | None:
    with store.session() as session:
        run = session.scalars(select(Run).join(Chip).where(Chip.key == chip_key)
                              .order_by(Run.started_at.desc()).limit(1)).first()
        return _run_view(session, run, True) if run else None


def get_run(store: Store, run_id: str) -> RunView | None:
    with store.session() as session:
        run = session.get(Run, run_id)
        return _run_view(session, run, True) if run else None
