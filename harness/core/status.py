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


def outcome_key(kind: str, key: str, name: str) -> str:
    """What a correctness outcome is about: a repository test is its node id (``name``), whichever pytest selection
    ran it; a kernel check or a selection's own job is its job key."""
    return f"test:{name}" if kind == "test" else key


def each_test_once(rows: Iterable[R], kind: Callable[[R], str], test: Callable[[R], Hashable],
                   status: Callable[[R], str]) -> list[R]:
    """Each repository test once (``test(row)`` its identity, e.g. its chip and node id), however many pytest
    selections (or runs) ran it: in the place of its first row, failing if it failed in any of them (that row).
    The one count of failed tests: `harness run`'s distinct line, `harness compare` and the report's index agree.
    Other rows are kept as they are."""
    kept: list[R] = []
    at: dict[Hashable, int] = {}
    for row in rows:
        if kind(row) != "test":
            kept.append(row)
        elif (ident := test(row)) not in at:
            at[ident] = len(kept)
            kept.append(row)
        elif is_run_failure(status(row)) and not is_run_failure(status(kept[at[ident]])):
            kept[at[ident]] = row
    return kept


def drop_explained_selections(rows: Iterable[R], kind: Callable[[R], str], selection: Callable[[R], Hashable]
                              ) -> list[R]:
    """A pytest selection's own row fails whenever one of its tests does: keep it only where no test row of the
    same selection (``selection(row)``) is among ``rows`` (it did not collect, crashed or timed out), so each
    outcome is counted once, by its test."""
    rows = list(rows)
    with_tests = {selection(row) for row in rows if kind(row) == "test"}
    return [row for row in rows if not (kind(row) == "pytest" and selection(row) in with_tests)]
