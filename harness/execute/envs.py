"""Isolated environments for repository suites: the ``[install]`` step, run once per install key.

A repository suite (``harness.toml`` with an ``[install]`` section, docs/external-repos.md) says how its code is
made runnable, e.g. ``pip install -e . --no-deps`` (pip builds in isolation: it fetches the build backend the
project's ``[build-system]`` asks for, a current setuptools and wheel, per build; the environment's own setuptools is
whatever the harness's interpreter has, often too old for a modern ``pyproject.toml``). Installing per commit would cost
minutes per commit, and installing into the harness's own environment would let one commit's install leak
into the next. So:

- **Install key** = sha256 of the install command, the harness's interpreter (path and version), and the
  names and contents of the files matching ``install.key_files`` at the tree's root (default
  ``pyproject.toml``, ``setup.py``, ``setup.cfg``, ``requirements*.txt``, ``*.lock``); with
  ``install.per_commit = true`` also the commit's sha (a fresh environment per commit, e.g. for compiled
  extensions). Commits that change none of these share one environment.
- **One virtual environment per key**, under ``<cache>/envs/<key[:16]>`` (``harness.core.config.cache_dir()``, i.e.
  ``$HARNESS_CACHE``), created with ``--system-site-packages`` *and* a ``harness-parent.pth`` that adds the
  harness interpreter's own site-packages (``site.addsitedir``, so their ``.pth`` files apply too): the
  harness's MLX, numpy, pytest and pytest-xdist are visible even when the harness itself runs in a venv
  (``--system-site-packages`` alone would only expose the base interpreter's). What the install puts in the
  environment comes first. When the harness interpreter has pip, the environment is created without its own
  pip and gets ``pip`` / ``pip3`` shims that run that pip *with the environment's python*, so ``pip install``
  installs into the environment (fast to create: no ensurepip).
- **The install command runs once per key**, in the first tree (commit) that needs it, with the
  environment's ``bin`` first on ``PATH`` and ``VIRTUAL_ENV`` set (``python`` and ``pip`` are the
  environment's), in a shell, in the tree's root, with ``install.timeout_s``. Concurrent jobs (a parallel
  local run, several Ray workers on one node) wait on a per-key file lock. Success leaves a marker; the
  environment is then reused by every later commit with the same key.
- **Every job then runs with that environment's python and the commit's tree first on PYTHONPATH** (the tree,
  then ``tree/src`` if present, then the harness's source root: harness/execute/local.py ``worker_env``). So a
  reused environment still imports exactly the commit's code: an editable install of an older tree, or a
  copy installed from it, comes after PYTHONPATH on ``sys.path``. (Compiled extension modules built in place
  are the exception: use ``per_commit``.)
- **A failed install** (non-zero exit or timeout) keeps its whole log under ``<cache>/envs/logs/`` (the
  environment's folder is wiped by the next attempt) and records the log's tail. The run's ``install`` job is
  failed with detail ``install failed: `COMMAND` exited with status N (log: PATH): DECISIVE LINE``, the
  decisive line being the last error or exception line of the log that is not one of pip's generic
  follow-ups (:func:`decisive_line`), and every job that needs the environment is failed with the same detail
  and the log tail (``harness bisect`` treats such a commit as "does not install" and skips it). Within one run
  (the same plan ``nonce``) the failure is reused, not retried per job; the next run retries.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.config import cache_dir
from harness.core.job import JobResult
from harness.core.proc import exclusive_lock, file_tail, group, kill_group

OK_MARKER = ".harness-installed"
FAILED_MARKER = ".harness-install-failed"
LOG_NAME = "harness-install.log"
PTH_NAME = "harness-parent.pth"
LOGS_DIR = "logs"  # under envs_dir(): the logs of failed installs, kept
SCAN_BYTES = 256 * 1024  # how much of a log's end is searched for the decisive line


def envs_dir() -> Path:
    return cache_dir() / "envs"


# An error line: "error: ...", "ERROR: ...", a compiler's "x.c:3:1: error: ...", "fatal error: ...".
ERROR_LINE = re.compile(r"(?:^|:\s*)(?:fatal error|error|Error|ERROR)\s*:\s*\S")
# A Python exception line ending a traceback: "ValueError: ...", "subprocess.CalledProcessError: ...", "SystemExit: 1".
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s*\S.*)?$")
# pip's generic follow-ups to a failed build: they say that something failed, never what.
GENERIC_LINE = re.compile(
    r"^(?:error: [a-z0-9]+(?:-[a-z0-9]+)+$"  # pip's diagnostic codes: subprocess-exited-with-error, ...
    r"|ERROR: Could not build wheels for "
    r"|ERROR: Failed (?:building|to build) "
    r"|hint: See above|note: This (?:error originates|is an issue)"
    r"|[×╰│]|\[end of output\]|exit code: )")


def _log_lines(text: str) -> list[str]:
    """The log's non-blank lines, stripped of indentation and pip's box-drawing prefixes."""
    lines = (line.strip().lstrip("│").strip() for line in text.splitlines())
    return [line for line in lines if line]


def decisive_line(text: str) -> str:
    """The line of a failed install's log that says what went wrong: the last error or exception line that is not
    one of pip's generic follow-ups ("error: metadata-generation-failed", "hint: See above for details", ...),
    else the last line that is not such a follow-up, else the last line."""
    lines = _log_lines(text)
    specific = [line for line in lines if not GENERIC_LINE.match(line)]
    errors = [line for line in specific if ERROR_LINE.search(line) or EXCEPTION_LINE.match(line)]
    for found in (errors, specific, lines):
        if found:
            return found[-1]
    return "no output"


def _read_end(path: Path, size: int = SCAN_BYTES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def keep_log(log: Path, key: str) -> Path:
    """A copy of a failed install's log that outlives the environment's folder (the next attempt wipes it)."""
    kept = envs_dir() / LOGS_DIR / f"{key[:16]}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    kept.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copyfile(log, kept)
    except OSError:
        kept.write_text("(no install log was written)\n")
    return kept


def key_files(tree: str | Path, patterns: list[str]) -> list[Path]:
    """The files at the tree's root (or below, for patterns with a folder) that the install depends on."""
    root = Path(tree)
    found = {path for pattern in patterns for path in root.glob(pattern) if path.is_file()}
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _commit_of(tree: str | Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or str(Path(tree).resolve())


def install_key(install: dict[str, Any], tree: str | Path) -> str:
    """sha256(command, interpreter, key files' names and contents[, commit]): equal keys share an environment."""
    digest = hashlib.sha256()
    for part in (install["command"], sys.executable, sys.version):
        digest.update(part.encode() + b"\0")
    root = Path(tree)
    for path in key_files(root, install.get("key_files") or []):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    if install.get("per_commit"):
        digest.update(b"commit\0" + _commit_of(root).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Environment:
    """An environment ready for jobs (``ok``), or why it could not be made (``reason`` and the log's tail)."""

    key: str
    path: Path
    ok: bool
    reused: bool
    reason: str = ""
    tail: str = ""
    seconds: float = 0.0

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def _parent_site_dirs() -> list[str]:
    """The harness interpreter's site-packages folders (a venv's own, then the base's)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _has_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


PIP_SHIM = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


def create_venv(path: Path) -> None:
    """A virtual environment that sees the harness's packages (see the module docstring)."""
    parent_pip = _has_pip()
    venv.EnvBuilder(system_site_packages=True, with_pip=not parent_pip, symlinks=os.name != "nt",
                    clear=True).create(path)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = path / "lib" / version / "site-packages"
    lines = [f"import site; site.addsitedir({d!r})" for d in _parent_site_dirs()]
    (site_packages / PTH_NAME).write_text("\n".join(lines) + "\n")
    if parent_pip:
        for name in ("pip", "pip3", f"pip{sys.version_info.major}.{sys.version_info.minor}"):
            shim = path / "bin" / name
            shim.write_text(PIP_SHIM.format(python=path / "bin" / "python"))
            shim.chmod(0o755)


def activated(env: dict[str, str], venv_path: str | Path) -> dict[str, str]:
    """``env`` with the environment activated: its bin first on PATH, VIRTUAL_ENV set."""
    env = dict(env)
    env["VIRTUAL_ENV"] = str(venv_path)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(venv_path) / "bin"), env.get("PATH", "")) if p)
    env.pop("PYTHONHOME", None)
    return env


def _run_install(command: str, tree: Path, path: Path, timeout_s: float) -> tuple[bool, str]:
    """Run the install command in the tree with the environment active, its output in the environment's log;
    (ok, how it failed: the exit status or the timeout)."""
    log_path = path / LOG_NAME
    env = activated(os.environ, path)
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
    with open(log_path, "ab") as log:
        log.write(f"$ {command}\n".encode())
        log.flush()
        with group(command, shell=True, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                   stdin=subprocess.DEVNULL) as proc:
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                return False, f"`{command}` did not finish within {timeout_s:g} s (killed)"
    if code != 0:
        return False, f"`{command}` exited with status {code}"
    return True, ""


def _failure(how: str, log: Path, key: str) -> str:
    """A failed install's reason: how it failed, where its whole log is kept, and the log's decisive line (last, so
    that a reason cut short on a console still shows where to look)."""
    kept = keep_log(log, key)
    return f"{how} (log: {kept}): {decisive_line(_read_end(kept))[:300]}"


def ensure(install: dict[str, Any], tree: str | Path) -> Environment:
    """The environment for ``install`` (created and installed in ``tree`` if needed); locked per key."""
    tree = Path(tree)
    key = install_key(install, tree)
    path = envs_dir() / key[:16]
    start = time.perf_counter()
    with exclusive_lock(path.with_name(path.name + ".lock")):
        if (path / OK_MARKER).exists():
            return Environment(key, path, True, True, tail=file_tail(path / LOG_NAME))
        failed = path / FAILED_MARKER
        if failed.exists():
            try:
                record = json.loads(failed.read_text())
            except (OSError, ValueError):
                record = {}
            if record.get("nonce") and record.get("nonce") == install.get("nonce"):
                return Environment(key, path, False, True, record.get("reason", ""), record.get("tail", ""))
        shutil.rmtree(path, ignore_errors=True)
        try:
            create_venv(path)
        except Exception as exc:  # noqa: BLE001 - a broken interpreter or a full disk: reported on the jobs
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True, exist_ok=True)
            ok, reason = False, f"cannot create a virtual environment: {type(exc).__name__}: {exc}"
            (path / LOG_NAME).write_text(f"{reason}\n")
        else:
            ok, reason = _run_install(install["command"], tree, path, float(install.get("timeout_s", 900)))
            if not ok:
                reason = _failure(reason, path / LOG_NAME, key)
        seconds = time.perf_counter() - start
        tail = file_tail(path / LOG_NAME)
        if ok:
            (path / OK_MARKER).write_text(json.dumps({"key": key, "tree": str(tree), "seconds": seconds}))
        else:
            failed.write_text(json.dumps({"nonce": install.get("nonce", ""), "reason": reason, "tail": tail,
                                          "tree": str(tree)}))
        return Environment(key, path, ok, False, reason, tail, seconds)


def install_failed(job_key: str, environment: Environment) -> JobResult:
    """What a job that needs a failed environment records."""
    return JobResult(job_key, "failed", f"install failed: {environment.reason}"[:4000], output_tail=environment.tail)


def install_result(job_key: str, environment: Environment) -> JobResult:
    """The ``install`` job's own result."""
    if not environment.ok:
        return install_failed(job_key, environment)
    how = "reused" if environment.reused else f"installed in {environment.seconds:.1f} s"
    return JobResult(job_key, "passed", f"environment {environment.key[:16]} {how}", output_tail=environment.tail)
