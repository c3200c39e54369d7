"""Bundles: runs (with their chips, machines, commits, jobs and raw samples) written to a file and read back.

Modules: ``format`` (what a record holds, the header, reading a file back), ``export`` (``export_bundle``) and
``importer`` (``import_bundle``).
"""

from __future__ import annotations

from harness.record.bundle.export import ExportSummary, export_bundle
from harness.record.bundle.format import (
    FORMAT,
    READABLE,
    RECORDS,
    REFERENCES,
    VERSION,
    BundleCorrupted,
    BundleInvalid,
    harness_version,
    read_header,
)
from harness.record.bundle.importer import ImportSummary, import_bundle

__all__ = ["FORMAT", "READABLE", "RECORDS", "REFERENCES", "VERSION", "BundleCorrupted", "BundleInvalid",
           "ExportSummary", "ImportSummary", "export_bundle", "harness_version", "import_bundle", "read_header"]
