"""What `cluster up` parses out of Ray's output: this session's log only, without Ray's terminal styling.

A stand-in `ray` script (named ``ray``, called with ``start --block --port P`` so that harness recognises it as its
own and may stop it) prints what `ray start` prints: a bold session folder and "Ray runtime started".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness.cluster import nodes as cl
from harness.core.errors import HarnessError
from testkit.ray import free_port

SESSION = "/tmp/ray/session_2025-01-02_03-04-05_123456_789"
FAKE_RAY = f'''#!{sys.executable}
import sys, time
print("Local node IP: 127.0.0.1", flush=True)
print("\\x1b[1m{SESSION}/logs/\\x1b[22m holds the logs", flush=True)
if "--never-ready" not in sys.argv:
    print("\\x1b[32m--------------------\\x1b[39m\\n\\x1b[32mRay runtime started.\\x1b[39m", flush=True)
time.sleep(60)
'''


@pytest.fixture
def fake_ray(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "ray"
    path.parent.mkdir()
    path.write_text(FAKE_RAY)
    path.chmod(0o755)
    return path


def _launch(fake_ray: Path, log: Path, *extra: str, timeout_s: float = 20) -> cl.Launched:
    port = str(free_port())
    return cl.launch("head", [str(fake_ray), "start", "--block", "--port", port, *extra], dict(os.environ), log,
                     ready=lambda: True, address=f"127.0.0.1:{port}", timeout_s=timeout_s)


def test_the_session_folder_is_recorded_without_ansi_escapes(fake_ray: Path, tmp_path: Path):
    launched = _launch(fake_ray, tmp_path / "head-1.log")
    try:
        assert launched.session_dir == SESSION  # not "\x1b[1m/tmp/ray/session_..."
        assert "\x1b" not in launched.session_dir
        assert "\x1b[1m" in (tmp_path / "head-1.log").read_text()  # the log itself keeps what Ray wrote
    finally:
        assert cl.stop(launched, timeout_s=10) in ("stopped", "killed")


def test_a_second_start_never_reads_the_previous_sessions_log(fake_ray: Path, tmp_path: Path):
    log = tmp_path / "head-1.log"
    log.write_text("\x1b[1m/tmp/ray/session_1999-01-01_00-00-00_1_1/logs/\x1b[22m\nRay runtime started.\n")
    with pytest.raises(HarnessError, match="did not start within 3 s"):  # the old "started" does not count
        _launch(fake_ray, log, "--never-ready", timeout_s=3)
    assert "session_1999" not in log.read_text() and SESSION in log.read_text()  # a fresh log for each session
    assert "session_1999" in log.with_suffix(".previous.log").read_text()  # the previous one kept aside

    launched = _launch(fake_ray, log)
    try:
        assert launched.session_dir == SESSION
        assert log.read_text().count("Ray runtime started") == 1
    finally:
        cl.stop(launched, timeout_s=10)


def test_launch_stops_the_process_it_started_when_it_never_gets_ready(fake_ray: Path, tmp_path: Path):
    """(What the timeout above relies on: the stand-in is recognised as ours, so nothing is left running.)"""
    before = {p for p in os.listdir("/proc") if p.isdigit()} if Path("/proc").is_dir() else set()
    with pytest.raises(HarnessError):
        _launch(fake_ray, tmp_path / "x.log", "--never-ready", timeout_s=2)
    for pid in ({p for p in os.listdir("/proc") if p.isdigit()} - before) if before else ():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert str(fake_ray).encode() not in cmdline
