"""What one run says about a commit, for `harness bisect`: pure classification of a run's job rows
(:class:`harness.record.runs.StoredJob`). The request (:class:`BisectRequest`), the benchmark series a perf bisect
follows (:class:`Series`) and which jobs it names are :mod:`harness.bisect.selection`'s; here are the rules that
turn one run's rows into an answer: the install job failed -> skip ("does not install"); perf mode: a correctness
job of the kernel (or of a ``--gate`` selection) failed, crashed or timed out -> skip ("fails correctness"), the
benchmark job itself failed, crashed or timed out or is missing -> skip, else its job id (whose samples, per trial,
are the measurement); correctness mode: a matching job failed -> bad, crashed / timed out / lost / skipped /
missing -> skip, passed -> good.

A pytest selection is judged test by test against the good commit (:func:`follow` -> :class:`Baseline`): the tests
that pass there are *followed*; those skipped there or already failing there (pre-existing failures, listed) are
ignored, and so are tests that appear later. A commit is bad when a followed test fails or errors (or its file or
folder fails to collect, or the selection stopped before running any test), a skip when a followed test is skipped
or missing, good when every followed test passes. The selection's own ``pytest`` row decides nothing while per-test
rows exist. ``--check`` narrows this to one test. Kernel correctness jobs keep the plain rule above.

No database, no git, no subprocess: the rows come in as plain records (:mod:`harness.bisect.run` reads them through
:mod:`harness.record.runs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.bisect import search as bisect
from harness.bisect.selection import (  # the request and which jobs it names (light: the CLI checks it first)
    BisectRequest,
    Series,
    benchmark_matches,
    correctness_matches,
    describe_selection,
    is_named,
    is_selection,
    normalize_shape,
)
from harness.core.errors import HarnessError
from harness.core.status import CORRECTNESS_KINDS, NO_ANSWER, PASSES, WRONG, count_label, is_code_failure
from harness.record.runs import StoredJob

__all__ = ["Baseline", "BisectRequest", "Series", "answers", "correctness_outcome", "describe_selection",
           "find_series", "follow", "normalize_shape", "perf_outcome"]



def find_series(jobs: Sequence[StoredJob], request: BisectRequest) -> Series:
    """The one benchmark series the request names, among the given jobs; a clear error if none or several."""
    shape = normalize_shape(request.shape)
    found = sorted({Series(j.kernel, j.variant, j.dtype, j.shape_key) for j in jobs
                    if benchmark_matches(j, request, shape)}, key=str)
    if len(found) == 1:
        return found[0]
    if not found:
        known = sorted({f"{j.kernel}" for j in jobs if j.kind == "benchmark"})
        raise HarnessError(f"no benchmark of {request.kernel!r} matching the options at the endpoints "
                           f"(benchmarks there: {', '.join(known) or 'none'})")
    listed = "; ".join(str(s) for s in found[:6]) + (f"; ... ({len(found)} in all)" if len(found) > 6 else "")
    raise HarnessError(f"{len(found)} series of {request.kernel!r} match: {listed}; pick one with --variant, "
                       "--dtype or --shape")


def answers(request: BisectRequest) -> Callable[[Sequence[StoredJob]], bool]:
    """Whether a stored run can be reused for this request: it failed to install, or it ran the job in question."""
    shape = normalize_shape(request.shape)
    wanted = benchmark_matches if request.mode == "perf" else correctness_matches

    def usable(jobs: Sequence[StoredJob]) -> bool:
        return _install_failure(jobs) is not None or any(wanted(job, request, shape) for job in jobs) or \
            (request.mode == "correctness" and bool(request.check) and any(is_selection(job, request) for job in jobs))

    return usable


def _install_failure(jobs: Sequence[StoredJob]) -> str | None:
    for job in jobs:
        if job.kind == "install" and job.status != "passed":
            return f"does not install: {job.first_line}"
    return None


def perf_outcome(jobs: Sequence[StoredJob], series: Series, gates: Sequence[str] = ()) -> tuple[int | None, str]:
    """(the series' benchmark job id, "") or (None, why the commit is skipped), from one run's job rows."""
    failed = _install_failure(jobs)
    if failed:
        return None, failed
    for job in jobs:
        gated = (job.kind == "correctness" and job.kernel == series.kernel) or \
                (job.kind in CORRECTNESS_KINDS and any(is_named(job, gate) for gate in gates))
        if gated and is_code_failure(job.status):
            return None, f"fails correctness: {job.key} {job.status}: {job.first_line}"
    for job in jobs:
        if job.kind == "benchmark" and Series(job.kernel, job.variant, job.dtype, job.shape_key) == series:
            if job.status != "passed":
                return None, f"benchmark {job.status}: {job.first_line}"
            return job.job_id, ""
    return None, f"no benchmark {series} in this run"


@dataclass(frozen=True)
class Baseline:
    """What the good commit says about the tests of the selection(s) a correctness request names (:func:`follow`).

    ``followed``: the test rows that pass there (their keys are followed at every other commit); ``pre_existing``:
    those failing or erroring there; ``ignored``: the rest (skipped there). Empty when no test row matches (a
    kernel correctness job, or a selection that ran no test): then the plain rule of :func:`correctness_outcome`
    applies.
    """

    followed: tuple[StoredJob, ...] = ()
    pre_existing: tuple[StoredJob, ...] = ()
    ignored: tuple[StoredJob, ...] = ()

    @property
    def selections(self) -> frozenset[str]:
        """The selections whose tests are followed (a test row's kernel is its selection's name)."""
        return frozenset(job.kernel for job in self.followed)


def _test_line(job: StoredJob) -> str:
    return f"{job.key} {job.status}" + (f": {job.first_line}" if job.first_line else "")


def follow(jobs: Sequence[StoredJob], request: BisectRequest, where: str = "the good commit") -> Baseline:
    """The tests to follow, from the good commit's job rows; ``where`` names that commit in errors (one line each).

    Errors: ``--check`` names no test of the selection there, or several; the one test it names is skipped or
    already failing there; no test of the selection passes there.
    """
    if request.mode != "correctness" or _install_failure(jobs):
        return Baseline()  # the install failure is correctness_outcome's to report
    shape = normalize_shape(request.shape)
    tests = [job for job in jobs if job.kind == "test" and correctness_matches(job, request, shape)]
    if request.check:
        if not tests:
            known = sorted(job.name for job in jobs if job.kind == "test" and is_named(job, request.kernel))
            if not known and not any(is_selection(job, request) for job in jobs):
                return Baseline()  # not a pytest selection here (a kernel's check, or nothing): the plain rule
            listed = ", ".join(known[:8]) + (f", ... ({len(known)} in all)" if len(known) > 8 else "")
            raise HarnessError(f"--check {request.check!r}: no test of {request.kernel} at {where} matches "
                               f"(its tests: {listed or 'none'}); give a node id or ::test_name")
        if len(tests) > 1:
            listed = ", ".join(job.name for job in tests[:8]) + (", ..." if len(tests) > 8 else "")
            raise HarnessError(f"--check {request.check!r} matches {len(tests)} tests of {request.kernel} at {where}: "
                               f"{listed}; give its node id")
        (test,) = tests
        if test.status in WRONG:
            raise HarnessError(f"{where} already fails: {_test_line(test)}")
        if test.status not in PASSES:
            raise HarnessError(f"{where} cannot be tested: {_test_line(test)}")
    followed = tuple(job for job in tests if job.status in PASSES)
    pre_existing = tuple(job for job in tests if job.status in WRONG)
    ignored = tuple(job for job in tests if job.status not in PASSES and job.status not in WRONG)
    if tests and not followed:
        counts: dict[str, int] = {}
        for job in tests:
            counts[job.status] = counts.get(job.status, 0) + 1
        raise HarnessError(f"{where} has no passing test of {describe_selection(request)} to follow "
                           f"({count_label(counts)})")
    return Baseline(followed, pre_existing, ignored)


def _followed_outcome(jobs: Sequence[StoredJob], others: Sequence[StoredJob],
                      baseline: Baseline) -> bisect.Classification:
    """The rule for followed tests (module docstring), plus the plain rule for the other matching jobs."""
    tests = {job.key: job for job in jobs if job.kind == "test"}
    selections = {job.kernel: job for job in jobs if job.kind == "pytest"}
    bad: list[str] = []
    skip: list[str] = []
    for wanted in baseline.followed:
        now = tests.get(wanted.key)
        if now is not None:
            if now.status in WRONG:
                bad.append(_test_line(now))
            elif now.status not in PASSES:
                skip.append(_test_line(now))
            continue
        # Missing: did its file or folder fail to collect, or did the selection stop before running any test?
        broken = [job for job in tests.values() if job.kernel == wanted.kernel and job.status in WRONG
                  and wanted.name.startswith((job.name + "::", job.name + "/"))]
        selection = selections.get(wanted.kernel)
        ran_none = not any(job.kernel == wanted.kernel for job in tests.values())
        if broken:
            bad.append(_test_line(broken[0]))
        elif selection is not None and selection.status in WRONG and ran_none:
            bad.append(_test_line(selection))
        else:
            why = f" ({_test_line(selection)})" if selection is not None and selection.status not in PASSES else ""
            skip.append(f"{wanted.key} not in this run{why}")
    bad += [_test_line(job) for job in others if job.status in WRONG]
    skip += [_test_line(job) for job in others if job.status in NO_ANSWER]
    if bad:
        return bisect.Classification("bad", _first(bad), runs=1)
    if skip:
        return bisect.Classification("skip", _first(skip), runs=1)
    extra = f" and {len(others)} other job(s)" if others else ""
    return bisect.Classification("good", f"{len(baseline.followed)} followed test(s) passed{extra}", runs=1)


def _first(reasons: list[str]) -> str:
    unique = list(dict.fromkeys(reasons))
    return unique[0] + (f" (+{len(unique) - 1} more)" if len(unique) > 1 else "")


def correctness_outcome(jobs: Sequence[StoredJob], request: BisectRequest,
                        baseline: Baseline | None = None) -> bisect.Classification:
    """good / bad / skip from one run's job rows, for the correctness job(s) the request names; with a
    ``baseline`` that follows tests, the tests that passed at the good commit decide (module docstring)."""
    failed = _install_failure(jobs)
    if failed:
        return bisect.Classification("skip", failed, runs=1)
    shape = normalize_shape(request.shape)
    if baseline is not None and baseline.followed:
        followed = baseline.selections
        others = [job for job in jobs if correctness_matches(job, request, shape) and job.kind != "test"
                  and not (job.kind == "pytest" and job.kernel in followed)]
        return _followed_outcome(jobs, others, baseline)
    order = {"test": 0, "correctness": 1, "pytest": 2}  # the most specific failure first
    matched = sorted((job for job in jobs if correctness_matches(job, request, shape)), key=lambda job: order[job.kind])
    if not matched:
        return bisect.Classification("skip", f"no correctness job matching {describe_selection(request)} in this run",
                                     runs=1)
    for job in matched:
        if job.status in WRONG:
            return bisect.Classification("bad", f"{job.key} {job.status}: {job.first_line}", runs=1)
    for job in matched:
        if job.status in NO_ANSWER:
            return bisect.Classification("skip", f"{job.key} {job.status}: {job.first_line}", runs=1)
    return bisect.Classification("good", f"{len(matched)} job(s) passed", runs=1)


