"""Probe runs: run a commit (locally or on the cluster) or reuse its stored runs, and read a perf run's trials.

What reuse and a probe run mean for the bisection: :mod:`harness.bisect.run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from harness.bisect.perf import Measured, RunTrials
from harness.bisect.probes import Series, perf_outcome
from harness.bisect.selection import BisectRequest, planned_row, probe_jobs
from harness.cluster.driver import run_on_cluster
from harness.core.errors import HarnessError
from harness.core.job import Job
from harness.pipeline.run import ClusterRunRequest, LocalRunRequest, execute_run
from harness.record.runs import StoredJob, clean_runs, job_rows, job_trials
from harness.record.store import Store

Log = Callable[[str], None]
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
                  gates: Sequence[str]) -> dict[str, Measured]:
    """What :class:`harness.bisect.prober.PerfProber` measures: the trials of each commit's (new or stored) runs,
    one :class:`harness.bisect.perf.RunTrials` per run that timed the series (the first ``reused`` run ids of a
    commit are the stored ones)."""
    jobs = job_rows(prober.store, [run_id for ids, _, _ in got.values() for run_id in ids])
    out = {}
    for sha, (run_ids, reused, why) in got.items():
        if not run_ids:
            out[sha] = Measured(skip=why)
            continue
        verdicts = [perf_outcome(jobs[run_id], series, gates) for run_id in run_ids]
        by_job = job_trials(prober.store, [job_id for job_id, _ in verdicts if job_id is not None])
        timed = []
        for position, (run_id, (job_id, _)) in enumerate(zip(run_ids, verdicts, strict=True)):
            per_trial = by_job.get(job_id, {}) if job_id is not None else {}
            if per_trial:
                timed.append(RunTrials(run_id, tuple(tuple(per_trial[t]) for t in sorted(per_trial)),
                                       reused=position < reused))
        skip = "" if timed else next((why for _, why in reversed(verdicts) if why), "no samples")
        out[sha] = Measured(tuple(timed), skip=skip, untimed=len(run_ids) - len(timed), reused=reused)
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
