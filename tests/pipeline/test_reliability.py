"""Faults on real processes and real databases: nothing lost, nothing stored twice.

- The database refusing connections mid-run (PostgreSQL: ALLOW_CONNECTIONS false + pg_terminate_backend on a
  scratch database; SQLite: another process holding the write lock): results are spooled to disk, the run exits 3
  saying so, and the next harness command writes each spooled result exactly once.
- The database coming back while the run is still retrying at its end: exit 0, every result once.
- The driver process SIGKILLed mid-run: `harness run --resume RUN_ID` runs only the missing jobs and leaves the
  stored rows (ids, created_at) untouched.
- A job that segfaults and one that hangs past its timeout, through the real CLI: crash / timeout with the tail
  of their output, and the rest of the run finishes.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from testkit.faults import harness, query, start, wait_for, write_suite
from testkit.pg import pg_admin


def job_rows(url: str) -> int:
    try:
        return query(url, "select count(*) from job")[0][0]
    except Exception:  # noqa: BLE001 - not migrated yet
        return 0


def assert_each_job_once(url: str, planned: int) -> None:
    keys = query(url, "select key, count(*) from job group by key")
    assert len(keys) == planned and all(count == 1 for _, count in keys), keys
    assert query(url, "select status, planned_jobs from run") == [("complete", planned)]


def spool_files(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "cache" / "spool").rglob("*.json")] if (tmp_path / "cache").exists() else []


PLANNED = 8  # 2 ok, then the gate, then 5 ok that finish while the database refuses
SECTIONS = (("before", "ok", 2, 60), ("gate", "gate", 1, 180), ("after", "ok", 5, 60))


def set_allow(name: str, allow: bool) -> None:
    engine = pg_admin()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allow else "false"}'))
            if not allow:
                conn.execute(text("select pg_terminate_backend(pid) from pg_stat_activity "
                                  "where datname = :name and pid <> pg_backend_pid()"), {"name": name})
    finally:
        engine.dispose()


def test_postgres_refusing_mid_run_spools_and_the_next_command_writes_each_result_once(tmp_path: Path, pg_url: str):
    name = make_url(pg_url).database
    suite = write_suite(tmp_path, *SECTIONS)
    proc = start(tmp_path, "run", "--suite", str(suite), "--db", pg_url, "--no-report", HARNESS_SPOOL_WAIT_S="2")
    try:
        wait_for(lambda: job_rows(pg_url) >= 2, what="the first results")
        set_allow(name, False)
        (tmp_path / "gate").touch()
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
        set_allow(name, True)
    assert proc.returncode == 3, stderr
    lines = [line for line in stderr.splitlines() if "results spooled to" in line]
    assert len(lines) == 1 and "the database was unreachable" in lines[0], stderr
    spooled = int(lines[0].split()[0])
    assert 1 <= spooled <= PLANNED - 2
    assert len(spool_files(tmp_path)) >= spooled  # results (+ the run's finish marker and label)

    status = harness(tmp_path, "spool", "status")
    assert status.returncode == 0 and f"{spooled} results" in status.stderr, status.stderr
    # any command that opens the database drains its spool first; `spool flush` is the explicit one
    flushed = harness(tmp_path, "spool", "flush", "--db", pg_url)
    assert flushed.returncode == 0, flushed.stderr
    assert_each_job_once(pg_url, PLANNED)
    assert harness(tmp_path, "spool", "status").stderr.startswith("spool empty")
    again = harness(tmp_path, "spool", "flush", "--db", pg_url)  # nothing doubled by a second drain
    assert again.returncode == 0
    assert_each_job_once(pg_url, PLANNED)


def test_postgres_back_while_the_run_retries_writes_everything_before_exit(tmp_path: Path, pg_url: str):
    name = make_url(pg_url).database
    suite = write_suite(tmp_path, *SECTIONS)
    proc = start(tmp_path, "run", "--suite", str(suite), "--db", pg_url, "--no-report", HARNESS_SPOOL_WAIT_S="60")
    try:
        wait_for(lambda: job_rows(pg_url) >= 2, what="the first results")
        set_allow(name, False)
        (tmp_path / "gate").touch()
        timer = threading.Timer(4.0, set_allow, (name, True))
        timer.start()
        _, stderr = proc.communicate(timeout=240)
        timer.join()
    finally:
        proc.kill()
        set_allow(name, True)
    assert proc.returncode == 0, stderr
    assert "spooled" not in stderr
    assert_each_job_once(pg_url, PLANNED)
    assert not [p for p in spool_files(tmp_path) if p.name != "db.txt"]


def test_sqlite_locked_mid_run_spools_and_the_next_command_writes_each_result_once(tmp_path: Path):
    db = tmp_path / "results.db"
    url = f"sqlite:///{db}"
    suite = write_suite(tmp_path, *SECTIONS)
    proc = start(tmp_path, "run", "--suite", str(suite), "--db", url, "--no-report", HARNESS_SPOOL_WAIT_S="1",
                 HARNESS_SQLITE_BUSY_MS="200")
    lock = None
    try:
        wait_for(lambda: db.exists() and job_rows(url) >= 2, what="the first results")
        lock = sqlite3.connect(db, isolation_level=None, timeout=30)
        lock.execute("BEGIN EXCLUSIVE")  # another process holds the write lock: every write of the run fails
        (tmp_path / "gate").touch()
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
        if lock is not None:
            lock.rollback()
            lock.close()
    assert proc.returncode == 3, stderr
    assert "results spooled to" in stderr
    # the next command that opens this database (here a report) writes the spool first
    report = harness(tmp_path, "report", "--db", url, "--out", str(tmp_path / "site"))
    assert report.returncode == 0, report.stderr
    assert_each_job_once(url, PLANNED)
    assert harness(tmp_path, "spool", "status").stderr.startswith("spool empty")


def test_a_killed_driver_is_resumed_without_rerunning_or_restoring_finished_jobs(tmp_path: Path):
    db = tmp_path / "results.db"
    url = f"sqlite:///{db}"
    suite = write_suite(tmp_path, ("quick", "ok", 2, 60), ("slow", "slow", 6, 60))
    proc = start(tmp_path, "run", "--suite", str(suite), "--db", url, "--no-report", HARNESS_TEST_SLOW_S="1.0")
    try:
        wait_for(lambda: db.exists() and job_rows(url) >= 3, what="three stored results")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    before = query(url, "select id, key, created_at, status from job order by id")
    assert 3 <= len(before) < 8
    [(run_id, status)] = query(url, "select id, status from run")
    assert status == "running"  # the killed driver never finished it
    # the next harness command on this machine sees that its driver is gone and finishes it as abandoned
    report = harness(tmp_path, "report", "--db", url, "--out", str(tmp_path / "site"), "--no-change-points")
    assert report.returncode == 0, report.stderr
    [(status, finished_at)] = query(url, "select status, finished_at from run")
    assert status == "abandoned" and finished_at is not None
    assert "abandoned" in (tmp_path / "site" / "index.html").read_text()

    resumed = harness(tmp_path, "run", "--resume", run_id, "--db", url, "--no-report", HARNESS_TEST_SLOW_S="0")
    assert resumed.returncode == 0, resumed.stderr
    assert "8 passed" in resumed.stdout and "(of 8)" in resumed.stdout, resumed.stdout
    after = query(url, "select id, key, created_at, status from job order by id")
    assert after[:len(before)] == before  # finished jobs neither re-run nor re-stored
    assert_each_job_once(url, 8)
    assert query(url, "select count(*) from run") == [(1,)]
    assert query(url, "select status from run") == [("complete",)]  # resumed, then finished


def test_resume_of_an_unknown_run_is_one_line(tmp_path: Path):
    done = harness(tmp_path, "run", "--resume", "nosuchrun", "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert done.returncode == 2 and "no run 'nosuchrun'" in done.stderr and "Traceback" not in done.stderr


def test_a_segfault_and_a_hang_are_recorded_with_their_output_and_the_run_finishes(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    suite = write_suite(tmp_path, ("segv", "segv", 1, 60), ("hang", "hang", 1, 3), ("after", "ok", 2, 60))
    done = harness(tmp_path, "run", "--suite", str(suite), "--db", url, "--no-report")
    assert done.returncode == 1, done.stderr
    assert "2 passed" in done.stdout and "1 crashed" in done.stdout and "1 timed out" in done.stdout
    rows = dict((variant, (status, detail, tail)) for variant, status, detail, tail in
                query(url, "select variant, status, detail, output_tail from job where variant in ('segv','hang')"))
    assert rows["segv"][0] == "crashed" and "fault job segv" in rows["segv"][2], rows["segv"]
    assert "SIGSEGV" in rows["segv"][1] or "signal" in rows["segv"][1]
    assert rows["hang"][0] == "timeout" and "fault job hang" in rows["hang"][2], rows["hang"]
    assert_each_job_once(url, 4)
