"""A database that is not one, or holds no results, and an output folder that is a file, through the real CLI: one
line on stderr, exit 2, and the file a reading command was asked to read left byte for byte as it was (a report on
an empty file wrote 94 KB of schema into it and exited 0; a text file as --db was a 90-line traceback)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from testkit.e2e import harness

READERS = {
    "report": ["report", "--out", "site"],
    "compare": ["compare", "aaaa", "bbbb"],
    "variants": ["variants"],
    "export": ["export", "--out", "b.jsonl.gz"],
    "noise": ["noise"],
}


def _text(path: Path) -> None:
    path.write_text("not a database\n" * 20)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _foreign(path: Path) -> None:  # a SQLite database of something else
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")


FILES = {"text": (_text, "is not a SQLite database"), "zero-byte": (_empty, "holds no harness results"),
         "no-harness-tables": (_foreign, "holds no harness results")}


def _one_error_line(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("kind", FILES)
@pytest.mark.parametrize("verb", READERS)
def test_a_reading_verb_refuses_a_file_that_is_no_harness_database_and_leaves_it_unchanged(verb, kind, tmp_path):
    make, words = FILES[kind]
    db = tmp_path / "results.db"
    make(db)
    before = db.read_bytes()
    line = _one_error_line(harness(*READERS[verb], "--db", str(db), cwd=tmp_path))
    assert words in line and "results.db" in line
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.db"]  # no -wal, no report, no bundle


def test_a_reading_verb_refuses_an_empty_postgresql_database_and_creates_no_table(pg_url):
    line = _one_error_line(harness("compare", "aaaa", "bbbb", "--db", pg_url, cwd=Path.cwd()))
    assert "holds no harness results" in line
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_run_refuses_a_text_file_as_its_database_in_one_line(tmp_path):
    db = tmp_path / "notes.txt"
    _text(db)
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\n[[correctness]]\nname = "c"\nkernel = "flash_prefill"\n'
                     'variants = ["sdpa"]\nchecks = ["reference"]\n'
                     'shapes = [{B = 1, H = 1, S_q = 8, S_kv = 8, D = 32}]\n')
    line = _one_error_line(harness("run", "--suite", str(suite), "--db", str(db), "--no-report", cwd=tmp_path))
    assert "notes.txt" in line


@pytest.mark.parametrize("args", [["report", "--db", "results.db", "--out", "taken"],
                                  ["run", "--report", "taken", "--db", "results.db"]])
def test_an_existing_file_as_the_report_folder_is_refused_before_any_work(args, tmp_path):
    (tmp_path / "taken").write_text("mine\n")
    line = _one_error_line(harness(*args, cwd=tmp_path))
    assert "taken is a file" in line
    assert (tmp_path / "taken").read_text() == "mine\n" and not (tmp_path / "results.db").exists()
