"""The store on SQLite and PostgreSQL: migrations, runs, idempotent job writes, samples, roofline, masking."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy import func, select

from harness.core.chip import ChipIdentity
from harness.core.errors import HarnessError
from harness.core.job import FunctionJob, InstallJob, JobResult, KernelJob, PytestJob
from harness.record import bundle, outbox, query, store
from harness.record.models import JobRecord, Run, Sample, TrialSummary
from testkit.migrations import downgraded

CHIP = ChipIdentity(key="test-chip", backend="cpu", device_name="Test", architecture="x86_64", memory_bytes=141 << 30)
FACTS = {"hostname": "host-a"}


def bench_job(variant: str = "v", kernel: str = "k") -> KernelJob:
    return KernelJob.of("benchmark", kernel, variant, {"N": 8}, "float32", name="b")


def new_run(db: store.Store, sha: str = "abc123") -> str:
    return store.create_run(db, ident=CHIP, facts=FACTS, commit={"sha": sha, "message": "msg"}, suite="s",
                            dirty=False, executor="local", planned_jobs=1)


def count(db, model) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(model))


def test_migrations_are_idempotent(db):
    store.migrate(db.engine)
    store.migrate(db.engine)
    assert count(db, Run) == 0


def test_the_schema_head_the_store_checks_without_alembic_is_alembics_head():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(store.MIGRATIONS))
    assert store.SCHEMA_HEAD == ScriptDirectory.from_config(config).get_current_head()


def test_an_older_schema_is_still_migrated_to_the_head(db_url):
    """The fast path (schema at the head: no Alembic) must not skip a database one revision behind."""
    from sqlalchemy import inspect, text

    from testkit.migrations import downgraded

    store.open_database(db_url).close()
    with downgraded(db_url, "0005") as engine:
        assert "backlog_calls" not in {c["name"] for c in inspect(engine).get_columns("job")}
    store.open_database(db_url).close()
    engine = store.make_engine(db_url)
    try:
        assert "backlog_calls" in {c["name"] for c in inspect(engine).get_columns("job")}
        with engine.connect() as connection:
            assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == store.SCHEMA_HEAD
    finally:
        engine.dispose()


def test_a_database_written_by_a_newer_harness_is_refused_in_one_line_and_left_untouched(db_url):
    """Its schema revision is one this harness does not know: Alembic's traceback became one clear error (exit 2
    from the CLI), and nothing is migrated or written."""
    import subprocess
    import sys

    from sqlalchemy import text

    store.open_database(db_url).close()
    engine = store.make_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(HarnessError, match="revision 9999, newer than this harness knows .*upgrade this checkout"):
        store.open_database(db_url)
    done = subprocess.run([sys.executable, "-m", "harness", "compare", "HEAD~1", "HEAD", "--db", db_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "newer than this harness knows" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    with engine.begin() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == "9999"
    engine.dispose()


def test_a_result_written_twice_is_stored_once(db):
    run_id = new_run(db)
    job = bench_job()
    result = JobResult(job.key, "passed", samples=[1.0, 2.0, 3.0], inner=4, flops=10.0, bytes_moved=20.0)
    assert store.record_result(db, run_id, job, result) is True
    assert store.record_result(db, run_id, job, result) is False
    assert count(db, JobRecord) == 1 and count(db, Sample) == 3
    assert store.stored_keys(db, run_id) == {job.key}


def test_a_sample_that_is_not_a_number_keeps_its_job_and_is_stored_as_an_invalid_sample(db, tmp_path):
    """SQLite reads a NaN as NULL, which the sample column refuses: the write failed with an IntegrityError that was
    taken for a concurrent writer's, and the job was lost without a word. A NaN is stored as +inf on every backend:
    to the statistics both are invalid (valid: finite and > 0), so nothing else changes."""
    run_id = new_run(db)
    job, later = bench_job(), bench_job("w")
    nan = float("nan")
    assert store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=[1.0, nan, 3.0])) is True
    assert store.record_result(db, run_id, later, JobResult(later.key, "passed", samples=[2.0, 2.0], trial=0))
    assert store.record_result(db, run_id, later, JobResult(later.key, "passed", samples=[nan, 4.0], trial=1))
    with db.session() as session:
        stored = {key: sorted(seconds for seconds, in session.execute(
            select(Sample.seconds).join(JobRecord).where(JobRecord.key == key))) for key in (job.key, later.key)}
        medians = dict(session.execute(select(JobRecord.key, JobRecord.median_s)).all())
    assert stored == {job.key: [1.0, 3.0, float("inf")], later.key: [2.0, 2.0, 4.0, float("inf")]}
    assert medians == {job.key: 2.0, later.key: 2.0}  # the medians of the valid samples, as before the write
    with db.session() as session:  # the trial summaries count the NaN as a sample, not as a valid one
        summaries = {key: (n, store.unpacked_trials(payload)[["trial", "valid"]].tolist()) for key, n, payload in
                     session.execute(select(JobRecord.key, TrialSummary.n, TrialSummary.trials).join(JobRecord))}
    assert summaries == {job.key: (3, [(0, 2)]), later.key: (4, [(0, 2), (1, 1)])}

    bundle.export_bundle(db, tmp_path / "nan.bundle")  # and a bundle carries the invalid sample as it is stored
    copy = outbox.open_store(f"sqlite:///{tmp_path / 'copy.db'}")
    try:
        bundle.import_bundle(copy, tmp_path / "nan.bundle")
        with copy.session() as session:
            assert sorted(session.scalars(select(Sample.seconds))) == [1.0, 2.0, 2.0, 3.0, 4.0, math.inf, math.inf]
    finally:
        copy.close()


def test_an_integrity_error_that_is_not_a_concurrent_write_is_raised_not_swallowed(db):
    job = bench_job()
    with pytest.raises(Exception, match="(?i)foreign key|integrity|violates"):
        store.record_result(db, "no-such-run", job, JobResult(job.key, "passed", samples=[1.0]))
    assert count(db, JobRecord) == 0


def test_running_the_same_commit_again_is_a_new_run_with_new_samples(db):
    job = bench_job()
    for _ in range(2):
        store.record_result(db, new_run(db), job, JobResult(job.key, "passed", samples=[1.0, 1.1]))
    assert count(db, Run) == 2 and count(db, JobRecord) == 2 and count(db, Sample) == 4
    views = query.runs(db, "test-chip")
    assert len(views) == 2 and {v.sha for v in views} == {"abc123"}


def test_summary_and_roofline_from_calibration(db):
    run_id = new_run(db)
    calib = KernelJob.of("calibration", "calib_matmul", "matmul", {"N": 4}, "float32", name="calibration")
    store.record_result(db, run_id, calib, JobResult(calib.key, "passed", samples=[1.0] * 3, flops=100.0,
                                                     bytes_moved=1.0))
    job = bench_job()
    store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=[2.0, 2.0, 2.0], flops=50.0,
                                                   bytes_moved=1.0))
    peaks = store.finalize_roofline(db, run_id)
    assert peaks == (100.0, None)
    record = next(j for j in query.get_run(db, run_id).jobs if j["key"] == job.key)
    assert record["median_s"] == 2.0 and record["achieved_flops"] == 25.0
    assert record["pct_peak"] == pytest.approx(25.0) and record["bound"] == "compute"


def test_every_job_type_is_stored_under_the_labels_of_the_single_job_type(db):
    run_id = new_run(db)
    install = {"command": "true", "nonce": "n"}
    jobs = [KernelJob.of("correctness", "k", "v", {"N": 8, "B": 1}, "float32", "reference", name="c"),
            FunctionJob.of("pkg.bench:mm", {"N": 8}, name="mm", install=install),
            FunctionJob.of("pkg.bench:bare", {}, "float16", name="bare"),
            PytestJob.of({"selection": "unit", "paths": ["tests"]}, install=install),
            InstallJob.of(install)]
    for job in jobs:
        tests = [{"nodeid": "t.py::a", "outcome": "passed"}] if job.kind == "pytest" else []
        assert store.record_result(db, run_id, job, JobResult(job.key, "passed", tests=tests))
    with db.session() as session:
        rows = {r.key: (r.kind, r.name, r.kernel, r.variant, r.shape, r.shape_key, r.dtype, r.check_name)
                for r in session.scalars(select(JobRecord))}
    assert rows == {  # what the single Job type stored for these jobs (kernel "install", a selection's name...)
        "correctness/k/v/float32/B=1,N=8/reference": ("correctness", "c", "k", "v", {"B": 1, "N": 8}, "B=1,N=8",
                                                      "float32", "reference"),
        "benchmark/pkg.bench:mm/default/-/N=8": ("benchmark", "mm", "pkg.bench:mm", "default", {"N": 8}, "N=8", "",
                                                 ""),
        "benchmark/pkg.bench:bare/default/float16/": ("benchmark", "bare", "pkg.bench:bare", "default", {}, "",
                                                      "float16", ""),
        "pytest/unit": ("pytest", "unit", "unit", "default", {}, "", "", ""),
        "test/unit/t.py::a": ("test", "t.py::a", "unit", "default", {}, "", "", ""),
        "install": ("install", "install", "install", "default", {}, "", "", ""),
    }


def test_big_memory_sizes_fit(db):
    new_run(db)
    assert query.chips(db)[0]["memory_bytes"] == 141 << 30


def test_passwords_are_masked():
    assert store.mask_url("postgresql://alice:s3cret@db.example/x") == "postgresql://alice:***@db.example/x"
    assert "s3cret" not in store.mask_url("postgresql+psycopg://alice:s3cret@h/x")


def test_bad_urls_are_one_line_errors_without_the_password(tmp_path):
    with pytest.raises(HarnessError, match="not a database URL"):
        outbox.open_store("sqlite:results.db")
    with pytest.raises(HarnessError) as info:
        outbox.open_store("postgresql://alice:s3cret@127.0.0.1:1/x")
    assert "s3cret" not in str(info.value) and "cannot open database" in str(info.value)


def test_a_plain_path_means_that_sqlite_file(tmp_path):
    assert store.as_db_url(str(tmp_path / "r.db")) == f"sqlite:///{tmp_path / 'r.db'}"
    assert store.as_db_url("~/r.db") == f"sqlite:///{Path.home() / 'r.db'}"
    for as_given in ("sqlite:///r.db", "postgresql://u@h/db", "u@h/db", "sqlite:r.db", ""):
        assert store.as_db_url(as_given) == as_given  # a URL, or for parse_url to explain
    outbox.open_store(str(tmp_path / "new" / "r.db")).close()
    assert (tmp_path / "new" / "r.db").is_file()


def test_a_database_from_before_trials_reads_as_one_trial_per_job(db_url):
    """Migration 0003 on rows written before it (written now, then the schema taken down to 0002, which drops the
    trial columns): every sample reads as trial 0 and every job as one trial, its timing mode unknown."""
    from sqlalchemy import inspect

    db = outbox.open_store(db_url)
    run_id = new_run(db)
    job = bench_job()
    store.record_result(db, run_id, job, JobResult(job.key, "passed", samples=[1.0, 2.0, 3.0], mode="pipelined"))
    db.close()
    with downgraded(db_url, "0002") as engine:
        assert "trial" not in {c["name"] for c in inspect(engine).get_columns("sample")}
    db = outbox.open_store(db_url)  # migrates to the newest revision again
    try:
        with db.session() as session:
            assert set(session.scalars(select(Sample.trial))) == {0}
            stored = session.scalars(select(JobRecord)).one()
            assert (stored.trials, stored.timing_mode, stored.round_trip_s) == (1, "", None)
        (series,) = query.series_trials(db, [run_id]).values()
        assert len(series.trials) == 1 and sorted(series.trials[0]) == [1.0, 2.0, 3.0] and series.runs == 1
    finally:
        db.close()


def test_a_sqlite_file_is_read_through_a_memory_map_and_keeps_its_write_settings(tmp_path):
    db = outbox.open_store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        with db.engine.connect() as conn:
            pragma = {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                      for name in ("mmap_size", "journal_mode", "synchronous", "secure_delete")}
    finally:
        db.close()
    assert pragma["mmap_size"] > 0  # 0 (SQLite's default) reads every page with a system call
    assert pragma["journal_mode"] == "wal" and pragma["synchronous"] == 1  # NORMAL
    assert pragma["secure_delete"] == 2  # FAST: a replaced row's freed pages are not written over with zeros


def test_within_reading_commits_leave_the_log_to_an_explicit_checkpoint(tmp_path):
    """A report (``Database.reading``) does not copy the write-ahead log into the file at its commits: its analysis'
    process does, once its rows are stored (``checkpoint``), in a thread of its own. Outside ``reading`` a commit
    that leaves the log past SQLite's threshold copies it, as SQLite does by default."""
    import shutil
    import sqlite3

    from harness.record import analysis_cache

    path = tmp_path / "r.db"
    db = outbox.open_store(f"sqlite:///{path}")

    def in_the_file(name: str) -> bool:  # the database file alone, without its log: what a checkpoint copied
        alone = tmp_path / f"alone-{name}.db"
        shutil.copyfile(path, alone)
        with sqlite3.connect(alone) as conn:
            return conn.execute("SELECT count(*) FROM analysis_cache WHERE name = ?", (name,)).fetchone()[0] == 1

    big = bytes(6 << 20)  # 1,500 pages: past the threshold
    try:
        db.checkpoint()  # the schema, in the file
        with db.reading():
            analysis_cache.write_entries(db, "chip-a", "chip", {"in-a-report": analysis_cache.Entry("k", big)})
        assert not in_the_file("in-a-report")
        db.checkpoint()
        assert in_the_file("in-a-report")
        analysis_cache.write_entries(db, "chip-a", "chip", {"outside": analysis_cache.Entry("k", big)})
        assert in_the_file("outside")
    finally:
        db.close()
    postgres_like = outbox.open_store("sqlite://")  # no file: nothing to copy, no error
    try:
        postgres_like.checkpoint()
    finally:
        postgres_like.close()


def test_a_sqlite_store_upserts_without_loading_postgresqls_dialect(tmp_path):
    """The ON CONFLICT inserts (the analysis cache's rows and stamps) take their dialect's INSERT when used: a SQLite
    user's commands on a database migrated already do not import PostgreSQL's dialect (~16 ms of every start)."""
    import subprocess
    import sys

    from testkit.paths import ROOT

    outbox.open_store(f"sqlite:///{tmp_path / 'p.db'}").close()  # created and migrated: as a user's database is
    probe = (
        "import sys\n"
        "from harness.record import analysis_cache, outbox\n"
        f"db = outbox.open_store('sqlite:///{tmp_path / 'p.db'}')\n"
        "analysis_cache.write_entries(db, 'chip', 'kind', {'n': analysis_cache.Entry('k', b'x')})\n"
        "analysis_cache.stamp(db, 'chip', 'kind', 'n', 'k', 5)\n"
        "assert analysis_cache.read_entries(db, 'chip', 'kind')['n'] == analysis_cache.Entry('k', b'x', 5)\n"
        "print('sqlalchemy.dialects.postgresql' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
