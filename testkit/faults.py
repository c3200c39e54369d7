"""Fault tests on real processes: a suite of fault kernels, the CLI with a per-test cache, database queries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from testkit.paths import PLUGINS, ROOT

SUITE = """
[suite]
name = "faults"
plugins = ["fault_kernels"]
{sections}
"""


SECTION = """
[[correctness]]
name = "{name}"
kernel = "fault"
variants = ["{variant}"]
checks = ["noop"]
shapes = [{shapes}]
timeout_s = {timeout}
"""


def write_suite(folder: Path, *sections: tuple[str, str, int, float]) -> Path:
    """sections: (name, variant, number of shapes, timeout); the plugin is copied beside the suite."""
    body, first = "", 1
    for name, variant, n, timeout in sections:  # distinct shapes throughout: every job its own key
        body += SECTION.format(name=name, variant=variant, timeout=timeout,
                               shapes=", ".join(f"{{N = {i}}}" for i in range(first, first + n)))
        first += n
    (folder / "fault_kernels.py").write_text((PLUGINS / "fault_kernels.py").read_text())
    path = folder / "suite.toml"
    path.write_text(SUITE.format(sections=body))
    return path


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(tmp_path / "cache"),
            "HARNESS_TEST_GATE": str(tmp_path / "gate"), **extra}


def harness(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env_for(tmp_path, **extra),
                          capture_output=True, text=True, timeout=300)


def start(tmp_path: Path, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env_for(tmp_path, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def query(url: str, sql: str) -> list[tuple]:
    engine = create_engine(url, connect_args={"connect_timeout": 5} if url.startswith("postgresql") else {})
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql))]
    finally:
        engine.dispose()


def wait_for(predicate, timeout: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
