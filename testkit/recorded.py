"""Recorded runs (reports/examples/, tests/data/recorded/), read as a user reads them: bundles imported and verbs
run by the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from testkit.e2e import harness
from testkit.paths import recorded


def import_examples(folder: Path, bundles: Iterable[str], name: str = "recorded.db") -> str:
    """A fresh SQLite database in ``folder`` holding the named recorded bundles; its URL."""
    db = f"sqlite:///{folder / name}"
    for bundle in bundles:
        done = harness("import", "--db", db, str(recorded(bundle)), cwd=folder)
        assert done.returncode == 0, done.stderr[-2000:]
    return db


def verb_json(folder: Path, db: str, *args: str) -> Any:
    """``harness ARGS --db DB --format json``'s output, parsed (the verb must exit 0)."""
    done = harness(*args, "--db", db, "--format", "json", cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def variant_cells(folder: Path, db: str, refs: dict[str, str]) -> dict[str, Sequence[dict]]:
    """Per side, the cells of ``harness variants --commit REF``."""
    return {side: verb_json(folder, db, "variants", "--commit", ref)["cells"] for side, ref in refs.items()}


def scaled_bundle(source: str, target: Path, variant: str, factor: float) -> Path:
    """A copy of the example bundle ``source`` with every sample (and median) of ``variant``'s jobs times
    ``factor``: a generated regression (or improvement) of the recorded run, with its checksum made again."""
    import gzip
    import hashlib

    with gzip.open(recorded(source), "rb") as raw:
        header_line, *lines = raw.read().split(b"\n")
    payload = []
    for line in lines:
        if not line:
            continue
        record = json.loads(line)
        if record.get("type") == "job" and record.get("variant") == variant and record.get("samples"):
            record["samples"] = [s * factor for s in record["samples"]]
            for name in ("median_s", "ci_low_s", "ci_high_s"):
                if record.get(name) is not None:
                    record[name] *= factor
        payload.append(json.dumps(record, separators=(",", ":")).encode("ascii") + b"\n")
    data = b"".join(payload)
    header = json.loads(header_line)
    header.update(payload_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    target.write_bytes(gzip.compress(json.dumps(header).encode("ascii") + b"\n", mtime=0) + gzip.compress(data))
    return target
