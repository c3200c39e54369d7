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
  needs two agreeing runs (:class:`harness.bisect.prober.PerfProber`). A perf probe that stays undecided is run
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.bisect import search as bisect
from harness.bisect.perf import Measured, describe
from harness.bisect.prober import PerfProber
from harness.bisect.probes import (
    Baseline,
    Series,
    answers,
    correctness_outcome,
    find_series,
    follow,
)
from harness.bisect.report import BisectReport, CommitRef, ProbeLine, SetAsideRun, SkippedCommit, TestAtGood
from harness.bisect.runner import Log, Prober, RunOne, local_runner, perf_measured, ray_runner
from harness.bisect.selection import (
    BisectRequest,
    check_against_suite,
    check_request,
    counted,
    describe_selection,
)
from harness.cluster.driver import connect
from harness.core import chip as chip_id
from harness.core.errors import HarnessError
from harness.pipeline.run import sigterm_stops_runs
from harness.record.outbox import open_store
from harness.record.runs import StoredJob, job_rows
from harness.spec import git
from harness.stats import decide

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


@dataclass(frozen=True)
class _Ending:
    """How a bisection ended, for its report: the answer in words, the runs it took (``reused`` of them stored before),
    and the evidence (perf: the comparisons and the prober; correctness: what failed, the tests followed)."""

    target: str
    status: str
    message: str
    runs: int
    reused: int
    evidence: decide.TrialComparison | None = None
    endpoints: decide.TrialComparison | None = None
    detail: str = ""
    baseline: Baseline | None = None
    perf: PerfProber | None = None


def _report(context: _Context, result: bisect.BisectResult | None, ending: _Ending) -> BisectReport:
    request, perf = context.request, ending.perf
    baseline = ending.baseline or Baseline()
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
        mode=request.mode, chip=context.chip, target=ending.target, repo=request.repo, good=context.good,
        bad=context.bad, commits=len(context.commits), status=ending.status, message=ending.message,
        culprit=context.ref(result.culprit) if result else None,
        last_good=(context.ref(result.last_good) or context.good) if result else None,
        candidates=tuple(context.ref(sha) for sha in result.candidates) if result else (),
        skipped=skipped, evidence=ending.evidence, endpoints=ending.endpoints, detail=ending.detail,
        rounds=result.rounds if result else 0,
        round_bound=bisect.max_rounds_needed(len(context.commits), context.per_round),
        probes=result.probes if result else 0, probes_per_round=context.per_round, runs=ending.runs,
        reused_runs=ending.reused,
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

    def measure(shas: Sequence[str]) -> dict[str, Measured]:
        got = context.prober.runs(shas)
        if not chosen:  # the first measurement is the endpoints': their runs name the series
            for sha, (ids, _, why) in got.items():
                if not ids:
                    which = "good" if sha == context.good.sha else "bad"
                    raise HarnessError(f"the {which} endpoint {sha[:12]} cannot be run: {why}")
            jobs = job_rows(context.prober.store, [r for ids, _, _ in got.values() for r in ids])
            chosen.append(find_series([j for rows in jobs.values() for j in rows], request))
        return perf_measured(context.prober, got, chosen[0], request.gates)

    prober = PerfProber(measure, context.good.sha, context.bad.sha, max_runs=request.max_runs,
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
        return _report(context, None, _Ending(target=target, status="inconclusive", message=message, runs=prober.runs,
                                              reused=prober.reused, endpoints=endpoints, perf=prober))
    if endpoints.verdict != "regressed":
        message = (f"the bad commit {context.bad.sha[:12]} is not slower than the good commit "
                   f"{context.good.sha[:12]} for {target} on {context.chip}: {_endpoints_line(endpoints)}; "
                   "nothing to bisect")
        return _report(context, None, _Ending(target=target, status="no-regression", message=message,
                                              runs=prober.runs, reused=prober.reused, endpoints=endpoints, perf=prober))
    context.log(f"endpoints: bad / good {_endpoints_line(endpoints)}")
    result = bisect.search([c.sha for c in context.commits], prober, probes_per_round=context.per_round,
                           max_rounds=request.max_rounds, on_round=context.on_round, confirm=prober.confirm_bounds)
    evidence = None
    if result.culprit:
        evidence = prober.evidence_between(result.last_good or context.good.sha, result.culprit)
    message = _summary(result, "slower")
    if evidence is not None:
        message += f": {describe(evidence, 'its predecessor')}"
    return _report(context, result, _Ending(target=target, status=result.status, message=message, runs=prober.runs,
                                            reused=prober.reused, evidence=evidence, endpoints=endpoints, perf=prober))


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
        return _report(context, None, _Ending(target=target, status="no-regression", message=message,
                                              runs=counts["runs"], reused=counts["reused"], baseline=baseline))
    result = bisect.search([c.sha for c in context.commits], classify, probes_per_round=context.per_round,
                           max_rounds=request.max_rounds, on_round=context.on_round)
    detail = ""
    if result.culprit:
        detail = (result.classifications.get(result.culprit) or bad).reason
    message = _summary(result, "failing") + (f": {detail}" if detail else "")
    return _report(context, result, _Ending(target=target, status=result.status, message=message,
                                            runs=counts["runs"], reused=counts["reused"], detail=detail,
                                            baseline=baseline))
