"""Bundle export: the selected runs, with their chips, machines, commits (and the ancestry linking them) and jobs
with raw samples, streamed from one read snapshot into a file written atomically."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path
from typing import IO, Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from harness.core.errors import HarnessError
from harness.record.bundle.format import (
    CHIP,
    COMMIT,
    COMPRESS_LEVEL,
    FORMAT,
    JOB,
    MACHINE,
    RUN,
    SAMPLE_BATCH,
    VERSION,
    WRITE_CHUNK,
    dt_out,
    fields_out,
    harness_version,
)
from harness.record.db import Database, mask_url
from harness.record.models import Chip, Commit, JobRecord, Machine, Run, Sample


@dataclass
class ExportSummary:
    path: Path
    runs: int = 0
    jobs: int = 0
    samples: int = 0
    bytes: int = 0


class _PayloadWriter:
    """JSON lines, hashed (SHA-256 of the uncompressed bytes) and compressed as one gzip member into ``sink``."""

    def __init__(self, sink: IO[bytes], level: int) -> None:
        self.sink = sink
        self.compressor = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: a gzip member
        self.digest = hashlib.sha256()
        self.parts: list[bytes] = []
        self.pending = 0
        self.size = 0

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")).encode("ascii") + b"\n"
        self.parts.append(line)
        self.pending += len(line)
        if self.pending >= WRITE_CHUNK:
            self._flush()

    def _flush(self) -> None:
        data = b"".join(self.parts)
        self.parts, self.pending = [], 0
        self.digest.update(data)
        self.size += len(data)
        self.sink.write(self.compressor.compress(data))

    def close(self) -> None:
        self._flush()
        self.sink.write(self.compressor.flush())


def _select_runs(session: Session, db_label: str, run_ids: Iterable[str] | None, commit: str | None,
                 chip: str | None) -> list[Run]:
    run_ids = list(dict.fromkeys(run_ids or ()))
    if run_ids and commit:
        raise HarnessError("give --run or --commit, not both")
    query = select(Run).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
    if run_ids:
        found = set(session.scalars(select(Run.id).where(Run.id.in_(run_ids))))
        if missing := [rid for rid in run_ids if rid not in found]:
            raise HarnessError(f"no run {', '.join(missing)} in {db_label}")
        query = query.where(Run.id.in_(run_ids))
    if commit:
        prefix = commit.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
            raise HarnessError(f"--commit must be a commit sha (4 to 64 hex digits), not {commit!r}")
        shas = set(session.scalars(select(Commit.sha).where(Commit.sha.startswith(prefix))  # not links: runs only
                                   .where(exists().where(Run.commit_id == Commit.id))))
        if not shas:
            raise HarnessError(f"no commit {commit} in {db_label}")
        if len(shas) > 1:
            raise HarnessError(f"commit {commit} is ambiguous in {db_label}: {', '.join(sorted(shas)[:5])}")
        query = query.where(Commit.sha.in_(shas))
    if chip:
        if session.scalar(select(Chip.id).where(Chip.key == chip)) is None:
            raise HarnessError(f"no chip {chip} in {db_label}")
        query = query.where(Chip.key == chip)
    runs = list(session.scalars(query.order_by(Run.started_at, Run.id)))
    if not runs and (run_ids or commit or chip):
        raise HarnessError(f"no runs in {db_label} match the selection")
    return runs


def _write_payload(session: Session, runs: list[Run], writer: _PayloadWriter, summary: ExportSummary) -> None:
    chips: dict[int, Chip] = {}
    machines: dict[int, Machine] = {}
    commits: dict[int, Commit] = {}
    for run in runs:
        chips[run.chip_id] = run.chip
        commits[run.commit_id] = run.commit
        if run.machine is not None:
            machines[run.machine.id] = run.machine
            chips.setdefault(run.machine.chip_id, session.get(Chip, run.machine.chip_id))
    # The other commits of those repositories whose parents are known (commits between runs, runs not selected):
    # the ancestry that links the exported commits travels with them.
    repos = sorted({commit.repo for commit in commits.values()})
    if repos:
        for commit in session.scalars(select(Commit).where(Commit.repo.in_(repos), Commit.parents.is_not(None))):
            commits.setdefault(commit.id, commit)
    for chip in sorted(chips.values(), key=lambda c: c.key):
        writer.write({"type": "chip", **fields_out(CHIP, chip)})
    for machine in sorted(machines.values(), key=lambda m: (chips[m.chip_id].key, m.hostname)):
        writer.write({"type": "machine", "chip": chips[machine.chip_id].key, **fields_out(MACHINE, machine)})
    for commit in sorted(commits.values(), key=lambda c: (c.repo, c.sha)):
        writer.write({"type": "commit", **fields_out(COMMIT, commit)})
    for run in runs:
        machine = run.machine
        writer.write({"type": "run", "chip": run.chip.key, "commit": {"repo": run.commit.repo, "sha": run.commit.sha},
                      "machine": None if machine is None else {"chip": chips[machine.chip_id].key,
                                                               "hostname": machine.hostname},
                      **fields_out(RUN, run)})
        summary.runs += 1
        _write_jobs(session, run.id, writer, summary)


_JobSamples = tuple[int, tuple[int, ...], tuple[float, ...], tuple[int, ...]]


def _samples_by_job(session: Session, run_id: str) -> Iterator[_JobSamples]:
    """(job id, idx, seconds, trial) per job of one run, in job id order, from one streamed Core query."""
    table, jobs = Sample.__table__, JobRecord.__table__
    result = session.connection().execute(
        select(table.c.job_id, table.c.idx, table.c.seconds, table.c.trial).join(jobs, table.c.job_id == jobs.c.id)
        .where(jobs.c.run_id == run_id).order_by(table.c.job_id, table.c.idx)
        .execution_options(yield_per=SAMPLE_BATCH))  # a server-side cursor on PostgreSQL
    current: int | None = None
    idx: tuple[int, ...] = ()
    seconds: tuple[float, ...] = ()
    trials: tuple[int, ...] = ()
    for part in result.partitions():
        ids, part_idx, part_seconds, part_trials = zip(*part, strict=True)  # the partition's columns, in C
        start = 0
        for job_id, group in groupby(ids):
            end = start + len(list(group))
            if job_id == current:  # a job whose samples straddle two partitions
                idx, seconds = idx + part_idx[start:end], seconds + part_seconds[start:end]
                trials += part_trials[start:end]
            else:
                if current is not None:
                    yield current, idx, seconds, trials
                current, idx, seconds = job_id, part_idx[start:end], part_seconds[start:end]
                trials = part_trials[start:end]
            start = end
    if current is not None:
        yield current, idx, seconds, trials


def _write_jobs(session: Session, run_id: str, writer: _PayloadWriter, summary: ExportSummary) -> None:
    """Every job of one run in id order, each with its raw samples in idx order."""
    table = JobRecord.__table__
    jobs = session.connection().execute(select(table).where(table.c.run_id == run_id).order_by(table.c.id)
                                        ).mappings().all()
    samples = _samples_by_job(session, run_id)
    pending = next(samples, None)
    for job in jobs:
        idx: tuple[int, ...] = ()
        seconds: tuple[float, ...] = ()
        trials: tuple[int, ...] = ()
        if pending is not None and pending[0] == job["id"]:
            _, idx, seconds, trials = pending
            pending = next(samples, None)
        record = {"type": "job", **fields_out(JOB, job), "samples": seconds}
        if idx and (idx[0] != 0 or idx[-1] != len(idx) - 1):  # ordered and unique: contiguous iff these hold
            record["sample_idx"] = idx
        if any(trials):
            record["sample_trial"] = trials
        writer.write(record)
        summary.jobs += 1
        summary.samples += len(seconds)


def export_bundle(store: Database, out_path: str | Path, run_ids: Iterable[str] | None = None,
                  commit: str | None = None, chip: str | None = None,
                  compresslevel: int = COMPRESS_LEVEL) -> ExportSummary:
    """Write the selected runs (all runs when nothing is selected) to ``out_path``, atomically."""
    out_path = Path(out_path)
    run_ids = list(run_ids) if run_ids else None
    summary = ExportSummary(out_path)
    source = mask_url(store.url)
    partial = out_path.with_name(f".{out_path.name}.partial")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with store.snapshot() as session, tempfile.TemporaryFile(dir=out_path.parent) as payload:
            runs = _select_runs(session, source, run_ids, commit, chip)
            writer = _PayloadWriter(payload, compresslevel)
            _write_payload(session, runs, writer, summary)
            writer.close()
            header = {"format": FORMAT, "version": VERSION, "created_at": dt_out(datetime.now(UTC)),
                      "harness_version": harness_version(), "source_db": source,
                      "selection": {"runs": list(run_ids) if run_ids else None, "commit": commit, "chip": chip},
                      "runs": summary.runs, "jobs": summary.jobs, "samples": summary.samples,
                      "payload_bytes": writer.size, "sha256": writer.digest.hexdigest()}
            with open(partial, "wb") as out:
                out.write(gzip.compress(json.dumps(header).encode("ascii") + b"\n", compresslevel, mtime=0))
                payload.seek(0)
                shutil.copyfileobj(payload, out, WRITE_CHUNK)
            os.replace(partial, out_path)
    except OSError as exc:
        raise HarnessError(f"cannot write bundle {out_path}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    summary.bytes = out_path.stat().st_size
    return summary
