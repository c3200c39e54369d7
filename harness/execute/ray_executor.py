"""Execute on a Ray cluster: the same Executor seam as LocalExecutor, one chip per executor.

How nodes are found: every node that runs jobs joined with ``harness node join``, which gives it the Ray node
label ``chip=<key>`` (harness.core.chip key) and the custom resource ``harness_node: 1`` (the whole machine). A job
task asks for ``label_selector={"chip": key}`` and a share of ``harness_node``: a job of a timed kind
(harness.core.job.PHASES: calibration, benchmark...) takes all of it, so it runs alone on its node, as locally;
a correctness job takes 1/parallel. Kinds run in PHASES order.

On the node, the task checks the commit out (per-node clone cache + worktree, verified clean and exact), then
runs the job with :func:`harness.execute.local.run_in_subprocess`: one process per job with its timeout, as locally.

A node that dies mid-job surfaces as a Ray system error (NodeDiedError, WorkerCrashedError...): the job is
re-queued on another live node of its chip (the dead node is excluded by label selector) up to
``max_attempts`` times, else recorded as ``lost`` with the node it was lost on (each task tells the cluster's
key-value store where it started, as nothing else says where a task that never returned ran). ``on_result`` is
called exactly once per job; every
``ray.wait``/``ray.get`` has a timeout, and the chip's live nodes are re-checked on every poll, so a job
whose chip has no live node left is recorded, never left pending.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError
from ray.experimental import internal_kv  # the cluster's key-value store (GCS): where each attempt started
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from harness.core import chip as chip_id
from harness.core import defaults
from harness.core.chip import ChipIdentity, validate_key
from harness.core.errors import HarnessError
from harness.core.job import PHASES, Job, JobResult, KernelJob, job_from_dict
from harness.execute.local import OnResult, batches, run_batch, run_in_subprocess
from harness.spec import git

CHIP_LABEL = "chip"  # Ray node label key (label keys cannot contain ':')
NODE_RESOURCE = "harness_node"  # custom resource, 1 per joined node: the unit timed jobs take whole
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label, used to keep retries off a dead node
NODE_ENV = "HARNESS_RAY_NODE_ID"  # the job process learns which Ray node runs it
LABEL_VALUE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$")
NODE_IN_MESSAGE = re.compile(r"node ID: ([0-9a-f]{20,})", re.IGNORECASE)
GET_TIMEOUT_S = 60.0  # fetching a finished task's (small) result
KV_NAMESPACE = b"harness"  # the cluster's key-value store (GCS): where each job attempt started (its node)
KV_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


def chip_label_value(key: str) -> str:
    """A chip key usable as a Ray label value (harness key rules plus Ray's: ends with a letter or digit)."""
    try:
        validate_key(key)
    except ValueError as exc:
        raise HarnessError(str(exc)) from None
    if not LABEL_VALUE.match(key):
        raise HarnessError(f"chip key {key!r} cannot be a Ray label value (it must end with a letter or digit)")
    return key


def node_labels(key: str) -> dict[str, str]:
    """The Ray labels a node of chip ``key`` joins with."""
    return {CHIP_LABEL: chip_label_value(key)}


def node_resources() -> dict[str, float]:
    """The custom resources a harness node joins with."""
    return {NODE_RESOURCE: 1.0}


def live_chips() -> dict[str, list[str]]:
    """Chip key -> ids of the live harness nodes labelled with it, as the cluster (GCS) sees them now."""
    chips: dict[str, list[str]] = {}
    for node in ray.nodes():
        labels = node.get("Labels") or {}
        if node.get("Alive") and CHIP_LABEL in labels and (node.get("Resources") or {}).get(NODE_RESOURCE):
            chips.setdefault(labels[CHIP_LABEL], []).append(node["NodeID"])
    return chips


def no_node_message(chip: str, present: dict[str, list[str]]) -> str:
    have = ", ".join(f"{k} ({len(v)} node{'s' if len(v) > 1 else ''})" for k, v in sorted(present.items()))
    return (f"no live node labelled chip={chip} in the Ray cluster (live chips: {have or 'none'}); "
            f"join one with `harness node join --address HEAD:PORT --chip-label {chip}`")


# --- what runs on the node -----------------------------------------------------------------------------------


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _tree_for(repo: str | None, sha: str | None, timeout: float) -> tuple[str | None, str | None]:
    """The verified worktree of ``sha`` on this node (None: run the node's installed code, no commit)."""
    if not repo:
        return None, None

    tree, head = git.checkout(repo, sha, timeout)
    git.verify_tree(tree, sha)  # exact and clean, checked again right before every job
    return str(tree), head


def _kv():
    """The GCS client of this Ray process (its key-value store calls take a timeout, unlike internal_kv's own)."""
    client = internal_kv.internal_kv_get_gcs_client()
    if client is None:
        raise RuntimeError("not connected to a Ray cluster")
    return client


def _started_on(attempt_key: str, node: str) -> None:
    """Tell the driver where this attempt runs, before anything can go wrong (best effort: never fails the job)."""
    if not attempt_key:
        return
    try:
        _kv().internal_kv_put(attempt_key.encode(), node.encode(), True, KV_NAMESPACE, timeout=KV_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - bookkeeping only: a lost job then records no node
        log.debug("cannot record where %s started", attempt_key, exc_info=True)


def _in_tree(job: Job, tree: str | None) -> Job:
    """The job with its plugin folder (planned relative to the commit's tree) inside this node's checkout."""
    if tree and isinstance(job, KernelJob) and job.plugin_dir and not os.path.isabs(job.plugin_dir):
        return replace(job, plugin_dir=os.path.join(tree, job.plugin_dir))
    return job


def _leave_if_the_node_died(raylet: int, result: JobResult) -> None:
    """A job process that died while this worker's raylet (its parent when the task began) died too was killed with
    the node: Ray's core worker kills its children once it sees the raylet gone, then exits, and the task's result,
    sent straight to the driver, can win that race (in CI a killed node's job came back "crashed", not re-run).
    Leave without a result instead: the driver sees the worker die and re-runs the job on a live node."""
    if result.status == "crashed" and os.getppid() != raylet:
        os._exit(1)


def run_job_on_node(job_json: str, repo: str | None, sha: str | None, checkout_timeout_s: float,
                    attempt_key: str = "") -> dict:
    """The Ray task body: check the commit out, run one job in its own process, return the result and where."""
    raylet = os.getppid()
    node = _node_id()
    _started_on(attempt_key, node)
    os.environ[NODE_ENV] = node
    tree, head = _tree_for(repo, sha, checkout_timeout_s)
    job = _in_tree(job_from_dict(json.loads(job_json)), tree)
    result = run_in_subprocess(job, tree=tree)
    _leave_if_the_node_died(raylet, result)
    result.node = node
    return {"result": result.to_dict(), "node": node, "host": socket.gethostname(), "sha": head}


def run_jobs_on_node(jobs_json: list[str], repo: str | None, sha: str | None, checkout_timeout_s: float,
                     attempt_key: str = "") -> list[dict]:
    """The Ray task body of a batch (one round's benchmark jobs): check the commit out once, run the jobs in one job
    process (a crash re-runs the rest alone: ``harness.execute.local.run_batch``), return each result and where."""
    raylet = os.getppid()
    node = _node_id()
    _started_on(attempt_key, node)
    os.environ[NODE_ENV] = node
    tree, head = _tree_for(repo, sha, checkout_timeout_s)
    jobs = [_in_tree(job_from_dict(json.loads(data)), tree) for data in jobs_json]
    payloads: list[dict] = []

    def collect(job: Job, result: JobResult) -> None:
        _leave_if_the_node_died(raylet, result)
        result.node = node
        payloads.append({"unit": job.unit, "result": result.to_dict(), "node": node, "host": socket.gethostname(),
                         "sha": head})

    run_batch(jobs, collect, tree)
    return payloads


def probe_node(chip: str, repo: str | None, sha: str | None, checkout_timeout_s: float) -> dict:
    """The node's chip identity (its label as the key) and host facts; with a repo, the commit checked out."""
    ident = chip_id.detect(override_key=chip)
    _tree, head = _tree_for(repo, sha, checkout_timeout_s)
    return {"ident": ident.to_dict(), "facts": chip_id.machine_facts(), "node": _node_id(), "sha": head}


_run_job_task = ray.remote(num_cpus=0, max_retries=0)(run_job_on_node)
_run_batch_task = ray.remote(num_cpus=0, max_retries=0)(run_jobs_on_node)
_probe_task = ray.remote(num_cpus=0, max_retries=0)(probe_node)


# --- the executor --------------------------------------------------------------------------------------------


@dataclass
class _Attempt:
    job: Job
    number: int
    node: str = ""  # the node the previous attempt ran on (a lost job records the last node it ran on)
    batch: tuple[Job, ...] = ()  # one round's benchmark jobs run in one task and job process (``job`` the first)

    @property
    def jobs(self) -> tuple[Job, ...]:
        return self.batch or (self.job,)


def _slot(parallel: int) -> float:
    """The share of a node one correctness job takes (Ray custom resources have 4 decimals)."""
    return math.floor(10_000 / max(1, parallel)) / 10_000


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class RayExecutor:
    """Run jobs on the live nodes labelled ``chip=<chip>`` of the connected Ray cluster.

    ``repo``/``sha``: every node checks out exactly that commit (``sha`` must be a full sha) and runs the job from
    it; without ``repo`` the node's installed code runs (tests, ad-hoc use). Requires ``ray.init`` done.
    """

    def __init__(self, chip: str, *, repo: str | None = None, sha: str | None = None, parallel: int = 1,
                 max_attempts: int = 2, poll_s: float = 0.5, deadline_s: float | None = None,
                 checkout_timeout_s: float = 900.0, log: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None):
        self.chip = chip_label_value(chip)
        if repo and not sha:
            raise HarnessError("a RayExecutor with a repo needs the full sha to run")
        self.repo, self.sha = repo, sha
        self.parallel = max(1, parallel)
        self.max_attempts = max(1, max_attempts)
        self.poll_s = poll_s
        self.deadline_s = deadline_s
        self.checkout_timeout_s = checkout_timeout_s
        self.log = log or (lambda message: None)
        self.stop = stop  # set: the run was stopped (SIGTERM, Ctrl-C); cancel what runs and schedule nothing more
        self._token = uuid.uuid4().hex  # this executor's attempt keys in the cluster's key-value store
        self.dead: set[str] = set()  # nodes seen dead during this run: retries never go back there
        self._live: list[str] = []
        self._live_at = -math.inf

    # -- nodes --

    def live_nodes(self, max_age_s: float = 0.0) -> list[str]:
        """The chip's live nodes (minus those seen dead); ``max_age_s`` > 0 may reuse a recent answer."""
        now = time.monotonic()
        if max_age_s <= 0 or now - self._live_at > max_age_s:
            self._live, self._live_at = live_chips().get(self.chip, []), now
        return [n for n in self._live if n not in self.dead]

    def check_nodes(self) -> list[str]:
        """The chip's live nodes; a clear HarnessError at once when there is none (nothing gets scheduled)."""
        if not ray.is_initialized():
            raise HarnessError("not connected to a Ray cluster (ray.init(address=...) first)")
        nodes = self.live_nodes()
        if not nodes:
            raise HarnessError(no_node_message(self.chip, live_chips()))
        return nodes

    def identify(self) -> tuple[ChipIdentity, dict, list[dict]]:
        """Probe every live node of the chip (identity, facts, checkout); the first node's identity keys the run."""
        nodes = self.check_nodes()
        refs = {
            _probe_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                                name=f"harness-probe:{self.chip}").remote(self.chip, self.repo, self.sha,
                                                                          self.checkout_timeout_s): node
            for node in nodes
        }
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.checkout_timeout_s + 60)
        for ref in pending:
            ray.cancel(ref, force=True)
        if pending:
            slow = ", ".join(refs[r][:12] for r in pending)
            raise HarnessError(f"chip {self.chip}: node(s) {slow} did not answer within "
                               f"{self.checkout_timeout_s + 60:g} s (identity and checkout of {self.sha or 'code'})")
        probes = []
        for ref in ready:
            try:
                probes.append(ray.get(ref, timeout=GET_TIMEOUT_S))
            except RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) else exc
                raise HarnessError(f"chip {self.chip}: node {refs[ref][:12]} cannot run "
                                   f"{(self.sha or 'jobs')[:12]}: {_error_line(cause)}") from None
            except RayError as exc:
                self.log(f"chip {self.chip}: node {refs[ref][:12]} lost while probing ({_error_line(exc)})")
        if not probes:
            raise HarnessError(no_node_message(self.chip, live_chips()))
        first = ChipIdentity(**probes[0]["ident"])
        for other in probes[1:]:
            ident = ChipIdentity(**other["ident"])
            if (ident.backend, ident.device_name) != (first.backend, first.device_name):
                self.log(f"warning: nodes labelled chip={self.chip} differ: {first.device_name} ({first.backend}) "
                         f"on {probes[0]['facts'].get('hostname')} vs {ident.device_name} ({ident.backend}) on "
                         f"{other['facts'].get('hostname')}; they pool their samples under one key")
        return first, probes[0]["facts"], probes

    # -- running --

    def execute(self, jobs: list[Job], on_result: OnResult) -> None:
        """The kinds in :data:`harness.core.job.PHASES` order, as locally: a timed kind (calibration, benchmark) takes
        its node whole, one job at a time; the others run ``parallel`` per node. A kind not listed runs last,
        timed: no job is ever left out."""
        self.check_nodes()
        budget = sum(j.timeout_s for j in jobs) * self.max_attempts + self.checkout_timeout_s + 300
        deadline = time.monotonic() + (self.deadline_s if self.deadline_s is not None else budget)
        phases = list(PHASES) + [(kind, True) for kind in dict.fromkeys(j.kind for j in jobs)
                                 if kind not in dict(PHASES)]
        try:
            for kind, timed in phases:
                share, per_node = (1.0, 1) if timed else (_slot(self.parallel), self.parallel)
                self._dispatch([j for j in jobs if j.kind == kind], share, per_node, on_result, deadline)
        finally:
            self._forget()

    # -- where an attempt ran --

    def _attempt_key(self, attempt: _Attempt) -> str:
        return f"harness-attempt/{self._token}/{attempt.number}/{attempt.job.unit}"

    def _ran_on(self, attempt: _Attempt) -> str:
        """The node this attempt started on (as the task recorded it), else the node of its previous attempt."""
        try:
            value = _kv().internal_kv_get(self._attempt_key(attempt).encode(), KV_NAMESPACE, timeout=KV_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the cluster store unreachable: fall back on what we know
            value = None
        return value.decode() if value else attempt.node

    def _forget(self) -> None:
        try:
            _kv().internal_kv_del(f"harness-attempt/{self._token}/".encode(), True, KV_NAMESPACE, timeout=KV_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - best effort: a few stale keys in the cluster store
            pass

    def _submit(self, attempt: _Attempt, share: float) -> ray.ObjectRef:
        selector = {CHIP_LABEL: self.chip}
        if self.dead:
            selector[NODE_ID_LABEL] = f"!in({','.join(sorted(self.dead))})"
        if attempt.batch:
            return _run_batch_task.options(label_selector=selector, resources={NODE_RESOURCE: share},
                                           name=f"harness-batch:{attempt.job.unit}"[:200]).remote(
                [job.to_json() for job in attempt.batch], self.repo, self.sha, self.checkout_timeout_s,
                self._attempt_key(attempt))
        return _run_job_task.options(label_selector=selector, resources={NODE_RESOURCE: share},
                                     name=f"harness:{attempt.job.unit}"[:200]).remote(
            attempt.job.to_json(), self.repo, self.sha, self.checkout_timeout_s, self._attempt_key(attempt))

    def _dispatch(self, jobs: list[Job], share: float, per_node: int, on_result: OnResult, deadline: float) -> None:
        queue = deque(_Attempt(group[0], 1, batch=tuple(group) if len(group) > 1 else ())
                      for group in batches(jobs, defaults.ROUND_BATCH))  # a round's benchmark jobs: one process
        inflight: dict[ray.ObjectRef, _Attempt] = {}
        while queue or inflight:
            if self.stop is not None and self.stop.is_set():
                self._cancel(inflight)
                raise HarnessError(f"chip {self.chip}: the run was stopped before its jobs finished")
            live = self.live_nodes(max_age_s=self.poll_s)  # the cluster view, at most one poll old
            if not live or time.monotonic() > deadline:
                why = (f"no live node of chip {self.chip} left in the cluster" if not live
                       else "the run's deadline passed before the job finished (nodes unresponsive or cluster busy)")
                self._give_up(inflight, queue, why, on_result)
                return
            # What the live nodes can run now, plus one queued behind each slot so a freed slot starts the next
            # job at once; never the whole queue, so retries and node loss are decided here, not in Ray's queue.
            while queue and len(inflight) < 2 * len(live) * per_node:
                attempt = queue.popleft()
                inflight[self._submit(attempt, share)] = attempt
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.poll_s)
            for ref in ready:
                self._collect(ref, inflight.pop(ref), queue, on_result)

    def _collect(self, ref: ray.ObjectRef, attempt: _Attempt, queue: deque, on_result: OnResult,
                 retry: bool = True) -> None:
        try:
            got = ray.get(ref, timeout=GET_TIMEOUT_S)
        except RayTaskError as exc:  # our code raised on a healthy node: e.g. the checkout refused the tree
            cause = exc.cause if getattr(exc, "cause", None) else exc
            for job in attempt.jobs:
                on_result(job, JobResult(job.key, "crashed", f"node could not run the job: {_error_line(cause)}",
                                         attempts=attempt.number))
            return
        except (RayError, GetTimeoutError) as exc:  # the node or its worker died, or the result is unreachable
            match = NODE_IN_MESSAGE.search(str(exc))
            node = match.group(1) if match else self._ran_on(attempt)
            if node and "NodeDied" in type(exc).__name__:
                self.dead.add(node)
            reason = f"node {node[:12] or '?'} failed mid-job ({_error_line(exc)})"
            live = self.live_nodes()
            if retry and attempt.number < self.max_attempts and live:
                self.log(f"{attempt.job.key}{' and the rest of its batch' if attempt.batch else ''}: {reason}; "
                         f"re-running on another node of chip {self.chip} "
                         f"(attempt {attempt.number + 1} of {self.max_attempts})")
                queue.appendleft(_Attempt(attempt.job, attempt.number + 1, node, attempt.batch))
                return
            why = (f"no other live node of chip {self.chip}" if not live
                   else f"gave up after {attempt.number} attempt(s)")
            for job in attempt.jobs:
                on_result(job, JobResult(job.key, "lost", f"{reason}; {why}", node=node, attempts=attempt.number))
            return
        payloads = {payload["unit"]: payload for payload in got} if attempt.batch else {attempt.job.unit: got}
        for job in attempt.jobs:
            self._report(job, payloads[job.unit], attempt.number, on_result)

    def _report(self, job: Job, payload: dict, number: int, on_result: OnResult) -> None:
        result = JobResult.from_dict(payload["result"])
        result.node, result.attempts = payload["node"], number
        if self.sha and payload.get("sha") != self.sha:
            result = JobResult(job.key, "crashed", f"node ran {payload.get('sha')} instead of {self.sha}",
                               node=payload["node"], attempts=number)
        on_result(job, result)

    def _give_up(self, inflight: dict, queue: deque, why: str, on_result: OnResult) -> None:
        if inflight:  # results that arrived meanwhile are kept (no retry: there is nowhere left to run)
            done, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=0)
            for ref in done:
                self._collect(ref, inflight.pop(ref), queue, on_result, retry=False)
        for ref, attempt in list(inflight.items()):
            _cancel(ref)
            node = self._ran_on(attempt)
            for job in attempt.jobs:
                on_result(job, JobResult(job.key, "lost", why, node=node, attempts=attempt.number))
        inflight.clear()
        while queue:  # never started again: the node of its last attempt, if it had one
            attempt = queue.popleft()
            for job in attempt.jobs:
                on_result(job, JobResult(job.key, "lost", why, node=attempt.node, attempts=attempt.number - 1))

    def _cancel(self, inflight: dict) -> None:
        for ref in inflight:
            _cancel(ref)
        inflight.clear()


def _cancel(ref: ray.ObjectRef) -> None:
    try:
        ray.cancel(ref, force=True)
    except Exception:  # noqa: BLE001 - best effort: the task may have finished or its node be gone
        pass
