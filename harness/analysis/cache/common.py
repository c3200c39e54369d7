"""What every analysis cache module shares: the code version and digests in every key, the payload frame, the rows
written once a chip is analysed, the cache's log and its counts."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy
from sqlalchemy.exc import SQLAlchemyError

from harness import stats as stats_package
from harness.analysis import compare as compare_module
from harness.analysis import history as history_module
from harness.analysis import noise as noise_module
from harness.analysis import records as records_module
from harness.analysis import regressions as regressions_module
from harness.analysis import segment_search
from harness.analysis import variants as variants_module
from harness.core import defaults
from harness.core.errors import first_line
from harness.record import analysis_cache, ancestry, bundle, query
from harness.record.store import Store

log = logging.getLogger("harness.analysis.cache")  # one logger for the package (harness report --timings)


@contextmanager
def cache_log() -> Iterator[list[str]]:
    """The INFO lines this module logs meanwhile (what the caches reused and computed: ``harness report --timings``
    shows them), collected into the list given and not passed on: a forked analysis sends them to the report's own
    process, which logs them again (``replay_log``)."""
    notes: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: notes.append(record.getMessage())  # type: ignore[method-assign]
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield notes
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def replay_log(notes: Sequence[str]) -> None:
    """Log the lines ``cache_log`` collected (in another process) as if logged here."""
    for note in notes:
        log.info("%s", note)

FORMAT = 1  # of the payloads the modules of this package store
# The code whose results are cached: any change to it (or to numpy / scipy) is a new version, every key changes.
_SOURCES = (history_module, segment_search, regressions_module, records_module, compare_module, noise_module,
            variants_module, stats_package, defaults, query, analysis_cache, ancestry)


def source_files() -> list[Path]:
    """The files ``code_version`` hashes: the analysed code (every module of a package: ``harness.record.query``'s,
    the statistics package ``harness.stats``) and this package's own modules."""
    files = []
    for module in _SOURCES:
        path = Path(module.__file__ or "")
        files += sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    return files + sorted(Path(__file__).parent.glob("*.py"))


@cache
def code_version() -> str:
    hasher = hashlib.sha256(f"format {FORMAT}; numpy {np.__version__}; scipy {scipy.__version__}".encode())
    for source in source_files():
        try:
            hasher.update(source.read_bytes())
        except OSError:  # no source to read (a frozen install): the module's name and the package version
            hasher.update(f"{source.name} {bundle.harness_version()}".encode())
    return hasher.hexdigest()[:32]


def digest(*parts: Any) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part if isinstance(part, bytes) else repr(part).encode())
        hasher.update(b"\x00")
    return hasher.hexdigest()


@dataclass
class CacheStats:
    """What the cache saved, per chip: commits whose cells were reused / computed, series whose change points were
    reused / computed, regression families reused / computed."""

    cells: dict[str, tuple[int, int]] = field(default_factory=dict)
    changes: dict[str, tuple[int, int]] = field(default_factory=dict)
    families: dict[str, tuple[int, int]] = field(default_factory=dict)
    unfinished: dict[str, int] = field(default_factory=dict)  # commits computed but not stored: a run not finished
    write_errors: int = 0
    chips_reused: int = 0  # chips whose whole analysis was reused (none of their runs changed)
    whole: dict[str, str] = field(default_factory=dict)  # per chip whose whole analysis the cache holds (reused, or
    # computed and stored): a digest of that and of its key (its commits), all its histories are made of
    # (``harness.render.history.HistoryPages`` fingerprints them by it)

    def summary(self) -> str:
        def total(d: dict[str, tuple[int, int]]) -> str:
            return f"{sum(r for r, _ in d.values())} reused, {sum(c for _, c in d.values())} computed"

        return (f"cells {total(self.cells)}; change points {total(self.changes)}; families {total(self.families)}; "
                f"chips reused whole {self.chips_reused}")


def frame(magic: bytes, header: dict[str, Any], body: bytes | bytearray) -> bytes:
    """A stored payload: ``magic``, the JSON header's length and the header (with the body's checksum), the body."""
    text = json.dumps({**header, "crc": zlib.crc32(body)}, separators=(",", ":")).encode()
    return magic + struct.pack("<I", len(text)) + text + body


def unframe(payload: bytes, magic: bytes) -> tuple[dict[str, Any], memoryview] | None:
    """``frame``'s header and body; None when the payload is not one (another magic, truncated, corrupted)."""
    if not payload.startswith(magic):
        return None
    at = len(magic)
    (length,) = struct.unpack_from("<I", payload, at)
    header = json.loads(payload[at + 4:at + 4 + length])
    body = memoryview(payload)[at + 4 + length:]
    return (header, body) if zlib.crc32(body) == header["crc"] else None


@dataclass
class ChipCells:
    """One chip's history reduced to its cells: ``data`` has the commits (history order, previous, window, lines),
    the series (key order) and the sample counts, no samples; per flat cell its level and interval and the
    regression screen's ``cells``; per commit index the identity of its cells (``ids``: fingerprint and content
    digest); ``raw``: the samples loaded this time (commit id -> (history, its commit index)), for the families."""

    data: query.ChipHistory
    level: npt.NDArray[np.float64]
    low: npt.NDArray[np.float64]
    high: npt.NDArray[np.float64]
    cells: Any  # regressions._Cells
    ids: list[tuple[str, str]]
    raw: dict[int, tuple[query.ChipHistory, int]]
    run_fingerprints: dict[int, tuple[tuple[Any, ...], ...]]  # every included run's fingerprint, per commit id


def dirty_suffix(include_dirty: bool) -> str:
    return "+dirty" if include_dirty else ""


class Writes:
    """Rows to write once the chip is analysed: (kind, entries, the other rows of kind to keep (None: all))."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, analysis_cache.Entry], list[str] | None]] = []

    def add(self, kind: str, entries: dict[str, analysis_cache.Entry], keep: list[str] | None = None) -> None:
        if entries or keep is not None:
            self.rows.append((kind, entries, keep))


def flush(store: Store, chip: str, writes: Writes, stats_out: CacheStats) -> None:
    for kind, entries, keep in writes.rows:
        try:
            analysis_cache.write_entries(store, chip, kind, entries, keep=keep)
        except SQLAlchemyError as exc:  # a read-only database, a lock held too long: the next report recomputes
            stats_out.write_errors += 1
            log.warning("analysis cache: could not store %s rows of %s: %s", kind, chip,
                        first_line(exc))
