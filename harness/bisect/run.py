"""The I/O side of `harness bisect`: list the commits, run probe commits like any run, read their stored results.

The search and the statistics are pure (:mod:`harness.bisect.search`), and so is what one run says about a
commit (:mod:`harness.bisect.probes`); this module feeds them:

- **Commits**: the commits after GOOD up to BAD on the ancestry path (:func:`harness.spec.git.ancestry_path`) in
  the repository (a local path) or in the harness's clone cache (a URL, fetched like ``harness run --repo URL``).
- **A probe is a run.** Probing a commit is ``execute_run(LocalRunRequest(repo=..., commit=sha, ...))``
  (locally) or the cluster driver's ``run_on_cluster`` restricted to the chip (``--executor ray``): the whole
  suite of that commit runs and every result is stored, so the history pages show the probes like any run.
  With Ray the probes of a round run at once (one driver thread per commit; the chip's nodes share the jobs).
- **Reuse.** The first time a commit is needed, its clean runs already stored for the chip are used instead of
  running it (all of them; read through :mod:`harness.record.runs`); a repeated bisect therefore runs nothing.
  Perf mode reads each run's samples per trial (:func:`harness.record.runs.job_trials`) and pools a commit's
  runs only while they agree within the run-to-run noise: a run slower than the commit's fastest runs beyond it
  (a stale run from a loaded machine, a loaded re-run) is set aside, listed in the report, and the commit then
  needs two agreeing runs (:class:`harness.bisect.search.PerfProber`). A perf probe that stays undecided is run
  again (a new run each time), up to ``max_runs`` new runs; still undecided, it is inconclusive and the bisect
  stops with the range instead of guessing. The culprit and the commit before it are re-checked (run again as
  needed) before the culprit is named.
- **What a run says**: :func:`harness.bisect.probes.perf_outcome` / ``correctness_outcome`` on its job rows; a
  run that could not be made at all (no suite at that commit, checkout failed...) -> skip. In correctness mode
  the good endpoint's rows first say which tests of a pytest selection to follow (:func:`harness.bisect.probes.
  follow`: those passing there; the ones failing there are reported as pre-existing failures).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.analysis.records import json_safe
from harness.bisect import search as bisect
from harness.bisect.probes import (
    Baseline,
    Series,
    answers,
    correctness_outcome,
    find_series,
    follow,
    perf_outcome,
)
from harness.bisect.selection import (
    BisectRequest,
    check_against_suite,
    check_request,
    counted,
    describe_selection,
    planned_row,
    probe_jobs,
)
from harness.cluster.driver import connect, run_on_cluster
from harness.core import chip as chip_id
from harness.core.errors import HarnessError
from harness.core.job import Job
from harness.pipeline.run import ClusterRunRequest, LocalRunRequest, execute_run, sigterm_stops_runs
from harness.record.outbox import open_store
from harness.record.runs import StoredJob, clean_runs, job_rows, job_trials
from harness.record.store import Store
from harness.spec import git
from harness.stats import decide

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# Commits
# ---------------------------------------------------------------------------------------------------------------


def commit_range(repo: str, good: str, bad: str) -> tuple[CommitRef, CommitRef, list[CommitRef]]:
    """(good, bad, the commits after good up to bad on the ancestry path, oldest first, bad last)."""
    if git.is_local_path(repo):
        path = Path(repo).expanduser()
        if not path.exists() or not git.is_repo(path):
            raise HarnessError(f"--repo {repo} is not a git repository")
        where = git.toplevel(path)
        good_sha, bad_sha = git.resolve(where, good).sha, git.resolve(where, bad).sha
    else:
        where, good_sha = git.fetch(repo, good)
        _, bad_sha = git.fetch(repo, bad)
    if good_sha == bad_sha:
        raise HarnessError(f"--good and --bad are the same commit ({good_sha[:12]})")
    if not git.is_ancestor(where, good_sha, bad_sha):
        raise HarnessError(f"good {good_sha[:12]} is not an ancestor of bad {bad_sha[:12]}: nothing to bisect")
    commits = [CommitRef(sha, subject) for sha, subject in git.ancestry_path(where, good_sha, bad_sha)]
    return CommitRef(good_sha, git.subject(where, good_sha)), commits[-1], commits


# ---------------------------------------------------------------------------------------------------------------
# Reading stored runs
# ---------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# Running probes
# ---------------------------------------------------------------------------------------------------------------


RunOne = Callable[[str], str]  # sha -> run id (HarnessError: the commit cannot be run)


@dataclass
class Prober:
    """Runs (or finds) the runs of commits on the chip; the first request for a commit may reuse stored runs
    (those ``usable`` accepts: they hold the job in question, or say the commit does not install)."""

    store: Store
    chip: str
    run_one: RunOne
    parallel_runs: bool = False
    reuse: bool = True
    log: Log = lambda line: None  # noqa: E731
    subjects: dict[str, str] = field(default_factory=dict)
    usable: Callable[[Sequence[StoredJob]], bool] = lambda jobs: True  # noqa: E731 - does a stored run answer?
    seen: set[str] = field(default_factory=set)
    new_runs: list[str] = field(default_factory=list)

    def _run(self, sha: str) -> tuple[str | None, str]:
        self.log(f"running {sha[:12]} {self.subjects.get(sha, '')}".rstrip())
        try:
            run_id = self.run_one(sha)
        except HarnessError as exc:
            return None, f"cannot run: {str(exc).splitlines()[0][:300]}"
        self.new_runs.append(run_id)
        return run_id, ""

    def runs(self, shas: Sequence[str]) -> dict[str, tuple[list[str], int, str]]:
        """Per commit: (run ids to read, how many of them were stored before, why none could be made)."""
        out: dict[str, tuple[list[str], int, str]] = {}
        to_run = []
        for sha in shas:
            stored = clean_runs(self.store, sha, self.chip) if self.reuse and sha not in self.seen else []
            if stored:  # only runs that answer the question (another suite's run, or an unfinished one, does not)
                jobs = job_rows(self.store, stored)
                stored = [run_id for run_id in stored if self.usable(jobs[run_id])]
            self.seen.add(sha)
            if stored:
                out[sha] = (stored, len(stored), "")
            else:
                to_run.append(sha)
        if self.parallel_runs and len(to_run) > 1:
            with ThreadPoolExecutor(max_workers=len(to_run), thread_name_prefix="probe") as pool:
                made = dict(zip(to_run, pool.map(self._run, to_run), strict=True))
        else:
            made = {sha: self._run(sha) for sha in to_run}
        for sha, (run_id, why) in made.items():
            out[sha] = ([run_id] if run_id else [], 0, why)
        return out


def perf_measured(prober: Prober, got: dict[str, tuple[list[str], int, str]], series: Series,
                  gates: Sequence[str]) -> dict[str, bisect.Measured]:
    """What :class:`harness.bisect.search.PerfProber` measures: the trials of each commit's (new or stored) runs,
    one :class:`harness.bisect.search.RunTrials` per run that timed the series (the first ``reused`` run ids of a
    commit are the stored ones)."""
    jobs = job_rows(prober.store, [run_id for ids, _, _ in got.values() for run_id in ids])
    out = {}
    for sha, (run_ids, reused, why) in got.items():
        if not run_ids:
            out[sha] = bisect.Measured(skip=why)
            continue
        verdicts = [perf_outcome(jobs[run_id], series, gates) for run_id in run_ids]
        by_job = job_trials(prober.store, [job_id for job_id, _ in verdicts if job_id is not None])
        timed = []
        for position, (run_id, (job_id, _)) in enumerate(zip(run_ids, verdicts, strict=True)):
            per_trial = by_job.get(job_id, {}) if job_id is not None else {}
            if per_trial:
                timed.append(bisect.RunTrials(run_id, tuple(tuple(per_trial[t]) for t in sorted(per_trial)),
                                              reused=position < reused))
        skip = "" if timed else next((why for _, why in reversed(verdicts) if why), "no samples")
        out[sha] = bisect.Measured(tuple(timed), skip=skip, untimed=len(run_ids) - len(timed), reused=reused)
    return out


def probe_keep(request: BisectRequest) -> Callable[[Job], bool] | None:
    """The planned jobs a probe run keeps (:func:`harness.bisect.probes.probe_jobs`), as a plan filter."""
    needed = probe_jobs(request)
    return None if needed is None else (lambda job: needed(planned_row(job)))


def local_runner(request: BisectRequest) -> RunOne:
    def run_one(sha: str) -> str:
        outcome = execute_run(LocalRunRequest(suite=request.suite, db_url=request.db_url, commit=sha,
                                              repo=request.repo, parallel=request.parallel,
                                              keep=probe_keep(request)))
        return outcome.run_id

    return run_one


def ray_runner(request: BisectRequest, chip: str) -> RunOne:
    def run_one(sha: str) -> str:
        outcome = run_on_cluster(ClusterRunRequest(suite=request.suite, db_url=request.db_url, commit=sha,
                                                   repo=request.repo, parallel=request.parallel,
                                                   address=request.address, chips=(chip,), keep=probe_keep(request)),
                                 log=lambda line: None)
        if not outcome.runs:
            raise HarnessError("; ".join(outcome.errors.values()) or "the cluster made no run")
        return outcome.runs[0].run_id

    return run_one


# ---------------------------------------------------------------------------------------------------------------
# The bisection
# ---------------------------------------------------------------------------------------------------------------


def run_bisect(request: BisectRequest, log: Log = lambda line: None, run_one: RunOne | None = None,
               checked: bool = False) -> BisectReport:
    """Bisect as the request says; ``run_one`` replaces the executor (tests). The selection is checked against the
    good commit's suite before anything runs (:func:`harness.bisect.selection.check_against_suite`; ``checked``: the
    caller did). In the main thread SIGTERM (a CI timeout, ``timeout``) stops it as Ctrl-C does: the run in progress
    is stored stopped and no job process is left (harness/core/proc.py)."""
    with sigterm_stops_runs():
        return _bisect(request, log, run_one, checked)


def _bisect(request: BisectRequest, log: Log, run_one: RunOne | None, checked: bool) -> BisectReport:
    check_request(request)
    if run_one is None and not checked:
        check_against_suite(request, log)
    good, bad, commits = commit_range(request.repo, request.good, request.bad)
    subjects = {c.sha: c.subject for c in (good, *commits)}
    connected = False
    if request.executor == "ray":
        from harness.execute.ray_executor import chip_label_value, live_chips, no_node_message  # loads ray

        if not request.chip:
            raise HarnessError("--chip is required with --executor ray (the chip key whose nodes run the probes)")
        chip = chip_label_value(request.chip)
        connected = connect(request.address)
    else:
        chip = _local_chip(request.chip)
    if request.mode == "perf" and not chip_id.timing_fit(chip):
        raise HarnessError(f"{chip} is a virtual GPU: its timings are not fit for a perf bisect (bisect on a real "
                           "chip; --mode correctness works here)")
    try:
        if request.executor == "ray":
            nodes = live_chips().get(chip, [])
            if not nodes:
                raise HarnessError(no_node_message(chip, live_chips()))
            per_round = request.probes_per_round or len(nodes)
            run_one = run_one or ray_runner(request, chip)
        else:
            per_round = request.probes_per_round or 1
            run_one = run_one or local_runner(request)
        store = open_store(request.db_url)
        try:
            prober = Prober(store, chip, run_one, parallel_runs=request.executor == "ray", reuse=request.reuse,
                            log=log, subjects=subjects, usable=answers(request))
            log(f"bisecting {counted(len(commits), 'commit')} after {good.sha[:12]} up to {bad.sha[:12]} on {chip}, "
                f"{per_round} probe(s) per round")
            context = _Context(request, chip, good, bad, commits, subjects, per_round, prober, log)
            return _perf(context) if request.mode == "perf" else _correctness(context)
        finally:
            store.close()
    finally:
        if connected:
            import ray  # loaded (and connected) above only with --executor ray

            ray.shutdown()


def _local_chip(wanted: str | None) -> str:
    key = chip_id.detect().key
    if wanted and wanted != key:
        raise HarnessError(f"this machine's chip is {key}, not {wanted}: bisect on a {wanted} machine, or use "
                           "--executor ray with nodes of that chip")
    return key


@dataclass
class _Context:
    request: BisectRequest
    chip: str
    good: CommitRef
    bad: CommitRef
    commits: list[CommitRef]
    subjects: dict[str, str]
    per_round: int
    prober: Prober
    log: Log

    def ref(self, sha: str | None) -> CommitRef | None:
        return None if sha is None else CommitRef(sha, self.subjects.get(sha, ""))

    def on_round(self, done: bisect.Round) -> None:
        what = "confirm" if done.confirm else "round"
        for sha, c in done.probes:
            extra = f" ({c.reason})" if c.reason else ""
            ratio = ""
            if c.vs_good is not None and c.state != "skip":
                ratio = (f", {c.vs_good.ratio:.3f}x good, {c.vs_bad.ratio:.3f}x bad, {c.trials} trial(s) of "
                         f"{len(c.run_ids)} run(s)" if c.vs_bad is not None else f", {c.vs_good.ratio:.3f}x good")
            self.log(f"{what} {done.index}: {sha[:12]} {c.state}{ratio}{extra}")


def _set_aside(items: Sequence[bisect.SetAside]) -> tuple[SetAsideRun, ...]:
    return tuple(SetAsideRun(item.run_id, item.vs_kept) for item in items)


def _lines(context: _Context, result: bisect.BisectResult) -> tuple[ProbeLine, ...]:
    lines = []
    for done in result.history:
        for sha, c in done.probes:
            lines.append(ProbeLine(
                round=done.index, step="confirm" if done.confirm else "probe", sha=sha,
                subject=context.subjects.get(sha, ""), state=c.state, reason=c.reason,
                ratio_vs_good=c.vs_good.ratio if c.vs_good else None, ratio_vs_bad=c.vs_bad.ratio if c.vs_bad else None,
                vs_good=c.vs_good, vs_bad=c.vs_bad, n=c.n, trials=c.trials, runs=c.runs, run_ids=c.run_ids,
                set_aside=_set_aside(c.set_aside), confirmed=c.confirmed, nearer=c.nearer))
    return tuple(lines)


def _report(context: _Context, result: bisect.BisectResult | None, *, target: str, status: str, message: str,
            runs: int, reused: int, evidence: decide.TrialComparison | None = None,
            endpoints: decide.TrialComparison | None = None, detail: str = "",
            baseline: Baseline | None = None, perf: bisect.PerfProber | None = None) -> BisectReport:
    request = context.request
    baseline = baseline or Baseline()
    skipped = tuple(SkippedCommit(sha, context.subjects.get(sha, ""), why) for sha, why in result.skipped) \
        if result else ()
    endpoint_runs: dict[str, tuple[str, ...]] = {}
    endpoint_set_aside: tuple[SetAsideRun, ...] = ()
    floor = None
    if perf is not None:
        for which, sha in (("good", context.good.sha), ("bad", context.bad.sha)):
            kept = perf.evidence(sha)
            endpoint_runs[which] = tuple(run.run_id for run in kept.kept)
            endpoint_set_aside += _set_aside(kept.aside)
        found = perf.floor()
        floor = {"sd": found.sd, "df": found.runs - 1} if found is not None else None
    return BisectReport(
        mode=request.mode, chip=context.chip, target=target, repo=request.repo, good=context.good, bad=context.bad,
        commits=len(context.commits), status=status, message=message,
        culprit=context.ref(result.culprit) if result else None,
        last_good=(context.ref(result.last_good) or context.good) if result else None,
        candidates=tuple(context.ref(sha) for sha in result.candidates) if result else (),
        skipped=skipped, evidence=evidence, endpoints=endpoints, detail=detail,
        rounds=result.rounds if result else 0,
        round_bound=bisect.max_rounds_needed(len(context.commits), context.per_round),
        probes=result.probes if result else 0, probes_per_round=context.per_round, runs=runs, reused_runs=reused,
        new_runs=tuple(context.prober.new_runs), history=_lines(context, result) if result else (),
        notes=result.notes if result else (), followed_tests=len(baseline.followed),
        pre_existing_failures=tuple(TestAtGood.of(job) for job in baseline.pre_existing),
        ignored_at_good=tuple(TestAtGood.of(job) for job in baseline.ignored),
        confirmations=result.confirmations if result else 0,
        inconclusive=tuple(context.ref(sha) for sha in result.inconclusive) if result else (),
        endpoint_runs=endpoint_runs, endpoint_set_aside=endpoint_set_aside, floor=floor)


def _range(result: bisect.BisectResult) -> str:
    return (f"{counted(len(result.candidates), 'commit')} {result.candidates[0][:12]}..{result.candidates[-1][:12]}"
            if result.candidates else "no commit")


def _summary(result: bisect.BisectResult, what: str) -> str:
    if result.status == "found":
        return f"{result.culprit[:12]} is the first {what} commit"
    if result.status == "hidden":
        return f"skipped commits hide the first {what} commit: it is one of {_range(result)}"
    if result.status == "inconclusive":
        probes = "; ".join(f"{sha[:12]}: {result.classifications[sha].reason}" for sha in result.inconclusive)
        return (f"the first {what} commit is one of {_range(result)}; no culprit named, as the measurements "
                f"could not classify {probes}")
    return f"stopped after {result.rounds} round(s) (--max-rounds): the first {what} commit is one of {_range(result)}"


def _endpoints_line(endpoints: decide.TrialComparison) -> str:
    ci = (f" (95% CI {endpoints.ci_low:.3f}-{endpoints.ci_high:.3f})" if math.isfinite(endpoints.ci_low) else "")
    return (f"{endpoints.verdict}, ratio {endpoints.ratio:.3f}{ci}, {endpoints.trials_base}/{endpoints.trials_head} "
            "trials")


def _perf(context: _Context) -> BisectReport:
    request = context.request
    chosen: list[Series] = []

    def measure(shas: Sequence[str]) -> dict[str, bisect.Measured]:
        got = context.prober.runs(shas)
        if not chosen:  # the first measurement is the endpoints': their runs name the series
            for sha, (ids, _, why) in got.items():
                if not ids:
                    which = "good" if sha == context.good.sha else "bad"
                    raise HarnessError(f"the {which} endpoint {sha[:12]} cannot be run: {why}")
            jobs = job_rows(context.prober.store, [r for ids, _, _ in got.values() for r in ids])
            chosen.append(find_series([j for rows in jobs.values() for j in rows], request))
        return perf_measured(context.prober, got, chosen[0], request.gates)

    prober = bisect.PerfProber(measure, context.good.sha, context.bad.sha, max_runs=request.max_runs,
                               confirm_runs=request.confirm_runs, min_effect=request.min_effect, alpha=request.alpha)
    endpoints = prober.confirm()
    target = str(chosen[0]) if chosen else request.kernel
    if endpoints is None:
        sha = context.good.sha if context.good.sha in prober.skips else context.bad.sha
        which = "good" if sha == context.good.sha else "bad"
        raise HarnessError(f"the {which} endpoint {sha[:12]} has no valid timing of {target}: {prober.skips[sha]}")
    ends = f"the bad commit {context.bad.sha[:12]} and the good commit {context.good.sha[:12]}"
    if not prober.endpoints_settled:
        kept = [len(prober.evidence(sha).kept) for sha in (context.good.sha, context.bad.sha)]
        message = (f"could not tell whether {ends} differ for {target} on {context.chip} after "
                   f"{prober.runs} run(s) ({kept[0]}/{kept[1]} agreeing run(s) kept, {prober.need('good')}/"
                   f"{prober.need('bad')} needed): "
                   f"{_endpoints_line(endpoints)}; nothing bisected")
        return _report(context, None, target=target, status="inconclusive", message=message, runs=prober.runs,
                       reused=prober.reused, endpoints=endpoints, perf=prober)
    if endpoints.verdict != "regressed":
        message = (f"the bad commit {context.bad.sha[:12]} is not slower than the good commit "
                   f"{context.good.sha[:12]} for {target} on {context.chip}: {_endpoints_line(endpoints)}; "
                   "nothing to bisect")
        return _report(context, None, target=target, status="no-regression", message=message, runs=prober.runs,
                       reused=prober.reused, endpoints=endpoints, perf=prober)
    context.log(f"endpoints: bad / good {_endpoints_line(endpoints)}")
    result = bisect.search([c.sha for c in context.commits], prober, probes_per_round=context.per_round,
                           max_rounds=request.max_rounds, on_round=context.on_round, confirm=prober.confirm_bounds)
    evidence = None
    if result.culprit:
        evidence = prober.evidence_between(result.last_good or context.good.sha, result.culprit)
    message = _summary(result, "slower")
    if evidence is not None:
        message += f": {bisect.describe(evidence, 'its predecessor')}"
    return _report(context, result, target=target, status=result.status, message=message, runs=prober.runs,
                   reused=prober.reused, evidence=evidence, endpoints=endpoints, perf=prober)


def _correctness(context: _Context) -> BisectReport:
    request = context.request
    counts = {"runs": 0, "reused": 0}

    def rows(shas: Sequence[str]) -> dict[str, list[StoredJob] | str]:
        """Per commit: the job rows of its latest run, or why it could not be run."""
        got = context.prober.runs(shas)
        jobs = job_rows(context.prober.store, [ids[-1] for ids, _, _ in got.values() if ids])
        out: dict[str, list[StoredJob] | str] = {}
        for sha, (ids, reused, why) in got.items():
            counts["runs"] += min(len(ids), 1)
            counts["reused"] += min(reused, 1)
            out[sha] = jobs[ids[-1]] if ids else why
        return out

    baseline = Baseline()

    def outcome(found: list[StoredJob] | str) -> bisect.Classification:
        if isinstance(found, str):
            return bisect.Classification("skip", found)
        return correctness_outcome(found, request, baseline)

    def classify(shas: Sequence[str]) -> dict[str, bisect.Classification]:
        return {sha: outcome(found) for sha, found in rows(shas).items()}

    target = describe_selection(request)
    # The good endpoint first, then the bad one: a --check naming no test there (known only once the selection ran)
    # is refused before the bad endpoint runs. With Ray both run at once, unless --check is given.
    together = request.executor == "ray" and not request.check
    ends = rows([context.good.sha, context.bad.sha] if together else [context.good.sha])
    at_good = ends[context.good.sha]
    if not isinstance(at_good, str):  # the tests to follow: those passing at good (raises the --check errors)
        baseline = follow(at_good, request, where=f"the good endpoint {context.good.sha[:12]}")
    if not together:
        ends.update(rows([context.bad.sha]))
    good, bad = outcome(at_good), outcome(ends[context.bad.sha])
    if baseline.followed:
        context.log(f"following {len(baseline.followed)} test(s) passing at the good commit; ignored there: "
                    f"{len(baseline.pre_existing)} failing, {len(baseline.ignored)} skipped")
    if good.state != "good":
        what = "cannot be tested" if good.state == "skip" else "already fails"
        raise HarnessError(f"the good endpoint {context.good.sha[:12]} {what}: {good.reason}")
    if bad.state != "bad":
        if bad.state == "skip":
            raise HarnessError(f"the bad endpoint {context.bad.sha[:12]} cannot be tested: {bad.reason}")
        if baseline.followed:
            message = (f"no test of {target} that passed at the good commit fails at the bad commit "
                       f"{context.bad.sha[:12]} on {context.chip}: nothing to bisect")
        else:
            message = (f"{target} passes at the bad commit {context.bad.sha[:12]} on {context.chip}: nothing to "
                       "bisect")
        return _report(context, None, target=target, status="no-regression", message=message, runs=counts["runs"],
                       reused=counts["reused"], baseline=baseline)
    result = bisect.search([c.sha for c in context.commits], classify, probes_per_round=context.per_round,
                           max_rounds=request.max_rounds, on_round=context.on_round)
    detail = ""
    if result.culprit:
        detail = (result.classifications.get(result.culprit) or bad).reason
    message = _summary(result, "failing") + (f": {detail}" if detail else "")
    return _report(context, result, target=target, status=result.status, message=message, runs=counts["runs"],
                   reused=counts["reused"], detail=detail, baseline=baseline)
