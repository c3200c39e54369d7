"""Generated git repositories for the ancestry tests: a main line with a side branch, runs recorded out of order
(as a bisect records them) through the real store, and databases created at an older schema revision."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, MetaData, insert, text

from harness.core.job import JobResult, KernelJob
from harness.record import store
from harness.record.models import Run
from harness.spec import git as spec_git
from testkit.analysis import CHIPS, T0, checks, grid_results

STEP_SERIES = ("swiglu", "fused_gateup", 1)  # 25 % slower from STEP on
BROKEN = ("flash_prefill", "flash_bq16_bk32")  # fails correctness from STEP on
STEP = 8


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def new_repo(path: Path) -> Path:
    """An empty repository on branch ``main``."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "k@example.com")
    git(path, "config", "user.name", "K")
    return path


def add_commit(repo: Path, message: str) -> str:
    """A new commit on the checked-out branch (a file of its own: branches merge cleanly); its sha."""
    (repo / f"{re.sub(r'[^A-Za-z0-9]+', '-', message)}.txt").write_text(message + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def record_run(db: store.Store, repo: Path, rev: str, chip: str, results: list[tuple[KernelJob, JobResult]], *,
               minutes: float, suite: str = "synthetic") -> str:
    """One run of ``suite`` at ``rev`` (a branch, a sha, HEAD) on ``chip``, recorded as ``harness run`` records it
    (the commit row of ``harness.spec.git.resolve``), started ``minutes`` after T0."""
    row = spec_git.resolve(repo, rev).as_row()
    run_id = store.create_run(db, ident=CHIPS[chip], facts={"hostname": f"host-{chip}"}, commit=row,
                              suite=suite, dirty=False, executor="local", planned_jobs=len(results))
    with db.session() as session:
        session.get(Run, run_id).started_at = T0 + timedelta(minutes=minutes)
    for job, result in results:
        store.record_result(db, run_id, job, result)
    return run_id


def results_at(rng: np.random.Generator, stepped: bool) -> list[tuple[KernelJob, JobResult]]:
    """The synthetic grid and checks of a commit before (``stepped`` False) or after the real change."""
    return (grid_results(rng, {STEP_SERIES: 1.25} if stepped else None)
            + checks({BROKEN: "failed"} if stepped else None))


@dataclass
class BisectHistory:
    """Main line m0..m11 (the real change at m8), a side branch ``feature`` with f1 forked at m4. Run in this time
    order, as nightly runs and then a bisect do: m0, m2, m4 (for ``main``), m11 (``main``), f1 (``feature``),
    then the bisect's probes m7, m9, m8 (by sha). m1, m3, m5, m6 and m10 are never run."""

    repo: Path
    main: list[str]
    side: str
    runs: dict[str, str] = field(default_factory=dict)  # "m7", "f1"... -> run id

    def sha(self, name: str) -> str:
        return self.side if name == "f1" else self.main[int(name[1:])]


def bisect_history(db: store.Store, path: Path, chip: str = "chip-a", seed: int = 5) -> BisectHistory:
    rng = np.random.default_rng(seed)
    repo = new_repo(path)
    main: list[str] = []
    history = BisectHistory(repo, main, "")
    minutes = 0

    def run(name: str, rev: str) -> None:
        nonlocal minutes
        stepped = name != "f1" and int(name[1:]) >= STEP
        history.runs[name] = record_run(db, repo, rev, chip, results_at(rng, stepped), minutes=minutes)
        minutes += 10

    main.append(add_commit(repo, "m0"))
    run("m0", "main")
    main.extend(add_commit(repo, f"m{i}") for i in (1, 2))
    run("m2", "main")
    main.extend(add_commit(repo, f"m{i}") for i in (3, 4))
    run("m4", "main")
    git(repo, "checkout", "-q", "-b", "feature")
    history.side = add_commit(repo, "f1")
    git(repo, "checkout", "-q", "main")
    main.extend(add_commit(repo, f"m{i}") for i in range(5, 12))
    run("m11", "main")
    run("f1", "feature")
    for name in ("m7", "m9", "m8"):  # the bisect between m4 and m11
        run(name, history.sha(name))
    return history


# --- databases at an older schema revision ------------------------------------------------------------------


def migrate_to(engine: Engine, revision: str) -> None:
    """Bring a database to the given Alembic revision (``store.migrate`` goes to the newest)."""
    config = Config()
    config.set_main_option("script_location", str(store.MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def insert_rows(engine: Engine, table: str, rows: list[dict[str, Any]]) -> None:
    """Plain rows into a table as the database has it (reflected: no model involved)."""
    metadata = MetaData()
    metadata.reflect(engine, only=[table])
    with engine.begin() as connection:
        connection.execute(insert(metadata.tables[table]), rows)
        if engine.dialect.name == "postgresql" and rows and isinstance(rows[0].get("id"), int):
            # explicit ids leave the sequence behind: move it on, as a database written normally has it
            connection.execute(text(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                                    f"(SELECT max(id) FROM \"{table}\"))"))
