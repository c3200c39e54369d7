"""Record: open a results database (SQLite or PostgreSQL), migrate it, and write runs and job results once."""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import Engine, bindparam, create_engine, delete, event, func, insert, inspect, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from harness.core.chip import ChipIdentity
from harness.core.errors import HarnessError, first_line
from harness.core.job import Job, JobResult, per_test_key, unit_key
from harness.core.proc import holder_is_gone, process_identity
from harness.record.identity import canonical, unify
from harness.record.models import Chip, Commit, JobRecord, Machine, Run, Sample, TrialSummary, utcnow
from harness.spec import git
from harness.stats.summary import sorted_medians, summarize

DEFAULT_DIR = Path("harness-out")
DEFAULT_DB_URL = f"sqlite:///{DEFAULT_DIR / 'results.db'}"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
FIRST_PARENT_LINKS = 100  # first-parent ancestors of a run's commit stored with it (and exported in its bundles)
ANCESTRY_LIMIT = 20_000  # commits of a repository's history read (newest first) to link its stored commits
log = logging.getLogger(__name__)


def default_db_url() -> str:
    """``$HARNESS_DB`` if set (a plain path read as SQLite), else ``sqlite:///harness-out/results.db`` (relative to
    the current folder)."""
    return as_db_url(os.environ.get("HARNESS_DB", DEFAULT_DB_URL))


def as_db_url(text: str) -> str:
    """``text`` as a database URL: a plain file path (no scheme, no ``user@host``) means that SQLite file
    (``~`` expanded); anything else is returned as given, for :func:`parse_url` to accept or explain."""
    if re.match(r"[A-Za-z][\w+.-]*:", text) or "@" in text or not text.strip():  # a scheme, a server, nothing
        return text
    return f"sqlite:///{os.path.expanduser(text)}"


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***: safe for logs, reports and bundles."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid database URL>"


def _mask_text(text: str) -> str:
    """Something given as a database URL that is not one, safe to print: a ``user:password@`` part is masked
    (everything between the user's ``:`` and the last ``@``, whatever the password holds)."""
    head, at, tail = text.rpartition("@")
    if not at:
        return text
    scheme, sep, userinfo = head.rpartition("://") if "://" in head else ("", "", head)
    if ":" not in userinfo:
        return text
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{tail}"


SUPPORTED = ("sqlite", "postgresql")


def parse_url(url: str, given_as: str = "--db") -> URL:
    """``url`` parsed, or one clear error: what was given (password masked) and what a URL looks like; a database
    kind other than SQLite or PostgreSQL is refused here, naming the supported ones. ``given_as``: where the
    value came from, for the message (``--db`` or ``$HARNESS_DB``)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        shown = _mask_text(url)
        if "@" in url and "://" not in url:  # a server without its scheme
            use = f"postgresql://{shown}"
        else:
            use = "sqlite:///path/to/results.db or postgresql://user@host/db"
        value = shown if shown.strip() else repr(url)
        label = f"{given_as}={value}" if given_as.startswith("$") else f"{given_as} {value}"
        raise HarnessError(f"{label} is not a database URL: use {use}") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        hint = " (did you mean postgresql://?)" if backend == "postgres" else ""
        raise HarnessError(f"cannot use database {mask_url(url)}: unknown database kind {backend!r}{hint}; "
                           f"supported: {', '.join(SUPPORTED)} (e.g. sqlite:///results.db, "
                           "postgresql://user@host/db)")
    return parsed


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for an in-memory database or another kind)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:" \
            or parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


def _check_exists(url: str) -> None:
    """A reading command's database must be there already: a missing SQLite file (or folder) is refused."""
    path = sqlite_path(url)
    if path is None or path.is_file():
        return
    why = f"no folder {path.parent}" if not path.parent.is_dir() else f"no file {path}"
    raise HarnessError(f"no database at {mask_url(url)} ({why}): `harness run` or `harness import` creates one")


NO_RESULTS = "holds no harness results (no harness tables): `harness run` or `harness import` fills one"


def _check_sqlite_results(url: str) -> None:
    """A reading command's SQLite file must be a harness database, checked read-only before anything opens it to
    write (a SQLite engine sets WAL on connect; migrating would write the schema into the file it was asked to
    read): a text file or an empty one is refused, untouched."""
    path = sqlite_path(url)
    if path is None or not path.is_file():
        return
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise HarnessError(f"{mask_url(url)} is not a SQLite database ({exc})") from None
    if "alembic_version" not in tables:
        raise HarnessError(f"{mask_url(url)} {NO_RESULTS}")


SQLITE_MMAP_BYTES = 1 << 31
"""How much of a SQLite file is read through a memory map (SQLite caps it at its build's limit, 2 GB by default):
without one, every page read is a ``pread`` call -- a report on a long history reads ~190,000 pages, ~1 s of system
time (measured by ``tools/bench_report.py``). Nothing here shrinks a file while it is open (no VACUUM)."""


def _sqlite_pragmas(engine: Engine) -> None:
    """WAL + busy timeout, reads through a memory map (``SQLITE_MMAP_BYTES``), and BEGIN IMMEDIATE so concurrent
    writers queue instead of failing mid-transaction."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let us emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(os.environ.get('HARNESS_SQLITE_BUSY_MS', '30000'))}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, *, must_exist: bool = False, given_as: str = "--db") -> Engine:
    """An engine for ``url`` (SQLite: its folder is created unless ``must_exist``, which refuses a missing file)."""
    parsed = parse_url(url, given_as)
    if must_exist:
        _check_exists(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})
        _sqlite_pragmas(engine)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        return create_engine(parsed, pool_pre_ping=True, connect_args=_pg_args(parsed))
    except Exception as exc:  # noqa: BLE001 - unknown driver, missing driver package
        raise HarnessError(f"cannot use database {mask_url(url)}: {first_line(exc)}") from None


def _pg_args(parsed) -> dict[str, Any]:
    return {"connect_timeout": 10} if parsed.get_backend_name() == "postgresql" else {}


class NewerSchemaError(HarnessError):
    """The database was migrated by a newer harness: this one does not know its schema revision."""


SCHEMA_HEAD = "0009"  # the newest migration's revision (tests/record/test_store.py holds it to Alembic's head)


def _at_head(engine: Engine) -> bool:
    """Whether the schema is already at ``SCHEMA_HEAD``: one query, without loading Alembic (~0.3 s) and its
    scripts, which every command opening a database would otherwise pay."""
    try:
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))] == [
                SCHEMA_HEAD]
    except SQLAlchemyError:  # no version table yet (a new database): Alembic creates it
        return False


MIGRATION_LOCK = 0x6D6C7868  # the PostgreSQL advisory lock key migrations hold ("mlxh")


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent); a database at a revision this harness does
    not know (written by a newer one) is refused, untouched."""
    if _at_head(engine):
        return
    from alembic import command  # Alembic (~0.3 s) only when the schema is not at the head: see _at_head
    from alembic.config import Config  # (the same)
    from alembic.runtime.migration import MigrationContext  # (the same)
    from alembic.script import ScriptDirectory  # (the same)

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(config)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Machines starting on one fresh database at once: one migrates, the others wait here and find it
            # done (without the lock two CREATE TABLEs race: UniqueViolation on pg_type). Released at commit.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        current = MigrationContext.configure(connection).get_current_heads()
        known = {revision.revision for revision in script.walk_revisions()}
        if unknown := sorted(set(current) - known):
            raise NewerSchemaError(
                f"the database's schema is at revision {', '.join(unknown)}, newer than this harness knows "
                f"(up to {script.get_current_head()}): it was written by a newer harness; upgrade this checkout")
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@dataclass
class Store:
    """A migrated database and a session factory."""

    engine: Engine
    url: str
    _memo: dict[Any, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @contextmanager
    def memoised(self) -> Iterator[None]:
        """Within it, the reads that go through ``memo`` are made once each: a report's pages read the same runs
        again and again (the newest run's samples: its compare, noise and variant cells). They do not see what is
        written meanwhile, as a report, which writes only its analysis cache, does not need to. Nested: one memo."""
        outer = self._memo
        self._memo = {} if outer is None else outer
        try:
            yield
        finally:
            self._memo = outer

    def memo(self, key: Any, read: Callable[[], Any]) -> Any:
        """``read()``, or within ``memoised`` its first answer for ``key`` (the caller must not change it)."""
        if self._memo is None:
            return read()
        if key not in self._memo:
            self._memo[key] = read()
        return self._memo[key]

    @property
    def sessions(self) -> sessionmaker[Session]:
        return sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    def close(self) -> None:
        self.engine.dispose()

    @property
    def shared_by_processes(self) -> bool:
        """Whether another process opening this URL reaches the same database (not an in-memory SQLite one)."""
        url = self.engine.url
        return url.get_backend_name() != "sqlite" or url.database not in (None, "", ":memory:")

    def forked(self) -> None:
        """In a forked process: leave the parent's open connections alone (this process opens its own)."""
        self.engine.dispose(close=False)


def open_database(url: str | None = None, *, must_exist: bool = False) -> Store:
    """Open (creating and migrating if needed) the database at ``url``; one clear error if unreachable.

    ``must_exist``: for commands that only read (report, compare, variants, export): a SQLite file that is not
    there is refused instead of created empty.
    Commands open it through :func:`harness.record.outbox.open_store`, which also writes the spooled results.
    """
    given_as = "--db" if url else "$HARNESS_DB"
    url = as_db_url(url) if url else default_db_url()
    engine = make_engine(url, must_exist=must_exist, given_as=given_as)  # a bad URL is refused here, lazily
    if must_exist:
        _check_sqlite_results(url)  # before the engine's first connection (which sets WAL)
    try:
        if must_exist and not inspect(engine).has_table("alembic_version"):  # PostgreSQL: an empty database
            engine.dispose()
            raise HarnessError(f"{mask_url(url)} {NO_RESULTS}")
        migrate(engine)
    except DatabaseError as exc:  # unreachable (OperationalError), or not a database at all
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise HarnessError(f"cannot open database {mask_url(url)}: {reason}") from None
    except NewerSchemaError as exc:
        engine.dispose()
        raise HarnessError(f"cannot open database {mask_url(url)}: {exc}") from None
    return Store(engine, url)


# --- writing -------------------------------------------------------------------------------------------------


def get_or_create_chip(session: Session, ident: ChipIdentity) -> Chip:
    chip = session.scalar(select(Chip).where(Chip.key == ident.key))
    if chip is None:
        chip = Chip(key=ident.key, backend=ident.backend, device_name=ident.device_name,
                    architecture=ident.architecture, memory_bytes=ident.memory_bytes, gpu_cores=ident.gpu_cores,
                    record=ident.to_dict())
        session.add(chip)
        session.flush()
    return chip


def get_or_create_machine(session: Session, chip: Chip, facts: dict[str, Any]) -> Machine:
    hostname = str(facts.get("hostname", "unknown"))
    machine = session.scalar(select(Machine).where(Machine.hostname == hostname, Machine.chip_id == chip.id))
    if machine is None:
        machine = Machine(hostname=hostname, chip_id=chip.id, facts=facts)
        session.add(machine)
        session.flush()
    return machine


def get_or_create_commit(session: Session, sha: str, repo: str = "", message: str = "", author: str = "",
                         committed_at: datetime | None = None, branch: str = "",
                         parents: list[str] | None = None) -> Commit:
    """The commit row, created if new; a row stored without these details (a commit between runs, or one from
    before parents were recorded) gets the ones it lacks. ``parents`` None: unknown."""
    repo = canonical(repo)
    commit = session.scalar(select(Commit).where(Commit.repo == repo, Commit.sha == sha))
    if commit is None:
        commit = Commit(repo=repo, sha=sha, message=message, author=author, committed_at=committed_at,
                        branch=branch, parents=None if parents is None else list(parents))
        session.add(commit)
        session.flush()
        return commit
    for name, value in (("message", message), ("author", author), ("committed_at", committed_at),
                        ("branch", branch)):
        if value and not getattr(commit, name):
            setattr(commit, name, value)
    if commit.parents is None and parents is not None:
        commit.parents = list(parents)
    return commit


def create_run(store: Store, *, ident: ChipIdentity, facts: dict[str, Any], commit: dict[str, Any], suite: str,
               dirty: bool, executor: str, planned_jobs: int, options: dict[str, Any] | None = None,
               run_id: str | None = None) -> str:
    """Insert a new run row (a new id each time: running the same commit again never overwrites).

    ``commit``: the commit row (``harness.spec.git.CommitInfo.as_row``): sha, repo, message, author, committed_at,
    parents, and ``branch``, the branch the run is made for (stored with the run too). With ``git_dir`` (where
    the repository is on this machine) the repository's stored commits are then linked (:func:`record_ancestry`).
    """
    run_id = run_id or uuid.uuid4().hex
    commit = dict(commit)
    git_dir = commit.pop("git_dir", "")
    for attempt in range(3):
        try:
            with store.session() as session:
                chip = get_or_create_chip(session, ident)
                machine = get_or_create_machine(session, chip, facts)
                commit_row = get_or_create_commit(session, **commit)
                session.add(Run(id=run_id, commit_id=commit_row.id, chip_id=chip.id, machine_id=machine.id,
                                suite=suite, dirty=dirty, executor=executor, planned_jobs=planned_jobs,
                                options={**(options or {}), "driver": process_identity()},
                                branch=commit.get("branch") or "", settling=bool((options or {}).get("settle"))))
            break
        except IntegrityError:
            # Another writer (a cluster driver's other chip, another run) created the same chip, machine or
            # commit between our look-up and our insert (PostgreSQL READ COMMITTED): the retry finds it.
            if attempt == 2:
                raise
    if git_dir:
        link_repository(store, canonical(commit.get("repo", "")), git_dir, commit.get("sha", ""))
    return run_id


def link_repository(store: Store, repo: str, git_dir: str | Path, head: str = "") -> None:
    """What a clone of ``repo`` at ``git_dir`` tells the store: the commits stored under a checkout path or folder
    name that the clone has are ``repo``'s (:func:`adopt`), and its stored commits are linked by their ancestry
    (:func:`record_ancestry`; ``head``: a commit whose first-parent chain is kept too). A failure is logged, not
    raised: the run or import goes on, the next one links them."""
    try:
        adopt(store, repo, git_dir)
        record_ancestry(store, repo, git_dir, head=head)
    except (HarnessError, SQLAlchemyError) as exc:
        log.warning("cannot record the ancestry of %s's stored commits: %s", repo, exc)


def adopt(store: Store, repo: str, git_dir: str | Path) -> int:
    """Commit rows keyed by a checkout path or folder name (written before repositories had an identity, or
    imported from such a bundle) whose sha the clone at ``git_dir`` has are moved under ``repo``, merged with the
    rows already there (``harness.record.identity.unify``); the number of rows merged away."""
    with store.session() as session:
        rows = session.execute(select(Commit.id, Commit.repo, Commit.sha).where(Commit.repo != repo)).all()
    loose = {row.id: row.sha for row in rows if not git.is_identity(row.repo) and git.FULL_SHA.match(row.sha)}
    if not loose:
        return 0
    present = git.present(git_dir, sorted(set(loose.values())))
    assign = {row_id: repo for row_id, sha in loose.items() if sha in present}
    if not assign:
        return 0
    with store.session() as session:
        return unify(session.connection(), assign)


def record_ancestry(store: Store, repo: str, git_dir: str | Path, limit: int = ANCESTRY_LIMIT,
                    head: str = "") -> tuple[int, int]:
    """Link the stored commits of ``repo`` with what the repository at ``git_dir`` knows (one ``git rev-list
    --parents`` over the stored shas, newest ``limit`` commits of their history at most):

    - stored commits whose parents are unknown (stored before revision 0002) get them: old databases heal;
    - the commits between stored commits that are not stored (never run) are added, sha and parents only, so that
      the walk from any commit to its nearest ancestor with runs stays in the database;
    - the first ``FIRST_PARENT_LINKS`` commits of ``head``'s first-parent line too: they travel in its bundle, so
      that the database it is imported into links it to the runs of other machines (harness/record/bundle.py).

    Idempotent, and safe beside concurrent writers. Returns (commits given parents, commits added).
    """
    with store.session() as session:
        stored = {sha: parents is not None for sha, parents in session.execute(
            select(Commit.sha, Commit.parents).where(Commit.repo == repo))}
    graph = git.ancestry(git_dir, sorted(sha for sha in stored if git.FULL_SHA.match(sha)), limit)
    healed = [{"b_sha": sha, "b_parents": list(graph[sha])} for sha, known in sorted(stored.items())
              if not known and sha in graph]  # in sha order, as the inserts: concurrent healers lock alike
    links = _between(graph, stored) | (_first_parent_line(graph, head, FIRST_PARENT_LINKS) - stored.keys())
    added = [{"repo": repo, "sha": sha, "message": "", "author": "", "committed_at": None, "branch": "",
              "parents": list(graph[sha])} for sha in sorted(links)]
    if not healed and not added:
        return 0, 0
    with store.session() as session:
        table = Commit.__table__
        if healed:
            session.execute(update(table).where(table.c.repo == repo, table.c.sha == bindparam("b_sha"),
                                                table.c.parents.is_(None))
                            .values(parents=bindparam("b_parents")), healed)
        if added:
            session.execute(_insert_new(session, table), added)
    return len(healed), len(added)


def _first_parent_line(graph: dict[str, tuple[str, ...]], head: str, count: int) -> set[str]:
    """Up to ``count`` first-parent ancestors of ``head`` that ``graph`` has (with their parents)."""
    line: set[str] = set()
    sha = head
    while sha in graph and graph[sha] and len(line) < count:
        sha = graph[sha][0]
        if sha not in graph:
            break
        line.add(sha)
    return line


def _between(graph: dict[str, tuple[str, ...]], stored: Collection[str]) -> set[str]:
    """The commits of ``graph`` (shas -> parents, ancestors of stored commits) that are not stored but have a stored
    ancestor: those between stored commits."""
    below: dict[str, bool] = {}  # has a stored ancestor
    for start in graph:
        if start in below:
            continue
        stack, on_path = [start], {start}  # depth first, parents before children
        while stack:
            sha = stack[-1]
            parent = next((p for p in graph[sha] if p in graph and p not in stored and p not in below
                           and p not in on_path), None)
            if parent is not None:
                stack.append(parent)
                on_path.add(parent)
                continue
            stack.pop()
            on_path.discard(sha)
            below[sha] = any(p in stored or below.get(p, False) for p in graph[sha])
    return {sha for sha, linked in below.items() if linked and sha not in stored}


def _insert_new(session: Session, table):
    """An INSERT of commits that skips those already there (a concurrent writer stored them first)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=["repo", "sha"])
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=["repo", "sha"])
    return insert(table)


def _job_record(run_id: str, job: Job, result: JobResult, peaks: tuple[float | None, float | None]) -> JobRecord:
    labels = job.labels  # what each job type is stored under (harness/core/job.py)
    record = JobRecord(run_id=run_id, key=job.key, kind=job.kind, name=job.name, kernel=labels.kernel,
                       variant=labels.variant, dtype=labels.dtype, shape=labels.shape, shape_key=labels.shape_key,
                       check_name=labels.check, status=result.status, detail=result.detail[:4000],
                       output_tail=result.output_tail[-4000:], max_error=result.max_error,
                       tolerance=result.tolerance, duration_s=result.duration_s, node=result.node,
                       attempts=result.attempts)
    if result.samples:
        record.inner, record.warmup_s, record.warmup_calls = result.inner, result.warmup_s, result.warmup_calls
        record.flops, record.bytes_moved = result.flops, result.bytes_moved
        record.timing_mode, record.round_trip_s = result.mode, result.round_trip_s
        record.backlog_calls = result.backlog_calls
        _summarize_samples(record, result.samples, peaks)
    return record


def _summarize_samples(record: JobRecord, samples: list[float], peaks: tuple[float | None, float | None]) -> None:
    """The stored median / CI / IQR and roofline of a job over all its samples (every trial's)."""
    summary = summarize(samples)
    record.n_samples = summary.n
    record.median_s, record.ci_low_s, record.ci_high_s, record.iqr_rel = (
        summary.median, summary.ci_low, summary.ci_high, summary.iqr_rel)
    apply_roofline(record, *peaks)


# The status a job keeps when its trials disagree: any failure shows over a pass, a pass over a skip.
_TRIAL_STATUS_RANK = {"skipped": 0, "passed": 1}


def _add_trial(session: Session, record: JobRecord, result: JobResult,
               peaks: tuple[float | None, float | None]) -> bool:
    """Another trial of a stored benchmark job: its samples appended (their ``trial`` set), the summary over all
    trials, and the worse status kept (a failed trial shows; its detail says which). False if already stored."""
    stored = session.scalar(select(func.count()).select_from(Sample).where(Sample.job_id == record.id,
                                                                         Sample.trial == result.trial))
    if stored or (not result.samples and result.status == record.status):
        return False
    if _TRIAL_STATUS_RANK.get(result.status, 2) > _TRIAL_STATUS_RANK.get(record.status, 2):
        record.status = result.status
        record.detail = f"trial {result.trial + 1}: {result.detail}"[:4000]
        record.output_tail = result.output_tail[-4000:] or record.output_tail
    record.duration_s += result.duration_s
    if result.samples:
        first = session.scalar(select(func.coalesce(func.max(Sample.idx) + 1, 0)).where(Sample.job_id == record.id))
        sample_writer(session, append=True)([(record.id, first + i, s, result.trial)
                                             for i, s in enumerate(result.samples)])
        everything = list(session.scalars(select(Sample.seconds).where(Sample.job_id == record.id)))
        record.trials = len(set(session.scalars(select(Sample.trial).where(Sample.job_id == record.id))))
        record.inner = record.inner or result.inner
        record.timing_mode = record.timing_mode or result.mode
        record.round_trip_s = record.round_trip_s if record.round_trip_s is not None else result.round_trip_s
        record.backlog_calls = least(record.backlog_calls, result.backlog_calls)  # host-paced in any trial shows
        record.flops, record.bytes_moved = record.flops or result.flops, record.bytes_moved or result.bytes_moved
        _summarize_samples(record, everything, peaks)
    return True


def least(first: float | None, second: float | None) -> float | None:
    """The smaller of two optional values (None where both are)."""
    known = [value for value in (first, second) if value is not None]
    return min(known) if known else None


def apply_roofline(record: JobRecord, peak_flops: float | None, peak_bytes_per_s: float | None) -> None:
    """Achieved FLOP/s and B/s, and % of the chip's calibrated peak for whichever bound is higher."""
    if not record.median_s:
        return
    record.achieved_flops = (record.flops or 0.0) / record.median_s
    record.achieved_bytes_per_s = (record.bytes_moved or 0.0) / record.median_s
    fractions = {}
    if peak_flops and record.flops:
        fractions["compute"] = record.achieved_flops / peak_flops
    if peak_bytes_per_s and record.bytes_moved:
        fractions["memory"] = record.achieved_bytes_per_s / peak_bytes_per_s
    if fractions:
        record.bound = max(fractions, key=fractions.get)
        record.pct_peak = 100.0 * fractions[record.bound]


def record_result(store: Store, run_id: str, job: Job, result: JobResult,
                  peaks: tuple[float | None, float | None] = (None, None)) -> bool:
    """Write one job result with its samples; False (and nothing written) if (run, key) is already stored -- for a
    benchmark, if that trial of it is (another trial adds its samples to the job's row: :func:`_add_trial`)."""
    with store.sessions() as session:
        try:
            with session.begin():
                existing = session.scalar(select(JobRecord).where(JobRecord.run_id == run_id,
                                                                  JobRecord.key == job.key))
                if existing is not None:
                    return job.kind == "benchmark" and _add_trial(session, existing, result, peaks)
                record = _job_record(run_id, job, result, peaks)
                session.add(record)
                session.flush()
                if result.samples:
                    sample_writer(session)([(record.id, i, s, result.trial) for i, s in enumerate(result.samples)])
                session.add_all(_test_records(run_id, job, result))  # a pytest job's tests, in the same transaction
        except IntegrityError:
            if _job_is_stored(store, run_id, job.key):
                return False  # a concurrent writer stored it first
            raise  # anything else (a run that is not there, a value the column refuses) must not vanish
    return True


def _job_is_stored(store: Store, run_id: str, key: str) -> bool:
    with store.session() as session:
        return session.scalar(select(JobRecord.id).where(JobRecord.run_id == run_id, JobRecord.key == key)) is not None


def _test_records(run_id: str, job: Job, result: JobResult) -> list[JobRecord]:
    """One row per test of a pytest job: kind "test", key test/<selection>/<nodeid>, status its outcome."""
    records: dict[str, JobRecord] = {}
    labels = job.labels
    for test in result.tests:
        key = per_test_key(job.name, str(test["nodeid"]))
        records.setdefault(key, JobRecord(
            run_id=run_id, key=key, kind="test", name=str(test["nodeid"])[:255], kernel=labels.kernel,
            variant=labels.variant, dtype=labels.dtype, shape={}, shape_key="", check_name="", status=test["outcome"],
            detail=str(test.get("detail", ""))[:4000], output_tail=str(test.get("longrepr", ""))[-4000:],
            duration_s=float(test.get("duration_s") or 0.0), node=result.node, attempts=result.attempts))
    return list(records.values())


def trial_summaries(rows: Sequence[Sequence[Any]]) -> list[tuple[int, int, int, int, float]]:
    """``(job_id, trial, n, valid, median)`` per (job, trial) of sample rows ``(job_id, idx, seconds, trial)``, in
    (job, trial) order: how many samples, how many valid (finite, > 0; the analysis drops the others) and the median
    of the valid ones as ``np.median`` computes it (the mean of the two middle values; nan with none valid)."""
    if not rows:
        return []
    count = len(rows)
    job = np.fromiter((row[0] for row in rows), dtype=np.int64, count=count)
    seconds = np.fromiter((row[2] for row in rows), dtype=np.float64, count=count)
    trial = np.fromiter((row[3] for row in rows), dtype=np.int64, count=count)
    valid = np.isfinite(seconds) & (seconds > 0)
    order = np.lexsort((np.where(valid, seconds, np.inf), trial, job))  # per (job, trial): valid ones first, sorted
    job, seconds, trial, valid = job[order], seconds[order], trial[order], valid[order]
    starts = np.flatnonzero(np.concatenate([[True], (job[1:] != job[:-1]) | (trial[1:] != trial[:-1])]))
    sizes = np.diff(np.append(starts, count))
    n_valid = np.add.reduceat(valid.astype(np.int64), starts)
    has = n_valid > 0
    medians = np.where(has, sorted_medians(seconds, starts, np.maximum(n_valid, 1)), np.nan)
    return list(zip(job[starts].tolist(), trial[starts].tolist(), sizes.tolist(), n_valid.tolist(),
                    medians.tolist(), strict=True))


# One trial in ``TrialSummary.trials``: the bytes of these records, one per trial in trial order.
TRIAL_RECORD = np.dtype([("trial", "<i8"), ("valid", "<i8"), ("median", "<f8")])


def packed_summaries(summaries: Sequence[tuple[int, int, int, int, float]]
                     ) -> dict[int, tuple[int, npt.NDArray[Any]]]:
    """``trial_summaries`` rows per job: its sample count and its ``TRIAL_RECORD`` array."""
    out: dict[int, tuple[int, npt.NDArray[Any]]] = {}
    for job_id, group in groupby(summaries, key=itemgetter(0)):
        trials = list(group)
        records = np.array([(t, v, m) for _, t, _, v, m in trials], dtype=TRIAL_RECORD)
        out[job_id] = (sum(n for _, _, n, _, _ in trials), records)
    return out


def unpacked_trials(payload: bytes) -> npt.NDArray[Any] | None:
    """The ``TRIAL_RECORD`` array of a ``TrialSummary.trials`` value; None if it is not one."""
    if len(payload) % TRIAL_RECORD.itemsize:
        return None
    return np.frombuffer(payload, dtype=TRIAL_RECORD)


def sample_writer(session: Session, *, append: bool = False) -> Callable[[list[tuple[int, int, float, int]]], None]:
    """The fastest bulk insert of (job_id, idx, seconds, trial) rows the database offers, in the session's
    transaction, with their jobs' ``TrialSummary`` rows: each call must hold all the samples of the trials it writes
    (a trial is written once). ``append``: the jobs may have trials stored already (a later trial), kept and merged
    with the new ones; else they are new jobs.

    PostgreSQL (psycopg 3): COPY FROM STDIN in text format, the rows formatted at once (float repr is exact and
    PostgreSQL reads inf/nan). SQLite: executemany of plain tuples (no per-row parameter processing).
    Anything else: a Core executemany insert.
    """
    write = _raw_sample_writer(session)
    table = TrialSummary.__table__

    def write_with_summaries(rows: list[tuple[int, int, float, int]]) -> None:
        if clean := _without_nan(rows):  # none at all (a bundle of test-only runs): SQLite's executemany of an
            write(clean)  # empty list runs the statement once, without its parameters
        new = packed_summaries(trial_summaries(rows))
        if not new:
            return
        connection = session.connection()
        jobs = sorted(new) if append else []
        for start in range(0, len(jobs), 500):
            part = jobs[start:start + 500]
            for job_id, n, payload in connection.execute(select(table.c.job_id, table.c.n, table.c.trials)
                                                         .where(table.c.job_id.in_(part))).all():
                old = unpacked_trials(payload)
                added, records = new[job_id]
                merged = records if old is None else np.concatenate([old, records])
                new[job_id] = (added + (n if old is not None else 0), np.sort(merged, order="trial", kind="stable"))
            connection.execute(delete(table).where(table.c.job_id.in_(part)))
        connection.execute(insert(table), [{"job_id": job_id, "n": n, "trials": records.tobytes()}
                                           for job_id, (n, records) in new.items()])

    return write_with_summaries


def _without_nan(rows: list[tuple[int, int, float, int]]) -> list[tuple[int, int, float, int]]:
    """The rows with a sample that is not a number as +inf. SQLite reads a NaN as NULL, which the sample column
    refuses (the job's whole write failed); to the analysis both are an invalid sample (valid: finite and > 0), so
    every backend stores +inf and reads the same."""
    if not any(seconds != seconds for _, _, seconds, _ in rows):  # noqa: PLR0124 -- NaN is the value unequal to itself
        return rows
    return [(job, idx, seconds if seconds == seconds else math.inf, trial)  # noqa: PLR0124
            for job, idx, seconds, trial in rows]


def _raw_sample_writer(session: Session) -> Callable[[list[tuple[int, int, float, int]]], None]:
    connection = session.connection()
    dialect = connection.dialect
    table = dialect.identifier_preparer.format_table(Sample.__table__)
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        driver_connection = connection.connection.driver_connection

        def copy(rows: list[tuple[int, int, float, int]]) -> None:
            with driver_connection.cursor() as cursor, \
                    cursor.copy(f"COPY {table} (job_id, idx, seconds, trial) FROM STDIN") as stream:
                stream.write("".join([f"{job}\t{idx}\t{seconds!r}\t{trial}\n" for job, idx, seconds, trial in rows]))

        return copy
    if dialect.name == "sqlite":
        return lambda rows: connection.exec_driver_sql(
            f"INSERT INTO {table} (job_id, idx, seconds, trial) VALUES (?, ?, ?, ?)", rows)
    return lambda rows: connection.execute(insert(Sample.__table__),
                                           [{"job_id": j, "idx": i, "seconds": s, "trial": t} for j, i, s, t in rows])


def set_peaks(store: Store, run_id: str, peak_flops: float | None, peak_bytes_per_s: float | None) -> None:
    with store.session() as session:
        run = session.get(Run, run_id)
        run.peak_flops, run.peak_bytes_per_s = peak_flops, peak_bytes_per_s


@dataclass(frozen=True)
class StoredRun:
    """What resuming a run needs: its options, commit, chip, and the jobs (and trials) it already has."""

    options: dict[str, Any]
    sha: str
    chip_key: str
    units: dict[str, str]  # each stored execution (job.unit: a key, or a benchmark's later trial) -> its status
    keys: set[str]  # every stored key, per-test rows included

    @property
    def statuses(self) -> Counter:
        """Of the stored executions (per-test rows not counted)."""
        return Counter(self.units.values())


def stored_run(store: Store, run_id: str) -> StoredRun | None:
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        rows = session.execute(select(JobRecord.id, JobRecord.key, JobRecord.kind, JobRecord.status)
                               .where(JobRecord.run_id == run.id)).all()
        trials: dict[int, set[int]] = {}
        for job_id, trial in session.execute(select(Sample.job_id, Sample.trial).distinct().join(
                JobRecord, Sample.job_id == JobRecord.id).where(JobRecord.run_id == run.id)):
            trials.setdefault(job_id, set()).add(trial)
        units = {unit_key(key, trial): status for job_id, key, kind, status in rows if kind != "test"
                 for trial in sorted(trials.get(job_id, {0}))}
        return StoredRun(dict(run.options or {}), run.commit.sha, run.chip.key, units, {row.key for row in rows})


def reopen_run(store: Store, run_id: str) -> None:
    """Mark a stored run as running again (``harness run --resume``), held by this process now."""
    with store.session() as session:
        run = session.get(Run, run_id)
        run.status, run.finished_at = "running", None
        run.options = {**(run.options or {}), "driver": process_identity()}


ABANDONED = "abandoned"  # a run whose driver process died without finishing it (SIGKILL, a crash, power loss)


def reap_abandoned_runs(store: Store) -> list[str]:
    """Finish as "abandoned" (with the time it was found) every "running" run whose driver was a process of this
    machine that no longer runs; a run driven from another machine is left alone (nothing here can tell)."""
    with store.session() as session:
        running = session.scalars(select(Run).where(Run.status == "running")).all()
        gone = [run for run in running if holder_is_gone((run.options or {}).get("driver") or {})]
        for run in gone:
            run.status, run.finished_at = ABANDONED, utcnow()
        return [run.id for run in gone]


def finish_run(store: Store, run_id: str, status: str) -> None:
    with store.session() as session:
        run = session.get(Run, run_id)
        run.status, run.finished_at = status, utcnow()


def stored_keys(store: Store, run_id: str) -> set[str]:
    with store.session() as session:
        return set(session.scalars(select(JobRecord.key).where(JobRecord.run_id == run_id)))


def finalize_roofline(store: Store, run_id: str) -> tuple[float | None, float | None]:
    """Set the run's calibrated peaks (best matmul FLOP/s, best copy B/s) and every benchmark's % of peak."""
    with store.session() as session:
        run = session.get(Run, run_id)
        calib = session.scalars(select(JobRecord).where(JobRecord.run_id == run_id,
                                                        JobRecord.kind == "calibration",
                                                        JobRecord.median_s.is_not(None))).all()
        flops = [r.achieved_flops for r in calib if r.kernel == "calib_matmul" and r.achieved_flops]
        copies = [r.achieved_bytes_per_s for r in calib if r.kernel == "calib_copy" and r.achieved_bytes_per_s]
        run.peak_flops = max(flops) if flops else run.peak_flops
        run.peak_bytes_per_s = max(copies) if copies else run.peak_bytes_per_s
        for record in session.scalars(select(JobRecord).where(JobRecord.run_id == run_id,
                                                              JobRecord.median_s.is_not(None))):
            apply_roofline(record, run.peak_flops, run.peak_bytes_per_s)
        return run.peak_flops, run.peak_bytes_per_s
