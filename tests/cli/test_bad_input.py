"""Bad input through the real CLI: exit 2, one line on stderr naming the problem, no traceback.

Suite-document validation is covered field by field (and by a hypothesis property: any document is accepted or
raises SuiteError) in tests/test_suite.py; here each kind of bad input goes through `python -m harness`.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.paths import ROOT

GOOD_SECTION = """
[suite]
name = "bad"
[[correctness]]
name = "c"
kernel = "flash_prefill"
variants = ["sdpa"]
checks = ["reference"]
shapes = [{B = 1, H = 1, S_q = 8, S_kv = 8, D = 32}]
"""

SUITES = {
    "wrong-type": (GOOD_SECTION.replace('name = "bad"', "name = 5"), "suite.name"),
    "unknown-kernel": (GOOD_SECTION.replace('"flash_prefill"', '"nope"'), "unknown kernel 'nope'"),
    "unknown-variant": (GOOD_SECTION.replace('["sdpa"]', '["bq99"]'), "unknown variant 'bq99'"),
    "empty-shapes": (GOOD_SECTION.replace("shapes = [{B = 1, H = 1, S_q = 8, S_kv = 8, D = 32}]", "shapes = []"),
                     "correctness[0].shapes"),
    "duplicate-name": (GOOD_SECTION + GOOD_SECTION.split("\n", 3)[3], "duplicate job name 'c'"),
    "not-toml": ("[suite\nname=", "not valid TOML"),
}


def harness(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE": str(cwd / "cache"), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def bundle(path: Path, header: dict | None, truncate: bool = False) -> Path:
    body = (json.dumps(header) + "\n" + json.dumps({"type": "run", "id": "x" * 32}) + "\n").encode()
    data = gzip.compress(body * 50)
    path.write_bytes(data[: len(data) // 2] if truncate else data)
    return path


def setup_case(case: str, tmp: Path) -> tuple[list[str], str]:
    """The CLI arguments of one bad input, and the words its error must contain."""
    db = f"sqlite:///{tmp / 'r.db'}"
    if case in SUITES:
        text, words = SUITES[case]
        (tmp / "s.toml").write_text(text)
        return ["run", "--suite", "s.toml", "--db", db, "--no-report"], words
    (tmp / "s.toml").write_text(GOOD_SECTION)
    if case == "missing-repo-url":
        return ["run", "--repo", f"file://{tmp}/no-such-repo.git", "--db", db, "--no-report"], "no-such-repo"
    if case == "missing-repo-path":
        return ["run", "--repo", str(tmp / "nowhere"), "--db", db, "--no-report"], "no such directory"
    if case == "missing-commit":
        subprocess.run(["git", "init", "-q", str(tmp)], check=True)
        subprocess.run(["git", "-C", str(tmp), "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q",
                        "--allow-empty", "-m", "x"], check=True)
        return ["run", "--suite", "s.toml", "--commit", "deadbeef1234", "--db", db, "--no-report"], "deadbeef1234"
    if case == "bad-db-scheme":
        return ["run", "--suite", "s.toml", "--db", "nonsense://", "--no-report"], "cannot use database"
    if case == "bad-db-unreachable":
        url = "postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:1/nope"
        return ["run", "--suite", "s.toml", "--db", url, "--no-report"], "cannot open database"
    if case == "bad-db-name":
        url = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_no_such_database_here"
        return ["run", "--suite", "s.toml", "--db", url, "--no-report"], "harness_no_such_database_here"
    if case == "bundle-garbage":
        (tmp / "b.jsonl.gz").write_bytes(b"this is not a bundle at all\n" * 10)
        return ["import", "b.jsonl.gz", "--db", db], "b.jsonl.gz"
    if case == "bundle-truncated":
        bundle(tmp / "b.jsonl.gz", {"format": "mlx-harness-bundle", "version": 1}, truncate=True)
        return ["import", "b.jsonl.gz", "--db", db], "b.jsonl.gz"
    if case == "bundle-version":
        bundle(tmp / "b.jsonl.gz", {"format": "mlx-harness-bundle", "version": 999})
        return ["import", "b.jsonl.gz", "--db", db], "version 999"
    if case == "resume-unknown-run":
        return ["run", "--resume", "nosuchrun", "--db", db], "no run 'nosuchrun'"
    raise AssertionError(case)


CASES = [*SUITES, "missing-repo-url", "missing-repo-path", "missing-commit", "bad-db-scheme", "bad-db-unreachable",
         "bad-db-name", "bundle-garbage", "bundle-truncated", "bundle-version", "resume-unknown-run"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_clear_line(case: str, tmp_path: Path, pg_server):
    args, words = setup_case(case, tmp_path)
    done = harness(tmp_path, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert words in lines[0], lines[0]
    assert "s3cret-pw" not in done.stderr + done.stdout


def test_debug_shows_the_traceback(tmp_path: Path):
    args, _ = setup_case("unknown-kernel", tmp_path)
    done = harness(tmp_path, "--debug", *args)
    assert done.returncode != 0 and "Traceback" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["compare"], "Missing argument"),
    (["run", "--nosuch"], "No such option"),
    (["node", "join", "10.0.0.5:6380"], "Missing option"),
    (["bisect", "--max-runs", "lots"], "Invalid value"),
])
def test_usage_errors_say_what_is_wrong_with_exit_2_and_no_traceback(tmp_path, args, message):
    done = harness(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
