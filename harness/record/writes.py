"""Writing runs: a run's chip, machine and commit (found or created), its job results with their samples, and
its life (resumed, finished, reaped when abandoned, its calibrated peaks set)."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from harness.core.chip import ChipIdentity
from harness.core.job import CALIBRATION_COPY, CALIBRATION_MATMUL, Job, JobResult, per_test_key, unit_key
from harness.core.proc import holder_is_gone, process_identity
from harness.record.db import Database
from harness.record.identity import canonical
from harness.record.links import link_repository
from harness.record.models import Chip, Commit, JobRecord, Machine, Run, Sample, utcnow
from harness.record.trial_summary import apply_roofline, sample_writer, summarize_samples


def get_or_create_chip(session: Session, ident: ChipIdentity) -> Chip:
    chip_id, _ = find_or_insert_chip(session, {
        "key": ident.key, "backend": ident.backend, "device_name": ident.device_name,
        "architecture": ident.architecture, "memory_bytes": ident.memory_bytes, "gpu_cores": ident.gpu_cores,
        "record": ident.to_dict()})
    return session.get(Chip, chip_id)


def get_or_create_machine(session: Session, chip: Chip, facts: dict[str, Any]) -> Machine:
    hostname = str(facts.get("hostname", "unknown"))
    machine_id, _ = find_or_insert_machine(session, {"hostname": hostname, "chip_id": chip.id, "facts": facts})
    return session.get(Machine, machine_id)


def get_or_create_commit(session: Session, sha: str, repo: str = "", message: str = "", author: str = "",
                         committed_at: datetime | None = None, branch: str = "",
                         parents: list[str] | None = None) -> Commit:
    """The commit row, created if new; a row stored without these details (a commit between runs, or one from
    before parents were recorded) gets the ones it lacks. ``parents`` None: unknown."""
    repo = canonical(repo)
    commit_id, _ = find_or_insert_commit(session, {
        "repo": repo, "sha": sha, "message": message, "author": author, "committed_at": committed_at,
        "branch": branch, "parents": None if parents is None else list(parents)})
    return session.get(Commit, commit_id, populate_existing=True)


# The one get-or-create of the rows found by their natural keys (a run's, and a bundle's on import): each takes the
# row's column values and returns its id and whether it was inserted.


def find_or_insert_chip(session: Session, values: dict[str, Any]) -> tuple[int, bool]:
    """The chip keyed ``values["key"]``."""
    found = session.scalar(select(Chip.id).where(Chip.key == values["key"]))
    return (found, False) if found is not None else (_insert_one(session, Chip, values), True)


def find_or_insert_machine(session: Session, values: dict[str, Any]) -> tuple[int, bool]:
    """The machine keyed (``values["hostname"]``, ``values["chip_id"]``)."""
    found = session.scalar(select(Machine.id).where(Machine.hostname == values["hostname"],
                                                    Machine.chip_id == values["chip_id"]))
    return (found, False) if found is not None else (_insert_one(session, Machine, values), True)


def find_or_insert_commit(session: Session, values: dict[str, Any]) -> tuple[int, bool]:
    """The commit keyed (``values["repo"]``, ``values["sha"]``), the repository key as given. A stored one is kept
    as it is, but for what it lacks: unknown parents, or the details of a commit stored as a link (or before they
    were recorded)."""
    existing = session.execute(select(Commit.id, Commit.parents, Commit.message, Commit.author,
                                      Commit.committed_at, Commit.branch)
                               .where(Commit.repo == values["repo"], Commit.sha == values["sha"])).first()
    if existing is None:
        return _insert_one(session, Commit, values), True
    lacking = {name: values[name] for name in ("parents", "message", "author", "committed_at", "branch")
               if getattr(existing, name) in (None, "") and values.get(name) not in (None, "")}
    if lacking:
        session.execute(update(Commit.__table__).where(Commit.__table__.c.id == existing.id).values(**lacking))
    return existing.id, False


def _insert_one(session: Session, model: type[Chip | Machine | Commit], values: dict[str, Any]) -> int:
    return session.execute(insert(model.__table__).values(**values).returning(model.__table__.c.id)).scalar_one()


def create_run(store: Database, *, ident: ChipIdentity, facts: dict[str, Any], commit: dict[str, Any], suite: str,
               dirty: bool, executor: str, planned_jobs: int, options: dict[str, Any] | None = None,
               run_id: str | None = None) -> str:
    """Insert a new run row (a new id each time: running the same commit again never overwrites).

    ``commit``: the commit row (``harness.spec.git.CommitInfo.as_row``): sha, repo, message, author, committed_at,
    parents, and ``branch``, the branch the run is made for (stored with the run too). With ``git_dir`` (where
    the repository is on this machine) the repository's stored commits are then linked (:func:`record_ancestry`).
    """
    run_id = run_id or uuid.uuid4().hex
    commit = dict(commit)
    git_dir = commit.pop("git_dir", "")
    for attempt in range(3):
        try:
            with store.session() as session:
                chip = get_or_create_chip(session, ident)
                machine = get_or_create_machine(session, chip, facts)
                commit_row = get_or_create_commit(session, **commit)
                session.add(Run(id=run_id, commit_id=commit_row.id, chip_id=chip.id, machine_id=machine.id,
                                suite=suite, dirty=dirty, executor=executor, planned_jobs=planned_jobs,
                                options={**(options or {}), "driver": process_identity()},
                                branch=commit.get("branch") or "", settling=bool((options or {}).get("settle"))))
            break
        except IntegrityError:
            # Another writer (a cluster driver's other chip, another run) created the same chip, machine or
            # commit between our look-up and our insert (PostgreSQL READ COMMITTED): the retry finds it.
            if attempt == 2:
                raise
    if git_dir:
        link_repository(store, canonical(commit.get("repo", "")), git_dir, commit.get("sha", ""))
    return run_id


def _job_record(run_id: str, job: Job, result: JobResult, peaks: tuple[float | None, float | None]) -> JobRecord:
    labels = job.labels  # what each job type is stored under (harness/core/job.py)
    record = JobRecord(run_id=run_id, key=job.key, kind=job.kind, name=job.name, kernel=labels.kernel,
                       variant=labels.variant, dtype=labels.dtype, shape=labels.shape, shape_key=labels.shape_key,
                       check_name=labels.check, status=result.status, detail=result.detail[:4000],
                       output_tail=result.output_tail[-4000:], max_error=result.max_error,
                       tolerance=result.tolerance, duration_s=result.duration_s, node=result.node,
                       attempts=result.attempts)
    if result.samples:
        record.inner, record.warmup_s, record.warmup_calls = result.inner, result.warmup_s, result.warmup_calls
        record.flops, record.bytes_moved = result.flops, result.bytes_moved
        record.timing_mode, record.round_trip_s = result.mode, result.round_trip_s
        record.backlog_calls = result.backlog_calls
        summarize_samples(record, result.samples, peaks)
    return record


# The status a job keeps when its trials disagree: any failure shows over a pass, a pass over a skip.
_TRIAL_STATUS_RANK = {"skipped": 0, "passed": 1}


def _add_trial(session: Session, record: JobRecord, result: JobResult,
               peaks: tuple[float | None, float | None]) -> bool:
    """Another trial of a stored benchmark job: its samples appended (their ``trial`` set), the summary over all
    trials, and the worse status kept (a failed trial shows; its detail says which). False if already stored."""
    stored = session.scalar(select(func.count()).select_from(Sample).where(Sample.job_id == record.id,
                                                                         Sample.trial == result.trial))
    if stored or (not result.samples and result.status == record.status):
        return False
    if _TRIAL_STATUS_RANK.get(result.status, 2) > _TRIAL_STATUS_RANK.get(record.status, 2):
        record.status = result.status
        record.detail = f"trial {result.trial + 1}: {result.detail}"[:4000]
        record.output_tail = result.output_tail[-4000:] or record.output_tail
    record.duration_s += result.duration_s
    if result.samples:
        first = session.scalar(select(func.coalesce(func.max(Sample.idx) + 1, 0)).where(Sample.job_id == record.id))
        sample_writer(session, append=True)([(record.id, first + i, s, result.trial)
                                             for i, s in enumerate(result.samples)])
        everything = list(session.scalars(select(Sample.seconds).where(Sample.job_id == record.id)))
        record.trials = len(set(session.scalars(select(Sample.trial).where(Sample.job_id == record.id))))
        record.inner = record.inner or result.inner
        record.timing_mode = record.timing_mode or result.mode
        record.round_trip_s = record.round_trip_s if record.round_trip_s is not None else result.round_trip_s
        record.backlog_calls = least(record.backlog_calls, result.backlog_calls)  # host-paced in any trial shows
        record.flops, record.bytes_moved = record.flops or result.flops, record.bytes_moved or result.bytes_moved
        summarize_samples(record, everything, peaks)
    return True


def least(first: float | None, second: float | None) -> float | None:
    """The smaller of two optional values (None where both are)."""
    known = [value for value in (first, second) if value is not None]
    return min(known) if known else None


def record_result(store: Database, run_id: str, job: Job, result: JobResult,
                  peaks: tuple[float | None, float | None] = (None, None)) -> bool:
    """Write one job result with its samples; False (and nothing written) if (run, key) is already stored -- for a
    benchmark, if that trial of it is (another trial adds its samples to the job's row: :func:`_add_trial`)."""
    with store.sessions() as session:
        try:
            with session.begin():
                existing = session.scalar(select(JobRecord).where(JobRecord.run_id == run_id,
                                                                  JobRecord.key == job.key))
                if existing is not None:
                    return job.kind == "benchmark" and _add_trial(session, existing, result, peaks)
                record = _job_record(run_id, job, result, peaks)
                session.add(record)
                session.flush()
                if result.samples:
                    sample_writer(session)([(record.id, i, s, result.trial) for i, s in enumerate(result.samples)])
                session.add_all(_test_records(run_id, job, result))  # a pytest job's tests, in the same transaction
        except IntegrityError:
            if _job_is_stored(store, run_id, job.key):
                return False  # a concurrent writer stored it first
            raise  # anything else (a run that is not there, a value the column refuses) must not vanish
    return True


def _job_is_stored(store: Database, run_id: str, key: str) -> bool:
    with store.session() as session:
        return session.scalar(select(JobRecord.id).where(JobRecord.run_id == run_id, JobRecord.key == key)) is not None


def _test_records(run_id: str, job: Job, result: JobResult) -> list[JobRecord]:
    """One row per test of a pytest job: kind "test", key test/<selection>/<nodeid>, status its outcome."""
    records: dict[str, JobRecord] = {}
    labels = job.labels
    for test in result.tests:
        key = per_test_key(job.name, str(test["nodeid"]))
        records.setdefault(key, JobRecord(
            run_id=run_id, key=key, kind="test", name=str(test["nodeid"])[:255], kernel=labels.kernel,
            variant=labels.variant, dtype=labels.dtype, shape={}, shape_key="", check_name="", status=test["outcome"],
            detail=str(test.get("detail", ""))[:4000], output_tail=str(test.get("longrepr", ""))[-4000:],
            duration_s=float(test.get("duration_s") or 0.0), node=result.node, attempts=result.attempts))
    return list(records.values())


def set_peaks(store: Database, run_id: str, peak_flops: float | None, peak_bytes_per_s: float | None) -> None:
    with store.session() as session:
        run = session.get(Run, run_id)
        run.peak_flops, run.peak_bytes_per_s = peak_flops, peak_bytes_per_s


@dataclass(frozen=True)
class StoredRun:
    """What resuming a run needs: its options, commit, chip, and the jobs (and trials) it already has."""

    options: dict[str, Any]
    sha: str
    chip_key: str
    units: dict[str, str]  # each stored execution (job.unit: a key, or a benchmark's later trial) -> its status
    keys: set[str]  # every stored key, per-test rows included

    @property
    def statuses(self) -> Counter:
        """Of the stored executions (per-test rows not counted)."""
        return Counter(self.units.values())


def stored_run(store: Database, run_id: str) -> StoredRun | None:
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        rows = session.execute(select(JobRecord.id, JobRecord.key, JobRecord.kind, JobRecord.status)
                               .where(JobRecord.run_id == run.id)).all()
        trials: dict[int, set[int]] = {}
        for job_id, trial in session.execute(select(Sample.job_id, Sample.trial).distinct().join(
                JobRecord, Sample.job_id == JobRecord.id).where(JobRecord.run_id == run.id)):
            trials.setdefault(job_id, set()).add(trial)
        units = {unit_key(key, trial): status for job_id, key, kind, status in rows if kind != "test"
                 for trial in sorted(trials.get(job_id, {0}))}
        return StoredRun(dict(run.options or {}), run.commit.sha, run.chip.key, units, {row.key for row in rows})


def reopen_run(store: Database, run_id: str) -> None:
    """Mark a stored run as running again (``harness run --resume``), held by this process now."""
    with store.session() as session:
        run = session.get(Run, run_id)
        run.status, run.finished_at = "running", None
        run.options = {**(run.options or {}), "driver": process_identity()}


ABANDONED = "abandoned"  # a run whose driver process died without finishing it (SIGKILL, a crash, power loss)


def reap_abandoned_runs(store: Database) -> list[str]:
    """Finish as "abandoned" (with the time it was found) every "running" run whose driver was a process of this
    machine that no longer runs; a run driven from another machine is left alone (nothing here can tell)."""
    with store.session() as session:
        running = session.scalars(select(Run).where(Run.status == "running")).all()
        gone = [run for run in running if holder_is_gone((run.options or {}).get("driver") or {})]
        for run in gone:
            run.status, run.finished_at = ABANDONED, utcnow()
        return [run.id for run in gone]


def finish_run(store: Database, run_id: str, status: str) -> None:
    with store.session() as session:
        run = session.get(Run, run_id)
        run.status, run.finished_at = status, utcnow()


def stored_keys(store: Database, run_id: str) -> set[str]:
    with store.session() as session:
        return set(session.scalars(select(JobRecord.key).where(JobRecord.run_id == run_id)))


def finalize_roofline(store: Database, run_id: str) -> tuple[float | None, float | None]:
    """Set the run's calibrated peaks (best matmul FLOP/s, best copy B/s) and every benchmark's % of peak."""
    with store.session() as session:
        run = session.get(Run, run_id)
        calib = session.scalars(select(JobRecord).where(JobRecord.run_id == run_id,
                                                        JobRecord.kind == "calibration",
                                                        JobRecord.median_s.is_not(None))).all()
        flops = [r.achieved_flops for r in calib if r.kernel == CALIBRATION_MATMUL and r.achieved_flops]
        copies = [r.achieved_bytes_per_s for r in calib if r.kernel == CALIBRATION_COPY and r.achieved_bytes_per_s]
        run.peak_flops = max(flops) if flops else run.peak_flops
        run.peak_bytes_per_s = max(copies) if copies else run.peak_bytes_per_s
        for record in session.scalars(select(JobRecord).where(JobRecord.run_id == run_id,
                                                              JobRecord.median_s.is_not(None))):
            apply_roofline(record, run.peak_flops, run.peak_bytes_per_s)
        return run.peak_flops, run.peak_bytes_per_s
