"""The LAN recipe of docs/cluster.md: each `cluster up` / `node join` line, run with --dry-run, would start Ray as
the recipe says (token auth from the token file, the address to bind or reach, the chip label)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.paths import ROOT

DOC = ROOT / "docs" / "cluster.md"


def recipe_lines() -> list[str]:
    block = re.search(r"```recipe\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/cluster.md has the LAN recipe block"
    lines = [re.sub(r"^([A-Z_]+=\S+ )+", "", line) for line in block.group(1).splitlines()]  # env prefixes off
    return [line for line in lines if line.startswith("harness ")]


def starting(line: str) -> bool:
    return line.startswith(("harness cluster up", "harness node join"))


@pytest.mark.parametrize("line", [line for line in recipe_lines() if starting(line)])
def test_each_start_line_of_the_recipe_would_start_ray_as_described(line: str, tmp_path: Path):
    token = tmp_path / "lan.token"
    token.write_text("0" * 64)
    token.chmod(0o600)
    args = [arg.replace("~/.harness/lan.token", str(token)) for arg in shlex.split(line)[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *args, "--dry-run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    label = args[args.index("--chip-label") + 1]
    assert "RAY_AUTH_MODE=token" in printed and f"RAY_AUTH_TOKEN_PATH={token}" in printed
    assert f"chip={label}" in printed and "ray start" in printed
    if "up" in args[:2]:
        assert "--head" in printed and "--node-ip-address 192.168.1.10" in printed
    else:
        assert "--address 192.168.1.10:6380" in printed
        assert f"--node-ip-address {args[args.index('--node-ip') + 1]}" in printed


def test_the_recipe_uses_only_options_the_cli_has():
    for line in recipe_lines():
        verb = shlex.split(line)[1:3] if line.split()[1] in ("cluster", "node") else shlex.split(line)[1:2]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
        done = subprocess.run([sys.executable, "-c", "from harness.cli.main import main; main()", *verb, "--help"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        for option in re.findall(r"(--[a-z][a-z-]+)", line):
            assert option in done.stdout, (line, option)
