"""Bundles: lossless export/import between SQLite and PostgreSQL, idempotent re-import, merging, and clear errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import DateTime, delete, func, select, update
from sqlalchemy.engine import make_url

from harness.core.chip import ChipIdentity
from harness.core.errors import HarnessError
from harness.core.job import JobResult, KernelJob
from harness.record import bundle, outbox, query, store
from harness.record.bundle import export_bundle, import_bundle, read_header
from harness.record.models import Base, Chip, Commit, JobRecord, Machine, Run, Sample, TrialSummary
from testkit.analysis import add_run, grid_results
from testkit.lineage import bisect_history
from testkit.paths import ROOT

MAC = ChipIdentity(key="apple-m4-pro-20c", backend="metal", device_name="Apple M4 Pro", architecture="applegpu_g16s",
                   memory_bytes=48 << 30, gpu_cores=20, os="macOS 15.1 (24B83)", mlx_version="0.32.0",
                   device_info={"architecture": "applegpu_g16s", "memory_size": 48 << 30,
                                "max_buffer_length": 1 << 34, "limits": {"threads": [1024, 1024, 64], "x": None}})
H200 = ChipIdentity(key="nvidia-h200-sm90", backend="cuda", device_name="NVIDIA H200", architecture="sm90",
                    memory_bytes=141 << 30, os="Linux 6.8", mlx_version="0.32.0.dev20261101+cuda13")
REPO = "git@example.com:ml/kernels.git"
COMMIT_A = {"sha": "a1" * 20, "repo": REPO, "message": "Flash prefill: tile 16x32\n\nBody with ünïcödé and \"quotes\"",
            "author": "Ada Lovelace", "committed_at": datetime(2026, 11, 1, 9, 30, 15, 123456, tzinfo=UTC),
            "branch": "main"}
COMMIT_B = {"sha": "b2" * 20, "repo": REPO, "message": "wip", "author": "Bob", "committed_at": None, "branch": ""}
CLI_RUNNER = "import harness.cli.bundle; from harness.cli.main import main; main()"


def job(kind: str, kernel: str, variant: str, n: int, dtype: str = "float32", check: str = "") -> KernelJob:
    return KernelJob.of(kind, kernel, variant, {"B": 1, "N": n}, dtype, check, name=f"{kernel}-{kind}")


def samples(rng: random.Random, median: float, n: int) -> list[float]:
    return [median * rng.lognormvariate(0.0, 0.05) for _ in range(n)]


def fill(db: store.Store) -> dict[str, str]:
    """Three realistic runs: a finished run with every outcome, a second chip's run, and one still running."""
    rng = random.Random(7)
    runs = {}
    runs["mac"] = store.create_run(db, ident=MAC, facts={"hostname": "mac-mini-1", "os": "macOS", "cpu_count": 12},
                                   commit=COMMIT_A, suite="builtin", dirty=False, executor="local", planned_jobs=9,
                                   options={"suite": "/repo/jobs/builtin.toml", "parallel": 2})
    calib = [(job("calibration", "calib_matmul", "matmul", 1024), dict(flops=2 * 1024**3, bytes_moved=3 * 4 * 2**20)),
             (job("calibration", "calib_copy", "copy", 1 << 24), dict(flops=0.0, bytes_moved=2.0 * (1 << 26)))]
    for j, extra in calib:
        store.record_result(db, runs["mac"], j, JobResult(j.key, "passed", samples=samples(rng, 2e-4, 30), inner=16,
                                                          warmup_s=0.25, warmup_calls=5, duration_s=1.25, **extra))
    outcomes = [
        ("passed", dict(max_error=1.1920928955078125e-07, tolerance=1e-5)),
        ("failed", dict(max_error=0.25, tolerance=1e-5, detail="max |err| 0.25 > 1e-05 at (0, 3, 17)",
                        output_tail="Traceback (most recent call last):\n  ...\nAssertionError: mismatch ✗\n")),
        ("failed", dict(max_error=float("inf"), tolerance=1e-3, detail="overflow to inf")),
        ("crashed", dict(detail="worker exited with signal 11 (SIGSEGV)", attempts=2, node="worker-3",
                         output_tail="Fatal Python error: Segmentation fault\n\nThread 0x00007f (most recent call "
                                     "first):\n  File \"kernels/flash_prefill.py\", line 88\n" + "x" * 300)),
        ("timeout", dict(detail="no result after 120 s", duration_s=120.0)),
        ("skipped", dict(detail="needs metal")),
    ]
    for n, (status, extra) in enumerate(outcomes):
        j = job("correctness", "flash_prefill", "flash_bq16_bk32", 13 + n, check="reference")
        store.record_result(db, runs["mac"], j, JobResult(j.key, status, duration_s=extra.pop("duration_s", 0.5 + n),
                                                          **extra))
    bench = job("benchmark", "flash_prefill", "flash_bq16_bk32", 4096, "float16")
    store.record_result(db, runs["mac"], bench, JobResult(bench.key, "passed", samples=samples(rng, 1.5e-3, 200),
                                                          inner=4, warmup_s=0.5, warmup_calls=3, flops=3.2e10,
                                                          bytes_moved=1.6e8, duration_s=2.5, node="local",
                                                          mode="pipelined", round_trip_s=8e-5, backlog_calls=17.5))
    store.finalize_roofline(db, runs["mac"])
    store.finish_run(db, runs["mac"], "failed")

    runs["h200"] = store.create_run(db, ident=H200, facts={"hostname": "gpu-node-7", "gpus": 8}, commit=COMMIT_A,
                                    suite="builtin", dirty=False, executor="ray", planned_jobs=2)
    for variant in ("sdpa", "flash_bq8_bk16"):
        j = job("benchmark", "flash_prefill", variant, 8192, "bfloat16")
        store.record_result(db, runs["h200"], j, JobResult(j.key, "passed", samples=samples(rng, 4e-4, 50), inner=32,
                                                           flops=1e11, bytes_moved=4e8, node="gpu-node-7"))
    store.set_peaks(db, runs["h200"], 9.89e14, 4.8e12)
    store.finish_run(db, runs["h200"], "passed")

    runs["wip"] = store.create_run(db, ident=H200, facts={"hostname": "gpu-node-7", "gpus": 8}, commit=COMMIT_B,
                                   suite="tiny", dirty=True, executor="local", planned_jobs=4)
    j = job("benchmark", "swiglu", "fused", 1 << 20)
    store.record_result(db, runs["wip"], j, JobResult(j.key, "passed", samples=samples(rng, 1e-5, 40), inner=128))
    with db.session() as session:  # a hole in the sample indices must survive too
        job_id = session.scalar(select(JobRecord.id).where(JobRecord.run_id == runs["wip"]))
        session.execute(delete(Sample).where(Sample.job_id == job_id, Sample.idx == 3))
    return runs


def dump(db: store.Store) -> dict[str, list]:
    """Every column of every table, surrogate ids replaced by natural keys, datetimes as UTC: comparable anywhere."""
    out: dict[str, list] = {}
    with db.engine.connect() as conn:
        chips = {r.id: r.key for r in conn.execute(select(Chip.id, Chip.key))}
        machines = {r.id: (chips[r.chip_id], r.hostname) for r in conn.execute(select(Machine))}
        commits = {r.id: (r.repo, r.sha) for r in conn.execute(select(Commit.id, Commit.repo, Commit.sha))}
        jobs = {r.id: (r.run_id, r.key) for r in conn.execute(select(JobRecord.id, JobRecord.run_id, JobRecord.key))}
        refs = {"chip_id": chips, "machine_id": machines, "commit_id": commits, "job_id": jobs}
        for table in Base.metadata.sorted_tables:
            if table.name == TrialSummary.__tablename__:  # derived from the samples (its own test below)
                continue
            rows = []
            for row in conn.execute(select(table)).mappings():
                item = {}
                for column in table.columns:
                    value = row[column.name]
                    if column.name == "id" and isinstance(value, int):  # surrogate (run ids are kept)
                        continue
                    if column.name in refs:
                        value = None if value is None else refs[column.name][value]
                    elif isinstance(column.type, DateTime) and value is not None:
                        value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
                    item[column.name] = value
                rows.append(item)
            out[table.name] = sorted(rows, key=repr)
    return out


def count(db: store.Store, model) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(model))


def counts(db: store.Store) -> dict[str, int]:
    return {model.__name__: count(db, model) for model in (Chip, Machine, Commit, Run, JobRecord, Sample)}


@pytest.fixture
def source(tmp_path: Path):
    db = outbox.open_store(f"sqlite:///{tmp_path / 'source.db'}")
    runs = fill(db)
    yield db, runs
    db.close()


@pytest.fixture
def target(db_url: str):
    db = outbox.open_store(db_url)
    yield db
    db.close()


def split(path: Path) -> tuple[dict, bytes]:
    """A bundle's header and payload (both gzip members, concatenated by any gzip reader)."""
    header, _, payload = gzip.decompress(path.read_bytes()).partition(b"\n")
    return json.loads(header), payload


def write(path: Path, header: dict, payload: bytes, fix_checksum: bool = True) -> Path:
    if fix_checksum:
        header = {**header, "sha256": hashlib.sha256(payload).hexdigest(), "payload_bytes": len(payload)}
    path.write_bytes(gzip.compress(json.dumps(header).encode() + b"\n") + gzip.compress(payload))
    return path


# --- lossless round trip ---------------------------------------------------------------------------------------


def test_round_trip_sqlite_to_postgresql_and_back_is_lossless(tmp_path: Path, source, pg_url: str):
    src, _ = source
    first = export_bundle(src, tmp_path / "from-sqlite.bundle")
    assert (first.runs, first.jobs, first.samples) == (3, 12, 30 + 30 + 200 + 50 + 50 + 39)

    pg = outbox.open_store(pg_url)
    try:
        added = import_bundle(pg, first.path)
        assert (added.runs_added, added.jobs_added, added.samples_added) == (3, 12, first.samples)
        assert (added.chips_added, added.machines_added, added.commits_added) == (2, 2, 2)
        second = export_bundle(pg, tmp_path / "from-postgresql.bundle")
        back = outbox.open_store(f"sqlite:///{tmp_path / 'back.db'}")
        import_bundle(back, second.path)
        original, in_pg, in_sqlite = dump(src), dump(pg), dump(back)
        back.close()
    finally:
        pg.close()

    assert original == in_pg == in_sqlite
    assert {name: len(rows) for name, rows in original.items()} == {
        "chip": 2, "commit": 2, "machine": 2, "run": 3, "job": 12, "sample": first.samples,
        "analysis_cache": 0,  # derived results (harness.analysis.cache): never in a bundle
        "analysis_stamp": 0,  # the analysis cache's raised watermarks: never in a bundle either
        "regression_ack": 0}  # acknowledgements belong to the shared database (harness ack), not to a run

    failed = [j for j in original["job"] if j["status"] == "failed"]
    assert {j["max_error"] for j in failed} == {0.25, float("inf")}
    assert any("Segmentation fault" in j["output_tail"] for j in original["job"])
    # Deterministic: the same rows give byte-identical payloads, whichever database they came from.
    assert read_header(first.path)["sha256"] == read_header(second.path)["sha256"]


def test_an_import_summarises_the_trials_of_the_samples_it_adds(tmp_path: Path, source, target):
    """Trial summaries are derived, never in a bundle: the import writes them from the samples it adds (the
    source's are stale where the fixture cut a hole in a job's samples behind the store's back)."""
    src, runs = source
    import_bundle(target, export_bundle(src, tmp_path / "all.bundle").path)
    with target.session() as session:
        samples = session.execute(select(Sample.job_id, Sample.idx, Sample.seconds, Sample.trial)).all()
        stored = {job_id: (n, trials) for job_id, n, trials in session.execute(
            select(TrialSummary.job_id, TrialSummary.n, TrialSummary.trials))}
        holed = session.scalar(select(JobRecord.id).where(JobRecord.run_id == runs["wip"]))
    expected = store.packed_summaries(store.trial_summaries(samples))
    assert {job_id: (n, records.tobytes()) for job_id, (n, records) in expected.items()} == stored
    assert len(stored) == 6 and stored[holed][0] == 39 and store.unpacked_trials(stored[holed][1])["valid"] == 39


def test_every_exported_field_is_documented():
    doc = (ROOT / "docs" / "bundles.md").read_text()
    for kind, spec in bundle.RECORDS.items():
        for name in (*spec.names, *bundle.REFERENCES[kind]):
            assert f"`{name}`" in doc, f"docs/bundles.md does not describe {kind}.{name}"


def test_reserved_record_keys_do_not_clash_with_columns():
    for kind, spec in bundle.RECORDS.items():
        assert not {"type", "sample_idx", *bundle.REFERENCES[kind]} & set(spec.names), kind


# --- idempotence and merging -----------------------------------------------------------------------------------


def test_importing_the_same_bundle_twice_adds_nothing(tmp_path: Path, source, target):
    src, _ = source
    path = export_bundle(src, tmp_path / "all.bundle").path
    first = import_bundle(target, path)
    after_first = counts(target)
    second = import_bundle(target, path)
    assert (second.runs_added, second.jobs_added, second.samples_added) == (0, 0, 0)
    assert (second.runs_skipped, second.jobs_skipped, second.samples_skipped) == (
        first.runs_added, first.jobs_added, first.samples_added)
    assert (second.chips_added, second.machines_added, second.commits_added, second.runs_completed) == (0, 0, 0, 0)
    assert counts(target) == after_first
    assert dump(target) == dump(src)


def test_a_partially_present_run_is_completed_without_duplicates(tmp_path: Path, source, target):
    src, runs = source
    path = export_bundle(src, tmp_path / "all.bundle").path
    import_bundle(target, path)
    with target.session() as session:  # as if an earlier import had stopped half-way through the run
        keys = session.scalars(select(JobRecord.key).where(JobRecord.run_id == runs["mac"])
                               .order_by(JobRecord.id)).all()
        dropped = [keys[0], keys[3], keys[-1]]  # a calibration, a failed check, the benchmark
        session.execute(delete(Sample).where(Sample.job_id.in_(
            select(JobRecord.id).where(JobRecord.run_id == runs["mac"], JobRecord.key.in_(dropped)))))
        session.execute(delete(JobRecord).where(JobRecord.run_id == runs["mac"], JobRecord.key.in_(dropped)))
        session.execute(update(Run).where(Run.id == runs["mac"]).values(status="running", finished_at=None,
                                                                         peak_flops=None, peak_bytes_per_s=None))
    before = counts(target)
    merged = import_bundle(target, path)
    assert (merged.runs_added, merged.runs_skipped, merged.runs_completed) == (0, 3, 1)
    assert merged.jobs_added == 3 and merged.samples_added == 30 + 200
    assert counts(target)["JobRecord"] == before["JobRecord"] + 3
    assert dump(target) == dump(src)


def test_concurrent_imports_of_one_bundle_store_it_once(tmp_path: Path, source, target):
    src, _ = source
    path = export_bundle(src, tmp_path / "all.bundle").path
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: import_bundle(target, path), range(2)))
    assert sorted(r.runs_added for r in results) == [0, 3]
    assert sorted(r.jobs_added for r in results) == [0, 12]
    assert dump(target) == dump(src)


def test_a_run_id_with_a_different_commit_or_chip_is_refused(tmp_path: Path, source, target):
    src, runs = source
    path = export_bundle(src, tmp_path / "all.bundle").path
    store.create_run(target, ident=MAC, facts={"hostname": "elsewhere"}, commit={"sha": "c3" * 20}, suite="s",
                     dirty=False, executor="local", planned_jobs=0, run_id=runs["mac"])
    with pytest.raises(HarnessError, match="not merging it"):
        import_bundle(target, path)
    assert counts(target)["Run"] == 1 and counts(target)["JobRecord"] == 0  # nothing of the bundle was written


def test_a_damaged_bundle_writes_nothing(tmp_path: Path, source, target):
    src, _ = source
    data = export_bundle(src, tmp_path / "all.bundle").path.read_bytes()
    cut = tmp_path / "cut.bundle"
    cut.write_bytes(data[: len(data) * 3 // 4])
    with pytest.raises(HarnessError, match="corrupted or truncated: the file ends early"):
        import_bundle(target, cut)
    assert counts(target) == dict.fromkeys(counts(target), 0)


def test_export_reads_a_sqlite_snapshot_without_blocking_writers(source):
    src, runs = source
    with src.snapshot() as session:
        before = session.scalar(select(func.count()).select_from(JobRecord))
        extra = job("benchmark", "swiglu", "other", 8)
        assert store.record_result(src, runs["wip"], extra, JobResult(extra.key, "passed", samples=[1.0]))
        assert session.scalar(select(func.count()).select_from(JobRecord)) == before  # still the same snapshot
    assert count(src, JobRecord) == before + 1


def test_a_bundle_recompressed_as_one_gzip_member_still_imports(tmp_path: Path, source, target):
    path = export_bundle(source[0], tmp_path / "all.bundle").path
    one = tmp_path / "one.bundle"
    one.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), 9))
    assert import_bundle(target, one).runs_added == 3
    assert dump(target) == dump(source[0])


def test_a_bundle_cut_after_its_header_is_truncated(tmp_path: Path, source, target):
    path = export_bundle(source[0], tmp_path / "all.bundle").path
    header_member = gzip.compress(gzip.decompress(path.read_bytes()).partition(b"\n")[0] + b"\n")
    path.write_bytes(header_member)
    with pytest.raises(HarnessError, match="corrupted or truncated: the file ends early"):
        import_bundle(target, path)


# --- selection -------------------------------------------------------------------------------------------------


def test_export_selects_runs_by_id_commit_and_chip(tmp_path: Path, source):
    src, runs = source

    def exported(**selection) -> set[str]:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.bundle"
        export_bundle(src, path, **selection)
        db = outbox.open_store(f"sqlite:///{path}.db")
        import_bundle(db, path)
        with db.session() as session:
            ids = set(session.scalars(select(Run.id)))
        db.close()
        return ids

    assert exported(run_ids=[runs["h200"], runs["wip"]]) == {runs["h200"], runs["wip"]}
    assert exported(commit=COMMIT_A["sha"][:8]) == {runs["mac"], runs["h200"]}
    assert exported(chip=H200.key) == {runs["h200"], runs["wip"]}
    assert exported(commit=COMMIT_B["sha"].upper(), chip=H200.key) == {runs["wip"]}
    assert exported() == set(runs.values())


@pytest.mark.parametrize("selection, message", [
    ({"run_ids": ["nope"]}, "no run nope in sqlite:///"),
    ({"commit": "c3c3c3"}, "no commit c3c3c3"),
    ({"commit": "HEAD"}, "--commit must be a commit sha"),
    ({"chip": "apple-m9"}, "no chip apple-m9"),
    ({"commit": COMMIT_A["sha"], "chip": MAC.key, "run_ids": ["x"]}, "give --run or --commit, not both"),
    ({"commit": COMMIT_B["sha"], "chip": MAC.key}, "no runs in sqlite:///"),
])
def test_export_selection_errors(tmp_path: Path, source, selection, message):
    with pytest.raises(HarnessError, match=re.escape(message)):
        export_bundle(source[0], tmp_path / "x.bundle", **selection)
    assert not list(tmp_path.glob("*.bundle")) and not list(tmp_path.glob(".*.partial"))


# --- security --------------------------------------------------------------------------------------------------


def test_the_database_password_never_reaches_a_bundle(tmp_path: Path, source, pg_url: str):
    secret = "s3cret-Pa55word"
    url = make_url(pg_url).set(password=secret).render_as_string(hide_password=False)
    pg = outbox.open_store(url)  # trust authentication: the password is accepted and ignored
    try:
        import_bundle(pg, export_bundle(source[0], tmp_path / "a.bundle").path)
        path = export_bundle(pg, tmp_path / "b.bundle").path
    finally:
        pg.close()
    raw = path.read_bytes()
    assert secret.encode() not in raw and secret.encode() not in gzip.decompress(raw)
    header = read_header(path)
    assert header["source_db"] == store.mask_url(url) and ":***@" in header["source_db"]


# --- through the real CLI --------------------------------------------------------------------------------------


def harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`harness ...` with the bundle verbs registered in-process (cli.py registers them once its COMMANDS list has
    "bundle"). COLUMNS is wide because cli.py prints errors through rich, which wraps at 80 columns off a terminal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "500"}
    return subprocess.run([sys.executable, "-c", CLI_RUNNER, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_export_and_import(tmp_path: Path, source):
    src, runs = source
    done = harness("export", "--db", src.url, "--run", runs["mac"], "--run", runs["h200"], "--out", "two.bundle",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"exported 2 runs, 11 jobs, 360 samples to two\.bundle \([\d.]+ KiB\)", done.stderr)
    target = "sqlite:///target.db"
    done = harness("import", "--db", target, "two.bundle", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "runs: 2 added, 0 already present; jobs: 11 added, 0 skipped; samples: 360 added, 0 skipped" \
        in done.stderr
    assert "new: 2 chips, 2 machines, 1 commits" in done.stderr
    again = harness("import", "--db", target, "two.bundle", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "runs: 0 added, 2 already present; jobs: 0 added, 11 skipped; samples: 0 added, 360 skipped" \
        in again.stderr


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def not_a_bundle(path: Path) -> None:
    path.write_bytes(gzip.compress(b'{"name": "results", "rows": [1, 2, 3]}\n'))


def other_gzip(path: Path) -> None:
    path.write_bytes(gzip.compress(b"kernel,variant,median\nflash,sdpa,0.1\n"))


def plain_text(path: Path) -> None:
    path.write_text('{"format": "mlx-harness-bundle", "version": 1}\n')


def empty(path: Path) -> None:
    path.write_bytes(b"")


def version_5(path: Path) -> None:
    header, payload = split(path)
    write(path, {**header, "version": 5}, payload)


def altered(path: Path) -> None:
    header, payload = split(path)
    write(path, header, payload.replace(b'"status":"failed"', b'"status":"passed"', 1), fix_checksum=False)


def newer_field(path: Path) -> None:
    header, payload = split(path)
    write(path, header, payload.replace(b'{"type":"job",', b'{"type":"job","energy_j":1.5,', 1))


@pytest.mark.parametrize("damage, message", [
    (corrupt, "error: bundle b.bundle is corrupted or truncated: "),
    (truncate, "error: bundle b.bundle is corrupted or truncated: the file ends early"),
    (not_a_bundle, "error: b.bundle is not a harness bundle (no 'mlx-harness-bundle' header)"),
    (version_5, "error: bundle format version 5 is not supported (this harness reads versions 1, 2, 3, 4): "
                "b.bundle"),
])
def test_cli_bad_bundles_give_one_line_and_write_nothing(tmp_path: Path, source, damage, message):
    path = export_bundle(source[0], tmp_path / "b.bundle").path
    damage(path)
    done = harness("import", "--db", "sqlite:///target.db", "b.bundle", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), done.stderr
    assert "Traceback" not in done.stderr
    if (tmp_path / "target.db").exists():
        target = outbox.open_store(f"sqlite:///{tmp_path / 'target.db'}")
        assert counts(target) == dict.fromkeys(counts(target), 0)
        target.close()


@pytest.mark.parametrize("damage, message", [
    (altered, "bundle {} is corrupted or truncated: SHA-256 checksum mismatch"),
    (plain_text, "bundle {} is corrupted or truncated: not gzip-compressed"),
    (empty, "bundle {} is corrupted or truncated: the file is empty"),
    (other_gzip, "{} is not a harness bundle (no 'mlx-harness-bundle' header)"),
    (newer_field, "bundle {} is not a valid version 4 bundle: a job record has fields this harness does not know: "
                  "energy_j (written by a newer harness?)"),
])
def test_more_bad_bundles(tmp_path: Path, source, damage, message):
    path = export_bundle(source[0], tmp_path / "b.bundle").path
    damage(path)
    target = outbox.open_store(f"sqlite:///{tmp_path / 'target.db'}")
    with pytest.raises(HarnessError) as caught:
        import_bundle(target, path)
    assert str(caught.value) == message.format(path) and "\n" not in str(caught.value)
    assert counts(target) == dict.fromkeys(counts(target), 0)
    target.close()


def test_cli_missing_bundle(tmp_path: Path):
    done = harness("import", "--db", "sqlite:///t.db", "missing.bundle", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == "error: bundle missing.bundle does not exist"
    assert not (tmp_path / "t.db").exists()


# --- ancestry (version 2) and version 1 bundles ----------------------------------------------------------------


def test_parents_branches_and_link_commits_travel(tmp_path: Path, target):
    src = outbox.open_store(f"sqlite:///{tmp_path / 'lineage.db'}")
    try:
        h = bisect_history(src, tmp_path / "repo")
        path = export_bundle(src, tmp_path / "all.bundle").path
        assert import_bundle(target, path).commits_added == 13  # 8 run, 5 only linking them
        assert dump(target) == dump(src)
        m8_only = export_bundle(src, tmp_path / "m8.bundle", commit=h.main[8]).path
        m7_only = export_bundle(src, tmp_path / "m7.bundle", commit=h.main[7]).path
        with pytest.raises(HarnessError, match=f"no commit {h.main[10]}"):  # stored only as a link: no runs
            export_bundle(src, tmp_path / "m10.bundle", commit=h.main[10])
    finally:
        src.close()
    named = {run.id: run for run in query.runs(target)}
    assert named[h.runs["f1"]].branch == "feature" and named[h.runs["m8"]].branch == ""
    assert query.previous_run_id(target, h.runs["f1"]) == h.runs["m4"]
    assert query.previous_run_id(target, h.runs["m11"]) == h.runs["m9"]
    # One run's bundle carries its repository's ancestry: imported apart, the runs still find each other.
    fresh = outbox.open_store(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        import_bundle(fresh, m8_only)
        import_bundle(fresh, m7_only)
        assert query.previous_run_id(fresh, h.runs["m8"]) == h.runs["m7"]
        assert query.previous_run_id(fresh, h.runs["m7"]) is None  # m4 did not come along
    finally:
        fresh.close()


V4_FIELDS = (("job", "backlog_calls"),)
V3_FIELDS = (("job", "trials"), ("job", "timing_mode"), ("job", "round_trip_s"), ("job", "sample_trial"))


def as_version(path: Path, version: int, keep: tuple[str, ...] = ()) -> Path:
    """The bundle as a version 1, 2 or 3 harness wrote it: version 3 without the backlog of version 4, version 2
    also without the trial fields of version 3, version 1 also without commit parents and run branch (fields named
    in ``keep`` are left)."""
    header, payload = split(path)
    records = [json.loads(line) for line in payload.splitlines()]
    dropped = V4_FIELDS + (V3_FIELDS if version <= 2 else ()) + (
        (("commit", "parents"), ("run", "branch")) if version == 1 else ())
    for record in records:
        for kind, name in dropped:
            if record["type"] == kind and name not in keep:
                record.pop(name, None)
    lines = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
    return write(path, {**header, "version": version}, lines)


def as_version_1(path: Path, keep: tuple[str, ...] = ()) -> Path:
    return as_version(path, 1, keep)


def test_a_version_2_bundle_imports_as_one_trial_per_job(tmp_path: Path, source, target):
    v2 = as_version(export_bundle(source[0], tmp_path / "v2.bundle").path, 2)
    assert import_bundle(target, v2).runs_added == 3
    with target.session() as session:
        assert set(session.scalars(select(JobRecord.trials))) == {1}
        assert set(session.scalars(select(JobRecord.timing_mode))) == {""}
        assert set(session.scalars(select(Sample.trial))) == {0}


def test_a_version_3_bundle_imports_with_the_backlog_unknown(tmp_path: Path, source, target):
    v3 = as_version(export_bundle(source[0], tmp_path / "v3.bundle").path, 3)
    assert import_bundle(target, v3).runs_added == 3
    with target.session() as session:
        assert set(session.scalars(select(JobRecord.backlog_calls))) == {None}
        assert "pipelined" in set(session.scalars(select(JobRecord.timing_mode)))  # version 3's fields kept


def test_a_version_3_bundle_with_a_backlog_is_refused(tmp_path: Path, source, target):
    v3 = as_version(export_bundle(source[0], tmp_path / "v3.bundle").path, 3, keep=("backlog_calls",))
    with pytest.raises(HarnessError, match="does not know: backlog_calls"):
        import_bundle(target, v3)


def test_trials_survive_a_round_trip(tmp_path: Path, target):
    src = outbox.open_store(f"sqlite:///{tmp_path / 'src.db'}")
    rng = np.random.default_rng(3)
    add_run(src, "chip-a", 1, grid_results(rng, trials=3), minutes=0)
    import_bundle(target, export_bundle(src, tmp_path / "t.bundle").path)
    for db in (src, target):
        with db.session() as session:
            assert set(session.scalars(select(JobRecord.trials))) == {3}
            assert sorted(set(session.scalars(select(Sample.trial)))) == [0, 1, 2]
    src.close()


def test_a_version_1_bundle_imports_with_unknown_parents_and_heals_later(tmp_path: Path, source, target):
    src, runs = source
    with src.session() as session:
        session.execute(update(Commit).values(parents=["c0" * 20]))
        session.execute(update(Run).values(branch="main"))
    current = export_bundle(src, tmp_path / "current.bundle").path
    v1 = as_version_1(export_bundle(src, tmp_path / "v1.bundle").path)
    assert read_header(v1)["version"] == 1 and read_header(current)["version"] == bundle.VERSION
    assert import_bundle(target, v1).runs_added == 3
    with target.session() as session:
        assert set(session.scalars(select(Commit.parents))) == {None}
        assert set(session.scalars(select(Run.branch))) == {""}
    assert {run.id: run.branch for run in query.runs(target)}[runs["mac"]] == "main"  # the commit's branch
    again = import_bundle(target, current)  # the same runs, from a current bundle: parents filled in
    assert (again.runs_added, again.commits_added) == (0, 0)
    with target.session() as session:
        assert list(session.scalars(select(Commit.parents))) == [["c0" * 20]] * 2
        assert set(session.scalars(select(Run.branch))) == {""}  # existing runs are left as they are


def test_a_version_1_bundle_with_version_2_fields_is_invalid(tmp_path: Path, source, target):
    path = as_version_1(export_bundle(source[0], tmp_path / "b.bundle").path, keep=("parents",))
    with pytest.raises(HarnessError, match=re.escape(
            f"bundle {path} is not a valid version 1 bundle: a commit record has fields this harness does not know: "
            "parents")):
        import_bundle(target, path)


def test_malformed_parents_are_invalid(tmp_path: Path, source, target):
    path = export_bundle(source[0], tmp_path / "b.bundle").path
    header, payload = split(path)
    write(path, header, payload.replace(b'"parents":null', b'"parents":"abc"', 1))
    with pytest.raises(HarnessError, match="parents are not a list of shas"):
        import_bundle(target, path)
