"""The cluster commands through the real CLI: `harness submit --wait` through the Ray Jobs API end to end,
`harness cluster up/down` and `harness node join --detach/leave` with real Ray processes (stopped by pid,
never `ray stop`), and the pieces that need no cluster (commands, environment, safety checks)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cli import submit as submit_cmd
from harness.cluster import nodes as cl
from harness.core.errors import HarnessError
from harness.spec import git
from testkit.faults import query
from testkit.faults import wait_for as poll_until
from testkit.procs import alive
from testkit.ray import (
    ROOT,
    commit_change,
    free_port,
    make_remote_repo,
    restore_env,
    set_env,
    sleepy_suite,
    start_cluster,
)

pytestmark = pytest.mark.xdist_group("cluster_cli")


def harness(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


# --- Jobs API end to end ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jobs_cluster(tmp_path_factory):
    """A loopback cluster with the dashboard (Jobs API) on a free port and two chips, and the repo to fetch."""
    tmp = tmp_path_factory.mktemp("jobs")
    previous = set_env(tmp)
    repo, sha = make_remote_repo(tmp / "remote")
    cluster = start_cluster(["tiny-a", "tiny-b"], dashboard=True)
    try:
        yield cluster, f"http://{cluster.webui_url}", repo, sha
    finally:
        cluster.shutdown()
        restore_env(previous)


def submit(api: str, repo: Path, sha: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return harness("submit", "--address", api, "--repo", str(repo), "--commit", sha, "--python", sys.executable,
                   "--wait", *extra, env=env)


def test_submit_wait_runs_the_commit_on_every_chip_into_postgres(jobs_cluster, pg_url, tmp_path):
    from sqlalchemy.engine import make_url

    from harness.record.models import Commit, JobRecord, Run
    from harness.record.outbox import open_store

    _cluster, api, repo, sha = jobs_cluster
    summary = tmp_path / "summary.md"
    # trust auth ignores the password: it is there to prove it never reaches a log or the job's command line
    db_url = make_url(pg_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    done = submit(api, repo, sha, "--suite", "tests/plugins/ray_sched.toml", "--db", db_url,
                  "--summary-md", str(summary))
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.splitlines()[0]
    assert job_id.startswith(f"harness-{sha[:12]}-")  # the Ray job id, first line, for CI to keep
    assert "[tiny-a] 2/2 passed" in done.stdout and "[tiny-b] 2/2 passed" in done.stdout  # streamed progress
    assert "SUCCEEDED" in done.stderr
    assert "s3cret-pw" not in done.stdout + done.stderr and "postgres:***@" in done.stdout
    text = summary.read_text()
    assert "| tiny-a |" in text and "| tiny-b |" in text and "SUCCEEDED" in text

    db = open_store(pg_url)
    try:
        with db.session() as session:
            runs = session.scalars(select(Run)).all()
            assert sorted(r.chip.key for r in runs) == ["tiny-a", "tiny-b"]  # one run per (commit, chip)
            for run in runs:
                assert session.get(Commit, run.commit_id).sha == sha and run.options["ray_job"] == job_id
                statuses = session.scalars(select(JobRecord.status).where(JobRecord.run_id == run.id)).all()
                assert statuses == ["passed", "passed"]
    finally:
        db.close()


def test_submit_wait_exits_1_when_a_correctness_job_fails(jobs_cluster, tmp_path):
    """(Also: without --db, the submitter's $HARNESS_DB is where the driver writes, as --help says.)"""
    _cluster, api, repo, sha = jobs_cluster
    db = tmp_path / "r.db"
    done = submit(api, repo, sha, "--suite", "tests/plugins/ray_sched_bad.toml", "--chips", "tiny-a",
                  env={"HARNESS_DB": f"sqlite:///{db}"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed   correctness/ray_sched/bad" in done.stdout
    assert "FAILED" in done.stderr
    assert f"database: sqlite:///{db} (from $HARNESS_DB here)" in done.stderr  # never wrapped inside the path
    assert query(f"sqlite:///{db}", "select status from job order by status") == [("failed",), ("passed",)]


SLOW_SUITE = sleepy_suite("ray-sched-slow", [(9, 30)])


def test_a_stopped_submission_leaves_no_run_running(jobs_cluster, tmp_path):
    """What `submit --wait --timeout` does past its timeout (stop the Ray job: SIGTERM to the driver, SIGKILL 3 s
    later): the run in progress is finished as "stopped", with its end time, not left "running" for good."""
    _cluster, api, repo, _sha = jobs_cluster
    sha = commit_change(repo, "a slow suite", {"tests/plugins/ray_sched_slow.toml": SLOW_SUITE})
    url = f"sqlite:///{tmp_path / 'r.db'}"
    done = harness("submit", "--address", api, "--repo", str(repo), "--commit", sha, "--python", sys.executable,
                   "--suite", "tests/plugins/ray_sched_slow.toml", "--chips", "tiny-a", "--db", url)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.splitlines()[0]
    marker_dir = Path(os.environ["HARNESS_TEST_MARKERS"])
    poll_until(lambda: list(marker_dir.glob("sleepy-N9-*")), timeout=180, what="the slow job to start")
    assert query(url, "select status from run") == [("running",)]

    client = submit_cmd.jobs_client(api)
    with pytest.raises(HarnessError, match="did not finish within 0 s; stopped it"):
        submit_cmd.wait_for(client, job_id, 0)  # what --timeout does
    poll_until(lambda: str(client.get_job_status(job_id).value) == "STOPPED", timeout=60, what="the job to stop")
    [(status, finished_at)] = query(url, "select status, finished_at from run")
    assert status == "stopped" and finished_at is not None
    logs = client.get_job_logs(job_id)
    assert "finished as stopped" in logs and "stopped by SIGTERM" in logs, logs[-2000:]


def test_submit_wait_exits_2_for_a_chip_with_no_node_or_a_missing_commit(jobs_cluster, tmp_path):
    _cluster, api, repo, sha = jobs_cluster
    done = submit(api, repo, sha, "--chips", "tiny-a,tiny-zz", "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no live node labelled chip=tiny-zz" in done.stdout
    assert not (tmp_path / "r.db").exists()  # failed before anything was scheduled or stored
    missing = "0123456789abcdef" * 2 + "01234567"
    done = submit(api, repo, missing, "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert done.returncode == 2 and f"commit {missing!r} does not exist in {repo}" in done.stdout


# --- cluster up / node join / down with real `ray start` processes ------------------------------------------


def test_cluster_up_status_down_start_and_stop_only_their_own_processes(tmp_path):
    """A one-machine cluster through the CLI: a loopback head that also runs jobs as chip tiny-cli."""
    previous = set_env(tmp_path)
    port, dashboard, client = free_port(), free_port(), free_port()
    launched: list[cl.Launched] = []
    try:
        up = harness("cluster", "up", "--port", str(port), "--dashboard-port", str(dashboard),
                     "--client-server-port", str(client), "--worker", "--chip-label", "tiny-cli",
                     f"--ray-arg=--dashboard-agent-listen-port={free_port()}", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"cluster address: 127.0.0.1:{port}" in up.stdout and f"http://127.0.0.1:{dashboard}" in up.stdout
        assert "runs jobs as chip=tiny-cli" in up.stdout and "Loopback only" in up.stdout
        head = cl.Launched.load(tmp_path / "cache" / "cluster" / f"head-{port}.json")
        launched.append(head)
        assert head.session_dir and alive(head.pid) and head.pgid == head.pid
        assert "RAY_AUTH_MODE=disabled" in Path(f"/proc/{head.pid}/environ").read_bytes().decode(errors="replace"
                                                                                                  ).replace("\0", " ")

        again = harness("cluster", "up", "--port", str(port), "--dashboard-port", str(dashboard))
        assert again.returncode == 2 and "already running" in again.stderr

        status = harness("cluster", "status", "--address", f"127.0.0.1:{port}", timeout=120)
        assert status.returncode == 0 and "tiny-cli: 1 node(s)" in status.stdout, status.stdout + status.stderr

        join = harness("node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", "tiny-x", "--dry-run")
        assert join.returncode == 0, join.stderr  # a loopback head takes nodes of this machine (test_real_cluster)

        down = harness("cluster", "down", timeout=120)
        assert down.returncode == 0 and "stopped" in down.stderr, down.stderr
        assert not alive(head.pid)
        with pytest.raises(ProcessLookupError):
            os.killpg(head.pgid, 0)  # nothing of its process group is left
        assert not list((tmp_path / "cache" / "cluster").glob("*.json"))
        assert harness("cluster", "down").returncode == 2  # nothing recorded any more: a clear error
        assert harness("node", "leave").returncode == 2
    finally:
        for proc in launched:  # a failed assertion must not leave Ray processes behind
            cl.stop(proc, timeout_s=20)
        restore_env(previous)


# --- no cluster needed ----------------------------------------------------------------------------------------


def test_node_join_on_macos_opts_in_to_multi_node_and_says_so(monkeypatch):
    monkeypatch.setattr(cl.platform, "system", lambda: "Darwin")
    done = harness("node", "join", "--address", "10.0.0.1:6380", "--chip-label", "apple-m4-pro-20c", "--dry-run",
                   env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert done.returncode == 0, done.stderr
    # (a subprocess does not see the monkeypatch: this checks Linux; the Darwin branch is checked in-process below)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1" in done.stdout  # `ray start --address` refuses 0 on any OS
    assert "--labels chip=apple-m4-pro-20c" in done.stdout and '{"harness_node": 1.0}' in done.stdout
    assert "RAY_USAGE_STATS_ENABLED=0" in done.stdout and "RAY_AUTH_MODE=disabled" in done.stdout
    env, notes = cl.ray_env("disabled", joining=True)
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1" and notes == [cl.MACOS_NOTE]
    env, notes = cl.ray_env("token", joining=False)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1" and notes


def _split_env(line: str) -> tuple[dict[str, str], list[str]]:
    """A printed command line, as a POSIX shell reads it: leading VAR=value words, then the argv."""
    words = shlex.split(line)
    n = 0
    while n < len(words) and "=" in words[n] and words[n].split("=", 1)[0].isidentifier():
        n += 1
    return dict(w.split("=", 1) for w in words[:n]), words[n:]


def test_dry_runs_print_shell_quoted_lines_that_split_back_to_the_exact_argv(tmp_path):
    extra = "--temp-dir=/tmp/a dir with spaces"
    cache = {"HARNESS_CACHE": str(tmp_path / "cache")}
    node = harness("node", "join", "--address", "10.0.0.1:6380", "--chip-label", "tiny-q", "--dry-run",
                   f"--ray-arg={extra}", env=cache)
    head = harness("cluster", "up", "--dry-run", "--port", "6390", "--worker", "--chip-label", "tiny-q",
                   f"--ray-arg={extra}", env=cache)
    expected = {
        "node": cl.node_command(address="10.0.0.1:6380", chip="tiny-q", extra=(extra,)),
        "head": cl.head_command(port=6390, host="127.0.0.1", dashboard_port=8265, chip="tiny-q", extra=(extra,)),
    }
    for name, done in (("node", node), ("head", head)):
        assert done.returncode == 0, done.stderr
        env, argv = _split_env(done.stdout.strip().splitlines()[-1])
        assert argv == expected[name], name  # `--resources {"harness_node": 1.0}` stays one word
        assert env["RAY_USAGE_STATS_ENABLED"] == "0" and env["RAY_AUTH_MODE"] == "disabled"
    assert "'{\"harness_node\": 1.0}'" in node.stdout
    assert not (tmp_path / "cache").exists()  # a dry run starts and records nothing


def test_submit_passes_the_submitters_harness_db_through_the_job_env_masked():
    secret = "postgresql://ci:s3cret@db.example:5432/results"
    env_vars, shown = submit_cmd.job_env("harness-x", None, {"HARNESS_DB": secret})
    assert env_vars["HARNESS_DB"] == secret and env_vars["HARNESS_RAY_JOB"] == "harness-x"
    assert "s3cret" not in shown and "ci:***@db.example" in shown and "$HARNESS_DB" in shown
    env_vars, shown = submit_cmd.job_env("harness-x", "sqlite:///r.db", {"HARNESS_DB": secret})
    assert env_vars["HARNESS_DB"] == "sqlite:///r.db" and "--db" in shown  # --db wins
    env_vars, shown = submit_cmd.job_env("harness-x", None, {})
    assert "HARNESS_DB" not in env_vars and "head" in shown  # then the head's own default applies
    done = harness("submit", "--help", env={"COLUMNS": "200"})
    text = " ".join(done.stdout.replace("│", " ").split())
    assert "Default: $HARNESS_DB of this shell; without either, the head's $HARNESS_DB" in text, text


def test_node_join_refuses_keys_ray_cannot_label():
    for bad in ("chip:m4", "ends-with-", "Upper"):
        done = harness("node", "join", "--address", "10.0.0.1:6380", "--chip-label", bad, "--dry-run")
        assert done.returncode == 2 and "chip key" in done.stderr, (bad, done.stderr)
    done = harness("node", "join", "--address", "http://10.0.0.1:8265", "--chip-label", "x", "--dry-run")
    assert done.returncode == 2 and "Jobs API address" in done.stderr


def test_cluster_down_never_signals_a_process_it_did_not_start(tmp_path):
    """A stale state file whose pid now belongs to someone else (here: this test) is removed, nobody signalled."""
    state = tmp_path / "head-1.json"
    cl.Launched("head", os.getpid(), os.getpgid(0), "127.0.0.1:1", str(tmp_path / "x.log"), ["ray", "start"]).save(
        state)
    assert "stale record" in cl.stop(cl.Launched.load(state))
    assert not state.exists()
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        fake = cl.Launched("head", sleeper.pid, sleeper.pid, "127.0.0.1:6380", "x", ["ray", "start"])
        assert not cl.is_ours(fake) and "stale" in cl.stop(fake)
        assert sleeper.poll() is None  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_submit_builds_a_quoted_entrypoint_and_reads_the_driver_summary():
    command = submit_cmd.entrypoint(python="python3", repo="/srv/repo with space", commit="a" * 40,
                                    suite="jobs/builtin.toml", chips="m4,h200", parallel=2, max_attempts=3)
    assert command.startswith("python3 -m harness.cluster.driver --repo '/srv/repo with space' --commit " + "a" * 40)
    assert "--chips m4,h200" in command and "HARNESS_DB" not in command and "--db" not in command
    logs = 'x\nHARNESS_SUMMARY {"runs": [{"run_id": "r1", "chip": "m4", "sha": "s", "planned": 2, ' \
           '"status": "complete", "counts": {"passed": 1, "lost": 1}}], "errors": {}, "exit_code": 1}\n'
    summary = submit_cmd.parse_summary(logs)
    assert summary["exit_code"] == 1
    markdown = submit_cmd.summary_markdown(summary, job_id="j", commit="abc", status="FAILED")
    assert "| m4 | `r1` | 1 | 0 | 0 | 0 | 0 | 1 | 2 |" in markdown


def test_checkout_gives_exactly_the_commit_and_refuses_a_dirty_tree(tmp_path):
    previous = set_env(tmp_path)
    try:
        repo, first = make_remote_repo(tmp_path / "remote")
        second = commit_change(repo, "second")
        tree, sha = git.checkout(str(repo), first)
        assert sha == first and git.resolve(tree, "HEAD").sha == first
        tree2, sha2 = git.checkout(str(repo), "main")  # a branch name resolves to the remote's newest commit
        assert sha2 == second and tree2 != tree
        (tree / "harness" / "spec" / "plan.py").write_text("# changed\n")
        with pytest.raises(HarnessError, match="local changes"):
            git.checkout(str(repo), first)
        with pytest.raises(HarnessError, match="is not in"):
            git.checkout(str(repo), "f" * 40)
    finally:
        restore_env(previous)


def test_a_cluster_run_refuses_uncommitted_changes(tmp_path):
    from harness.cluster.driver import prepare_source

    previous = set_env(tmp_path)
    try:
        repo, _sha = make_remote_repo(tmp_path / "remote")
        (repo / "harness" / "spec" / "plan.py").write_text("# uncommitted\n")
        with pytest.raises(HarnessError, match="uncommitted changes"):
            prepare_source(str(repo), None)
        with pytest.raises(HarnessError, match="needs --repo"):
            prepare_source(None, "abc")
    finally:
        restore_env(previous)


def test_node_join_of_a_loopback_head_keeps_loopback_and_gets_its_own_agent_port_and_temp_dir():
    first = cl.node_command(address="127.0.0.1:6390", chip="tiny-q")
    second = cl.node_command(address="127.0.0.1:6390", chip="tiny-q")
    assert first[1:3] == ["-m", cl.LOOPBACK_JOIN]  # `ray` that leaves 127.0.0.1 as is (Ray rewrites it otherwise)
    assert "--node-ip-address" not in first  # Ray would rewrite 127.0.0.1 there too; it takes the address it joins from
    ports = {c[c.index("--dashboard-agent-listen-port") + 1] for c in (first, second)}
    temps = {c[c.index("--temp-dir") + 1] for c in (first, second)}
    assert len(ports) == 2 and len(temps) == 2 and all(len(t) < 40 for t in temps)  # Ray's socket paths must fit
    given = cl.node_command(address="127.0.0.1:6390", chip="tiny-q",
                            extra=("--dashboard-agent-listen-port=5", "--temp-dir=/tmp/x"))
    assert given.count("--temp-dir") == 0 and "--temp-dir=/tmp/x" in given  # what the user passes wins
    lan = cl.node_command(address="10.0.0.1:6390", chip="tiny-q")
    assert Path(lan[0]).name == "ray" and "--temp-dir" not in lan  # a machine of its own: Ray's defaults
    env, _ = cl.ray_env("disabled", joining=False, loopback_head=True)
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # the head then binds every component to 127.0.0.1
    env, _ = cl.ray_env("token", joining=True, token_file=Path("/t/token"))
    assert env["RAY_AUTH_TOKEN_PATH"] == "/t/token" and "RAY_AUTH_TOKEN" not in env


def test_a_head_beyond_loopback_needs_token_auth_or_insecure(tmp_path):
    cache = {"HARNESS_CACHE": str(tmp_path / "cache")}
    refused = harness("cluster", "up", "--host", "10.0.0.5", "--auth-mode", "disabled", "--dry-run", env=cache)
    assert refused.returncode == 2 and "--auth-mode token" in refused.stderr and "--insecure" in refused.stderr
    assert len([line for line in refused.stderr.splitlines() if line.strip()]) <= 3  # one error, not a traceback
    allowed = harness("cluster", "up", "--host", "10.0.0.5", "--auth-mode", "disabled", "--insecure", "--dry-run",
                      env=cache)
    assert allowed.returncode == 0 and "RAY_AUTH_MODE=disabled" in allowed.stdout, allowed.stderr
    token = tmp_path / "token"
    token.write_text("abc\n")
    secure = harness("cluster", "up", "--host", "10.0.0.5", "--auth-mode", "token", "--token-file", str(token),
                     "--dry-run", env=cache)
    assert secure.returncode == 0 and f"RAY_AUTH_TOKEN_PATH={token}" in secure.stdout and "abc" not in secure.stdout
    missing = harness("node", "join", "--address", "10.0.0.5:6380", "--chip-label", "tiny-q", "--auth-mode", "token",
                      "--token-file", str(tmp_path / "nope"), "--dry-run", env=cache)
    assert missing.returncode == 2 and "cannot read the Ray auth token file" in missing.stderr
