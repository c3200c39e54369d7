"""Child processes and their files: the output tail, killing a job's whole process group, a machine-wide lock."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
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


def process_identity(pid: int | None = None) -> dict[str, object]:
    """Who holds something, so that another process can later tell whether the holder is gone: this machine's
    name, the pid and (where /proc has it) the process's start time, which a recycled pid does not share."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid": pid, "start": _start_ticks(pid)}


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # no /proc (macOS) or no such process
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the parenthesised command name


def holder_is_gone(holder: dict[str, object]) -> bool:
    """True only when ``holder`` (:func:`process_identity`) was a process of this machine that no longer runs; a
    holder on another machine, or one that cannot be checked, is never declared gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    pid = int(holder["pid"])  # type: ignore[arg-type]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    start = holder.get("start")
    return start is not None and _start_ticks(pid) not in (None, start)  # the pid now names another process
