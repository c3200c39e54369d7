"""The records `harness bisect` reports: the culprit (or the range it hides in), the probes with their evidence."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from harness.analysis.records import json_safe
from harness.record.runs import StoredJob
from harness.stats import decide


class _Record:
    """``to_dict()``: every field, JSON-serialisable (nan -> None)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: json_safe(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class CommitRef(_Record):
    sha: str
    subject: str


@dataclass(frozen=True)
class SkippedCommit(_Record):
    sha: str
    subject: str
    reason: str


@dataclass(frozen=True)
class TestAtGood(_Record):
    """A test of the selection at the good commit that the bisect does not follow (failing or skipped there)."""

    __test__ = False  # not a pytest test class

    key: str
    name: str
    status: str
    reason: str

    @classmethod
    def of(cls, job: StoredJob) -> TestAtGood:
        return cls(job.key, job.name, job.status, job.first_line)


@dataclass(frozen=True)
class SetAsideRun(_Record):
    """A run of a commit left out of its evidence: slower than the commit's fastest runs beyond the noise."""

    run_id: str
    vs_kept: decide.TrialComparison  # this run against the kept runs (ratio = this run / kept)


@dataclass(frozen=True)
class ProbeLine(_Record):
    """One classified commit of one round (``step`` "probe"), or of the re-check of the culprit's bounds
    ("confirm"), with its evidence: the runs and trials behind it and, in perf mode, its comparison with each
    endpoint (ratio = probe / endpoint, interval, verdict)."""

    round: int
    step: str  # probe | confirm
    sha: str
    subject: str
    state: str  # good | bad | skip | inconclusive
    reason: str
    ratio_vs_good: float | None
    ratio_vs_bad: float | None
    vs_good: decide.TrialComparison | None
    vs_bad: decide.TrialComparison | None
    n: int  # samples in the evidence
    trials: int  # trials (processes) in the evidence
    runs: int  # runs of the commit read, set-aside ones included
    run_ids: tuple[str, ...]  # the runs whose trials are the evidence
    set_aside: tuple[SetAsideRun, ...]
    confirmed: bool
    nearer: str  # inconclusive: the endpoint its level is nearer (a hint only)


@dataclass(frozen=True)
class BisectReport(_Record):
    """What `harness bisect` prints: the culprit (or the range it hides in) with its evidence and the cost."""

    mode: str
    chip: str
    target: str  # the series (perf) or job selection (correctness), in words
    repo: str
    good: CommitRef
    bad: CommitRef
    commits: int  # candidates after good, bad included
    status: str  # found | hidden | stopped | inconclusive | no-regression
    message: str
    culprit: CommitRef | None
    last_good: CommitRef | None
    candidates: tuple[CommitRef, ...]  # the range the culprit is in (found: the culprit)
    skipped: tuple[SkippedCommit, ...]
    evidence: decide.TrialComparison | None  # perf: culprit vs last good (ratio = culprit / last good)
    endpoints: decide.TrialComparison | None  # perf: bad vs good
    detail: str  # correctness: what failed at the culprit
    rounds: int  # k-ary rounds (confirmation steps not included)
    round_bound: int  # ceil(log_{P+1} N): the most rounds needed without skips
    probes: int
    probes_per_round: int
    runs: int  # runs used, endpoints and repeats included
    reused_runs: int  # of which were already stored
    new_runs: tuple[str, ...]  # run ids made by this bisect
    history: tuple[ProbeLine, ...]
    notes: tuple[str, ...] = ()
    confirmations: int = 0  # perf: re-checks of the culprit's bounds
    inconclusive: tuple[CommitRef, ...] = ()  # status inconclusive: the probes inside the range left undecided
    # perf: the endpoints' runs kept as evidence (and those set aside), and the between-run floor (log sd, df)
    endpoint_runs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    endpoint_set_aside: tuple[SetAsideRun, ...] = ()
    floor: dict[str, float] | None = None
    # correctness of a pytest selection: the tests passing at good that the bisect follows (how many), the tests
    # failing there (pre-existing failures: ignored) and those skipped there (ignored)
    followed_tests: int = 0
    pre_existing_failures: tuple[TestAtGood, ...] = ()
    ignored_at_good: tuple[TestAtGood, ...] = ()

    @property
    def exit_code(self) -> int:
        """0 when one culprit is named, 1 otherwise (hidden by skips, stopped, inconclusive, or no regression)."""
        return 0 if self.status == "found" else 1

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "exit_code": self.exit_code}
