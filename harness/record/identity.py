"""One commit row per (repository, sha): stored rows that today's repository keys split are merged.

A repository is known by its identity (``harness.spec.git.identity``): its normalised remote ``host/owner/name``,
or ``root:<sha>`` of its root commit. Rows written before that rule (revision 0007 migrates them), bundles from
older harnesses and ``--repo-name`` overrides carry other keys: a remote URL in any spelling, a checkout path, a
folder name. :func:`plan` decides from what the rows store which key each row belongs under:

1. a key that is a remote URL is normalised (``https://github.com/o/r.git`` and ``git@github.com:o/r`` are
   ``github.com/o/r``);
2. a key that names no remote (a path, a folder name, ``root:``) goes under the one remote identity its commits
   share shas with, theirs or their parents' (a full sha names one commit of one history). Where its shas meet
   several remote identities (a fork, or one folder name used for two repositories), each of its rows goes to the
   remote identity that alone has its sha (or its parents'), and the others stay where they are;
3. the keys left without a remote that share shas are one repository, named by its ``root:`` key if it has one,
   else by the smallest key.

Remote identities are never merged with each other (a fork is another repository): ``--repo-name`` does that.
:func:`unify` applies the plan: duplicates of a (key, sha) are merged into one row (the one with known parents,
else the oldest), which gets the details it lacked from the others; their runs are re-pointed to it.
Nothing else refers to a commit row (the analysis cache is keyed by runs and is recomputed where they moved).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sqlalchemy import Connection, bindparam, delete, select, update

from harness.record.models import AnalysisCache, Commit, Run
from harness.spec import git

Row = tuple[int, str, str, "tuple[str, ...] | list[str] | None"]  # (commit id, repo key, sha, parents)
DETAILS = ("message", "author", "committed_at", "branch", "parents")


def canonical(key: str) -> str:
    """A stored repository key in the identity's spelling where it is a remote URL; else as it is."""
    return git.remote_key(key) or key


def _is_remote(key: str) -> bool:
    return not key.startswith(git.ROOT_PREFIX) and git.is_identity(key)


def _find(parent: dict[str, str], key: str) -> str:
    while parent[key] != key:
        parent[key] = parent[parent[key]]
        key = parent[key]
    return key


def _named(row: Row) -> list[str]:
    """The full shas a row names: its own and its parents' (one history)."""
    return [sha for sha in (row[2], *(row[3] or ())) if git.FULL_SHA.match(sha)]


def plan(rows: Iterable[Row]) -> dict[int, str]:
    """Each row's repository key by the rule of the module docstring (only rows whose key changes)."""
    rows = list(rows)
    key_of = {row[0]: canonical(row[1]) for row in rows}
    remotes_of_sha: dict[str, set[str]] = defaultdict(set)
    local_rows: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        key = key_of[row[0]]
        if _is_remote(key):
            for sha in _named(row):
                remotes_of_sha[sha].add(key)
        else:
            local_rows[key].append(row)
    left: dict[str, list[Row]] = defaultdict(list)  # local keys' rows that found no remote identity
    for key, members in local_rows.items():
        met = set().union(*(remotes_of_sha.get(sha, set()) for row in members for sha in _named(row)))
        for row in members:
            only = set().union(*(remotes_of_sha.get(sha, set()) for sha in _named(row)))
            target = next(iter(met)) if len(met) == 1 else next(iter(only)) if len(only) == 1 else None
            if target is None:
                left[key].append(row)
            else:
                key_of[row[0]] = target
    parent = {key: key for key in left}
    first_key: dict[str, str] = {}
    for key, members in left.items():
        for row in members:
            for sha in _named(row):
                a, b = _find(parent, key), _find(parent, first_key.setdefault(sha, key))
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[str, list[str]] = defaultdict(list)
    for key in left:
        groups[_find(parent, key)].append(key)
    for keys in groups.values():
        roots = sorted(k for k in keys if k.startswith(git.ROOT_PREFIX))
        name = roots[0] if roots else min(keys)
        for key in keys:
            for row in left[key]:
                key_of[row[0]] = name
    original = {row[0]: row[1] for row in rows}
    return {row_id: key for row_id, key in key_of.items() if key != original[row_id]}


def unify(connection: Connection, assign: dict[int, str] | None = None) -> int:
    """Apply :func:`plan` to every stored commit row (in the caller's transaction); the number of rows merged
    away. ``assign``: rows whose repository is known better than their key says (row id -> key; ``adopt``).
    Idempotent: a database that follows the rule is only read."""
    table = Commit.__table__
    stored = {row.id: (row.repo, row.sha, row.parents) for row in connection.execute(
        select(table.c.id, table.c.repo, table.c.sha, table.c.parents))}
    assign = assign or {}
    rows = [(row_id, assign.get(row_id, repo), sha, parents) for row_id, (repo, sha, parents) in stored.items()]
    moves = plan(rows)
    target = {row[0]: moves.get(row[0], row[1]) for row in rows}
    changed = {row_id for row_id, (repo, _, _) in stored.items() if target[row_id] != repo}
    if not changed:
        return 0
    touched = {(target[row_id], stored[row_id][1]) for row_id in changed}
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row_id, _, sha, _ in rows:
        if (target[row_id], sha) in touched:
            groups[(target[row_id], sha)].append(row_id)
    ids = [row_id for members in groups.values() for row_id in members]
    details: dict[int, dict] = {}
    columns = [table.c[name] for name in ("id", "repo", *DETAILS)]  # those of revision 0007 (its migration runs this)
    for start in range(0, len(ids), 500):
        for row in connection.execute(select(*columns).where(table.c.id.in_(ids[start:start + 500]))).mappings():
            details[row["id"]] = dict(row)
    merged = 0
    renames: list[dict[str, object]] = []
    runs = Run.__table__
    for (key, _sha), members in sorted(groups.items()):
        members.sort(key=lambda i: (details[i]["parents"] is None, i))
        keeper, others = members[0], members[1:]
        values = {}
        for name in DETAILS:
            if details[keeper][name] in (None, ""):
                found = next((details[i][name] for i in sorted(others) if details[i][name] not in (None, "")), None)
                if found is not None:
                    values[name] = found
        if others:
            connection.execute(update(runs).where(runs.c.commit_id.in_(others)).values(commit_id=keeper))
            connection.execute(delete(table).where(table.c.id.in_(others)))
            merged += len(others)
        if details[keeper]["repo"] != key:
            renames.append({"b_id": keeper, "b_repo": key, "b_parked": f"~{keeper}"})
        if values:
            connection.execute(update(table).where(table.c.id == keeper).values(**values))
    if renames:  # by way of a key no row has: a row may take (key, sha) before another leaves it
        by_id = table.c.id == bindparam("b_id")
        connection.execute(update(table).where(by_id).values(repo=bindparam("b_parked")), renames)
        connection.execute(update(table).where(by_id).values(repo=bindparam("b_repo")), renames)
    if merged or renames:
        connection.execute(delete(AnalysisCache.__table__))  # derived only: recomputed from the merged rows
    return merged
