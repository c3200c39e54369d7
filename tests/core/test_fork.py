"""``harness.core.fork.ForkedWork``: what the child sends comes back in order, a failure says why, and a value
larger than a pipe holds does not hold the child until the parent reads it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.core import fork

pytestmark = pytest.mark.skipif(not fork.can_fork(), reason="no fork here")

BIG = b"x" * (4 << 20)  # far beyond a pipe's 64 KiB


def _wait_for(path: Path, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def test_the_child_goes_on_after_sending_a_large_value_before_the_parent_reads_it(tmp_path):
    flag = tmp_path / "went-on"

    def work(send):  # noqa: ANN001, ANN202 - ForkedWork's callable
        send(BIG)
        flag.write_text("after the first value")  # reached only if send did not wait for the parent
        send("second")

    child = fork.ForkedWork(work)
    try:
        assert _wait_for(flag), "the child waited for the parent to read its first value"
        assert child.receive() == (True, BIG)
        assert child.receive() == (True, "second")
        assert child.receive() == (False, "exit status 0, no result")  # everything sent came, and it ended
    finally:
        child.abandon()


def test_a_child_that_fails_says_why_after_what_it_sent():
    def work(send):  # noqa: ANN001, ANN202 - ForkedWork's callable
        send(1)
        raise RuntimeError("broken")

    child = fork.ForkedWork(work)
    assert child.receive() == (True, 1)
    assert child.receive() == (False, "RuntimeError: broken")
    assert child.pid is None  # reaped


def test_abandoning_a_child_with_values_still_unread_ends_it():
    def work(send):  # noqa: ANN001, ANN202 - ForkedWork's callable
        for _ in range(3):
            send(BIG)

    child = fork.ForkedWork(work)
    began = time.monotonic()
    child.abandon()
    assert child.pid is None and time.monotonic() - began < 30
