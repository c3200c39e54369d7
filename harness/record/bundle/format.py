"""The bundle format: what each record holds (the columns of its table, dates as UTC ISO 8601), the header,
and reading a bundle file back (every gzip member's CRC, the payload's SHA-256 and the header's counts checked)."""

from __future__ import annotations

import hashlib
import json
import tomllib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from itertools import chain
from pathlib import Path
from typing import IO, Any

from sqlalchemy import DateTime

from harness.core.config import SOURCE_ROOT
from harness.core.errors import HarnessError
from harness.record.models import Chip, Commit, JobRecord, Machine, Run

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


@dataclass(frozen=True)
class Fields:
    """The columns of one table that a record carries (surrogate ids and foreign keys are replaced by references)."""

    names: tuple[str, ...]
    datetimes: frozenset[str]


def _fields(model, exclude: set[str]) -> Fields:
    columns = [c for c in model.__table__.columns if c.name not in exclude]
    return Fields(tuple(c.name for c in columns),
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


def dt_out(value: datetime | None) -> str | None:
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


def fields_out(spec: Fields, row: Any) -> dict[str, Any]:
    """The bundle fields of one row (an ORM object or a Core row mapping)."""
    get = row.__getitem__ if hasattr(row, "keys") else lambda name: getattr(row, name)
    return {name: dt_out(get(name)) if name in spec.datetimes else get(name) for name in spec.names}


def fields_in(spec: Fields, record: dict[str, Any]) -> dict[str, Any]:
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
    with open_bundle(path) as stream:
        return BundleReader(path, stream).read_header()


def open_bundle(path: Path) -> IO[bytes]:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise HarnessError(f"bundle {path} does not exist") from None
    except OSError as exc:
        raise HarnessError(f"cannot read bundle {path}: {exc.strerror or exc}") from None
