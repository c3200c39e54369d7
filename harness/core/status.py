"""The status vocabulary: every status a job or test can have, and what counts as failed. Every module imports it.

A job's status says what happened to it; these groups say what that means, and each decision is made here only:

- ``WRONG`` (failed, error): the code ran and was wrong (a check failed, a test failed or its fixture errored).
- ``DIED`` (crashed, timeout): the job process died or hung: the code or the machine.
- ``CODE_FAILURES`` = WRONG + DIED: the commit has no valid timing on that chip (performance is gated on it).
- ``RUN_FAILURES`` = CODE_FAILURES + lost (the node died and no other node of its chip could take the job):
  any of these makes a run fail (exit status 1).
- ``NO_ANSWER`` = DIED + lost + skipped: a job that cannot say good or bad (bisect skips such a commit).
- ``PASSES`` (passed, xfailed, xpassed): an expected failure and a non-strict xfail that passed are not failures.
- "skipped" (e.g. "Metal not available" on a CUDA machine) is never a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Literal, TypeVar

R = TypeVar("R")

Status = Literal["passed", "failed", "skipped", "crashed", "timeout", "lost", "error", "xfailed", "xpassed"]
STATUSES: tuple[str, ...] = ("passed", "failed", "skipped", "crashed", "timeout", "lost", "error", "xfailed",
                             "xpassed")
TEST_OUTCOMES: tuple[str, ...] = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
# The job kinds that say whether the code is correct: a kernel's checks, a pytest selection, and its tests.
CORRECTNESS_KINDS: tuple[str, ...] = ("correctness", "pytest", "test")

PASSES: tuple[str, ...] = ("passed", "xfailed", "xpassed")
WRONG: tuple[str, ...] = ("failed", "error")
DIED: tuple[str, ...] = ("crashed", "timeout")
CODE_FAILURES: tuple[str, ...] = WRONG + DIED
RUN_FAILURES: tuple[str, ...] = CODE_FAILURES + ("lost",)
NO_ANSWER: tuple[str, ...] = DIED + ("lost", "skipped")


def is_run_failure(status: str) -> bool:
    """Whether a job (or a test) with this status makes its run fail."""
    return status in RUN_FAILURES


def is_code_failure(status: str) -> bool:
    """Whether this status says the code under test is broken on that chip (no valid timing there)."""
    return status in CODE_FAILURES


def run_failures(counts: Mapping[str, int]) -> int:
    """How many of the counted jobs fail their run."""
    return sum(counts.get(status, 0) for status in RUN_FAILURES)


def count_label(counts: Mapping[str, int], order: tuple[str, ...] = TEST_OUTCOMES) -> str:
    """'3 passed, 1 failed, 2 skipped' in a fixed order (zero counts left out)."""
    return ", ".join(f"{counts[o]} {o}" for o in order if counts.get(o)) or "no tests"


def drop_explained_selections(rows: Iterable[R], kind: Callable[[R], str], selection: Callable[[R], Hashable]
                              ) -> list[R]:
    """A pytest selection's own row fails whenever one of its tests does: keep it only where no test row of the
    same selection (``selection(row)``) is among ``rows`` (it did not collect, crashed or timed out), so each
    outcome is counted once, by its test."""
    rows = list(rows)
    with_tests = {selection(row) for row in rows if kind(row) == "test"}
    return [row for row in rows if not (kind(row) == "pytest" and selection(row) in with_tests)]
