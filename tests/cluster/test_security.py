"""Safety properties: loopback by default, no password ever shown or stored, no `ray stop`, nothing killed broadly."""

from __future__ import annotations

import ast
import gzip
import inspect
import re
from pathlib import Path

from sqlalchemy.engine import make_url

from harness.cli import cluster as cluster_cmd
from harness.cluster import nodes as cluster
from testkit.faults import harness, write_suite
from testkit.paths import ROOT


def test_the_head_and_dashboard_bind_to_loopback_by_default():
    default_host = inspect.signature(cluster_cmd.up).parameters["host"].default
    assert default_host == "127.0.0.1"
    assert inspect.signature(cluster.start_head).parameters["host"].default == "127.0.0.1"
    command = cluster.head_command(port=6380, host=default_host, dashboard_port=8265)
    assert command[command.index("--node-ip-address") + 1] == "127.0.0.1"
    assert command[command.index("--dashboard-host") + 1] == "127.0.0.1"
    assert "0.0.0.0" not in command


def test_the_docs_say_how_to_open_the_cluster_safely():
    text = (ROOT / "docs" / "cluster.md").read_text()
    assert "loopback" in text.lower() and "--auth-mode token" in text and "--host" in text


def _code_strings(path: Path) -> list[str]:
    """Every string literal of a module except docstrings (commands are built from these)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_harness_never_runs_ray_stop_nor_kills_by_name():
    offenders = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        for value in _code_strings(path):
            if value == "stop" or re.search(r"\bray\s+stop\b", value) or re.search(r"\b(pkill|killall)\b", value):
                offenders.append(f"{path.relative_to(ROOT)}: {value[:80]!r}")
    assert not offenders, offenders


def test_a_database_password_is_never_printed_rendered_bundled_or_spooled(tmp_path: Path, pg_url: str):
    secret = "s3cret-Pa55word"
    url = make_url(pg_url).set(password=secret).render_as_string(hide_password=False)  # trust auth ignores it
    suite = write_suite(tmp_path, ("a", "ok", 2, 60), ("b", "segv", 1, 60))
    site = tmp_path / "site"
    ran = harness(tmp_path, "run", "--suite", str(suite), "--db", url, "--report", str(site))
    assert ran.returncode == 1, ran.stderr  # the segfault is a bad status; the run itself completed
    assert "***" in ran.stdout + ran.stderr and secret not in ran.stdout + ran.stderr
    exported = harness(tmp_path, "export", "--out", str(tmp_path / "b.jsonl.gz"), "--db", url)
    assert exported.returncode == 0, exported.stderr
    assert secret not in exported.stdout + exported.stderr
    assert secret.encode() not in gzip.decompress((tmp_path / "b.jsonl.gz").read_bytes())
    pages = [p for p in site.rglob("*") if p.is_file()]
    assert pages and not [p for p in pages if secret.encode() in p.read_bytes()]
    unreachable = make_url(url).set(port=1).render_as_string(hide_password=False)
    failed = harness(tmp_path, "run", "--suite", str(suite), "--db", unreachable, "--no-report")
    assert failed.returncode == 2 and secret not in failed.stdout + failed.stderr
    cache = tmp_path / "cache"
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
