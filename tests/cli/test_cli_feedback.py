"""What the CLI says about its database and its progress: a reading command refuses a database that is not there,
a value that is not a database URL (or of an unsupported kind) is one line saying what a URL looks like, and
`harness run` in a log (stderr piped, as in CI) prints progress lines with an ETA and failures as they happen."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from harness.cli.run import LineProgress, duration
from harness.record import query
from harness.record.outbox import open_store
from testkit.e2e import harness, write_suite
from testkit.paths import PLUGINS


def one_error_line(done) -> str:
    """The single ``error:`` line of a command that exited 2 without a traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


READING = {
    "report": ["report", "--out", "site"],
    "variants": ["variants"],
    "compare": ["compare", "abcd", "abce"],
    "export": ["export", "--out", "b.jsonl.gz"],
}


@pytest.mark.parametrize("as_url", [True, False], ids=["url", "plain-path"])
@pytest.mark.parametrize("where", ["missing/dir/r.db", "r.db"])
@pytest.mark.parametrize("command", list(READING))
def test_a_reading_command_refuses_a_missing_database(tmp_path: Path, command: str, where: str, as_url: bool):
    given = f"sqlite:///{tmp_path / where}" if as_url else where
    line = one_error_line(harness(*READING[command], "--db", given, cwd=tmp_path))
    url = given if as_url else f"sqlite:///{where}"  # a plain path means that SQLite file
    assert f"no database at {url} " in line and "harness run" in line
    assert not (tmp_path / where).exists() and not (tmp_path / "missing").exists()  # nothing created


def test_a_reading_command_refuses_the_missing_default_database(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("HARNESS_DB", raising=False)
    line = one_error_line(harness("variants", cwd=tmp_path))
    assert "no database at sqlite:///harness-out/results.db" in line and not (tmp_path / "harness-out").exists()


@pytest.mark.parametrize("value, env, expected", [
    ("postgres:s3cret-pw@db.example/harness", None,
     "error: --db postgres:***@db.example/harness is not a database URL: use postgresql://postgres:***@db.example/harness"),
    ("u:s3cret/pw@host/db", None, "error: --db u:***@host/db is not a database URL: use postgresql://u:***@host/db"),
    (None, {"HARNESS_DB": "u:s3cret@host/db"},
     "error: $HARNESS_DB=u:***@host/db is not a database URL: use postgresql://u:***@host/db"),
    ("sqlite:results.db", None,
     "error: --db sqlite:results.db is not a database URL: use sqlite:///path/to/results.db or postgresql://user@host/db"),
])
def test_a_value_that_is_not_a_url_says_what_one_looks_like(tmp_path: Path, value, env, expected):
    args = ["report"] + (["--db", value] if value else [])
    done = harness(*args, cwd=tmp_path, env=env)
    assert one_error_line(done) == expected
    assert "s3cret" not in done.stderr + done.stdout
    assert not (tmp_path / "harness-out").exists()


@pytest.mark.parametrize("command", [["report"], ["run", "--no-report"], ["export", "--out", "b.jsonl.gz"]])
@pytest.mark.parametrize("url, kind", [("foo://x", "foo"), ("mysql://root:s3cret-pw@host/db", "mysql"),
                                       ("postgres://u:s3cret-pw@host/db", "postgres")])
def test_an_unknown_database_kind_is_one_line_naming_the_supported_ones(tmp_path: Path, command, url, kind):
    done = harness(*command, "--db", url, cwd=tmp_path)
    line = one_error_line(done)
    assert f"unknown database kind {kind!r}" in line and "supported: sqlite, postgresql" in line, line
    assert "s3cret-pw" not in done.stderr + done.stdout and "NoSuchModuleError" not in line


def test_parallel_help_says_the_default_is_the_number_of_cores(tmp_path: Path):
    done = harness("run", "--help", cwd=tmp_path, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    section = done.stdout[done.stdout.index("--parallel"):].split("--no-report")[0]
    assert "number of CPU cores" in section and "default: 0" not in section.replace("(", "")


# --- progress ------------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_line_progress_is_bounded_to_every_tenth_or_every_30_s():
    clock, said = Clock(), []
    lines = LineProgress(said.append, clock=clock)
    lines.planned(1000)
    assert said == ["running 1000 jobs"]
    for done in range(1, 1001):
        clock.now += 0.1  # 100 s in all: 10 steps of 10%, three 30 s marks fall between them
        lines.update(done, 1000)
    progress = said[1:]
    assert len(progress) == 10
    assert progress[0] == "progress: 100/1000 jobs (10%), 10s elapsed, ETA 1m30s"
    assert progress[-1] == "progress: 1000/1000 jobs (100%), 1m40s elapsed"


def test_line_progress_prints_every_30_s_and_a_heartbeat_while_a_job_runs():
    clock, said = Clock(), []
    lines = LineProgress(said.append, clock=clock)
    lines.planned(1000)
    clock.now = 31
    lines.update(1, 1000)  # under 10%, but 30 s since the last line
    lines.update(2, 1000)  # nothing: neither
    clock.now = 50
    lines.tick()  # nothing yet
    clock.now = 62
    lines.tick()  # a long job: the heartbeat's line
    assert said[1:] == ["progress: 1/1000 jobs (0%), 31s elapsed, ETA 8h36m",
                        "progress: 2/1000 jobs (0%), 1m02s elapsed, ETA 8h35m"]


def test_duration():
    assert [duration(s) for s in (0, 42.4, 65, 3600 + 120)] == ["0s", "42s", "1m05s", "1h02m"]


def test_a_piped_run_prints_progress_with_an_eta_and_failures_as_they_happen(repo: Path):
    suite = write_suite(repo, '["sdpa", "broken_no_mask"]', plugins='["broken_kernels"]')
    (repo / "broken_kernels.py").write_text((PLUGINS / "broken_kernels.py").read_text())
    db = repo / "new" / "folder" / "r.db"  # run creates a missing folder (reading commands refuse one)
    done = harness("run", "--suite", str(suite), "--db", f"sqlite:///{db}", "--no-report", cwd=repo)
    assert done.returncode == 1, done.stderr
    assert db.is_file()
    lines = done.stderr.splitlines()
    planned = int(re.fullmatch(r"running (\d+) jobs", lines[0]).group(1))
    progress = [i for i, line in enumerate(lines) if line.startswith("progress: ")]
    assert progress and lines[progress[-1]].startswith(f"progress: {planned}/{planned} jobs (100%), ")
    assert any(", ETA " in lines[i] for i in progress)
    assert len(progress) <= 10 + 1
    failures = [i for i, line in enumerate(lines) if line.startswith("failed ") and "broken_no_mask" in line]
    assert failures and max(failures) < progress[-1]  # printed as they happen, not in the summary at the end
    assert not any(line.startswith("jobs: ") for line in lines)  # the results: on stdout, after the run
    assert done.stdout.splitlines()[1].startswith("jobs: ")


def test_a_plain_path_means_that_sqlite_file_for_run_and_for_reading_commands(repo: Path):
    suite = write_suite(repo, '["sdpa"]')
    done = harness("run", "--suite", str(suite), "--db", "out/r.db", "--no-report", cwd=repo)
    assert done.returncode == 0, done.stderr
    assert (repo / "out" / "r.db").is_file() and not (repo / "harness-out" / "results.db").exists()
    by_url = harness("variants", "--db", f"sqlite:///{repo / 'out' / 'r.db'}", cwd=repo)
    by_path = harness("variants", "--db", "out/r.db", cwd=repo)
    by_env = harness("variants", cwd=repo, env={"HARNESS_DB": "out/r.db"})
    assert by_url.returncode == by_path.returncode == by_env.returncode == 0, by_path.stderr + by_env.stderr
    store = open_store(f"sqlite:///{repo / 'out' / 'r.db'}", must_exist=True)
    try:
        (chip,) = query.chip_keys(store)  # this machine's key, whichever CPU it has
    finally:
        store.close()
    assert f"Variant verdicts on {chip}:" in by_url.stdout  # the run is there (its verdict is measured)
    assert by_path.stdout == by_url.stdout == by_env.stdout


def test_a_run_in_a_terminal_shows_an_eta_column(repo: Path):
    suite = write_suite(repo, '["sdpa"]')
    done = harness("run", "--suite", str(suite), "--no-report", cwd=repo, env={"TTY_INTERACTIVE": "1"})
    assert done.returncode == 0, done.stderr
    assert "ETA" in done.stderr and "progress: " not in done.stderr


# --- help texts ------------------------------------------------------------------------------------------------


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    """Every (command path, click command) of the app, sub-groups included."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_bracketed_words_in_help_texts_are_printed_not_taken_for_markup():
    """Rich reads "[timing]" as a markup tag and drops it: `compare --help` said "a run measures each benchmark in
    trials of them" where the source says "[timing] trials"."""
    from harness.cli.main import app  # every verb registered

    group = typer.main.get_command(app)
    checked = 0
    for path, command in _commands(group):
        texts = [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]
        words = {word for text in texts for word in re.findall(r"\[[a-z_]+\]", text.replace("\\[", "["))}
        if not words:
            continue
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}, terminal_width=400).output
        for word in words:
            assert word in shown, f"{' '.join(path)} --help lost {word}"
        checked += 1
    assert checked, "no help text has a bracketed word: the test checks nothing"
