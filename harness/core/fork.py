"""Work in a forked process: ``ForkedWork`` runs a function there and hands back what it sends, in order;
``can_fork`` says where that is safe. The report's analysis (``harness.pipeline.report``), its history pages
(``harness.render.pages``) and the chips of a full analysis (``harness.analysis.cache``) use it to share the
cores."""

from __future__ import annotations

import gc
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from harness.core.errors import first_line


def can_fork() -> bool:
    """Whether work is handed to a forked process (``ForkedWork``): where ``os.fork`` is safe -- not on macOS, whose
    frameworks (Metal, once MLX is loaded) do not survive a fork, and not while another thread runs here (e.g. a Ray
    client's, after ``harness run``): the child would inherit the locks it holds -- and a second core can take it."""
    return (hasattr(os, "fork") and sys.platform != "darwin" and (os.cpu_count() or 1) > 1
            and threading.active_count() == 1)


class ForkedWork:
    """``work(send)`` run in a forked process, each value it ``send``s coming back, in order, to ``receive``.

    The collector is frozen while the child lives (``gc.freeze``: neither process copies memory pages to scan
    what existed at the fork) and the child leaves by ``os._exit``, running none of the parent's exit handlers; it
    must not use the parent's open connections (``Store.forked``). A child that raises sends why."""

    def __init__(self, work: Callable[[Callable[[Any], None]], None]) -> None:
        read, write = os.pipe()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            try:
                gc.disable()
                os.close(read)
                with os.fdopen(write, "wb") as pipe:
                    writer = _Writer(pipe)
                    try:
                        work(writer.send)
                    except Exception as exc:  # told to the parent, which does the work itself
                        writer.send(f"{type(exc).__name__}: {first_line(exc)}", "failed")
                    finally:
                        writer.close()
            finally:
                os._exit(0)
        os.close(write)
        self.pid: int | None = pid
        self._pipe: Any = os.fdopen(read, "rb")

    def receive(self) -> tuple[bool, Any]:
        """The next value sent: (True, value), or (False, why) when the child failed or ended before sending it
        (then it is reaped: nothing more comes)."""
        if self._pipe is None:
            return False, "no more results"
        head = self._pipe.read(8)
        payload = self._pipe.read(int.from_bytes(head, "little")) if len(head) == 8 else b""
        try:
            outcome, value = pickle.loads(payload) if payload else ("failed", None)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
            outcome, value = "failed", None
        if outcome == "ok":
            return True, value
        status = self.close()
        return False, value or f"exit status {status}, no result"

    def close(self) -> int | None:
        """Wait for the child to end (it has sent everything, or failed); its exit status."""
        status = None
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if self.pid is not None:
            _, raw = os.waitpid(self.pid, 0)
            status = os.waitstatus_to_exitcode(raw)
            self.pid = None
            gc.unfreeze()
        return status

    def abandon(self) -> None:
        """Stop the child (the parent failed before taking everything)."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.close()


class _Writer:
    """The child's end of the pipe: ``send`` pickles a value and goes on while a thread of its own writes it (a pipe
    holds 64 KiB: a larger value written here would hold the child until the parent reads it, and the parent reads
    when it needs the value -- the report's analysis sends its results, then writes the history pages meanwhile).
    ``close`` waits until everything sent is written (or the parent is gone)."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def send(self, value: Any, outcome: str = "ok") -> None:
        payload = pickle.dumps((outcome, value), protocol=pickle.HIGHEST_PROTOCOL)
        if self._thread is None:  # started on the first value: the child's work may fork before it sends
            self._thread = threading.Thread(target=self._drain, name="forked-work-writer", daemon=True)
            self._thread.start()
        self._queue.put(len(payload).to_bytes(8, "little") + payload)

    def _drain(self) -> None:
        while (chunk := self._queue.get()) is not None:
            try:
                self._pipe.write(chunk)
                self._pipe.flush()
            except OSError:  # the parent stopped reading (it abandoned the work): nothing more to write
                return

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
