"""A token-auth cluster of real processes through the harness CLI only: `cluster up --auth-mode token` (loopback),
two `node join --detach` of two chips on the same machine, `harness submit --wait` with the token, what listens
where (nothing beyond loopback), and `node leave` / `cluster down` to clean up (never `ray stop`)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.cluster import nodes as cl
from testkit.procs import alive
from testkit.ray import (
    ROOT,
    free_port,
    is_loopback_listener,
    listeners,
    make_remote_repo,
    process_tree,
    restore_env,
    set_env,
    sleepy_suite,
)

# Whole clusters of real processes on fixed loopback ports: they run alone, after the parallel suite
# (tools/test.sh), so no other test's Ray cluster can take a port or a Jobs API they use.
pytestmark = pytest.mark.exclusive


def harness(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def head_up(port: int, dashboard: int, auth_mode: str) -> subprocess.CompletedProcess:
    """`harness cluster up` of a loopback head on these ports (its dashboard agent on a free port of its own)."""
    return harness("cluster", "up", "--port", str(port), "--dashboard-port", str(dashboard), "--auth-mode", auth_mode,
                   f"--ray-arg=--dashboard-agent-listen-port={free_port()}", timeout=180)


def _status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads listening sockets from Linux's ss and /proc")
def test_a_token_cluster_of_two_chips_on_loopback_through_the_cli(tmp_path):
    previous = set_env(tmp_path)
    for key in (cl.TOKEN_ENV, cl.TOKEN_PATH_ENV):  # the token is the one `cluster up` makes or names, nothing else
        previous.setdefault(key, os.environ.pop(key, None))
    port, dashboard = free_port(), free_port()
    api = f"http://127.0.0.1:{dashboard}"
    state = tmp_path / "cache" / "cluster"
    launched: list[cl.Launched] = []
    try:
        up = head_up(port, dashboard, "token")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "auth mode token" in up.stdout and "auth token:" in up.stdout
        head = cl.Launched.load(state / f"head-{port}.json")
        launched.append(head)
        token_file = Path(head.token_file)
        token = token_file.read_text().strip()
        assert head.auth_mode == "token" and token and token not in up.stdout + up.stderr  # shown: the file only
        if token_file.parent == state:  # made by `cluster up`: readable by this user only
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        # the readiness check passed with the token; without it the dashboard refuses
        assert _status(f"{api}/api/version", {}) == 401
        assert _status(f"{api}/api/version", cl.auth_headers(token)) == 200

        if not cl.RAY_DEFAULT_TOKEN.exists():  # a node without the token is refused at once, nothing started
            refused = harness("node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", "tiny-a",
                              "--auth-mode", "token", "--detach")
            assert refused.returncode == 2 and "needs the head's token" in refused.stderr, refused.stderr
        wrong = tmp_path / "wrong.token"
        wrong.write_text("0" * 64)
        refused = harness("node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", "tiny-a", "--auth-mode",
                          "token", "--token-file", str(wrong), "--detach", timeout=120)
        assert refused.returncode == 2 and "refused this node's auth token" in refused.stderr, refused.stderr
        assert not list(state.glob("node-*.json"))  # stopped at once, nothing recorded
        for chip in ("tiny-a", "tiny-b"):  # one after another, each with its own agent port and temp folder
            join = harness("node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", chip, "--num-cpus",
                           "1", "--auth-mode", "token", "--token-file", str(token_file), "--detach", timeout=180)
            assert join.returncode == 0, join.stdout + join.stderr
        nodes = [cl.Launched.load(path) for path in sorted(state.glob("node-*.json"))]
        launched += nodes
        assert sorted(n.chip for n in nodes) == ["tiny-a", "tiny-b"] and all(alive(n.pid) for n in nodes)

        status = harness("cluster", "status", "--address", f"127.0.0.1:{port}", timeout=120,
                         env={"RAY_AUTH_MODE": "token", cl.TOKEN_PATH_ENV: str(token_file)})
        assert status.returncode == 0, status.stdout + status.stderr
        assert "tiny-a: 1 node(s)" in status.stdout and "tiny-b: 1 node(s)" in status.stdout
        recorded = harness("cluster", "status", timeout=120)  # the recorded head: its auth mode and token file
        assert recorded.returncode == 0 and "tiny-b: 1 node(s)" in recorded.stdout, recorded.stdout + recorded.stderr

        # nothing the harness started listens beyond loopback: head, nodes, and every process under them
        sockets = listeners(process_tree(head.pid, *(n.pid for n in nodes)))
        print("listening:", sockets)
        assert len(sockets) >= 10  # GCS, raylets, dashboard, agents, client server... all found
        assert f"127.0.0.1:{dashboard}" in [a for a, _ in sockets]
        assert any(a.endswith(f":{port}") and name == "gcs_server" for a, name in sockets)
        assert [s for s in sockets if not is_loopback_listener(s[0])] == []

        repo, sha = make_remote_repo(tmp_path / "remote")
        db = tmp_path / "r.db"
        common = ("submit", "--address", api, "--repo", str(repo), "--commit", sha, "--python", sys.executable,
                  "--suite", "tests/plugins/ray_sched.toml", "--db", f"sqlite:///{db}")
        anonymous = harness(*common, "--auth-mode", "disabled", timeout=120)
        assert anonymous.returncode == 2 and "Traceback" not in anonymous.stderr, anonymous.stderr
        assert "pass --auth-mode token" in anonymous.stderr and not db.exists()
        done = harness(*common, "--wait", "--auth-mode", "token", "--token-file", str(token_file), timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[tiny-a] 2/2 passed" in done.stdout and "[tiny-b] 2/2 passed" in done.stdout

        leave = harness("node", "leave", timeout=120)
        assert leave.returncode == 0 and leave.stderr.count("stopped") + leave.stderr.count("killed") == 2, \
            leave.stderr
        down = harness("cluster", "down", "--port", str(port), timeout=120)
        assert down.returncode == 0, down.stderr
        for proc in launched:
            assert not alive(proc.pid)
            with pytest.raises(ProcessLookupError):
                os.killpg(proc.pgid, 0)  # nothing of its process group is left
        assert not list(state.glob("*.json"))
        for node in nodes:  # the temp folders `node join` chose for them are gone with them
            assert not Path(node.command[node.command.index("--temp-dir") + 1]).exists()
    finally:
        for proc in launched:  # a failed assertion must not leave Ray processes behind
            cl.stop(proc, timeout_s=20)
        restore_env(previous)


KILL_SUITE = sleepy_suite("ray-sched-kill", [(101, 15), (102, 15), (103, 15), (104, 15)])


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the raylet among a node's processes in /proc")
def test_a_node_whose_raylet_is_killed_mid_job_loses_and_doubles_nothing(tmp_path):
    """(tests/execute/test_ray_faults.py does this in-process; here: processes started by the CLI, a raylet
    killed by its PID.) Every job is stored once, passed, on the surviving node of its chip."""
    from testkit.faults import query
    from testkit.faults import wait_for as poll_until
    from testkit.ray import commit_change, markers

    previous = set_env(tmp_path)
    port, dashboard = free_port(), free_port()
    state = tmp_path / "cache" / "cluster"
    launched: list[cl.Launched] = []
    try:
        up = head_up(port, dashboard, "disabled")
        assert up.returncode == 0, up.stdout + up.stderr
        launched.append(cl.Launched.load(state / f"head-{port}.json"))
        for _ in range(2):
            join = harness("node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", "tiny-k", "--num-cpus",
                           "2", "--auth-mode", "disabled", "--detach", timeout=180)
            assert join.returncode == 0, join.stdout + join.stderr
        nodes = [cl.Launched.load(path) for path in sorted(state.glob("node-*.json"))]
        launched += nodes
        repo, _sha = make_remote_repo(tmp_path / "remote")
        sha = commit_change(repo, "a suite to kill", {"tests/plugins/ray_sched_kill.toml": KILL_SUITE})
        db = f"sqlite:///{tmp_path / 'r.db'}"
        submit = subprocess.Popen(
            [sys.executable, "-m", "harness", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--repo",
             str(repo), "--commit", sha, "--python", sys.executable, "--suite", "tests/plugins/ray_sched_kill.toml",
             "--chips", "tiny-k", "--parallel", "2", "--max-attempts", "2", "--db", db, "--wait"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = poll_until(lambda: [m for m in markers(tmp_path, "sleepy") if m.name.endswith(".0")],
                               timeout=240, what="a first attempt to start")
            victim_id = first[0].read_text()
            assert victim_id, f"{first[0]} names no node"
            raylets = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for n in nodes for pid in process_tree(n.pid)
                       if Path(f"/proc/{pid}/comm").exists() and Path(f"/proc/{pid}/comm").read_text().strip()
                       == "raylet"}
            [victim_raylet] = [pid for pid, argv in raylets.items() if victim_id.encode() in argv]
            os.kill(victim_raylet, 9)  # the node dies mid-job, as a machine that loses power
            out, err = submit.communicate(timeout=400)
        finally:
            if submit.poll() is None:
                submit.kill()
                submit.wait()
        assert submit.returncode == 0, out + err
        assert query(db, "select count(*) from run") == [(1,)]
        rows = query(db, "select key, status, node, attempts from job order by key")
        assert len(rows) == 4 and len({r[0] for r in rows}) == 4  # each job stored once
        assert all(r[1] == "passed" and r[2] and r[2] != victim_id for r in rows), rows
        assert len({r[2] for r in rows}) == 1  # all on the surviving tiny-k node (the head runs no jobs)
        assert any(r[3] == 2 for r in rows)  # the killed one ran again
    finally:
        for proc in reversed(launched):
            cl.stop(proc, timeout_s=20)
        restore_env(previous)
