"""A head runs submitted drivers with the Python that started it (docs/cluster.md, "Which Python runs the driver").

As the README starts everything: `.venv/bin/harness cluster up` with the venv not activated, a node joined the
same way, then `harness submit --wait` without --python. The Ray job used to run `python -m harness.cluster.driver`
with whatever `python` the head's PATH found (VeloxQuant-MLX: `ModuleNotFoundError: No module named 'sqlalchemy'`,
exit 2). Here the PATH has no venv and its `python` is a stand-in that cannot run the harness.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cluster import nodes as cl
from testkit.ray import free_port, make_remote_repo

VENV_BIN = Path(sys.executable).parent
WRONG_PYTHON = """#!/bin/sh
echo "ModuleNotFoundError: No module named 'sqlalchemy' (the PATH's python, not the head's)" >&2
exit 1
"""


def plain_env(tmp: Path) -> dict[str, str]:
    """A shell where the venv is not activated: its bin is not on PATH, and `python` there is the wrong one."""
    fake = tmp / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "python").write_text(WRONG_PYTHON)
    (fake / "python").chmod(0o755)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != VENV_BIN.resolve()]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=os.pathsep.join([str(fake), *path]), HARNESS_CACHE=str(tmp / "cache"),
               RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    for key in (cl.TOKEN_ENV, cl.TOKEN_PATH_ENV, "RAY_ADDRESS", "HARNESS_DB"):
        env.pop(key, None)
    return env


@pytest.mark.exclusive  # a real cluster on loopback ports: alone, after the parallel suite (test_real_cluster.py)
@pytest.mark.skipif(not (VENV_BIN / "harness").exists(), reason="needs the harness installed in a venv")
def test_a_head_started_from_an_unactivated_venv_runs_submitted_drivers_with_its_python(tmp_path: Path):
    env = plain_env(tmp_path)
    harness = str(VENV_BIN / "harness")

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([harness, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout)

    assert subprocess.run(["python", "-c", "pass"], env=env).returncode == 1  # the PATH's python is the wrong one
    port, dashboard = free_port(), free_port()
    state = tmp_path / "cache" / "cluster"
    launched: list[cl.Launched] = []
    try:
        up = run("cluster", "up", "--port", str(port), "--dashboard-port", str(dashboard),
                 f"--ray-arg=--dashboard-agent-listen-port={free_port()}", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        head = cl.Launched.load(state / f"head-{port}.json")
        launched.append(head)
        assert Path(head.python).parent == VENV_BIN and f"drivers run by:  {head.python}" in up.stdout
        join = run("node", "join", "--address", f"127.0.0.1:{port}", "--chip-label", "tiny-venv", "--num-cpus", "1",
                   "--detach", timeout=180)
        assert join.returncode == 0, join.stdout + join.stderr
        launched += [cl.Launched.load(path) for path in state.glob("node-*.json")]

        repo, sha = make_remote_repo(tmp_path / "remote")
        db = tmp_path / "r.db"
        done = run("submit", "--address", f"http://127.0.0.1:{dashboard}", "--repo", str(repo), "--commit", sha,
                   "--suite", "tests/plugins/ray_sched.toml", "--db", f"sqlite:///{db}", "--wait", timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[tiny-venv] 2/2 passed" in done.stdout
        with sqlite3.connect(db) as conn:
            assert conn.execute("select status, planned_jobs from run").fetchall() == [("complete", 2)]
            assert conn.execute("select count(*) from job where status = 'passed'").fetchone() == (2,)

        assert run("node", "leave", timeout=120).returncode == 0
        assert run("cluster", "down", "--port", str(port), timeout=120).returncode == 0
    finally:
        for proc in launched:  # a failed assertion must not leave Ray processes behind
            cl.stop(proc, timeout_s=20)


@pytest.mark.skipif(not (VENV_BIN / "harness").exists(), reason="needs the harness installed in a venv")
def test_submit_without_python_uses_the_heads_and_cluster_up_refuses_a_python_without_the_harness(tmp_path: Path):
    from harness.cli import submit

    command = submit.entrypoint(python=None, repo="/r", commit="c" * 40, suite=None, chips=None, parallel=1,
                                max_attempts=2)
    assert command.startswith('"${HARNESS_HEAD_PYTHON:-python}" -m harness.cluster.driver --repo /r ')
    done = subprocess.run([str(VENV_BIN / "harness"), "cluster", "up", "--python", "/bin/sh", "--dry-run"],
                          env=plain_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--python /bin/sh cannot run the harness's cluster driver" in done.stderr
    done = subprocess.run([str(VENV_BIN / "harness"), "cluster", "up", "--dry-run"], env=plain_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"HARNESS_HEAD_PYTHON={VENV_BIN}/python" in done.stdout, done.stderr
