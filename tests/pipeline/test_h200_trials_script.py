"""bench/h200_trials/run.sh as it is run on the lent GPU machine, here on the CPU grid of a small suite: from a
git clone of the project (the device gets one from a bundle) it must make a repository of its own with the commits
base and head (a copy that kept the clone's .git once committed nothing and stopped: "ambiguous argument 'base'")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from testkit.paths import ROOT


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_run_sh_base_from_a_clone_times_the_suite_at_its_own_base_commit(tmp_path):
    clone = tmp_path / "proj"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # the working tree as it is now (the clone has the last commit): the script under test and the suite files
    for part in ("bench", "tools", "kernels", "harness", "jobs", "testkit"):
        shutil.copytree(ROOT / part, clone / part, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    env = {**os.environ, "WORK": str(work), "SUITE": "planted.toml", "PATH": f"{os.path.dirname(sys.executable)}:"
           f"{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(["bash", str(clone / "bench" / "h200_trials" / "run.sh"), "base"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    log = subprocess.run(["git", "-C", str(work / "repo"), "log", "--format=%s", "base"], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    assert log[0] == "base" and len([line for line in log if line]) == 1  # its own history, not the clone's
    assert len((work / "base.run").read_text().strip()) == 32 and float((work / "base.seconds").read_text()) > 0
    assert "jobs: " in (work / "base.log").read_text()
