"""The cluster driver: run a suite for one commit on every chip of a Ray cluster, one stored run per chip.

It runs on the head, started by ``harness submit`` through the Ray Jobs API (``python -m harness.cluster.driver``), or
in-process by ``harness run --executor ray``. Steps:

1. Connect (``ray.init(address=...)`` with the address given, or ``$RAY_ADDRESS`` set by the Jobs API).
2. Find the chips: every live node labelled ``chip=<key>`` (or only the ``--chips`` asked; an asked chip with
   no live node is an error before anything is scheduled).
3. Resolve the commit: the head fetches ``--repo`` into its clone cache and checks out exactly that commit.
4. Per chip, concurrently: probe its nodes (identity via ``harness.core.chip.detect(override_key=label)``, facts,
   checkout of the commit), plan the suite *from the commit's own tree* for the chip's class (cpu/gpu grid),
   then :func:`harness.pipeline.run.run_planned` with a :class:`RayExecutor` for that chip: one DB run per
   (commit, chip), the same store functions as a local run.
5. Print a one-line JSON summary (``HARNESS_SUMMARY {...}``) that ``harness submit --wait`` reads.

Stopped (SIGTERM: ``harness submit --timeout`` or ``ray job stop``; Ray SIGKILLs it 3 s later) or interrupted
(Ctrl-C), it finishes every run in progress at once as "stopped" / "interrupted", with its end time: no run is
left "running".

Exit status: 0 all jobs passed or skipped; 1 a job failed, crashed, timed out or was lost; 2 the run could not
be completed (no such chip, commit not found, database unreachable, stopped...).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.job import Job, JobResult, RunContext, job_from_dict
from harness.core.status import is_run_failure, run_failures
from harness.execute.local import worker_env
from harness.pipeline.run import (
    ClusterRunRequest,
    RunOutcome,
    RunStop,
    RunStopped,
    kept,
    run_planned,
    sigterm_stops_runs,
    stop_status,
)
from harness.record import outbox, store
from harness.spec import git

SUMMARY_PREFIX = "HARNESS_SUMMARY "
STOP_GRACE_S = 2.0  # once its runs are finished, how long a stopped driver waits for its chip threads to return
STOP_POLL_S = 0.5  # how often the main thread wakes up (to run a signal handler) while the chips run
ClusterProgress = Callable[[str, Job, JobResult, int, int], None]

# Planning imports the kernels of the commit under test, so it runs in a process whose import path is that tree.
PLAN_SNIPPET = """
import json, sys
from pathlib import Path
from harness.spec.plan import plan_suite
from harness.spec.suite import load_suite
suite = load_suite(sys.argv[1] or ("harness.toml" if Path("harness.toml").exists() else None))
jobs = plan_suite(suite, sys.argv[2], plugin_dir=str(Path(suite.source).resolve().parent))
print(json.dumps({"name": suite.suite.name, "source": suite.source, "jobs": [json.loads(j.to_json()) for j in jobs]}))
"""


@dataclass(frozen=True)
class Source:
    """The commit every node runs: where to fetch it, its full sha, its DB row, the head's checkout of it."""

    url: str
    sha: str
    commit: dict
    tree: Path


@dataclass(frozen=True)
class Plan:
    suite: str
    source: str
    jobs: list[Job]


@dataclass
class ClusterOutcome:
    runs: list[RunOutcome] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # chip -> why its run could not complete

    @property
    def bad_jobs(self) -> int:
        return sum(run_failures(run.counts) for run in self.runs)

    @property
    def exit_code(self) -> int:
        return 2 if self.errors else (1 if self.bad_jobs else 0)

    def summary(self) -> dict:
        return {"runs": [{"run_id": r.run_id, "chip": r.chip_key, "sha": r.sha, "planned": r.planned,
                          "status": r.status, "counts": dict(r.counts)} for r in self.runs],
                "errors": self.errors, "exit_code": self.exit_code}


def connect(address: str | None) -> bool:
    """Connect to the cluster at ``address`` (or ``$RAY_ADDRESS``); True if this call connected."""
    import ray  # loads ray: only when needed

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise HarnessError("no Ray cluster address: pass --address HEAD:PORT (or set RAY_ADDRESS)")
    if address.startswith(("http://", "https://")):
        raise HarnessError(f"{address} is a dashboard (Jobs API) address: `harness submit` takes it; "
                           "a driver connects to the cluster itself (HEAD:PORT)")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        ray.init(address=address, namespace="harness", log_to_driver=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise HarnessError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
    return True


def prepare_source(repo: str | None, rev: str | None, checkout_timeout_s: float = 900) -> Source:
    """Fetch ``repo`` into this machine's clone cache and check out exactly ``rev`` (default: HEAD of a local repo).

    A local path must be reachable at the same path from every node (one machine, shared disk); otherwise pass
    a URL every node can fetch. Uncommitted changes never reach a cluster: a dirty local HEAD is refused.
    """
    if not repo:
        raise HarnessError("a cluster run needs --repo: a git URL (or a path) every node can fetch the commit from")
    name = None  # the repository's identity (None: the clone's)
    branch: str | None = None  # the branch the run is for (None: the one ``rev`` names in the clone)
    if git.is_local_path(repo):
        path = Path(repo).expanduser().resolve()
        if not git.is_repo(path):
            raise HarnessError(f"--repo {path} is not a git repository")
        if rev is None and git.is_dirty(path):
            raise HarnessError(f"{path} has uncommitted changes and a cluster runs commits only: commit them, "
                               "or pass --commit")
        local = git.resolve(path, rev or "HEAD")  # a local name (HEAD, a branch) means what it means here
        rev, branch = local.sha, local.branch
        repo, name = str(path), local.repo
    elif not rev:
        raise HarnessError("--commit is required with a repository URL")
    tree, sha = git.checkout(repo, rev, checkout_timeout_s)
    info = git.resolve(tree, sha)  # a detached worktree: its branch is the one asked for
    if branch is None:
        branch = git.mirror_branch(repo, rev)
    return Source(repo, sha, {**info.as_row(), "repo": name or info.repo, "branch": branch}, tree)


def plan_in_tree(tree: Path, suite: str | None, chip_class: str) -> Plan:
    """Plan the suite with the commit's own kernels and suite file; plugin folders become tree-relative."""
    done = subprocess.run([sys.executable, "-c", PLAN_SNIPPET, suite or "", chip_class], cwd=tree,
                          env=worker_env(str(tree)), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"cannot plan suite {suite or 'builtin'} at this commit: {last}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    jobs = []
    for raw in data["jobs"]:
        plugin_dir = Path(raw.get("plugin_dir") or ".")
        if plugin_dir.is_absolute() and plugin_dir.resolve().is_relative_to(tree.resolve()):
            raw["plugin_dir"] = str(plugin_dir.resolve().relative_to(tree.resolve()))
        jobs.append(job_from_dict(raw))  # an older commit's harness plans the untyped form: read as well
    return Plan(data["name"], data["source"], jobs)


def run_on_cluster(request: ClusterRunRequest, *, progress: ClusterProgress | None = None,
                   log: Callable[[str], None] = print, checkout_timeout_s: float = 900,
                   deadline_s: float | None = None) -> ClusterOutcome:
    """Run ``request`` on every chip asked for; one stored run per chip, returned with errors."""
    import ray  # loads ray: only when needed

    from harness.execute.ray_executor import (  # loads ray: only when needed
        RayExecutor,
        chip_label_value,
        live_chips,
        no_node_message,
    )

    connected = connect(request.address)
    try:
        present = live_chips()
        wanted = [chip_label_value(c) for c in request.chips] or sorted(present)
        if not wanted:
            raise HarnessError("no chip-labelled nodes in the Ray cluster: start one with "
                               "`harness node join --address HEAD:PORT`")
        missing = [c for c in wanted if c not in present]
        if missing:
            raise HarnessError(no_node_message(missing[0], present))
        source = prepare_source(request.repo, request.commit, checkout_timeout_s)
        if request.repo_name:
            source = replace(source, commit={**source.commit, "repo": request.repo_name})
        log(f"commit {source.sha} from {store.mask_url(source.url) if '://' in source.url else source.url}")
        log(f"chips: {', '.join(f'{c} ({len(present[c])} node(s))' for c in wanted)}")
        db = outbox.open_store(request.db_url)
        log(f"database: {store.mask_url(db.url)}")
        plans: dict[str, Plan] = {}
        plan_lock = threading.Lock()
        outcome = ClusterOutcome()
        stop = RunStop()  # SIGTERM / Ctrl-C reach the main thread; the runs are in the chip threads

        def one_chip(chip: str) -> RunOutcome:
            executor = RayExecutor(chip, repo=source.url, sha=source.sha, parallel=request.parallel,
                                   max_attempts=request.max_attempts, checkout_timeout_s=checkout_timeout_s,
                                   deadline_s=deadline_s, log=log, stop=stop.event)
            ident, facts, probes = executor.identify()
            with plan_lock:
                if ident.chip_class not in plans:
                    plans[ident.chip_class] = plan_in_tree(source.tree, request.suite, ident.chip_class)
                plan = plans[ident.chip_class]
            jobs, only = kept(plan.jobs, request.keep)
            log(f"[{chip}] {ident.device_name} ({ident.backend}), {len(probes)} node(s): {len(jobs)} jobs")

            def on_progress(job: Job, result: JobResult, done: int, total: int) -> None:
                if progress:
                    progress(chip, job, result, done, total)

            options = {"suite": plan.source, "repo": source.commit["repo"], "nodes": [p["node"] for p in probes],
                       "ray_job": os.environ.get("HARNESS_RAY_JOB", ""), **only}
            context = RunContext(ident=ident, facts=facts, commit=source.commit, dirty=False, suite=plan.suite,
                                 executor="ray", options=options)
            return run_planned(db, jobs, executor, context, progress=on_progress, stop=stop)

        pool = ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="chip")
        futures: dict[str, Future] = {}
        try:
            with sigterm_stops_runs():  # after ray.init, which sets its own SIGTERM handler (a bare sys.exit)
                for chip in wanted:
                    futures[chip] = pool.submit(one_chip, chip)
                pending = set(futures.values())
                while pending:  # wake up regularly: a SIGTERM taken by another thread is handled here, not never
                    _done, pending = wait(pending, timeout=STOP_POLL_S)
                for chip, future in futures.items():
                    try:
                        outcome.runs.append(future.result())
                    except HarnessError as exc:
                        outcome.errors[chip] = str(exc)
                    except Exception as exc:  # noqa: BLE001 - one chip's failure must not hide the others' runs
                        outcome.errors[chip] = f"{type(exc).__name__}: {exc}"
        except KeyboardInterrupt as exc:  # first finish the runs (seconds count), then let the chip threads go
            status = stop_status(exc)
            finished = stop.request(status)
            log(f"{status}: run(s) {', '.join(finished) or '(none started)'} finished as {status}")
            wait(futures.values(), timeout=STOP_GRACE_S)  # the executors cancel their Ray tasks at their next poll
            raise
        finally:
            pool.shutdown(wait=not stop.event.is_set(), cancel_futures=True)
            db.close()
        return outcome
    finally:
        if connected:
            ray.shutdown()


def progress_line(chip: str, job: Job, result: JobResult, done: int, total: int) -> str:
    """One finished job of a cluster run: chip, done/total, status, key, node, attempt, a failure's detail."""
    node = f" on {result.node[:12]}" if result.node else ""
    again = f" (attempt {result.attempts})" if result.attempts > 1 else ""
    line = f"[{chip}] {done}/{total} {result.status:8s} {job.key}{node}{again}"
    if is_run_failure(result.status):
        line += f": {result.detail[:200]}"
    return line


def print_progress(chip: str, job: Job, result: JobResult, done: int, total: int) -> None:
    """The driver's progress, on its stdout: the Ray job's log, which ``harness submit --wait`` follows."""
    print(progress_line(chip, job, result, done, total), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cluster.driver", description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="Ray cluster HEAD:PORT (default: $RAY_ADDRESS, set by the Jobs API)")
    parser.add_argument("--repo", required=True, help="git URL or path every node can fetch the commit from")
    parser.add_argument("--commit", help="commit to run (full sha, branch or tag; default HEAD of a local --repo)")
    parser.add_argument("--suite", help="suite file, relative to the repository root (default: the built-in suite)")
    parser.add_argument("--chips", default="", help="comma-separated chip keys (default: every chip present)")
    parser.add_argument("--db", help="database URL (default: $HARNESS_DB)")
    parser.add_argument("--parallel", type=int, default=1, help="correctness jobs at once per node")
    parser.add_argument("--max-attempts", type=int, default=2, help="runs of a job whose node dies")
    parser.add_argument("--checkout-timeout", type=float, default=900.0, help="seconds to fetch and check out")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    request = ClusterRunRequest(suite=args.suite, db_url=args.db, commit=args.commit, repo=args.repo,
                                parallel=args.parallel, address=args.address,
                                chips=tuple(c for c in args.chips.split(",") if c), max_attempts=args.max_attempts)
    try:
        with sigterm_stops_runs():  # from the start: a stop while connecting or planning ends cleanly too
            outcome = run_on_cluster(request, progress=print_progress, checkout_timeout_s=args.checkout_timeout,
                                     log=lambda line: print(line, flush=True))  # the Jobs API log is a file
    except (HarnessError, KeyboardInterrupt) as exc:
        why = str(exc) or "interrupted (Ctrl-C)"
        print(f"error: {why}", flush=True)
        print(SUMMARY_PREFIX + json.dumps({"runs": [], "errors": {"*": why}, "exit_code": 2}), flush=True)
        return 143 if isinstance(exc, RunStopped) else (130 if isinstance(exc, KeyboardInterrupt) else 2)
    for run in outcome.runs:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(run.counts.items()))
        print(f"[{run.chip_key}] run {run.run_id}: {counts} (of {run.planned})", flush=True)
    for chip, why in outcome.errors.items():
        print(f"[{chip}] error: {why}", flush=True)
    print(SUMMARY_PREFIX + json.dumps(outcome.summary()), flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
