"""Child processes and their files: the output tail, killing a job's whole process group, a machine-wide lock."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TAIL_CHARS = 4000


def file_tail(path: Path, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" if it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-chars:].decode("utf-8", errors="replace")


def kill_group(proc: subprocess.Popen) -> int:
    """SIGKILL the process group a child was started in (start_new_session=True), children included; its code."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    return proc.wait()


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """An exclusive lock shared by every process on this machine (several jobs or Ray workers at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
