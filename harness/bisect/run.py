"""The I/O side of `harness bisect`: list the commits, run probe commits like any run, read their stored results.

The search and the statistics are pure (:mod:`harness.bisect.search`); this module feeds them:

- **Commits**: ``git rev-list --ancestry-path --reverse GOOD..BAD`` in the repository (a local path) or in the
  harness's clone cache (a URL, fetched like ``harness run --repo URL``).
- **A probe is a run.** Probing a commit is ``execute_run(RunRequest(repo=..., commit=sha, suite=..., db_url=...))``
  (locally) or the cluster driver's ``run_on_cluster`` restricted to the chip (``--executor ray``): the whole
  suite of that commit runs and every result is stored, so the history pages show the probes like any run.
  With Ray the probes of a round run at once (one driver thread per commit; the chip's nodes share the jobs).
- **Reuse.** The first time a commit is needed, its clean runs already stored for the chip are used instead of
  running it (all of them, pooled); a repeated bisect therefore runs nothing. A perf probe that stays
  inconclusive is run again (a new run each time) and its samples are pooled, up to ``max_runs`` runs in all.
- **What a run says** (``perf_outcome`` / ``correctness_outcome``): the install job failed -> skip ("does not
  install"); the run could not be made at all (no suite at that commit, checkout failed...) -> skip; perf mode:
  a correctness job of the kernel (or of a ``--gate`` selection) failed, crashed or timed out -> skip ("fails
  correctness"), the benchmark job itself failed, crashed or timed out or is missing -> skip, else its samples;
  correctness mode: a matching job failed (pytest: a test failed or errored) -> bad, crashed / timed out / lost
  / skipped / missing -> skip, passed -> good.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select

from harness.analysis.grid import json_safe
from harness.bisect import search as bisect
from harness.core import stats
from harness.core.errors import HarnessError
from harness.core.job import shape_label
from harness.record.models import Chip, Commit, JobRecord, Run, Sample
from harness.record.store import Store, open_store
from harness.spec import git

Mode = Literal["perf", "correctness"]
Log = Callable[[str], None]

GATE_KINDS = ("correctness", "pytest", "test")
GATE_STATUSES = ("failed", "error", "crashed", "timeout")  # a correctness job that makes timings meaningless
FAIL_STATUSES = ("failed", "error")  # correctness mode: the job ran and said "wrong"
UNKNOWN_STATUSES = ("crashed", "timeout", "lost", "skipped")  # correctness mode: no answer -> skip the commit
GOOD_STATUSES = ("passed", "xfailed", "xpassed")


# ---------------------------------------------------------------------------------------------------------------
# The request and the report
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class BisectRequest:
    good: str
    bad: str
    kernel: str
    mode: Mode = "perf"
    chip: str | None = None  # default: this machine's chip (local executor); required with Ray
    variant: str | None = None
    shape: str | None = None  # "N=256" or "B=1,H=4,S=128,D=64" (any order)
    dtype: str | None = None
    check: str | None = None  # correctness mode: a check name, or a pytest test's node id (or "::name" suffix)
    repo: str = "."
    suite: str | None = None
    db_url: str | None = None
    executor: str = "local"
    address: str | None = None
    parallel: int = 1
    max_rounds: int | None = None
    probes_per_round: int | None = None  # default: 1 locally, the chip's live nodes with Ray
    max_runs: int = bisect.DEFAULT_MAX_RUNS
    min_effect: float = stats.DEFAULT_MIN_EFFECT
    alpha: float = stats.DEFAULT_ALPHA
    gates: tuple[str, ...] = ()  # perf mode: more correctness jobs / pytest selections whose failure skips a commit
    reuse: bool = True


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
class ProbeLine(_Record):
    """One classified commit of one round."""

    round: int
    sha: str
    subject: str
    state: str
    reason: str
    ratio_vs_good: float | None
    ratio_vs_bad: float | None
    n: int
    runs: int
    weak: bool


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
    status: str  # found | hidden | stopped | no-regression
    message: str
    culprit: CommitRef | None
    last_good: CommitRef | None
    candidates: tuple[CommitRef, ...]
    skipped: tuple[SkippedCommit, ...]
    evidence: stats.Comparison | None  # perf: culprit vs last good (ratio = culprit / last good)
    endpoints: stats.Comparison | None  # perf: bad vs good
    detail: str  # correctness: what failed at the culprit
    rounds: int
    round_bound: int  # ceil(log_{P+1} N): the most rounds needed without skips
    probes: int
    probes_per_round: int
    runs: int  # runs used, endpoints and repeats included
    reused_runs: int  # of which were already stored
    new_runs: tuple[str, ...]  # run ids made by this bisect
    history: tuple[ProbeLine, ...]
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """0 when one culprit is named, 1 otherwise (hidden by skips, stopped, or no regression to find)."""
        return 0 if self.status == "found" else 1

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "exit_code": self.exit_code}


# ---------------------------------------------------------------------------------------------------------------
# Commits
# ---------------------------------------------------------------------------------------------------------------


def _git_lines(repo: Path, *args: str) -> list[str]:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise HarnessError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()[-300:]}")
    return [line for line in done.stdout.splitlines() if line]


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
    ancestor = subprocess.run(["git", "-C", str(where), "merge-base", "--is-ancestor", good_sha, bad_sha],
                              capture_output=True, check=False)
    if ancestor.returncode != 0:
        raise HarnessError(f"good {good_sha[:12]} is not an ancestor of bad {bad_sha[:12]}: nothing to bisect")
    lines = _git_lines(where, "log", "--reverse", "--ancestry-path", "--format=%H%x00%s", f"{good_sha}..{bad_sha}")
    commits = [CommitRef(*line.split("\x00", 1)) for line in lines]
    subject = _git_lines(where, "log", "-1", "--format=%s", good_sha)
    return CommitRef(good_sha, subject[0] if subject else ""), commits[-1], commits


# ---------------------------------------------------------------------------------------------------------------
# Reading stored runs
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    job_id: int
    run_id: str
    kind: str
    key: str
    kernel: str
    name: str
    variant: str
    dtype: str
    shape_key: str
    check: str
    status: str
    detail: str

    @property
    def first_line(self) -> str:
        return (self.detail.splitlines() or [""])[0][:300]


def stored_runs(store: Store, sha: str, chip: str) -> list[str]:
    """Clean runs of commit ``sha`` on ``chip``, oldest first."""
    with store.session() as session:
        return list(session.scalars(
            select(Run.id).join(Commit, Run.commit_id == Commit.id).join(Chip, Run.chip_id == Chip.id)
            .where(Commit.sha == sha, Chip.key == chip, Run.dirty.is_(False))
            .order_by(Run.started_at, Run.id)))


def run_jobs(store: Store, run_ids: Sequence[str]) -> dict[str, list[JobRow]]:
    """Every job row of the given runs, per run."""
    out: dict[str, list[JobRow]] = {run_id: [] for run_id in run_ids}
    if not run_ids:
        return out
    with store.session() as session:
        rows = session.execute(
            select(JobRecord.id, JobRecord.run_id, JobRecord.kind, JobRecord.key, JobRecord.kernel, JobRecord.name,
                   JobRecord.variant, JobRecord.dtype, JobRecord.shape_key, JobRecord.check_name, JobRecord.status,
                   JobRecord.detail)
            .where(JobRecord.run_id.in_(list(run_ids))).order_by(JobRecord.id))
        for row in rows:
            out[row[1]].append(JobRow(*row))
    return out


def job_samples(store: Store, job_ids: Sequence[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {job_id: [] for job_id in job_ids}
    if not job_ids:
        return out
    with store.session() as session:
        for job_id, seconds in session.execute(select(Sample.job_id, Sample.seconds)
                                               .where(Sample.job_id.in_(list(job_ids)))
                                               .order_by(Sample.job_id, Sample.idx)):
            out[job_id].append(seconds)
    return out


# ---------------------------------------------------------------------------------------------------------------
# What one run says about a commit (pure, on job rows)
# ---------------------------------------------------------------------------------------------------------------


def normalize_shape(text: str | None) -> str | None:
    """'S=128, B=1' -> 'B=1,S=128' (the stored shape key)."""
    if text is None:
        return None
    shape: dict[str, int] = {}
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            shape[name.strip()] = int(value)
        except ValueError:
            raise HarnessError(f"--shape {text!r}: expected NAME=INT pairs, e.g. N=256 or B=1,H=4") from None
        if not sep or not name.strip():
            raise HarnessError(f"--shape {text!r}: expected NAME=INT pairs, e.g. N=256 or B=1,H=4")
    return shape_label(shape)


@dataclass(frozen=True)
class Series:
    kernel: str
    variant: str
    dtype: str
    shape_key: str

    def __str__(self) -> str:
        parts = [self.variant, self.dtype or "", self.shape_key or "no shape"]
        return f"{self.kernel} [{', '.join(p for p in parts if p)}]"


def _names(job: JobRow, name: str) -> bool:
    return name in (job.kernel, job.name)


def find_series(jobs: Sequence[JobRow], request: BisectRequest) -> Series:
    """The one benchmark series the request names, among the given jobs; a clear error if none or several."""
    shape = normalize_shape(request.shape)
    found = sorted({Series(j.kernel, j.variant, j.dtype, j.shape_key) for j in jobs
                    if _benchmark_matches(j, request, shape)}, key=str)
    if len(found) == 1:
        return found[0]
    if not found:
        known = sorted({f"{j.kernel}" for j in jobs if j.kind == "benchmark"})
        raise HarnessError(f"no benchmark of {request.kernel!r} matching the options at the endpoints "
                           f"(benchmarks there: {', '.join(known) or 'none'})")
    listed = "; ".join(str(s) for s in found[:6]) + (f"; ... ({len(found)} in all)" if len(found) > 6 else "")
    raise HarnessError(f"{len(found)} series of {request.kernel!r} match: {listed}; pick one with --variant, "
                       "--dtype or --shape")


def _benchmark_matches(job: JobRow, request: BisectRequest, shape: str | None) -> bool:
    return (job.kind == "benchmark" and _names(job, request.kernel) and request.variant in (None, job.variant)
            and request.dtype in (None, job.dtype) and shape in (None, job.shape_key))


def answers(request: BisectRequest) -> Callable[[Sequence[JobRow]], bool]:
    """Whether a stored run can be reused for this request: it failed to install, or it ran the job in question."""
    shape = normalize_shape(request.shape)
    wanted = _benchmark_matches if request.mode == "perf" else _matches

    def usable(jobs: Sequence[JobRow]) -> bool:
        return _install_failure(jobs) is not None or any(wanted(job, request, shape) for job in jobs)

    return usable


def _install_failure(jobs: Sequence[JobRow]) -> str | None:
    for job in jobs:
        if job.kind == "install" and job.status != "passed":
            return f"does not install: {job.first_line}"
    return None


def perf_outcome(jobs: Sequence[JobRow], series: Series, gates: Sequence[str] = ()) -> tuple[int | None, str]:
    """(the series' benchmark job id, "") or (None, why the commit is skipped), from one run's job rows."""
    failed = _install_failure(jobs)
    if failed:
        return None, failed
    for job in jobs:
        gated = (job.kind == "correctness" and job.kernel == series.kernel) or \
                (job.kind in GATE_KINDS and any(_names(job, gate) for gate in gates))
        if gated and job.status in GATE_STATUSES:
            return None, f"fails correctness: {job.key} {job.status}: {job.first_line}"
    for job in jobs:
        if job.kind == "benchmark" and Series(job.kernel, job.variant, job.dtype, job.shape_key) == series:
            if job.status != "passed":
                return None, f"benchmark {job.status}: {job.first_line}"
            return job.job_id, ""
    return None, f"no benchmark {series} in this run"


def _matches(job: JobRow, request: BisectRequest, shape: str | None) -> bool:
    if job.kind not in GATE_KINDS or not _names(job, request.kernel):
        return False
    if request.variant not in (None, job.variant) or request.dtype not in (None, job.dtype):
        return False
    if shape is not None and job.kind == "correctness" and job.shape_key != shape:
        return False
    if request.check:
        if job.kind == "correctness":
            return job.check == request.check
        if job.kind == "test":
            return job.name == request.check or job.name.endswith("::" + request.check.removeprefix("::"))
        return False
    return True


def correctness_outcome(jobs: Sequence[JobRow], request: BisectRequest) -> bisect.Classification:
    """good / bad / skip from one run's job rows, for the correctness job(s) the request names."""
    failed = _install_failure(jobs)
    if failed:
        return bisect.Classification("skip", failed, runs=1)
    shape = normalize_shape(request.shape)
    order = {"test": 0, "correctness": 1, "pytest": 2}  # the most specific failure first
    matched = sorted((job for job in jobs if _matches(job, request, shape)), key=lambda job: order[job.kind])
    if not matched:
        return bisect.Classification("skip", f"no correctness job matching {describe_selection(request)} in this run",
                                     runs=1)
    for job in matched:
        if job.status in FAIL_STATUSES:
            return bisect.Classification("bad", f"{job.key} {job.status}: {job.first_line}", runs=1)
    for job in matched:
        if job.status in UNKNOWN_STATUSES:
            return bisect.Classification("skip", f"{job.key} {job.status}: {job.first_line}", runs=1)
    return bisect.Classification("good", f"{len(matched)} job(s) passed", runs=1)


def describe_selection(request: BisectRequest) -> str:
    parts = [f"variant {request.variant}" if request.variant else "", f"check {request.check}" if request.check else "",
             f"dtype {request.dtype}" if request.dtype else "", f"shape {request.shape}" if request.shape else ""]
    extra = ", ".join(p for p in parts if p)
    return f"{request.kernel}" + (f" ({extra})" if extra else "")


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
    usable: Callable[[Sequence[JobRow]], bool] = lambda jobs: True  # noqa: E731 - does a stored run answer?
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
            stored = stored_runs(self.store, sha, self.chip) if self.reuse and sha not in self.seen else []
            if stored:  # only runs that answer the question (another suite's run, or an unfinished one, does not)
                jobs = run_jobs(self.store, stored)
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
    """What :class:`harness.bisect.search.PerfProber` measures: the samples of each commit's (new or stored) runs."""
    jobs = run_jobs(prober.store, [run_id for ids, _, _ in got.values() for run_id in ids])
    out = {}
    for sha, (run_ids, reused, why) in got.items():
        if not run_ids:
            out[sha] = bisect.Measured(runs=0, skip=why)
            continue
        verdicts = [perf_outcome(jobs[run_id], series, gates) for run_id in run_ids]
        job_ids = [job_id for job_id, _ in verdicts if job_id is not None]
        samples = job_samples(prober.store, job_ids)
        pooled = tuple(s for job_id in job_ids for s in samples[job_id])
        skip = "" if pooled else (verdicts[-1][1] or "no samples")
        out[sha] = bisect.Measured(pooled, runs=len(run_ids), skip=skip, reused=reused)
    return out


def local_runner(request: BisectRequest) -> RunOne:
    from harness.pipeline.run import RunRequest, execute_run

    def run_one(sha: str) -> str:
        outcome = execute_run(RunRequest(suite=request.suite, db_url=request.db_url, commit=sha, repo=request.repo,
                                         parallel=request.parallel))
        return outcome.run_id

    return run_one


def ray_runner(request: BisectRequest, chip: str) -> RunOne:
    from harness.cluster.driver import run_on_cluster
    from harness.pipeline.run import RunRequest

    def run_one(sha: str) -> str:
        outcome = run_on_cluster(RunRequest(suite=request.suite, db_url=request.db_url, commit=sha, repo=request.repo,
                                            parallel=request.parallel, executor="ray", address=request.address,
                                            chips=(chip,)), log=lambda line: None)
        if not outcome.runs:
            raise HarnessError("; ".join(outcome.errors.values()) or "the cluster made no run")
        return outcome.runs[0].run_id

    return run_one


# ---------------------------------------------------------------------------------------------------------------
# The bisection
# ---------------------------------------------------------------------------------------------------------------


def _check_request(request: BisectRequest) -> None:
    if request.mode not in ("perf", "correctness"):
        raise HarnessError(f"--mode must be perf or correctness, not {request.mode!r}")
    if request.executor not in ("local", "ray"):
        raise HarnessError(f"--executor must be local or ray, not {request.executor!r}")
    if request.max_rounds is not None and request.max_rounds < 1:
        raise HarnessError(f"--max-rounds must be at least 1, not {request.max_rounds}")
    if request.probes_per_round is not None and request.probes_per_round < 1:
        raise HarnessError(f"--probes-per-round must be at least 1, not {request.probes_per_round}")
    if request.max_runs < 1:
        raise HarnessError(f"--max-runs must be at least 1, not {request.max_runs}")
    normalize_shape(request.shape)


def run_bisect(request: BisectRequest, log: Log = lambda line: None,
               run_one: RunOne | None = None) -> BisectReport:
    """Bisect as the request says; ``run_one`` replaces the executor (tests)."""
    _check_request(request)
    good, bad, commits = commit_range(request.repo, request.good, request.bad)
    subjects = {c.sha: c.subject for c in (good, *commits)}
    connected = False
    if request.executor == "ray":
        from harness.cluster.driver import connect
        from harness.execute.ray_executor import chip_label_value, live_chips, no_node_message

        if not request.chip:
            raise HarnessError("--chip is required with --executor ray (the chip key whose nodes run the probes)")
        chip = chip_label_value(request.chip)
        connected = connect(request.address)
    else:
        chip = _local_chip(request.chip)
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
            log(f"bisecting {len(commits)} commit(s) after {good.sha[:12]} up to {bad.sha[:12]} on {chip}, "
                f"{per_round} probe(s) per round")
            context = _Context(request, chip, good, bad, commits, subjects, per_round, prober, log)
            return _perf(context) if request.mode == "perf" else _correctness(context)
        finally:
            store.close()
    finally:
        if connected:
            import ray

            ray.shutdown()


def _local_chip(wanted: str | None) -> str:
    from harness.core import chip as chip_id

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
        for sha, c in done.probes:
            extra = f" ({c.reason})" if c.reason else ""
            ratio = f", {c.vs_good.ratio:.3f}x good" if c.vs_good is not None and c.state != "skip" else ""
            self.log(f"round {done.index}: {sha[:12]} {c.state}{ratio}{extra}")


def _lines(context: _Context, result: bisect.BisectResult) -> tuple[ProbeLine, ...]:
    lines = []
    for done in result.history:
        for sha, c in done.probes:
            lines.append(ProbeLine(done.index, sha, context.subjects.get(sha, ""), c.state, c.reason,
                                   c.vs_good.ratio if c.vs_good else None, c.vs_bad.ratio if c.vs_bad else None,
                                   c.n, c.runs, c.weak))
    return tuple(lines)


def _report(context: _Context, result: bisect.BisectResult | None, *, target: str, status: str, message: str,
            runs: int, reused: int, evidence: stats.Comparison | None = None,
            endpoints: stats.Comparison | None = None, detail: str = "") -> BisectReport:
    request = context.request
    skipped = tuple(SkippedCommit(sha, context.subjects.get(sha, ""), why) for sha, why in result.skipped) \
        if result else ()
    return BisectReport(
        request.mode, context.chip, target, request.repo, context.good, context.bad, len(context.commits), status,
        message, context.ref(result.culprit) if result else None,
        (context.ref(result.last_good) or context.good) if result else None,
        tuple(context.ref(sha) for sha in result.candidates) if result else (), skipped, evidence, endpoints, detail,
        result.rounds if result else 0, bisect.max_rounds_needed(len(context.commits), context.per_round),
        result.probes if result else 0, context.per_round, runs, reused, tuple(context.prober.new_runs),
        _lines(context, result) if result else (), result.notes if result else ())


def _summary(result: bisect.BisectResult, what: str) -> str:
    if result.status == "found":
        return f"{result.culprit[:12]} is the first {what} commit"
    if result.status == "hidden":
        return (f"skipped commits hide the first {what} commit: it is one of {len(result.candidates)} commits "
                f"{result.candidates[0][:12]}..{result.candidates[-1][:12]}")
    return (f"stopped after {result.rounds} round(s) (--max-rounds): the first {what} commit is one of "
            f"{len(result.candidates)} commits {result.candidates[0][:12]}..{result.candidates[-1][:12]}")


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
            jobs = run_jobs(context.prober.store, [r for ids, _, _ in got.values() for r in ids])
            chosen.append(find_series([j for rows in jobs.values() for j in rows], request))
        return perf_measured(context.prober, got, chosen[0], request.gates)

    prober = bisect.PerfProber(measure, context.good.sha, context.bad.sha, max_runs=request.max_runs,
                               min_effect=request.min_effect, alpha=request.alpha)
    endpoints = prober.confirm()
    target = str(chosen[0]) if chosen else request.kernel
    if endpoints is None:
        sha = context.good.sha if context.good.sha in prober.skips else context.bad.sha
        which = "good" if sha == context.good.sha else "bad"
        raise HarnessError(f"the {which} endpoint {sha[:12]} has no valid timing of {target}: {prober.skips[sha]}")
    if endpoints.verdict != "regressed":
        message = (f"the bad commit {context.bad.sha[:12]} is not slower than the good commit "
                   f"{context.good.sha[:12]} for {target} on {context.chip}: {endpoints.verdict}, ratio "
                   f"{endpoints.ratio:.3f} (95% CI {endpoints.ci_low:.3f}-{endpoints.ci_high:.3f}), "
                   f"{endpoints.n_base}/{endpoints.n_head} samples; nothing to bisect")
        return _report(context, None, target=target, status="no-regression", message=message, runs=prober.runs,
                       reused=prober.reused, endpoints=endpoints)
    context.log(f"endpoints: bad is {endpoints.ratio:.3f}x good (95% CI {endpoints.ci_low:.3f}-"
                f"{endpoints.ci_high:.3f})")
    result = bisect.search([c.sha for c in context.commits], prober, probes_per_round=context.per_round,
                           max_rounds=request.max_rounds, on_round=context.on_round)
    evidence = None
    if result.culprit:
        evidence = prober.evidence(result.last_good or context.good.sha, result.culprit)
    message = _summary(result, "slower")
    if evidence is not None:
        message += (f": {evidence.ratio:.3f}x its predecessor (95% CI {evidence.ci_low:.3f}-{evidence.ci_high:.3f}, "
                    f"p {evidence.p_value:.2g}, {evidence.n_base}/{evidence.n_head} samples)")
    return _report(context, result, target=target, status=result.status, message=message, runs=prober.runs,
                   reused=prober.reused, evidence=evidence, endpoints=endpoints)


def _correctness(context: _Context) -> BisectReport:
    request = context.request
    counts = {"runs": 0, "reused": 0}

    def classify(shas: Sequence[str]) -> dict[str, bisect.Classification]:
        got = context.prober.runs(shas)
        jobs = run_jobs(context.prober.store, [ids[-1] for ids, _, _ in got.values() if ids])
        out = {}
        for sha, (ids, reused, why) in got.items():
            counts["runs"] += min(len(ids), 1)
            counts["reused"] += min(reused, 1)
            out[sha] = correctness_outcome(jobs[ids[-1]], request) if ids else \
                bisect.Classification("skip", why)
        return out

    target = describe_selection(request)
    ends = classify([context.good.sha, context.bad.sha])
    good, bad = ends[context.good.sha], ends[context.bad.sha]
    if good.state != "good":
        what = "cannot be tested" if good.state == "skip" else "already fails"
        raise HarnessError(f"the good endpoint {context.good.sha[:12]} {what}: {good.reason}")
    if bad.state != "bad":
        if bad.state == "skip":
            raise HarnessError(f"the bad endpoint {context.bad.sha[:12]} cannot be tested: {bad.reason}")
        message = (f"{target} passes at the bad commit {context.bad.sha[:12]} on {context.chip}: nothing to "
                   "bisect")
        return _report(context, None, target=target, status="no-regression", message=message, runs=counts["runs"],
                       reused=counts["reused"])
    result = bisect.search([c.sha for c in context.commits], classify, probes_per_round=context.per_round,
                           max_rounds=request.max_rounds, on_round=context.on_round)
    detail = ""
    if result.culprit:
        detail = (result.classifications.get(result.culprit) or bad).reason
    message = _summary(result, "failing") + (f": {detail}" if detail else "")
    return _report(context, result, target=target, status=result.status, message=message, runs=counts["runs"],
                   reused=counts["reused"], detail=detail)
