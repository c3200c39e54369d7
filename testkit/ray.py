"""Helpers for the Ray tests: loopback clusters (ray.cluster_utils.Cluster only, never `ray stop`), a git
repository to serve as the "remote" the nodes fetch from, and the environment the Ray processes inherit."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import select

from harness.core.chip import detect
from harness.core.job import KernelJob, RunContext
from harness.pipeline.run import run_planned
from harness.record.models import JobRecord
from testkit.paths import PLUGINS, ROOT, TESTS

# Fast node-death detection for the tests (Ray's defaults take ~30 s to mark a silent node dead).
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4,
               "health_check_initial_delay_ms": 0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_env(tmp: Path) -> dict[str, str | None]:
    """What every Ray process of a test cluster inherits: the project importable, the per-test caches.

    Returns the previous values, for restore_env.
    """
    values = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
        "HARNESS_CACHE": str(tmp / "cache"),
        "HARNESS_TEST_MARKERS": str(tmp / "markers"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    (tmp / "markers").mkdir(parents=True, exist_ok=True)
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    return previous


def restore_env(previous: dict[str, str | None]) -> None:
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def start_cluster(chips: list[str], *, dashboard: bool = False):
    """A loopback head (no CPUs: it runs drivers only) plus one node per entry of ``chips``, labelled with it."""
    from ray.cluster_utils import Cluster


    # Every head's dashboard agent defaults to port 52365: two test clusters at once (xdist) must not share it.
    head = {"num_cpus": 0, "gcs_server_port": free_port(), "include_dashboard": dashboard,
            "dashboard_agent_listen_port": free_port(), "node_ip_address": "127.0.0.1",
            "_system_config": FAST_HEALTH}
    if dashboard:
        head.update(dashboard_host="127.0.0.1", dashboard_port=free_port())
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for chip in chips:
            add_node(cluster, chip)
        cluster.wait_for_nodes(timeout=120)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def add_node(cluster, chip: str):
    from harness.execute.ray_executor import node_labels, node_resources

    return cluster.add_node(num_cpus=1, labels=node_labels(chip), resources=node_resources(),
                            node_ip_address="127.0.0.1")


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=harness-test", "-c", "user.email=test@example.invalid",
                           "-c", "commit.gpgsign=false", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_remote_repo(dest: Path) -> tuple[Path, str]:
    """A git repository holding this project's code and the test plugins: what nodes fetch by path."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True)
    for package in ("harness", "kernels", "jobs"):
        shutil.copytree(ROOT / package, dest / package, ignore=ignore)
    (dest / "tests" / "plugins").mkdir(parents=True)
    for path in (TESTS / "plugins").glob("ray_sched*"):
        shutil.copy2(path, dest / "tests" / "plugins" / path.name)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "the code under test")
    return dest, _git(dest, "rev-parse", "HEAD")


def commit_change(repo: Path, message: str, files: dict[str, str] | None = None) -> str:
    """Commit ``files`` (path relative to the repository -> text; default: CHANGES holding the message)."""
    for name, text in (files or {"CHANGES": message}).items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
        _git(repo, "add", name)
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def sleepy_suite(name: str, shapes: list[tuple[int, int]]) -> str:
    """A suite of ``sleepy`` no-op jobs of the ray_sched plugin: one per (N, T seconds) shape, committed into a
    test repository (``commit_change``) to run on a cluster."""
    listed = ", ".join(f"{{ N = {n}, T = {t} }}" for n, t in shapes)
    return f"""
[suite]
name = "{name}"
plugins = ["ray_sched_plugin"]

[[correctness]]
name = "noop"
kernel = "ray_sched"
variants = ["sleepy"]
checks = ["noop"]
shapes = [{listed}]
"""


def sched_job(variant: str, n: int, **shape) -> KernelJob:
    return KernelJob.of("correctness", "ray_sched", variant, {"N": n, **shape}, "float32", "noop", name="noop",
                        timeout_s=60, plugins=("ray_sched_plugin",), plugin_dir=str(PLUGINS))


def markers(tmp: Path, variant: str) -> list[Path]:
    return sorted((tmp / "markers").glob(f"{variant}-*"))


def run_in_thread(executor, jobs, db_url):
    """run_planned (the path every run takes) in a thread; returns (thread, box with outcome or error)."""
    from harness.record.outbox import open_store

    box: dict = {}

    def target():
        db = open_store(db_url)
        try:
            context = RunContext(ident=detect("tiny-x"), facts={"hostname": "t"},
                                 commit={"sha": "unversioned", "repo": "t"}, dirty=False, suite="t", executor="ray")
            box["outcome"] = run_planned(db, jobs, executor, context)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            box["error"] = exc
        finally:
            db.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def stored_jobs(db_url: str) -> list[JobRecord]:
    from harness.record.outbox import open_store

    db = open_store(db_url)
    try:
        with db.session() as session:
            return list(session.scalars(select(JobRecord)).all())
    finally:
        db.close()


def process_tree(*roots: int) -> set[int]:
    """``roots`` and every process descending from them (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def listeners(pids: set[int]) -> list[tuple[str, str]]:
    """(local address:port, process name) of every listening TCP socket of ``pids`` (from `ss -ltnpH`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            name = re.search(r'\(\("([^"]*)"', line)
            found.append((line.split()[3], name.group(1) if name else "?"))
    return found


def is_loopback_listener(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith(("127.", "::ffff:127.")) or host == "::1"
