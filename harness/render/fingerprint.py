"""Page fingerprints: an exact SHA-256 of everything a page's template reads, and the renderer's version."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis import records
from harness.analysis.records import HistoryPoints
from harness.analysis.site_inputs import JobSamples, RunBrief, SeriesKey
from harness.analysis.site_manifests import MANIFEST_FORMAT
from reports import evidence as evidence_pages
from reports import render as site_render
from reports import svg

# --- fingerprints ----------------------------------------------------------------------------------------------------


@cache
def render_version() -> str:
    """A digest of everything that turns records into pages: the renderer's sources, templates and static files."""
    digest = hashlib.sha256(f"format {MANIFEST_FORMAT}".encode())
    for package in ("jinja2", "markupsafe", "numpy"):
        try:
            digest.update(f"{package} {metadata.version(package)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} ?\n".encode())
    folders = [Path(site_render.__file__).resolve().parent, Path(__file__).resolve().parent]
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".py", ".j2", ".css", ".js")):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    for module in (svg, evidence_pages, site_render):  # in case they are loaded from elsewhere than the folders above
        digest.update(module.__name__.encode() + (module.__file__ or "").encode())
    return digest.hexdigest()


_SCALARS = frozenset({str, int, float, bool, type(None), datetime})
# Records made of plain values only (strings, numbers, None, datetimes, and tuples, dicts and records of them), whose
# generated repr shows every field exactly (a float's repr is exact): fingerprinted by their text, in one call.
_BY_REPR = frozenset({records.CompareRow, records.CompareReport, records.Side, records.CorrectnessFailure,
                      records.ChangeFlag, records.RegressionEvidence, SeriesKey, RunBrief,
                      JobSamples, evidence_pages.CompareRowLink})


def _exact(value: Any) -> bool:
    """Whether ``repr(value)`` shows every part of it exactly: a plain value, a record of ``_BY_REPR``, or a list,
    tuple or dict of such (a compare page's rows and its runs per series: hundreds of them, in one call)."""
    kind = type(value)
    if kind in _SCALARS or kind in _BY_REPR:
        return True
    if kind is list or kind is tuple:
        return all(_exact(item) for item in value)
    if kind is dict:
        return all(_exact(key) and _exact(item) for key, item in value.items())
    return False


class Fingerprint:
    """A SHA-256 over plain values, records and arrays, exact: floats by their repr, arrays by their bytes, sets in
    sorted order, dataclasses and named tuples field by field with their type's name. Anything else is an error
    (a value whose text could change between processes, e.g. an object's id, must not reach a fingerprint)."""

    def __init__(self, *parts: Any, memo: FingerprintMemo | None = None) -> None:
        self._digest = hashlib.sha256()
        self._memo = memo
        self._commits: dict[tuple[int, bytes], bytes] = memo.commits if memo is not None else {}
        self._keep: list[Any] = memo.keep if memo is not None else []  # the commit tables memoised by id stay alive
        for part in parts:
            self.feed(part)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def digest(self) -> bytes:
        return self._digest.digest()

    def _put(self, tag: bytes, payload: bytes = b"") -> None:
        self._digest.update(tag + len(payload).to_bytes(8, "little") + payload)

    def feed(self, value: Any) -> None:
        put = self._put
        kind = type(value)
        if kind in _BY_REPR or (kind in (list, tuple, dict) and _exact(value)):
            put(b"r", kind.__qualname__.encode() + repr(value).encode("utf-8", "surrogatepass"))
        elif value is None or isinstance(value, bool | int | float):
            put(b"v", repr(value).encode())
        elif isinstance(value, str):  # Markup too: its text is what is rendered
            put(b"s", value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, bytes):
            put(b"b", value)
        elif isinstance(value, datetime | date):
            put(b"t", repr(value).encode())
        elif kind is range:
            put(b"R", f"{value.start},{value.stop},{value.step}".encode())
        elif isinstance(value, np.ndarray):
            put(b"a", f"{value.dtype.str}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
        elif isinstance(value, np.generic):
            put(b"g", f"{value.dtype.str}".encode() + value.tobytes())
        elif isinstance(value, HistoryPoints):
            self._points(value)
        elif kind is records.SeriesHistory and self._memo is not None:  # a history is on two pages: digested once
            found = self._memo.records.get(id(value))
            if found is None:
                inner = Fingerprint(memo=self._memo)
                inner._record(value)
                found = self._memo.records[id(value)] = (value, inner._digest.digest())
            put(b"H", found[1])
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            self._record(value)
        elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            put(b"n", type(value).__qualname__.encode())
            self._items(value)
        elif isinstance(value, list | tuple):
            put(b"l" if isinstance(value, list) else b"u")
            self._items(value)
        elif isinstance(value, Mapping):
            put(b"m", str(len(value)).encode())
            for key, item in value.items():  # in order: the order a page shows them in
                self.feed(key)
                self.feed(item)
        elif isinstance(value, set | frozenset):
            put(b"e", str(len(value)).encode())
            for item in sorted(Fingerprint(item).hexdigest() for item in value):
                put(b"h", item.encode())
        else:
            raise TypeError(f"no fingerprint for a {type(value).__qualname__}")

    def _record(self, value: Any) -> None:
        self._put(b"d", type(value).__qualname__.encode())
        for f in dataclasses.fields(value):
            self._put(b"f", f.name.encode())
            self.feed(getattr(value, f.name))

    def _items(self, values: Iterable[Any]) -> None:
        values = list(values)
        self._put(b"#", str(len(values)).encode())
        for item in values:
            self.feed(item)

    def _points(self, points: HistoryPoints) -> None:
        """A history's points: each commit's (sha, message, branch, start) and the columns, whatever table of the
        chip's commits the rows index (only the commits the points use count)."""
        rows = points.rows
        if rows.size < 2 or bool(np.all(rows[1:] > rows[:-1])):  # each point its own commit, in table order
            used, where = rows, np.arange(rows.size, dtype=np.int64)
        else:
            used, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # the commits in the order the points first use them
            used = used[order]
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            where = rank[inverse.reshape(-1)]
        key = (id(points._commits), used.tobytes())
        commits = self._commits.get(key)
        if commits is None:
            table = points._commits
            self._keep.append(table)
            commits = self._commits[key] = hashlib.sha256(
                repr([tuple(table[row]) for row in used.tolist()]).encode()).digest()
        self._put(b"p", commits)
        for column in (where.astype(np.int64), points.median, points.ci_low, points.ci_high, points.n):
            self.feed(np.asarray(column))


@dataclass
class FingerprintMemo:
    """What the fingerprints of one build share: each history's digest (by identity: the record is kept alive
    with it, a history is on its chip's page and on the page of every chip) and the commit tables' digests."""

    records: dict[int, tuple[Any, bytes]] = field(default_factory=dict)
    commits: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)

    def known(self, histories: Sequence[Any], whole: str) -> None:
        """``histories`` (a chip's, in its order) are made of nothing but what ``whole`` digests (their chip's
        stored analysis and commits: ``CacheStats.whole``): each is fingerprinted by it and its place."""
        for place, history in enumerate(histories):
            self.records[id(history)] = (history, hashlib.sha256(f"{whole}:{place}".encode()).digest())


def commit_links(links: evidence_pages.Links, shas: Iterable[str]) -> list[tuple[str, str | None]]:
    """The web pages of ``shas`` as a page shows them (``commit_ref``, ``web_link``), in sorted order."""
    return [(sha, links.commit_urls.get(sha)) for sha in sorted(set(shas))]
