"""docs/tutorial.md, run as written: every `$ ` command of its console blocks, in order, in one shell, on a fresh
virtual environment; each output it shows is what the command prints (the stable lines: numbers, shas and the
run's ids normalised; progress lines, table cells and the chip's own fields depend on the machine and the moment).

The install command is the one line changed: the harness comes from this checkout instead of its release URL
(no network), with --no-deps; its dependencies come from the test's own environment through a .pth file."""

from __future__ import annotations

import os
import re
import site
import subprocess
from pathlib import Path

from testkit.paths import ROOT

DOC = ROOT / "docs" / "tutorial.md"
RELEASE = re.compile(r'"mlx-kernel-harness\[cpu\] @ git\+https://[^"]+"')
MARK = "@@tutorial-command"
# Lines that depend on the machine and the moment: progress, the chip's own fields, table cells, and what a run or a
# settle round says of each series (under load a series is held in one run and short of trials in the next)
MOVING = re.compile(r"^(progress: |key: |device: |architecture: |OS: |MLX: |GPU cores: |memory: |[┏┃┡│└]"
                    r"|\s+(held|inconclusive) |settle round )")


def commands_and_outputs(text: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of every `$ ` line of the ```console blocks; `> ` lines continue a command."""
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line.startswith("> ") or line == ">":
                steps[-1] = (steps[-1][0] + "\n" + line[2:], steps[-1][1])
            elif line.strip():
                steps[-1][1].append(line)
    return steps


def normalise(line: str) -> str:
    line = re.sub(r"/\S+/kern/", "DIR/kern/", line)  # where the tutorial ran
    line = re.sub(r"\bcpu-[a-z0-9_]+(-[a-z0-9]+)*", "<cpu chip>", line)  # the machine it ran on (an Intel or AMD)
    line = re.sub(r"\b[0-9a-f]{7,40}\b", "<id>", line.strip())
    line = re.sub(r"\d+(\.\d+)?", "<n>", line)
    return re.sub(r"\s+", " ", line)


def test_the_tutorials_commands_print_what_it_shows(tmp_path: Path):
    steps = commands_and_outputs(DOC.read_text())
    assert any(cmd.startswith("harness run") for cmd, _ in steps) and any("python3 -m venv" in c for c, _ in steps)
    deps = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    script = []
    for index, (command, _) in enumerate(steps):
        if RELEASE.search(command):
            command = RELEASE.sub(f'"mlx-kernel-harness[cpu] @ file://{ROOT}"', command) + " --no-deps"
            command += f" && echo {deps} > .venv/lib/python3.11/site-packages/_tutorial_deps.pth"
        script.append(f"echo {MARK} {index}\n{{\n{command}\n}} 2>&1\necho {MARK}-status $?")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(HARNESS_CACHE=str(tmp_path / "cache"), RAY_USAGE_STATS_ENABLED="0", COLUMNS="120",
               GIT_AUTHOR_NAME="you", GIT_AUTHOR_EMAIL="you@example.com", GIT_COMMITTER_NAME="you",
               GIT_COMMITTER_EMAIL="you@example.com", PATH="/usr/local/bin:/usr/bin:/bin")
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    printed = done.stdout + done.stderr
    python3 = Path("/usr/bin/python3")
    assert python3.exists(), "the tutorial starts from the system's python3"
    if os.environ.get("TUTORIAL_PRINT"):
        print(printed)
    chunks = re.split(rf"^{MARK} (\d+)\n", done.stdout, flags=re.M)
    outputs = {int(chunks[i]): chunks[i + 1] for i in range(1, len(chunks), 2)}
    assert len(outputs) == len(steps), printed
    for index, (command, shown) in enumerate(steps):
        out, _, status = outputs[index].rpartition(f"{MARK}-status ")
        expected_status = 1 if command.startswith("harness compare") else 0
        assert int(status.strip()) == expected_status, (command, out, done.stderr[-3000:])
        actual = {normalise(line) for line in out.splitlines()}
        for line in shown:
            if not MOVING.match(line):
                assert normalise(line) in actual, (command, line, out)
