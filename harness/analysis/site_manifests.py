"""The site's page manifests, one per output folder, kept in the database's analysis cache."""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from harness.core.errors import first_line
from harness.record import analysis_cache
from harness.record.store import Store

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1


# --- the manifest ----------------------------------------------------------------------------------------------------


@dataclass
class Manifest:
    """What a build wrote into its folder: page name -> (fingerprint, size, mtime_ns) of its file."""

    pages: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return zlib.compress(json.dumps({"format": MANIFEST_FORMAT, "pages": self.pages}, sort_keys=True,
                                        separators=(",", ":")).encode())

    @classmethod
    def from_bytes(cls, payload: bytes) -> Manifest:
        """The manifest, or an empty one when unreadable or of another format (every page is rendered)."""
        try:
            data = json.loads(zlib.decompress(payload))
            if data.get("format") != MANIFEST_FORMAT:
                return cls()
            return cls({str(name): (str(fp), int(size), int(mtime))
                        for name, (fp, size, mtime) in data["pages"].items()})
        except (ValueError, TypeError, KeyError, AttributeError, zlib.error):
            return cls()

    def fresh(self, folder: Path, name: str, fingerprint: str) -> bool:
        """Whether ``name`` was written with ``fingerprint`` and its file is untouched since."""
        entry = self.pages.get(name)
        if entry is None or entry[0] != fingerprint:
            return False
        try:
            stat = (folder / name).stat()
        except OSError:
            return False
        return (stat.st_size, stat.st_mtime_ns) == entry[1:]


class SiteManifests:
    """The manifests of the folders a database's sites were built into, kept in its analysis cache (``chip`` "",
    ``kind`` "site", one row per folder, named by a digest of its resolved path): the output folder holds pages
    only. Like every cached row, one may be deleted at any time (the next build renders every page)."""

    CHIP, KIND = "", "site"

    def __init__(self, store: Store, version: str) -> None:
        self.store, self.version = store, version  # version: the renderer's (``render_version``), the rows' key

    @staticmethod
    def _name(folder: Path) -> str:
        return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:32]

    def read(self, folder: Path) -> Manifest:
        try:
            entry = analysis_cache.read_entries(self.store, self.CHIP, self.KIND, [self._name(folder)]).get(
                self._name(folder))
        except SQLAlchemyError as exc:
            log.warning("site manifest unreadable, every page rendered: %s", first_line(exc))
            return Manifest()
        return Manifest() if entry is None else Manifest.from_bytes(entry.payload)

    def write(self, folder: Path, manifest: Manifest) -> None:
        try:
            analysis_cache.write_entries(self.store, self.CHIP, self.KIND, {
                self._name(folder): analysis_cache.Entry(self.version[:32], manifest.to_bytes())})
        except SQLAlchemyError as exc:  # the next build renders every page
            log.warning("site manifest not stored: %s", first_line(exc))

    def forget(self, folder: Path) -> None:
        try:
            others = set(analysis_cache.read_entries(self.store, self.CHIP, self.KIND)) - {self._name(folder)}
            analysis_cache.write_entries(self.store, self.CHIP, self.KIND, {}, keep=others)
        except SQLAlchemyError as exc:
            log.warning("site manifest not removed: %s", first_line(exc))
