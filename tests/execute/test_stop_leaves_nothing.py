"""Stopping anything stops everything it started: a `harness run`, `harness bisect` or `harness compare --ab` sent
SIGTERM or SIGINT mid-run, and a job that times out, leave no process behind (docs/bisect.md, "Stopping").

On VeloxQuant-MLX a bisect stopped by a timeout left its job process, pytest and two xdist workers running as
orphans: pytest ran in a session of its own, out of reach of the job's group kill, and nothing killed the job
process itself when the harness was stopped. Here the real CLI runs a generated repository whose pytest selection
runs on two xdist workers, each test starting a grandchild (``sleep``) and, for the timeout cases, a daemon in a
session of its own; the test lists the harness's process tree (/proc) once every test is running, stops it, and
checks that not one of those processes survives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.e2e import commit, new_repo
from testkit.paths import ROOT
from testkit.procs import alive

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists processes through /proc")

# Each test writes a marker file once its grandchild runs, then sleeps; the grandchild sleeps longer.
TESTS = '''import os
import subprocess
import sys
import time
from pathlib import Path


def _hang(name):
    child = subprocess.Popen(["sleep", "300"], start_new_session=bool(os.environ.get("DAEMON")))
    Path(os.environ["MARKS"], f"{{name}}.{{os.getpid()}}.{{child.pid}}").touch()
    time.sleep(300)


def test_one():
    _hang("one")


def test_two():
    _hang("two")
'''

BENCH = '''import os
import subprocess
import time
from pathlib import Path


def bench_hang(N):
    child = subprocess.Popen(["sleep", "300"], start_new_session=bool(os.environ.get("DAEMON")))
    Path(os.environ["MARKS"], f"bench.{{os.getpid()}}.{{child.pid}}").touch()
    return lambda: time.sleep(300)
'''

SUITE = '''[suite]
name = "hang"

[timing]
warmup_s = 0.0
warmup_calls = 1
min_sample_s = 0.002
samples = 3
timeout_s = {bench_timeout}

[[pytest]]
name = "slow"
paths = ["tests"]
workers = 2
timeout_s = {pytest_timeout}
args = ["-p", "no:hypothesispytest"]

[[function]]
name = "hang"
target = "hangpkg.bench:bench_hang"
grid.cpu = {{ N = [1] }}
grid.gpu = {{ N = [1] }}
timeout_s = {bench_timeout}
'''


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> set[int]:
    tree, todo, kids = set(), [pid], children_map()
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:150]
    except OSError:
        return "?"


class Hang:
    def __init__(self, root: Path, *, pytest_timeout: float = 600, bench_timeout: float = 600):
        self.root, self.repo, self.marks = root, root / "hangpkg", root / "marks"
        self.marks.mkdir()
        files = {"hangpkg/__init__.py": "", "hangpkg/bench.py": BENCH.format(), "tests/test_hang.py": TESTS.format(),
                 "harness.toml": SUITE.format(pytest_timeout=pytest_timeout, bench_timeout=bench_timeout)}
        self.shas = [new_repo(self.repo, files, "c0"), commit(self.repo, {"README": "1\n"}, "c1")]
        self.db = f"sqlite:///{root / 'results.db'}"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(self.root / "cache"),
                "MARKS": str(self.marks), **extra}

    def start(self, *args: str, blocked: frozenset[signal.Signals] = frozenset(), **extra: str) -> subprocess.Popen:
        """``harness ARGS`` with SIGINT and SIGTERM at their defaults, as a shell's foreground command or a CI step
        starts it (this test process may have them ignored: once in CI it handed SIGINT ignored to the run, which
        then rightly ignored it, as a background job does); ``blocked``: signals it starts with blocked, as
        children of Ray's processes do."""
        def child() -> None:
            for stop in (signal.SIGINT, signal.SIGTERM):
                signal.signal(stop, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_BLOCK, blocked)

        return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=self.root, env=self.env(**extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=child)

    def wait_marks(self, count: int, proc: subprocess.Popen, timeout: float = 240) -> list[int]:
        """The pids of the hanging tests (or benchmark) and of their grandchildren, once ``count`` run."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            marks = [m.name.split(".") for m in self.marks.iterdir()]
            if len(marks) >= count:
                return [int(pid) for _, *pids in marks for pid in pids]
            if proc.poll() is not None:
                pytest.fail(f"ended before the jobs ran: {proc.communicate()}")
            time.sleep(0.2)
        pytest.fail(f"{count} jobs not running after {timeout} s")


def assert_all_end(pids: set[int], within_s: float = 10) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    left = {pid: describe(pid) for pid in pids if alive(pid)}
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the stop: {left}"


def stop_and_check(hang: Hang, proc: subprocess.Popen, marks: int, how: signal.Signals, stacks: bool = False) -> str:
    started = hang.wait_marks(marks, proc)
    if stacks:  # SIGUSR1 first: the stacks on stderr, and the command goes on
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        assert proc.poll() is None
    tree = descendants(proc.pid)
    assert set(started) <= tree  # the tests and their grandchildren are the harness's descendants
    names = [describe(pid) for pid in tree]
    # the job process, pytest, its two xdist workers and their grandchildren (a benchmark: the job and its child)
    assert len(tree) >= (6 if marks == 2 else 2), names
    proc.send_signal(how)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired as exc:  # still running: its signal masks, where its threads are, the failure
        masks = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Sig")]
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        seen = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"not ended 60 s after {how.name}; {masks}; its stderr, then its threads:\n{seen[-6000:]}\n"
                    f"{proc.communicate()[1][-12000:]}")
    finally:
        proc.kill()
    assert_all_end(tree)
    print(f"{how.name}: exit {proc.returncode}; {len(tree)} descendants, none left: {names}")
    return stderr


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_leaves_no_process(tmp_path: Path, how: signal.Signals):
    hang = Hang(tmp_path)
    # started with the signal blocked, as a child of a Ray process is (Ray blocks SIGINT in its processes): without
    # the CLI's unblock the run waits on its job for a minute after the signal
    proc = hang.start("run", "--repo", str(hang.repo), "--db", hang.db, "--no-report", blocked=frozenset({how}))
    stderr = stop_and_check(hang, proc, 2, how, stacks=True)
    assert proc.returncode == 130
    assert "(most recent call first)" in stderr and "harness/cli/main.py" in stderr  # every thread's stack


def test_a_bisect_stopped_by_sigterm_leaves_no_process(tmp_path: Path):
    hang = Hang(tmp_path)
    proc = hang.start("bisect", "--repo", str(hang.repo), "--good", hang.shas[0], "--bad", hang.shas[1], "--db",
                      hang.db, "--mode", "correctness", "--kernel", "slow")
    stop_and_check(hang, proc, 2, signal.SIGTERM)  # what `timeout` and a CI runner's cancel send
    assert proc.returncode == 130


def test_a_stopped_ab_compare_leaves_no_process(tmp_path: Path):
    hang = Hang(tmp_path)
    proc = hang.start("compare", hang.shas[0], hang.shas[1], "--ab", "--repo", str(hang.repo), "--db", hang.db)
    stop_and_check(hang, proc, 1, signal.SIGTERM)
    assert proc.returncode == 130


def test_a_harness_killed_outright_leaves_no_process(tmp_path: Path):
    hang = Hang(tmp_path)
    proc = hang.start("run", "--repo", str(hang.repo), "--db", hang.db, "--no-report")
    stop_and_check(hang, proc, 2, signal.SIGKILL)  # nothing to handle: the job process notices its parent is gone


def test_a_job_that_times_out_leaves_no_process(tmp_path: Path):
    """pytest past the selection's timeout_s, then a benchmark past the job's, in one run: each killed with
    everything it started, a daemon in a session of its own included."""
    hang = Hang(tmp_path, pytest_timeout=4, bench_timeout=4)
    proc = hang.start("run", "--repo", str(hang.repo), "--db", hang.db, "--no-report", DAEMON="1")
    started = set(hang.wait_marks(3, proc, timeout=300))  # both tests and the benchmark, with their grandchildren
    assert_all_end(started, within_s=60)  # each timeout is 4 s
    proc.communicate(timeout=300)
    assert proc.returncode == 1  # a timed-out job fails the run
