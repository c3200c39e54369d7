"""Bundles: write runs (with their chips, machines, commits, jobs and raw samples) to a file and read them back."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from itertools import chain, groupby, repeat
from pathlib import Path
from typing import IO, Any

from sqlalchemy import DateTime, create_engine, event, exists, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from harness.core.config import SOURCE_ROOT
from harness.core.errors import HarnessError
from harness.record.identity import canonical, unify
from harness.record.models import Chip, Commit, JobRecord, Machine, Run, Sample
from harness.record.store import Store, mask_url, sample_writer

FORMAT = "mlx-harness-bundle"
VERSION = 4  # what export writes
READABLE = (1, 2, 3, 4)  # what import reads
# Fields an older record lacks, and what they read as. Version 1 (before migration 0002): parents unknown, no
# branch. Version 2 (before migration 0003): one trial per job, timing mode and round trip not recorded. Version 3
# (before migration 0006): no pipelined backlog.
_V3_DEFAULTS: dict[str, dict[str, Any]] = {"job": {"backlog_calls": None}}
_V2_DEFAULTS: dict[str, dict[str, Any]] = {"job": {"trials": 1, "timing_mode": "", "round_trip_s": None,
                                                   **_V3_DEFAULTS["job"]}}
_V1_DEFAULTS: dict[str, dict[str, Any]] = {"commit": {"parents": None}, "run": {"branch": ""}, **_V2_DEFAULTS}
OLD_DEFAULTS: dict[int, dict[str, dict[str, Any]]] = {1: _V1_DEFAULTS, 2: _V2_DEFAULTS, 3: _V3_DEFAULTS}
GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_LEVEL = 1  # JSON floats gain little from harder work: level 6 is ~5x slower for ~8% less
READ_CHUNK = 1 << 18  # compressed bytes read at a time
WRITE_CHUNK = 1 << 20  # uncompressed bytes compressed at a time
MAX_HEADER_BYTES = 1 << 20
JOB_BATCH = 1000  # jobs inserted per statement
SAMPLE_BATCH = 50_000  # samples inserted per statement (and buffered before jobs are flushed)
HEADER_COUNTS = ("runs", "jobs", "samples", "payload_bytes")


# --- what a record holds -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fields:
    """The columns of one table that a record carries (surrogate ids and foreign keys are replaced by references)."""

    names: tuple[str, ...]
    datetimes: frozenset[str]


def _fields(model, exclude: set[str]) -> _Fields:
    columns = [c for c in model.__table__.columns if c.name not in exclude]
    return _Fields(tuple(c.name for c in columns),
                   frozenset(c.name for c in columns if isinstance(c.type, DateTime)))


CHIP = _fields(Chip, {"id"})
MACHINE = _fields(Machine, {"id", "chip_id"})
COMMIT = _fields(Commit, {"id"})
RUN = _fields(Run, {"chip_id", "commit_id", "machine_id", "settling"})  # settling runs travel as plain runs
JOB = _fields(JobRecord, {"id"})
# Reference keys each record type adds to its columns (and "type" itself); "sample_idx" and "sample_trial" (each
# sample's trial; absent: all trial 0) are optional on jobs.
REFERENCES = {"chip": (), "machine": ("chip",), "commit": (), "run": ("chip", "commit", "machine"),
              "job": ("samples",)}
RECORDS = {"chip": CHIP, "machine": MACHINE, "commit": COMMIT, "run": RUN, "job": JOB}


def _dt_out(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with an explicit offset; SQLite hands back naive datetimes, which the harness writes in UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def _dt_in(value: Any) -> datetime | None:
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _out(spec: _Fields, row: Any) -> dict[str, Any]:
    """The bundle fields of one row (an ORM object or a Core row mapping)."""
    get = row.__getitem__ if hasattr(row, "keys") else lambda name: getattr(row, name)
    return {name: _dt_out(get(name)) if name in spec.datetimes else get(name) for name in spec.names}


def _in(spec: _Fields, record: dict[str, Any]) -> dict[str, Any]:
    """Column values from a validated record."""
    return {name: _dt_in(record[name]) if name in spec.datetimes else record[name] for name in spec.names}


def harness_version() -> str:
    """The installed package version, else the version in the source tree's pyproject.toml."""
    try:
        return metadata.version("mlx-kernel-harness")
    except metadata.PackageNotFoundError:
        pyproject = SOURCE_ROOT / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


# --- export --------------------------------------------------------------------------------------------------


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
        writer.write({"type": "chip", **_out(CHIP, chip)})
    for machine in sorted(machines.values(), key=lambda m: (chips[m.chip_id].key, m.hostname)):
        writer.write({"type": "machine", "chip": chips[machine.chip_id].key, **_out(MACHINE, machine)})
    for commit in sorted(commits.values(), key=lambda c: (c.repo, c.sha)):
        writer.write({"type": "commit", **_out(COMMIT, commit)})
    for run in runs:
        machine = run.machine
        writer.write({"type": "run", "chip": run.chip.key, "commit": {"repo": run.commit.repo, "sha": run.commit.sha},
                      "machine": None if machine is None else {"chip": chips[machine.chip_id].key,
                                                               "hostname": machine.hostname},
                      **_out(RUN, run)})
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
        record = {"type": "job", **_out(JOB, job), "samples": seconds}
        if idx and (idx[0] != 0 or idx[-1] != len(idx) - 1):  # ordered and unique: contiguous iff these hold
            record["sample_idx"] = idx
        if any(trials):
            record["sample_trial"] = trials
        writer.write(record)
        summary.jobs += 1
        summary.samples += len(seconds)


@contextmanager
def _snapshot(store: Store) -> Iterator[Session]:
    """A read transaction that sees one consistent state of the database.

    On a SQLite file this is a deferred BEGIN on a connection of its own: WAL gives it a snapshot without the write
    lock the store's sessions take (BEGIN IMMEDIATE), so runs recording results meanwhile are not held up.
    """
    url = store.engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        with store.session() as session:
            yield session
        return
    engine = create_engine(url, connect_args={"timeout": 30}, poolclass=NullPool)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let us emit BEGIN ourselves

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        connection.exec_driver_sql("BEGIN")

    try:
        with Session(engine) as session, session.begin():
            yield session
    finally:
        engine.dispose()


def export_bundle(store: Store, out_path: str | Path, run_ids: Iterable[str] | None = None,
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
        with _snapshot(store) as session, tempfile.TemporaryFile(dir=out_path.parent) as payload:
            runs = _select_runs(session, source, run_ids, commit, chip)
            writer = _PayloadWriter(payload, compresslevel)
            _write_payload(session, runs, writer, summary)
            writer.close()
            header = {"format": FORMAT, "version": VERSION, "created_at": _dt_out(datetime.now(UTC)),
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


# --- reading -------------------------------------------------------------------------------------------------


class BundleCorrupted(HarnessError):
    """The file is damaged: not gzip, bad compressed data, cut short, or its checksum does not match."""


class BundleInvalid(HarnessError):
    """The file is intact but does not follow the format (a bug in whatever wrote it)."""


class BundleReader:
    """Reads a bundle file as one decompressed stream over its gzip members: the header line, then the records.

    The writer puts the header in a member of its own, so its gzip CRC is checked before it is trusted; a bundle
    recompressed into one member (``gzip -dc a | gzip > b``) reads the same. ``records()`` checks every member's
    CRC, the payload's SHA-256 and the header's counts by the time it has returned the last record.
    """

    def __init__(self, path: Path, stream: IO[bytes]) -> None:
        self.path = path
        self.stream = stream
        self.leftover = b""  # compressed bytes read but not yet inflated
        self.chunks = self._chunks()
        self.rest = b""  # decompressed payload bytes read along with the header
        self.header: dict[str, Any] = {}
        self.version = VERSION  # the header's, once read
        self.counts = dict.fromkeys(HEADER_COUNTS, 0)

    def corrupted(self, reason: str) -> BundleCorrupted:
        return BundleCorrupted(f"bundle {self.path} is corrupted or truncated: {reason}")

    def invalid(self, reason: str) -> BundleInvalid:
        return BundleInvalid(f"bundle {self.path} is not a valid version {self.version} bundle: {reason}")

    def not_a_bundle(self) -> HarnessError:
        return HarnessError(f"{self.path} is not a harness bundle (no {FORMAT!r} header)")

    def _member(self) -> Iterator[bytes]:
        """The decompressed chunks of the next gzip member (zlib checks its CRC-32 and length at its end)."""
        inflater = zlib.decompressobj(31)
        data, self.leftover = self.leftover, b""
        while True:
            if not data:
                data = self.stream.read(READ_CHUNK)
                if not data:
                    raise self.corrupted("the file ends early")
            try:
                out = inflater.decompress(data)
            except zlib.error as exc:
                raise self.corrupted("gzip checksum mismatch" if "incorrect" in str(exc)
                                     else "compressed data is damaged") from None
            if out:
                yield out
            if inflater.eof:
                self.leftover = inflater.unused_data
                return
            data = b""

    def _chunks(self) -> Iterator[bytes]:
        """The decompressed chunks of every member, as ``gzip -dc`` concatenates them; anything else is damage."""
        while True:
            while len(self.leftover) < len(GZIP_MAGIC):
                more = self.stream.read(READ_CHUNK)
                if not more:
                    break
                self.leftover += more
            if not self.leftover:
                return
            if len(self.leftover) < len(GZIP_MAGIC):
                raise self.corrupted("the file ends early")
            if not self.leftover.startswith(GZIP_MAGIC):
                raise self.corrupted("unexpected data after the payload")
            yield from self._member()

    def read_header(self) -> dict[str, Any]:
        self.leftover = self.stream.read(READ_CHUNK)
        if not self.leftover:
            raise self.corrupted("the file is empty")
        if not self.leftover.startswith(GZIP_MAGIC):
            raise self.corrupted("not gzip-compressed")
        data = b""
        for chunk in self.chunks:
            data += chunk
            if b"\n" in data or len(data) > MAX_HEADER_BYTES:
                break
        line, newline, self.rest = data.partition(b"\n")
        try:
            header = json.loads(line) if newline else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise self.not_a_bundle()
        if header.get("version") not in READABLE or isinstance(header.get("version"), bool):
            raise HarnessError(f"bundle format version {header.get('version')} is not supported "
                               f"(this harness reads versions {', '.join(map(str, READABLE))}): {self.path}")
        self.version = header["version"]
        for name, kind in (*((name, int) for name in HEADER_COUNTS), ("sha256", str)):
            if not isinstance(header.get(name), kind):
                raise self.invalid(f"the header lacks {name!r} (or it is not {'a number' if kind is int else 'text'})")
        self.header = header
        return header

    def records(self) -> Iterator[dict[str, Any]]:
        """Every payload record in order; raises BundleCorrupted/BundleInvalid, at the latest after the last one."""
        digest = hashlib.sha256()
        rest = b""
        line_no = 1
        for chunk in chain((self.rest,), self.chunks):
            digest.update(chunk)
            self.counts["payload_bytes"] += len(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                line_no += 1
                try:
                    record = json.loads(line)
                except (UnicodeDecodeError, json.JSONDecodeError):
                    raise self.corrupted(f"line {line_no} is not JSON") from None
                if not isinstance(record, dict) or record.get("type") not in RECORDS:
                    raise self.invalid(f"line {line_no} is not a chip, machine, commit, run or job record")
                kind = record["type"]
                if kind == "run":
                    self.counts["runs"] += 1
                elif kind == "job":
                    self.counts["jobs"] += 1
                    samples = record.get("samples")
                    self.counts["samples"] += len(samples) if isinstance(samples, list) else 0
                yield record
        if self.counts["payload_bytes"] < self.header["payload_bytes"]:
            raise self.corrupted("the file ends early")
        if rest:
            raise self.corrupted("the payload does not end with a newline")
        if digest.hexdigest() != self.header["sha256"]:
            raise self.corrupted("SHA-256 checksum mismatch")
        for name in HEADER_COUNTS:
            if self.counts[name] != self.header[name]:
                raise self.invalid(f"the header says {self.header[name]} {name}, the payload has {self.counts[name]}")


def read_header(path: str | Path) -> dict[str, Any]:
    """Only the header of a bundle (validated: format and version)."""
    path = Path(path)
    with _open(path) as stream:
        return BundleReader(path, stream).read_header()


def _open(path: Path) -> IO[bytes]:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise HarnessError(f"bundle {path} does not exist") from None
    except OSError as exc:
        raise HarnessError(f"cannot read bundle {path}: {exc.strerror or exc}") from None


# --- import --------------------------------------------------------------------------------------------------


@dataclass
class ImportSummary:
    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    runs_added: int = 0
    runs_skipped: int = 0  # already present (their missing jobs are still merged)
    runs_completed: int = 0  # present but unfinished here, finished in the bundle: run columns taken from it
    jobs_added: int = 0
    jobs_skipped: int = 0
    samples_added: int = 0
    samples_skipped: int = 0
    chips_added: int = 0
    machines_added: int = 0
    commits_added: int = 0


class _Importer:
    """Applies records in bundle order inside one transaction: natural keys find existing rows, jobs are batched."""

    def __init__(self, session: Session, reader: BundleReader, summary: ImportSummary,
                 repo_name: str | None = None) -> None:
        self.session = session
        self.repo_name = repo_name
        self.reader = reader
        self.summary = summary
        self.chips: dict[str, int] = {}
        self.machines: dict[tuple[str, str], int] = {}
        self.commits: dict[tuple[str, str], int] = {}
        self.keys: dict[str, bool] = {}  # repository key -> whether no row had it before this import
        self.run_id: str | None = None
        self.run_keys: set[str] = set()
        self.jobs: list[dict[str, Any]] = []
        self.samples: list[tuple[list[float], list[int] | None, list[int] | None]] = []
        self.buffered = 0
        self.write_samples = sample_writer(session)

    def _check(self, record: dict[str, Any]) -> dict[str, Any]:
        kind = record["type"]
        absent = OLD_DEFAULTS.get(self.reader.version, {}).get(kind, {})
        expected = {"type", *RECORDS[kind].names, *REFERENCES[kind]} - absent.keys()
        optional = {"sample_idx", "sample_trial"} if kind == "job" else set()
        if missing := expected - record.keys():
            raise self.reader.invalid(f"a {kind} record lacks {', '.join(sorted(missing))}")
        if unknown := record.keys() - expected - optional:
            raise self.reader.invalid(f"a {kind} record has fields this harness does not know: "
                                      f"{', '.join(sorted(unknown))} (written by a newer harness?)")
        parents = record.get("parents")
        if kind == "commit" and parents is not None and (not isinstance(parents, list)
                                                         or not all(isinstance(p, str) for p in parents)):
            raise self.reader.invalid(f"commit {record['sha']}'s parents are not a list of shas")
        try:
            return _in(RECORDS[kind], {**absent, **record})
        except (TypeError, ValueError) as exc:
            raise self.reader.invalid(f"a {kind} record has a bad date: {exc}") from None

    def _insert_one(self, model, values: dict[str, Any]) -> int:
        return self.session.execute(insert(model.__table__).values(**values).returning(model.__table__.c.id)
                                    ).scalar_one()

    def _chip_id(self, key: Any) -> int:
        if not isinstance(key, str) or key not in self.chips:
            raise self.reader.invalid(f"chip {key!r} is referenced before its chip record")
        return self.chips[key]

    def add(self, record: dict[str, Any]) -> None:
        getattr(self, f"_add_{record['type']}")(record, self._check(record))

    def _add_chip(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        chip_id = self.session.scalar(select(Chip.id).where(Chip.key == values["key"]))
        if chip_id is None:
            chip_id = self._insert_one(Chip, values)
            self.summary.chips_added += 1
        self.chips[values["key"]] = chip_id

    def _add_machine(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        chip_id = self._chip_id(record["chip"])
        machine_id = self.session.scalar(select(Machine.id).where(Machine.hostname == values["hostname"],
                                                                  Machine.chip_id == chip_id))
        if machine_id is None:
            machine_id = self._insert_one(Machine, {**values, "chip_id": chip_id})
            self.summary.machines_added += 1
        self.machines[(record["chip"], values["hostname"])] = machine_id

    def _add_commit(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        ref = (values["repo"], values["sha"])  # as the bundle's runs refer to it
        values["repo"] = self.repo_name or canonical(values["repo"])  # an older bundle: a remote as it was spelled
        if values["repo"] not in self.keys:  # one look-up per key (the (repo, sha) index): is it a new one?
            self.keys[values["repo"]] = self.session.scalar(
                select(Commit.id).where(Commit.repo == values["repo"]).limit(1)) is None
        existing = self.session.execute(select(Commit.id, Commit.parents, Commit.message, Commit.author,
                                               Commit.committed_at, Commit.branch)
                                        .where(Commit.repo == values["repo"], Commit.sha == values["sha"])).first()
        if existing is None:
            commit_id = self._insert_one(Commit, values)
            self.summary.commits_added += 1
        else:
            # Kept as it is, but for what it lacks: unknown parents, or the details of a commit stored as a link.
            commit_id = existing.id
            lacking = {name: values[name] for name in ("parents", "message", "author", "committed_at", "branch")
                       if getattr(existing, name) in (None, "") and values[name] not in (None, "")}
            if lacking:
                self.session.execute(update(Commit.__table__).where(Commit.__table__.c.id == commit_id)
                                     .values(**lacking))
        self.commits[ref] = commit_id

    def _add_run(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        self.flush()
        chip_id = self._chip_id(record["chip"])
        ref, machine_ref = record["commit"], record["machine"]
        try:
            commit_id = self.commits[(ref["repo"], ref["sha"])]
            machine_id = None if machine_ref is None else self.machines[(machine_ref["chip"],
                                                                         machine_ref["hostname"])]
        except (KeyError, TypeError):
            raise self.reader.invalid(f"run {values['id']} references a commit or machine the bundle does not "
                                      "define before it") from None
        row = {**values, "chip_id": chip_id, "commit_id": commit_id, "machine_id": machine_id}
        existing = self.session.execute(select(Run.chip_id, Run.commit_id, Run.finished_at)
                                        .where(Run.id == values["id"])).first()
        self.run_id = values["id"]
        if existing is None:
            self.session.execute(insert(Run.__table__), [row])
            self.run_keys = set()
            self.summary.runs_added += 1
            return
        if (existing.chip_id, existing.commit_id) != (chip_id, commit_id):
            raise HarnessError(f"run {values['id']} in bundle {self.reader.path} is for chip {record['chip']} at "
                               f"{ref['sha'][:12]}, but the database's run {values['id']} is not: not merging it")
        self.summary.runs_skipped += 1
        if existing.finished_at is None and values["finished_at"] is not None:
            self.session.execute(update(Run.__table__).where(Run.__table__.c.id == values["id"]).values(**row))
            self.summary.runs_completed += 1
        self.run_keys = set(self.session.scalars(select(JobRecord.key).where(JobRecord.run_id == values["id"])))

    def _add_job(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        samples, idx, trials = record["samples"], record.get("sample_idx"), record.get("sample_trial")
        if values["run_id"] != self.run_id:
            raise self.reader.invalid(f"job {values['key']} does not follow its run {values['run_id']}")
        if not isinstance(samples, list) or any(
                extra is not None and (not isinstance(extra, list) or len(extra) != len(samples))
                for extra in (idx, trials)):
            raise self.reader.invalid(f"job {values['key']} has malformed samples")
        if values["key"] in self.run_keys:
            self.summary.jobs_skipped += 1
            self.summary.samples_skipped += len(samples)
            return
        self.run_keys.add(values["key"])
        self.jobs.append(values)
        self.samples.append((samples, idx, trials))
        self.buffered += len(samples)
        if len(self.jobs) >= JOB_BATCH or self.buffered >= SAMPLE_BATCH:
            self.flush()

    def flush(self) -> None:
        """Insert the buffered jobs (ids come back in parameter order), then their samples in bulk."""
        if not self.jobs:
            return
        table = JobRecord.__table__
        ids = self.session.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True),
                                   self.jobs).scalars().all()
        rows: list[tuple[int, int, float, int]] = []
        for job_id, (samples, idx, trials) in zip(ids, self.samples, strict=True):
            rows.extend(zip(repeat(job_id), idx if idx is not None else range(len(samples)), samples,
                            trials if trials is not None else repeat(0), strict=False))
        self.write_samples(rows)  # in one call: a job's trials are summarised whole
        self.summary.jobs_added += len(self.jobs)
        self.summary.samples_added += len(rows)
        self.jobs, self.samples, self.buffered = [], [], 0


def import_bundle(store: Store, path: str | Path, attempts: int = 3, repo_name: str | None = None) -> ImportSummary:
    """Add a bundle's runs to ``store`` in one transaction: nothing is written unless the whole file checks out.

    Runs keep their ids; chips, machines and commits are found by their natural keys; a job already stored for its
    (run, key) is skipped, so importing twice adds nothing and a partially present run gets its missing jobs. A
    unique-key clash with a concurrent writer (another import, a run creating the same chip) rolls back and retries:
    the next attempt finds those rows.

    Commits go under their repository's identity (an older bundle's remote URL normalised; ``repo_name``: every
    commit of the bundle under that name instead), and rows that the bundle's keys split from stored ones are
    merged (``harness.record.identity.unify``): one row per (repository, sha). That merge reads every commit row, so
    it runs only when the bundle brings a repository key no stored row has (a new spelling, a new repository): under
    keys already known, the rows were merged when their key first came. Known parents are never overwritten.
    """
    path = Path(path)
    dbapi_error = store.engine.dialect.loaded_dbapi.Error
    integrity = (IntegrityError, store.engine.dialect.loaded_dbapi.IntegrityError)
    for attempt in range(1, attempts + 1):
        summary = ImportSummary(path)
        with _open(path) as stream:
            reader = BundleReader(path, stream)
            summary.header = reader.read_header()
            records = reader.records()
            try:
                with store.session() as session:
                    importer = _Importer(session, reader, summary, repo_name)
                    for record in records:
                        importer.add(record)
                    importer.flush()
                    if any(importer.keys.values()):  # a key no row had: rows it splits from stored ones merge
                        unify(session.connection())
                return summary
            except (BundleInvalid, SQLAlchemyError, dbapi_error) as exc:
                # Damage shows as a failed checksum further on: prefer that verdict over the symptom.
                for _ in records:
                    pass
                if isinstance(exc, BundleInvalid):
                    raise
                if isinstance(exc, integrity) and attempt < attempts:
                    continue
                reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
                raise HarnessError(f"cannot import bundle {path} into {mask_url(store.url)}: {reason}") from None
    raise AssertionError("unreachable")
