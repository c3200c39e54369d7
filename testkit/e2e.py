"""The real CLI end to end: run `python -m harness` in a folder, a tiny suite committed to a git repository."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from testkit.paths import ROOT

TINY = """
[suite]
name = "tiny"
plugins = {plugins}
[timing]
warmup_s = 0.0
warmup_calls = 1
min_sample_s = 0.002
samples = 5
[calibration.cpu]
matmul_n = [64]
copy_n = [65536]
dtype = "float32"
[[correctness]]
name = "flash-small"
kernel = "flash_prefill"
variants = {variants}
dtypes = ["float32"]
checks = ["reference", "causal_perturb"]
shapes = [{{B = 1, H = 1, S_q = 13, S_kv = 37, D = 32}}]
[[benchmark]]
name = "flash-bench"
kernel = "flash_prefill"
variants = ["sdpa", "flash_bq16_bk32"]
dtypes = ["float32"]
grid.cpu = {{B = [1], H = [1], S = [32], D = [32]}}
"""


# Two variants of one small benchmark, 10 samples a trial: what a null pair of `harness run`s of one commit measures
# (tests/cli/test_compare_cli.py, bench/runs_null_under_load.py).
NOISE_SUITE = """
[suite]
name = "noise"
[timing]
warmup_s = 0.02
warmup_calls = 2
min_sample_s = 0.004
samples = 10
[[benchmark]]
name = "flash-bench"
kernel = "flash_prefill"
variants = ["sdpa", "flash_bq16_bk32"]
dtypes = ["float32"]
grid.cpu = {B = [1], H = [1], S = [32], D = [32]}
"""


def harness(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in ``cwd``; ``env``: more environment variables (e.g. ``HARNESS_CACHE``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def copy_checkout(folder: Path, message: str = "checkout") -> str:
    """This checkout's files as git sees them (committed or not, ignored ones left out) copied into ``folder`` as a
    fresh repository with one commit; its sha. What the scripts run real `harness run`s of, at chosen commits."""
    for name in git(ROOT, "ls-files", "-co", "--exclude-standard").splitlines():
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return new_repo(folder, {}, message)


def new_repo(path: Path, files: dict[str, str], message: str = "initial") -> str:
    """A git repository at ``path`` with ``files`` (relative path -> text) committed; the commit's sha."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "k@example.com")
    git(path, "config", "user.name", "K")
    return commit(path, files, message)


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    """Write ``files`` (relative path -> text) into ``repo`` and commit everything; the new commit's sha."""
    for name, text in files.items():
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def write_suite(repo: Path, variants: str, plugins: str = "[]") -> Path:
    path = repo / "suite.toml"
    path.write_text(TINY.format(variants=variants, plugins=plugins))
    git(repo, "add", "suite.toml")
    git(repo, "commit", "-qm", "add <b>suite</b>")
    return path


def rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


# A repository of one numpy benchmark (a "function" target): what `harness compare --ab` measures in tests and in
# bench/ab_null_under_load.py. ``sort_repeats`` sets how much work a commit does.
AB_PACKAGE = """import numpy as np


def work(x):
    for _ in range({repeats}):
        np.sort(x)
"""
AB_BENCH = """import numpy as np

import abkern


def bench_work(N):
    x = np.random.default_rng(0).random(N)
    return lambda: abkern.work(x)
"""
AB_SUITE = """[suite]
name = "abkern"

[timing]
warmup_s = 0.02
warmup_calls = 2
min_sample_s = 0.005
samples = 5
trials = 3

[[function]]
name = "work"
target = "abkern.bench:bench_work"
grid.cpu = {{ N = [20000] }}
grid.gpu = {{ N = [20000] }}
"""


def ab_repo(path: Path) -> list[str]:
    """``path`` as a repository of three commits: c0; c1 changes only the README; c2 sorts 8x as often
    (unmistakably slower even on a loaded machine). Their shas."""
    return [new_repo(path, {"abkern/__init__.py": AB_PACKAGE.format(repeats=1), "abkern/bench.py": AB_BENCH,
                            "harness.toml": AB_SUITE.format(), "README": "0\n"}, "c0"),
            commit(path, {"README": "1\n"}, "c1 docs"),
            commit(path, {"abkern/__init__.py": AB_PACKAGE.format(repeats=8)}, "c2 sort 8x as often")]
