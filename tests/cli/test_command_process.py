"""The ``harness`` executable's process: it leaves without the interpreter's teardown (``harness.cli.main.command``)
and loses nothing by it -- its exit status, its output (piped, so buffered), the exit handlers; the verbs that only
analyse run one BLAS thread, the others leave the thread variables to the user and the timing protocol."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.cli.main import ANALYSIS_VERBS
from harness.core.defaults import THREAD_VARS
from harness.record.outbox import open_store
from testkit.paths import ROOT

# an object whose finaliser runs only when the interpreter tears its modules down, an exit handler, then the command
PROGRAM = """
import atexit, sys
class TornDown:
    def __del__(self):
        print("torn down", flush=True)
kept = TornDown()
atexit.register(lambda: print("exit handler ran"))
print("x" * 100000)  # more than the pipe's buffer holds: flushed on the way out
sys.argv = ["harness", *sys.argv[1:]]
from harness.cli.main import {entry}
{entry}()
"""


def _command(*args: str, entry: str = "command") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(entry=entry), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_the_command_skips_the_teardown_and_keeps_its_status_output_and_exit_handlers(tmp_path):
    missing = tmp_path / "missing.db"
    done = _command("variants", "--db", str(missing))
    assert done.returncode == 2, done.stderr
    assert "error:" in done.stderr and "missing.db" in done.stderr
    assert "x" * 100000 in done.stdout and "exit handler ran" in done.stdout
    assert "torn down" not in done.stdout
    assert not missing.exists()
    ok = _command("--help")
    assert ok.returncode == 0 and "report" in ok.stdout and "exit handler ran" in ok.stdout
    assert "torn down" not in ok.stdout


def test_main_itself_exits_as_python_does():  # tests call it in-process: it must raise SystemExit, not _exit
    done = _command("--help", entry="main")
    assert done.returncode == 0 and "exit handler ran" in done.stdout and "torn down" in done.stdout


def test_python_dash_m_harness_is_the_command():
    done = subprocess.run([sys.executable, "-m", "harness", "variants", "--db", "sqlite:///does/not/exist.db"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "error:" in done.stderr


THREADS = """
import os, sys
sys.argv = ["harness", *sys.argv[1:]]
import harness.cli.main
import numpy
print(os.environ.get("OPENBLAS_NUM_THREADS"), os.environ.get("OMP_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def _threads(*argv: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    done = subprocess.run([sys.executable, "-c", THREADS, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**clean, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_analysis_verbs_load_numpy_with_one_blas_thread_and_the_others_leave_it_alone():
    for verb in ANALYSIS_VERBS:
        assert _threads("--debug", verb, "--help") == ["1", "1", "1"]  # set before numpy loaded: no pool started
    assert _threads("report", OPENBLAS_NUM_THREADS="2")[:2] == ["2", "1"]  # what the user set is kept
    for argv in (("run", "--help"), ("bisect", "--help"), ("--help",)):
        assert _threads(*argv)[:2] == ["None", "None"]


COLLECTIONS = """
import gc, sys, traceback
sys.argv = ["harness", *sys.argv[1:]]
under_import = []

def note(phase, info):  # a collection that starts while a module is being imported (the standard library's, at the
    if phase == "start" and "click" in sys.modules:  # top of harness.cli.main, before click, aside)
        under_import.append(any("importlib._bootstrap" in frame.filename for frame in traceback.extract_stack()[:-1]))


gc.callbacks.append(note)
from harness.cli.main import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print(code, gc.isenabled(), sum(under_import), len(under_import))
"""


def test_a_command_imports_its_modules_without_collections_and_leaves_the_collector_on(tmp_path):
    """Imports make objects and next to no garbage: the collector is off while the verb's modules load (a tenth of a
    second of a report's start, measured: ``harness.core.collector``), and on again after the command."""
    open_store(f"sqlite:///{tmp_path / 'r.db'}").close()  # an empty database: the report imports all it uses
    done = subprocess.run([sys.executable, "-c", COLLECTIONS, "report", "--db", f"sqlite:///{tmp_path / 'r.db'}",
                           "--out", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    code, enabled, under_import, _ = done.stdout.split()[-4:]
    assert (code, enabled, under_import) == ("0", "True", "0"), done.stdout
