"""A repository's `[install]` through the real CLI: the documented default command installs a modern
setuptools project (PEP 639 ``license = "MIT"``) in the environment the harness makes, and a failed install
stores and prints the line of its log that says what went wrong, with the path of the whole log, kept."""

from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.execute import envs
from testkit.e2e import harness, new_repo
from testkit.paths import ROOT


def documented_install() -> str:
    """The install command of docs/external-repos.md's `harness.toml` example: the one users copy."""
    docs = (ROOT / "docs" / "external-repos.md").read_text()
    found = re.search(r'^\[install\].*\ncommand = "([^"]+)"$', docs, re.MULTILINE)
    assert found, "docs/external-repos.md has no [install] command"
    return found.group(1)


PYPROJECT = """[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.3"
license = "MIT"
"""

SUITE = """[suite]
name = "{name}"

[install]
command = "{command}"

[[pytest]]
name = "unit"
paths = ["tests"]
"""

# The installed distribution's metadata is only there if the install ran in the job's environment (the module
# itself would also import from the tree on PYTHONPATH).
TESTS = """import importlib.metadata
import sys

import tinymit


def test_twice():
    assert tinymit.twice(21) == 42


def test_installed_in_the_environment():
    assert importlib.metadata.version("tinymit") == "0.3"
    assert sys.prefix != sys.base_prefix
"""

SETUP_FAILS = 'raise RuntimeError("tinybad needs the CUDA 12.4 toolkit")\n'
DECISIVE = "RuntimeError: tinybad needs the CUDA 12.4 toolkit"


@pytest.fixture
def cache() -> Iterator[Path]:
    """A short $HARNESS_CACHE: the console prints a failed job's first 200 characters, log path included."""
    path = Path(tempfile.mkdtemp(prefix="hc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(repo: Path, root: Path, cache: Path):
    return harness("run", "--repo", str(repo), "--db", f"sqlite:///{root / 'results.db'}", "--no-report", cwd=root,
                   env={"HARNESS_CACHE": str(cache), "COLUMNS": "1000"})


def stored(root: Path, kind: str) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(root / "results.db") as conn:
        return {key: (status, detail) for key, status, detail in
                conn.execute("select key, status, detail from job where kind = ?", (kind,))}


def test_the_documented_install_builds_a_modern_setuptools_project(tmp_path: Path, cache: Path):
    command = documented_install()
    repo = tmp_path / "tinymit"
    new_repo(repo, {"pyproject.toml": PYPROJECT.format(name="tinymit"),
                    "tinymit/__init__.py": "def twice(x):\n    return 2 * x\n",
                    "tests/test_tinymit.py": TESTS, "harness.toml": SUITE.format(name="tinymit", command=command)})
    done = run(repo, tmp_path, cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stored(tmp_path, "install")["install"][0] == "passed"
    assert stored(tmp_path, "test") == {
        "test/unit/tests/test_tinymit.py::test_twice": ("passed", ""),
        "test/unit/tests/test_tinymit.py::test_installed_in_the_environment": ("passed", "")}


def test_a_failed_install_stores_and_prints_its_decisive_line_and_kept_log(tmp_path: Path, cache: Path):
    command = documented_install()
    repo = tmp_path / "tinybad"
    new_repo(repo, {"pyproject.toml": PYPROJECT.format(name="tinybad"), "setup.py": SETUP_FAILS,
                    "tinybad/__init__.py": "", "tests/test_nothing.py": "def test_x():\n    pass\n",
                    "harness.toml": SUITE.format(name="tinybad", command=command)})
    done = run(repo, tmp_path, cache)
    assert done.returncode == 1, done.stderr[-3000:]
    status, detail = stored(tmp_path, "install")["install"]
    assert status == "failed" and detail.startswith(f"install failed: `{command}` exited with status 1 (log: ")
    assert detail.endswith(f"): {DECISIVE}")
    log = Path(re.search(r"\(log: (\S+)\)", detail).group(1))
    assert log.is_file() and log.parent == cache / "envs" / "logs"
    assert DECISIVE in log.read_text() and "Traceback" in log.read_text()  # the whole log, not its tail
    assert stored(tmp_path, "pytest")["pytest/unit"] == ("failed", detail)  # the job that needed the environment
    assert f"install: {detail}" in done.stderr  # the console line: decisive line and log path


# What pip printed for the old documented default (`--no-build-isolation`) in the harness's environment
# (setuptools 65.5, no wheel), abridged: the last line is pip's generic hint, the decisive lines are above it.
OLD_SETUPTOOLS_LICENSE = """$ pip install -e . --no-deps --no-build-isolation
  Preparing editable metadata (pyproject.toml): finished with status 'error'
  error: subprocess-exited-with-error

  × Preparing editable metadata (pyproject.toml) did not run successfully.
  │ exit code: 1
  ╰─> [47 lines of output]
      Traceback (most recent call last):
        File "/venv/lib/python3.11/site-packages/setuptools/config/pyprojecttoml.py", line 51, in validate
          raise ValueError(f"{error}\\n{summary}") from None
      ValueError: invalid pyproject.toml config: `project.license`.
      configuration error: `project.license` must be valid exactly by one definition (2 matches found):

          - keys:
              'file': {type: string}
            required: ['file']
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed

× Encountered error while generating package metadata.
╰─> from file:///tmp/tinymit

note: This is an issue with the package mentioned above, not pip.
hint: See above for details.
"""

NO_WHEEL = """$ pip install -e . --no-deps --no-build-isolation
  Preparing editable metadata (pyproject.toml): finished with status 'error'
  error: subprocess-exited-with-error

  × Preparing editable metadata (pyproject.toml) did not run successfully.
  │ exit code: 1
  ╰─> [10 lines of output]
      running dist_info
      creating '/tmp/pip-modern-metadata-74ewb2sd/tinyx-0.1.dist-info'
      error: invalid command 'bdist_wheel'
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed

× Encountered error while generating package metadata.
╰─> from file:///tmp/pkg2

note: This is an issue with the package mentioned above, not pip.
hint: See above for details.
"""


@pytest.mark.parametrize(("log", "line"), [
    (OLD_SETUPTOOLS_LICENSE, "ValueError: invalid pyproject.toml config: `project.license`."),
    (NO_WHEEL, "error: invalid command 'bdist_wheel'"),
    ("$ pip install nope\nERROR: Could not find a version that satisfies the requirement nope\n"
     "ERROR: No matching distribution found for nope\n", "ERROR: No matching distribution found for nope"),
    ("$ make\ncc -c k.c\nk.c:3:1: error: expected ';' before '}' token\nmake: *** [all] Error 1\n",
     "k.c:3:1: error: expected ';' before '}' token"),
    ("$ ./install.sh\nbuilding\nsomething went wrong\n", "something went wrong"),
    ("", "no output"),
])
def test_the_decisive_line_skips_pips_generic_follow_ups(log: str, line: str):
    assert envs.decisive_line(log) == line
