"""A Ray task whose job process died while the task's raylet died too leaves without a result (the driver then re-runs
the job on a live node), rather than sending back "crashed": Ray's core worker kills its children once it sees its
raylet gone, and the result could reach the driver first (``harness.execute.ray_executor._leave_if_the_node_died``).

Real processes: the "raylet" is the parent of the process standing in for the worker, killed or not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.paths import ROOT
from testkit.procs import alive

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")

WORKER = """
import os, sys, time
from pathlib import Path
from harness.core.job import JobResult
from harness.execute.ray_executor import _leave_if_the_node_died

status, raylet_dies, folder = sys.argv[1], sys.argv[2] == "1", Path(sys.argv[3])
raylet = os.getpid()  # the worker's parent: read before the fork, as it may be gone before the child runs
child = os.fork()
if child:  # the raylet: gone at once, or waiting for its worker
    if not raylet_dies:
        os.waitpid(child, 0)
    os._exit(0)
(folder / "pid").write_text(str(os.getpid()))
end = time.monotonic() + 60
while raylet_dies and os.getppid() == raylet and time.monotonic() < end:  # handed to another parent
    time.sleep(0.01)
_leave_if_the_node_died(raylet, JobResult("job", status))
(folder / "returned").write_text("")
"""


@pytest.mark.parametrize(("status", "raylet_dies", "returns"), [
    ("crashed", True, False),  # killed with its node: no result, the driver re-runs it
    ("crashed", False, True),  # crashed on a live node: the crash is the job's
    ("passed", True, True),  # finished before the node died: its result stands
])
def test_a_job_killed_with_its_raylet_leaves_no_result(tmp_path: Path, status: str, raylet_dies: bool,
                                                        returns: bool):
    subprocess.run([sys.executable, "-c", WORKER, status, "1" if raylet_dies else "0", str(tmp_path)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}, timeout=120)
    end = time.monotonic() + 60
    while not (tmp_path / "pid").exists() and time.monotonic() < end:
        time.sleep(0.02)
    pid = int((tmp_path / "pid").read_text())
    while alive(pid) and time.monotonic() < end:  # the worker, an orphan when its raylet died, has ended
        time.sleep(0.02)
    assert not alive(pid) and (tmp_path / "returned").exists() == returns
