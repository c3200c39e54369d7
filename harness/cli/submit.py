"""`harness submit`: run a commit on a Ray cluster through the Jobs API (what CI calls), optionally wait for it."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.cluster import TokenFileOption
from harness.cli.common import app, console
from harness.cluster import nodes as cluster
from harness.cluster.driver import SUMMARY_PREFIX
from harness.core.errors import HarnessError
from harness.record.store import mask_url
from harness.spec import git

REQUEST_TIMEOUT_S = 30.0
POLL_S = 2.0
SUBMIT_RETRY_S = 120.0  # a head that just started has no job agent yet
DB_HELP = ("Database URL the driver writes to, passed in the job's environment (never its command line; shown "
           "masked). Default: $HARNESS_DB of this shell; without either, the head's $HARNESS_DB, else the head's "
           "default SQLite file. A sqlite:/// URL names a file on the head.")


def jobs_client(address: str, token: str = ""):
    """A JobSubmissionClient whose every HTTP request has a timeout (the SDK sets none) and, with token auth, the
    cluster's token (``Authorization: Bearer``)."""
    from ray.job_submission import JobSubmissionClient  # loads ray: only when this command runs

    class _Client(JobSubmissionClient):
        def _do_request(self, method, endpoint, **kwargs):
            kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
            return super()._do_request(method, endpoint, **kwargs)

    try:
        return _Client(address, headers=cluster.auth_headers(token) or None)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, requests errors, version mismatch
        hint = "" if token or "uthenticat" not in str(exc) else " (a token-auth cluster: pass --auth-mode token)"
        raise HarnessError(f"cannot reach the Ray Jobs API at {address}: {exc}{hint}") from None


def default_repo() -> str:
    """The origin URL of the repository in the current folder (what CI checked out)."""
    if git.is_repo("."):
        url = git.remote_url(".")
        if url:
            return url
    raise HarnessError("pass --repo: a git URL every node can fetch (the current folder has no origin remote)")


def resolve_commit(repo: str, commit: str) -> str:
    """A full sha when the commit can be resolved here (a local repo, or the current checkout of ``repo``)."""
    candidates = [repo] if git.is_local_path(repo) else []
    if git.is_repo(".") and git.remote_url(".") == repo:
        candidates.append(".")
    for path in candidates:
        try:
            return git.resolve(path, commit).sha
        except HarnessError:
            continue
    return commit


def job_env(submission_id: str, db: str | None, environ: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """The job's environment variables and where its results go (password masked), from ``--db`` or this shell's
    ``$HARNESS_DB``: the database URL travels in the environment, never on the command line (``ps``, logs)."""
    environ = os.environ if environ is None else environ
    env_vars = {"RAY_USAGE_STATS_ENABLED": "0", "HARNESS_RAY_JOB": submission_id}  # stored with each run
    source = "--db" if db else "$HARNESS_DB here"
    db = db or environ.get("HARNESS_DB") or None
    if not db:
        return env_vars, "the head's default ($HARNESS_DB there, else its SQLite file)"
    env_vars["HARNESS_DB"] = db
    return env_vars, f"{mask_url(db)} (from {source})"


# The driver's Python when --python is not given: the head's own (`harness cluster up` puts it in the head's
# environment), else `python` as found there (a head started by plain `ray start`). Expanded by the head's shell.
HEAD_PYTHON = f'"${{{cluster.HEAD_PYTHON_ENV}:-python}}"'


def entrypoint(*, python: str | None, repo: str, commit: str, suite: str | None, chips: str | None, parallel: int,
               max_attempts: int) -> str:
    """The job's shell command: ``python -m harness.cluster.driver ...`` (``python`` None: :data:`HEAD_PYTHON`)."""
    parts = ["-m", "harness.cluster.driver", "--repo", repo, "--commit", commit, "--parallel", str(parallel),
             "--max-attempts", str(max_attempts)]
    if suite:
        parts += ["--suite", suite]
    if chips:
        parts += ["--chips", chips]
    return " ".join([HEAD_PYTHON if python is None else shlex.quote(python), *(shlex.quote(p) for p in parts)])


def parse_summary(logs: str) -> dict | None:
    for line in reversed(logs.splitlines()):
        if line.startswith(SUMMARY_PREFIX):
            try:
                return json.loads(line[len(SUMMARY_PREFIX):])
            except json.JSONDecodeError:
                return None
    return None


def summary_markdown(summary: dict | None, *, job_id: str, commit: str, status: str) -> str:
    lines = [f"### MLX kernel harness: `{commit[:12]}` on the cluster", "",
             f"Ray job `{job_id}`: **{status}**", ""]
    if summary and summary.get("runs"):
        lines += ["| chip | run | passed | failed | skipped | crashed | timeout | lost | planned |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for run in summary["runs"]:
            c = run.get("counts", {})
            lines.append(f"| {run['chip']} | `{run['run_id'][:12]}` | {c.get('passed', 0)} | {c.get('failed', 0)} "
                         f"| {c.get('skipped', 0)} | {c.get('crashed', 0)} | {c.get('timeout', 0)} "
                         f"| {c.get('lost', 0)} | {run['planned']} |")
    for chip, why in ((summary or {}).get("errors") or {}).items():
        lines.append(f"- **{chip}**: {why}")
    if summary is None:
        lines.append("No summary from the driver: see the job log.")
    return "\n".join(lines) + "\n"


def wait_for(client, job_id: str, timeout_s: float) -> tuple[str, str]:
    """Stream the job's log until it ends; (final status, whole log). Stops the job past ``timeout_s``."""
    seen, logs, errors_since = 0, "", None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = str(client.get_job_status(job_id).value)
            logs = client.get_job_logs(job_id)
            errors_since = None
        except Exception as exc:  # noqa: BLE001 - a restarting dashboard: retry for a while
            errors_since = errors_since or time.monotonic()
            if time.monotonic() - errors_since > 120:
                raise HarnessError(f"lost contact with the Jobs API while waiting for {job_id}: {exc}") from None
            time.sleep(POLL_S)
            continue
        if len(logs) > seen:
            sys.stdout.write(logs[seen:])
            sys.stdout.flush()
            seen = len(logs)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status, logs
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise HarnessError(f"job {job_id} did not finish within {timeout_s:g} s; stopped it")
        time.sleep(POLL_S)


def submit_with_retry(client, address: str, *, retry_s: float = SUBMIT_RETRY_S, **job) -> str:
    """Submit once; while the head is still starting ("No available agent... try again later"), retry."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return client.submit_job(**job)
        except Exception as exc:  # noqa: BLE001 - HTTP errors from the SDK
            text = str(exc)
            if "already exists" in text:  # an earlier attempt got through but its answer was lost
                return job["submission_id"]
            if "try again later" not in text or time.monotonic() > deadline:
                raise HarnessError(f"the Jobs API at {address} refused the submission: {exc}") from None
            time.sleep(POLL_S)


@app.command()
def submit(
    address: Annotated[str, typer.Option(help="Jobs API (dashboard) address, e.g. http://HEAD:8265.")],
    commit: Annotated[str, typer.Option(help="Commit to run (full sha from CI; a name is resolved locally "
                                             "when possible, else on the head).")],
    suite: Annotated[str | None, typer.Option(help="Suite file, relative to the repository root "
                                                   "(default: the built-in suite of that commit).")] = None,
    chips: Annotated[str | None, typer.Option(help="Comma-separated chip keys (default: every chip present).")]
    = None,
    db: Annotated[str | None, typer.Option("--db", help=DB_HELP)] = None,
    repo: Annotated[str | None, typer.Option(help="Git URL (or shared path) the nodes fetch the commit from "
                                                  "(default: origin of the current checkout).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Stream the job's log; exit 1 if a job failed, 2 if the "
                                                      "run could not complete.")] = False,
    parallel: Annotated[int, typer.Option(help="Correctness jobs at once per node.")] = 1,
    max_attempts: Annotated[int, typer.Option(help="Runs of a job whose node dies (then: lost).")] = 2,
    python: Annotated[str | None, typer.Option(help="Python on the head that has the harness installed. Default: "
                                                    "the one that started the head (`harness cluster up` records "
                                                    "it), else `python` on the head's PATH.")] = None,
    timeout: Annotated[float, typer.Option(help="With --wait: seconds before the job is stopped.")] = 6 * 3600,
    summary_md: Annotated[Path | None, typer.Option(help="With --wait: append a markdown summary here "
                                                         "(e.g. $GITHUB_STEP_SUMMARY).")] = None,
    auth_mode: Annotated[str | None, typer.Option(help="The cluster's Ray auth: disabled or token (default "
                                                       "$RAY_AUTH_MODE, else disabled).")] = None,
    token_file: TokenFileOption = None,
) -> None:
    """Submit a commit to the cluster's Ray Jobs API; prints the Ray job id."""
    token, _file = cluster.find_token(cluster.auth_mode(auth_mode), token_file)
    repo = repo or default_repo()
    if git.is_local_path(repo):
        repo = str(Path(repo).expanduser().resolve())
        console.print(f"note: --repo {repo} is a path: every node must see it at that path (shared disk)",
                      soft_wrap=True)
    sha = resolve_commit(repo, commit)
    submission_id = f"harness-{sha[:12]}-{uuid.uuid4().hex[:8]}"
    env_vars, database = job_env(submission_id, db)
    client = jobs_client(address, token)
    command = entrypoint(python=python, repo=repo, commit=sha, suite=suite, chips=chips, parallel=parallel,
                         max_attempts=max_attempts)
    metadata = {"harness_commit": sha, "harness_repo": mask_url(repo) if "://" in repo else repo}
    job_id = submit_with_retry(client, address, entrypoint=command, submission_id=submission_id,
                               runtime_env={"env_vars": env_vars}, metadata=metadata)
    print(job_id, flush=True)
    console.print(f"submitted {sha[:12]} as Ray job {job_id}; database: {database}", soft_wrap=True)  # copyable
    if not wait:
        return
    status, logs = wait_for(client, job_id, timeout)
    summary = parse_summary(logs)
    if summary_md:
        with open(summary_md, "a", encoding="utf-8") as handle:
            handle.write(summary_markdown(summary, job_id=job_id, commit=sha, status=status))
    if status == "SUCCEEDED":
        code = 0
    else:
        code = int(summary["exit_code"]) if summary and summary.get("exit_code") else 2
    console.print(f"Ray job {job_id}: {status}" + ("" if code == 0 else f" (exit {code})"))
    raise typer.Exit(code)
