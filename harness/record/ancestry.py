"""Commit ancestry as the store knows it, and the orders built on it.

Every stored commit has its parents (``Commit.parents``: full shas, first parent first; None when unknown, as for
rows written before parents were recorded). The store also keeps the commits between run commits that were never
run, so a walk from a run commit reaches its nearest run ancestors without the repository
(``harness.record.store.record_ancestry``). On that graph (keys are ``(repo, sha)``; a walk stays in its repo):

- :func:`nearest`: "the previous commit": the first ancestor in a set (the commits with runs on a chip), walking
  first parents, then the other parents (nearest merge first), each commit once.
- :func:`arrange`: a chip's commits in history order: the branch's first-parent line from its newest commit, oldest
  first, then the commits off that line (side branches, another repository) as lines of their own, never
  interleaved into it; and every commit's previous commit.

A commit whose parents are unknown, or whose walk runs into unknown parents before finding anything, falls back to
the time order of first runs: its previous commit is the one run just before it (the order before parents were
recorded).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.record.models import Commit

Key = tuple[str, str]  # (repo, sha)
Graph = Mapping[Key, Sequence[str] | None]  # stored commits -> parents (None: unknown)


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()  # a walk that ran into unknown parents (or too far) before finding anything
WALK_LIMIT = 100_000  # commits one walk visits at most (then: UNKNOWN)


def load_graph(session: Session, repos: Iterable[str]) -> dict[Key, tuple[str, ...] | None]:
    """Every stored commit of ``repos`` with its parents (None: unknown)."""
    repos = sorted(set(repos))
    if not repos:
        return {}
    return {(repo, sha): None if parents is None else tuple(parents) for repo, sha, parents in session.execute(
        select(Commit.repo, Commit.sha, Commit.parents).where(Commit.repo.in_(repos)))}


def nearest(graph: Graph, start: Key, targets: Collection[Key], limit: int = WALK_LIMIT) -> Key | _Unknown | None:
    """The nearest ancestor of ``start`` in ``targets``: along first parents, then along the other parents
    (those of the nearest merges first); None when there is none (the walk reached root commits), UNKNOWN when
    ``start``'s parents are unknown or the walk met unknown parents, a parent the store does not keep (its
    ancestry did not travel with a bundle), or ``limit`` commits, first."""
    if graph.get(start) is None:
        return UNKNOWN
    repo = start[0]
    seen = {start}
    pending: deque[Key] = deque()  # other parents met along the way, nearest first
    unknown = False
    current = start
    while True:
        while True:  # the first-parent chain from ``current``
            if current not in graph:  # not stored (a bundle's commit whose parents did not travel): cannot tell
                unknown = True
                break
            parents = graph[current]
            if parents is None:
                unknown = True
                break
            if not parents:
                break
            pending.extend((repo, sha) for sha in parents[1:])
            current = (repo, parents[0])
            if current in seen:
                break
            seen.add(current)
            if current in targets:
                return current
            if len(seen) > limit:
                return UNKNOWN
        while pending and pending[0] in seen:
            pending.popleft()
        if not pending:
            return UNKNOWN if unknown else None
        current = pending.popleft()
        seen.add(current)
        if current in targets:
            return current
        if current not in graph:
            unknown = True


@dataclass(frozen=True)
class Arrangement:
    """A chip's commits (indices into the time-ordered input) in history order.

    ``order``: every commit once: the main line (oldest first), then the other lines; ``line``: per position of
    ``order``, 0 for the main line, 1, 2... for the others; ``previous``: per input index, the input index of its
    previous commit (nearest ancestor in the input), -1 when it has none.
    """

    order: list[int]
    line: list[int]
    previous: list[int]
    proven: list[bool] = field(default_factory=list)  # per input index: its previous commit and line place are
    # proven by ancestry (False: placed by commit time, ``fallback_order``)

    @property
    def all_proven(self) -> bool:
        return all(self.proven)


class _FirstParents:
    """Nearest target along first parents only, memoised over the whole graph (chains share their tails)."""

    def __init__(self, graph: Graph, targets: Collection[Key]) -> None:
        self.graph = graph
        self.targets = targets
        self.memo: dict[Key, Key | _Unknown | None] = {}

    def __call__(self, start: Key) -> Key | _Unknown | None:
        path = []
        current = start
        while True:
            if current in self.memo:
                found = self.memo[current]
                break
            parents = self.graph.get(current)  # None: unknown, or not stored (its ancestry did not travel)
            if parents is None:
                found = UNKNOWN
                break
            if not parents:
                found = None
                break
            path.append(current)
            current = (current[0], parents[0])
            if current in self.targets:
                found = current
                break
            if len(path) > len(self.graph):  # a cycle: not a git history
                found = UNKNOWN
                break
        for key in path:
            self.memo[key] = found
        return found


def _break_cycles(previous: list[int], fallback: list[bool]) -> None:
    """Make ``previous`` a forest: cut each cycle (time fallbacks can close one) at a fallback edge."""
    state = [0] * len(previous)  # 0 unseen, 1 on the current path, 2 done
    for start in range(len(previous)):
        path = []
        i = start
        while i >= 0 and state[i] == 0:
            state[i] = 1
            path.append(i)
            i = previous[i]
        if i >= 0 and state[i] == 1:
            cycle = path[path.index(i):]
            previous[next((j for j in cycle if fallback[j]), cycle[-1])] = -1
        for j in path:
            state[j] = 2


def _depths(previous: list[int], stop: Collection[int] = ()) -> list[int]:
    """Commits on each commit's ``previous`` chain, itself included, up to (not counting) ``stop`` or the end."""
    depth = [0] * len(previous)
    for start in range(len(previous)):
        path = []
        i = start
        while i >= 0 and depth[i] == 0 and i not in stop:
            path.append(i)
            i = previous[i]
        base = depth[i] if i >= 0 and i not in stop else 0
        for j in reversed(path):
            base += 1
            depth[j] = base
    return depth


def _chain(previous: list[int], tip: int, stop: Collection[int]) -> list[int]:
    """``tip`` and its ``previous`` chain up to ``stop``, oldest first."""
    chain = []
    i = tip
    while i >= 0 and i not in stop:
        chain.append(i)
        i = previous[i]
    return chain[::-1]


def fallback_order(keys: Sequence[Key], times: Sequence[datetime | None] = ()) -> list[int]:
    """Per commit, the commit placed before it where ancestry cannot tell: of the same repository, the one with
    the latest commit time before its own (by input order -- first runs -- among equal or unknown times); -1 for
    none. Only ever a guess: pages and ``compare`` say "order not proven by ancestry" where it is used."""
    out = [-1] * len(keys)
    latest: dict[str, int] = {}
    order = sorted(range(len(keys)), key=lambda i: (times[i] is None if i < len(times) else True,
                                                     times[i] if i < len(times) and times[i] is not None else 0, i))
    for i in order:
        repo = keys[i][0]
        out[i] = latest.get(repo, -1)
        latest[repo] = i
    return out


def arrange(keys: Sequence[Key], graph: Graph, branches: Sequence[Collection[str]] = (),
            times: Sequence[datetime | None] = ()) -> Arrangement:
    """History order and previous commits of ``keys`` (a chip's commits, in time order of their first runs).

    ``branches``: per commit, the branches its runs were made for. The main line is followed from its newest
    commit: among the commits whose parents are known, those of the branch most of them were run for (else all of
    them; all commits when no parents are known), the one with the most commits on its first-parent line (the
    newest by ancestry; ties: run last). Its line links each commit to its nearest ancestor in ``keys`` along first
    parents only; ``previous`` also walks the other parents (:func:`nearest`). Both fall back to commit time
    (:func:`fallback_order`; ``times``: the commits' times, else the input order) for commits whose parents are
    unknown or did not travel, marked not ``proven``; a database without parents keeps its time order.
    """
    n = len(keys)
    index = {key: i for i, key in enumerate(keys)}
    guess = fallback_order(keys, times)
    first_parents = _FirstParents(graph, index)
    line_previous = [-1] * n
    previous = [-1] * n
    line_fallback = [False] * n
    fallback = [False] * n
    for i, key in enumerate(keys):
        if graph.get(key) is None:
            line_previous[i] = previous[i] = guess[i]
            line_fallback[i] = fallback[i] = guess[i] >= 0
            continue
        found = first_parents(key)
        if isinstance(found, tuple):
            line_previous[i] = previous[i] = index[found]
            continue
        if found is UNKNOWN:
            line_previous[i], line_fallback[i] = guess[i], guess[i] >= 0
        found = nearest(graph, key, index)
        if isinstance(found, tuple):
            previous[i] = index[found]
        elif found is UNKNOWN:
            previous[i], fallback[i] = guess[i], guess[i] >= 0
    _break_cycles(line_previous, line_fallback)
    _break_cycles(previous, fallback)
    proven = [not (line_fallback[i] and line_previous[i] >= 0) and not (fallback[i] and previous[i] >= 0)
              for i in range(n)]

    known = [i for i, key in enumerate(keys) if graph.get(key) is not None]
    candidates = known or list(range(n))  # no parents known at all: the latest commit, and the time order
    per_commit = [{b for b in branches[i] if b} if i < len(branches) else set() for i in range(n)]
    counts = Counter(b for i in known for b in per_commit[i])
    if counts:
        latest = {b: max(i for i in known if b in per_commit[i]) for b in counts}
        main = max(counts, key=lambda b: (counts[b], latest[b]))
        candidates = [i for i in known if main in per_commit[i]]
    order: list[int] = []
    lines: list[list[int]] = []
    placed: set[int] = set()
    while len(placed) < n:
        remaining = candidates if not lines and candidates else [i for i in range(n) if i not in placed]
        depth = _depths(line_previous, placed)
        tip = max(remaining, key=lambda i: (depth[i], i))
        line = _chain(line_previous, tip, placed)
        placed.update(line)
        lines.append(line)
    lines[1:] = sorted(lines[1:], key=min)
    line_of: list[int] = []
    for number, line in enumerate(lines):
        order.extend(line)
        line_of.extend([number] * len(line))
    return Arrangement(order, line_of, previous, proven)
