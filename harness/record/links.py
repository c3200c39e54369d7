"""What a clone of a repository tells the store: the commits stored under a checkout path or folder name that
are its (``adopt``), and its stored commits linked by their ancestry (``record_ancestry``)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from harness.core.errors import HarnessError
from harness.record.db import Database, upsert_insert
from harness.record.identity import unify
from harness.record.models import Commit
from harness.spec import git

FIRST_PARENT_LINKS = 100  # first-parent ancestors of a run's commit stored with it (and exported in its bundles)
ANCESTRY_LIMIT = 20_000  # commits of a repository's history read (newest first) to link its stored commits
log = logging.getLogger(__name__)


def link_repository(store: Database, repo: str, git_dir: str | Path, head: str = "") -> None:
    """What a clone of ``repo`` at ``git_dir`` tells the store: the commits stored under a checkout path or folder
    name that the clone has are ``repo``'s (:func:`adopt`), and its stored commits are linked by their ancestry
    (:func:`record_ancestry`; ``head``: a commit whose first-parent chain is kept too). A failure is logged, not
    raised: the run or import goes on, the next one links them."""
    try:
        adopt(store, repo, git_dir)
        record_ancestry(store, repo, git_dir, head=head)
    except (HarnessError, SQLAlchemyError) as exc:
        log.warning("cannot record the ancestry of %s's stored commits: %s", repo, exc)


def adopt(store: Database, repo: str, git_dir: str | Path) -> int:
    """Commit rows keyed by a checkout path or folder name (written before repositories had an identity, or
    imported from such a bundle) whose sha the clone at ``git_dir`` has are moved under ``repo``, merged with the
    rows already there (``harness.record.identity.unify``); the number of rows merged away. The stored keys are
    read first (one index scan): only the rows of keys that are no identity are read, and none when there are none
    (after the first adoption, the usual case: every run and import with a clone asks)."""
    with store.session() as session:
        keys = [key for key in session.scalars(select(Commit.repo).distinct())
                if key != repo and not git.is_identity(key)]
        if not keys:
            return 0
        rows = session.execute(select(Commit.id, Commit.repo, Commit.sha).where(Commit.repo.in_(keys))).all()
    loose = {row.id: row.sha for row in rows if git.FULL_SHA.match(row.sha)}
    if not loose:
        return 0
    present = git.present(git_dir, sorted(set(loose.values())))
    assign = {row_id: repo for row_id, sha in loose.items() if sha in present}
    if not assign:
        return 0
    with store.session() as session:
        return unify(session.connection(), assign)


def record_ancestry(store: Database, repo: str, git_dir: str | Path, limit: int = ANCESTRY_LIMIT,
                    head: str = "") -> tuple[int, int]:
    """Link the stored commits of ``repo`` with what the repository at ``git_dir`` knows (one ``git rev-list
    --parents`` over the stored shas, newest ``limit`` commits of their history at most):

    - stored commits whose parents are unknown (stored before revision 0002) get them: old databases heal;
    - the commits between stored commits that are not stored (never run) are added, sha and parents only, so that
      the walk from any commit to its nearest ancestor with runs stays in the database;
    - the first ``FIRST_PARENT_LINKS`` commits of ``head``'s first-parent line too: they travel in its bundle, so
      that the database it is imported into links it to the runs of other machines (harness/record/bundle/).

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
    statement = upsert_insert(session.get_bind().dialect.name, table)
    return insert(table) if statement is None else statement.on_conflict_do_nothing(index_elements=["repo", "sha"])
