"""Order by ancestry: the run a run is compared with, whether one commit precedes another, and each chip's tip."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.record import ancestry
from harness.record.models import Chip, Commit, Run
from harness.record.query.common import commit_graph, utc
from harness.record.store import Store


def previous_run_id(store: Store, run_id: str) -> str | None:
    """The run ``run_id`` is compared with (:func:`previous_run`)."""
    return previous_run(store, run_id)[0]


def previous_run(store: Store, run_id: str) -> tuple[str | None, bool]:
    """The run ``run_id`` is compared with, and whether ancestry proves it is of an earlier commit: the latest run,
    on the same chip, of the previous commit, the nearest ancestor of the run's commit with runs on that chip (first
    parents, then the other parents: ``harness.record.ancestry.nearest``); (None, True) if no ancestor has one.
    When the commit's parents are unknown, or the walk meets unknown ones or a parent not stored (its ancestry did
    not travel with a bundle) first: the chip's latest run of the same repository's commit with the latest commit
    time before this one's (else the run started just before it), not proven. Read once per run within
    ``store.memoised``."""
    return store.memo(("previous run", run_id), lambda: _previous_run(store, run_id))


def _previous_run(store: Store, run_id: str) -> tuple[str | None, bool]:
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None, True
        repo, sha = run.commit.repo, run.commit.sha
        with_runs = {(repo, other) for other in session.scalars(
            select(Commit.sha).join(Run, Run.commit_id == Commit.id)
            .where(Run.chip_id == run.chip_id, Commit.repo == repo, Run.settling.is_(False)).distinct())}
        found = ancestry.nearest(commit_graph(store, session, [repo]), (repo, sha), with_runs)
        if found is None:
            return None, True
        same = (select(Run.id).join(Commit, Run.commit_id == Commit.id)
                .where(Run.chip_id == run.chip_id, Commit.repo == repo, Run.id != run.id, Run.settling.is_(False)))
        newest = (Run.started_at.desc(), Run.id.desc())
        if isinstance(found, tuple):
            return session.scalars(same.where(Commit.sha == found[1]).order_by(*newest).limit(1)).first(), True
        when = run.commit.committed_at
        if when is not None:
            earlier = session.scalars(same.where(Commit.committed_at < when, Commit.sha != sha)
                                      .order_by(Commit.committed_at.desc(), *newest).limit(1)).first()
            if earlier is not None:
                return earlier, False
        earlier = session.scalars(same.where(Run.started_at < run.started_at).order_by(*newest).limit(1)).first()
        return earlier, earlier is None  # nothing before it: nothing guessed


NOT_PROVEN = "order not proven by ancestry"  # said wherever commits are ordered by commit time, not ancestry


def ancestry_proves(store: Store, base_sha: str, head_sha: str) -> bool:
    """Whether the stored ancestry shows commit ``base_sha`` before ``head_sha`` (an ancestor of it, or it)."""
    with store.session() as session:
        heads = session.scalars(select(Commit.repo).where(Commit.sha == head_sha)).all()
        for repo in heads:
            if base_sha == head_sha:
                return True
            graph = ancestry.load_graph(session, [repo])
            if (repo, base_sha) in graph and isinstance(
                    ancestry.nearest(graph, (repo, head_sha), {(repo, base_sha)}), tuple):
                return True
    return False


class SuiteTip(NamedTuple):
    """One (repository, suite) of a chip at its tip (``chip_tips``): the run shown, and that pair's runs (newest
    first)."""

    repo: str
    suite: str
    run_id: str
    same: list[str]


def chip_tip(store: Store, chip_key: str) -> tuple[str | None, list[str]]:
    """The run a chip's page shows, and the runs it may take missing jobs from (newest first): one suite of one
    repository -- the repository of the chip's newest run made for a branch (a bisect probe, made for a sha, does
    not choose it), and of its suites the one with the most planned jobs (a partial suite, one kernel re-run, does
    not take the page over; ties: the newest) -- at its tip: the newest commit of the branch's first-parent line by
    ancestry (``harness.record.ancestry.arrange``), not the most recently started run, so bisect probes and
    re-measurements of older commits never replace it; of the tip commit's runs, the newest made for a branch.
    (None, []) for a chip without runs."""
    tips = chip_tips(store, chip_key)
    return (tips[0].run_id, tips[0].same) if tips else (None, [])


def chip_tips(store: Store, chip_key: str) -> list[SuiteTip]:
    """Every (repository, suite) a chip has runs of, each at its tip (as ``chip_tip`` finds it): the one its page
    shows first (``chip_tip``'s), then the others, newest run first. [] for a chip without runs."""
    with store.session() as session:
        rows = session.execute(
            select(Run.id, Run.suite, Run.branch, Run.planned_jobs, Commit.repo, Commit.sha, Commit.committed_at)
            .join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
            .where(Chip.key == chip_key).order_by(Run.started_at.desc(), Run.id.desc())).all()
        if not rows:
            return []
        repo = next((row for row in rows if row.branch), rows[0]).repo
        size: dict[str, int] = {}
        for row in rows:
            if row.repo == repo:
                size[row.suite] = max(size.get(row.suite, 0), row.planned_jobs or 0)
        suite = max(size, key=lambda name: size[name])  # dicts keep the order met: newest first among ties
        pairs = [(repo, suite)] + list(dict.fromkeys((row.repo, row.suite) for row in rows
                                                     if (row.repo, row.suite) != (repo, suite)))
        return [_suite_tip(store, session, [row for row in rows if (row.repo, row.suite) == pair])
                for pair in pairs]


def _suite_tip(store: Store, session: Session, mine: list[Any]) -> SuiteTip:
    """The tip of one (repository, suite)'s runs ``mine`` (newest first), by ancestry (``chip_tip``; the
    repository's commit graph read once within ``store.memoised``)."""
    lead = mine[0]
    first: dict[str, Any] = {}
    branches: dict[str, set[str]] = {}
    for row in reversed(mine):  # oldest first: the commits in time order of their first runs
        first.setdefault(row.sha, row)
        branches.setdefault(row.sha, set()).add(row.branch)
    shas = list(first)
    arranged = ancestry.arrange([(lead.repo, sha) for sha in shas], commit_graph(store, session, [lead.repo]),
                                [branches[sha] for sha in shas], [utc(first[sha].committed_at) for sha in shas])
    main = [i for i, line in zip(arranged.order, arranged.line, strict=True) if line == 0]
    tip = shas[main[-1]]
    of_tip = [row for row in mine if row.sha == tip]
    run_id = next((row for row in of_tip if row.branch), of_tip[0]).id
    return SuiteTip(lead.repo, lead.suite, run_id, [row.id for row in mine])
