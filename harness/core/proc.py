"""Child processes and their files: the output tail, killing a job's whole process group, a machine-wide lock.

Nothing a harness command starts outlives it (docs/bisect.md, "Stopping"):

- every job process starts in a session (so a process group) of its own, registered here while it runs
  (:func:`start_group`); its children (pytest, xdist workers, the install's pip) stay in its group;
- a job that overruns, and every registered group when the command stops (Ctrl-C, SIGTERM), is killed as a group
  (``os.killpg``: :func:`kill_group`, :func:`kill_started`; also at interpreter exit);
- a job process whose parent dies without a word (SIGKILL, a Ray worker cancelled by force) kills its own group
  (:func:`die_with_parent`), as it can no longer be reached by anyone.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TAIL_CHARS = 4000
PARENT_POLL_S = 0.5  # how often a job process checks that the harness that started it still runs

_started: dict[int, subprocess.Popen] = {}  # pid (= its group's id) -> a group this process started, still running
_started_lock = threading.Lock()


def file_tail(path: Path, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" if it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-chars:].decode("utf-8", errors="replace")


def start_group(args: Any, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen`` in a new session (its own process group), registered until :func:`done_with` (or a
    kill) so that a stop reaches it and everything it started (:func:`kill_started`)."""
    proc = subprocess.Popen(args, start_new_session=True, **popen)
    with _started_lock:
        if not _started:
            atexit.register(kill_started)  # a command that ends any other way (an exception) kills them too
        _started[proc.pid] = proc
    return proc


def done_with(proc: subprocess.Popen) -> None:
    """Forget a group (its process ended): its id may be reused by an unrelated group from now on."""
    with _started_lock:
        _started.pop(proc.pid, None)


@contextmanager
def group(args: Any, **popen: Any) -> Iterator[subprocess.Popen]:
    """:func:`start_group` for a block: however the block is left (an exception, a KeyboardInterrupt from Ctrl-C or
    SIGTERM while it waits), a group still running is killed."""
    proc = start_group(args, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_group(proc)
        done_with(proc)


def kill_group(proc: subprocess.Popen) -> int:
    """SIGKILL the process group a child was started in (start_new_session=True), children included, and its
    descendants that left the group (a test's daemon in a session of its own); its exit code."""
    kill_tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    code = proc.wait()
    done_with(proc)
    return code


def kill_started() -> int:
    """SIGKILL every process group this process started and that still runs (a stop: Ctrl-C, SIGTERM, the end of a
    command); how many. Threads waiting on those processes then see them end."""
    with _started_lock:
        running = list(_started.values())
    killed = 0
    for proc in running:
        if proc.poll() is None:
            kill_group(proc)
            killed += 1
        done_with(proc)
    return killed


def die_with_parent(poll_s: float = PARENT_POLL_S) -> None:
    """In a job process that leads its own group: when the process that started it is gone (its parent changes:
    killed with SIGKILL, or cancelled by force as a Ray worker), SIGKILL the whole group, this process and what it
    started, instead of running on as an orphan. A daemon thread; a no-op where this process does not lead its
    group (then its parent's group is not its to kill)."""
    if os.getpgrp() != os.getpid():
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(poll_s)
        kill_tree(os.getpid(), spare=os.getpid())  # descendants that left the group too
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def kill_tree(pid: int, spare: int | None = None) -> None:
    """SIGKILL a process and its descendants (listed by ``ps``, on Linux and macOS alike; ``spare``: not that one),
    whatever their group: for a child that shares this process's group (pytest in a job process: a group kill
    would kill the job process too), or descendants that started a session of their own."""
    done = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True, check=False)
    children: dict[int, list[int]] = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    for member in tree:
        if member == spare:
            continue
        try:
            os.kill(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


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
