"""Runs, chips and references: run views, a chip's runs, the latest runs, and commit / run references resolved."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from harness.core.errors import HarnessError
from harness.record.models import Chip, Commit, JobRecord, Run
from harness.record.store import Store


@dataclass
class RunView:
    id: str
    chip_key: str
    sha: str
    message: str
    branch: str
    dirty: bool
    suite: str
    status: str
    started_at: Any
    finished_at: Any
    peak_flops: float | None
    peak_bytes_per_s: float | None
    planned_jobs: int
    hostname: str
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in self.jobs:
            out[job["status"]] = out.get(job["status"], 0) + 1
        return out


JOB_FIELDS = ("key", "kind", "name", "kernel", "variant", "dtype", "shape", "shape_key", "check_name", "status",
              "detail", "output_tail", "max_error", "tolerance", "duration_s", "node", "attempts", "n_samples",
              "inner", "warmup_s", "median_s", "ci_low_s", "ci_high_s", "iqr_rel", "flops", "bytes_moved",
              "achieved_flops", "achieved_bytes_per_s", "pct_peak", "bound", "trials", "timing_mode", "round_trip_s",
              "backlog_calls")


_JOB_COLUMNS = tuple(getattr(JobRecord, name) for name in JOB_FIELDS)


def _run_view(session: Session, run: Run, with_jobs: bool) -> RunView:
    view = RunView(run.id, run.chip.key, run.commit.sha, run.commit.message, run.branch or run.commit.branch,
                   run.dirty, run.suite, run.status, run.started_at, run.finished_at, run.peak_flops,
                   run.peak_bytes_per_s, run.planned_jobs, run.machine.hostname if run.machine else "")
    if with_jobs:  # the columns, not ORM objects: the same values, in half the time (a run of 400 jobs: 5 ms)
        rows = session.execute(select(*_JOB_COLUMNS).where(JobRecord.run_id == run.id).order_by(JobRecord.id))
        view.jobs = [dict(zip(JOB_FIELDS, row, strict=True)) for row in rows]
    return view


def chips(store: Store) -> list[dict[str, Any]]:
    with store.session() as session:
        return [{"key": c.key, "backend": c.backend, "device_name": c.device_name, "architecture": c.architecture,
                 "memory_bytes": c.memory_bytes, "gpu_cores": c.gpu_cores, "record": c.record}
                for c in session.scalars(select(Chip).order_by(Chip.key))]


def runs(store: Store, chip_key: str | None = None, with_jobs: bool = False) -> list[RunView]:
    """Runs, newest first (optionally of one chip)."""
    with store.session() as session:
        query = select(Run).join(Chip).order_by(Run.started_at.desc())
        if chip_key:
            query = query.where(Chip.key == chip_key)
        return [_run_view(session, run, with_jobs) for run in session.scalars(query)]


def latest_run(store: Store, chip_key: str) -> RunView | None:
    with store.session() as session:
        run = session.scalars(select(Run).join(Chip).where(Chip.key == chip_key)
                              .order_by(Run.started_at.desc()).limit(1)).first()
        return _run_view(session, run, True) if run else None


def get_run(store: Store, run_id: str) -> RunView | None:
    with store.session() as session:
        run = session.get(Run, run_id)
        return _run_view(session, run, True) if run else None


def latest_runs(store: Store) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Per chip (by key): its latest run (as a one-run tuple) and that run's commit sha; chips without runs left out."""
    runs: dict[str, tuple[str, ...]] = {}
    shas: dict[str, str] = {}
    with store.session() as session:
        for chip_key in list(session.scalars(select(Chip.key).order_by(Chip.key))):
            latest = session.execute(
                select(Run.id, Commit.sha).join(Chip, Run.chip_id == Chip.id).join(Commit, Run.commit_id == Commit.id)
                .where(Chip.key == chip_key, Run.settling.is_(False))
                .order_by(Run.started_at.desc(), Run.id.desc()).limit(1)
            ).first()
            if latest is not None:
                runs[chip_key], shas[chip_key] = (latest[0],), latest[1]
    return runs, shas


def chip_keys(store: Store) -> list[str]:
    """Every chip key, sorted."""
    with store.session() as session:
        return list(session.scalars(select(Chip.key).order_by(Chip.key)))


def _check_chip(session: Session, chip: str | None) -> None:
    if chip is not None and session.scalar(select(Chip.id).where(Chip.key == chip)) is None:
        known = ", ".join(session.scalars(select(Chip.key).order_by(Chip.key))) or "none"
        raise HarnessError(f"unknown chip {chip!r} (known: {known})")


def check_chip(store: Store, chip: str | None) -> None:
    """Raise HarnessError, naming the known chips, unless ``chip`` is None or a stored chip key."""
    with store.session() as session:
        _check_chip(session, chip)


MIN_PREFIX = 4  # shortest commit / run id prefix accepted (as git)


class ResolvedRef(NamedTuple):
    """What a commit or run reference denotes: a commit (all its runs) or one run, and its commit."""

    kind: Literal["commit", "run"]
    sha: str
    message: str
    branch: str
    runs: dict[str, tuple[str, ...]]  # chip key -> run ids, in start order
    dirty_runs: int


def _resolved(kind: Literal["commit", "run"], commit: Commit, runs: Sequence[Run]) -> ResolvedRef:
    per_chip: dict[str, list[str]] = {}
    for run in sorted(runs, key=lambda r: (r.started_at, r.id)):
        per_chip.setdefault(run.chip.key, []).append(run.id)
    return ResolvedRef(kind, commit.sha, commit.message, commit.branch,
                       {chip: tuple(ids) for chip, ids in sorted(per_chip.items())}, sum(bool(r.dirty) for r in runs))


def _commit_runs(session: Session, commits: Sequence[Commit]) -> list[Run]:
    ids = [c.id for c in commits]
    # a commit's settling runs (harness compare --settle) hold some series only: reached by run id alone
    return list(session.scalars(select(Run).options(joinedload(Run.chip))
                                .where(Run.commit_id.in_(ids), Run.settling.is_(False))))


def resolve_ref(store: Store, ref: str, chip: str | None = None) -> ResolvedRef:
    """A commit sha (full or unique prefix: all its runs, per chip) or a run id (full or unique prefix).

    ``chip`` keeps that chip's runs only.  HarnessError on an empty, unknown, too short or ambiguous reference, an
    unknown chip, a run of another chip, or a commit without runs (on ``chip``). Read once per reference within
    ``store.memoised`` (a report's compare pages name the same runs and commits again and again).
    """
    found = store.memo(("resolved ref", ref.strip(), chip), lambda: _resolve_ref(store, ref, chip))
    return found._replace(runs=dict(found.runs))


def prefetch_refs(store: Store, refs: Iterable[tuple[str, str | None]]) -> None:
    """Within ``store.memoised``, resolve the (ref, chip) pairs that name a stored run or commit exactly, in three
    queries for all of them, into what ``resolve_ref`` then returns for each (a report's compare pages resolve two
    refs a page, ~4 ms each one by one). A prefix, or a ref ``resolve_ref`` would refuse, is left to it."""
    if not store.memoising:
        return
    wanted = sorted({(ref.strip(), chip) for ref, chip in refs if ref.strip()}, key=lambda w: (w[0], w[1] or ""))
    if not wanted:
        return
    for chip in sorted({chip for _, chip in wanted if chip is not None}):
        try:
            store.memo(("known chip", chip), lambda chip=chip: check_chip(store, chip) or True)
        except HarnessError:  # resolve_ref says so
            wanted = [w for w in wanted if w[1] != chip]
    names = sorted({ref for ref, _ in wanted})
    with store.session() as session:
        exact_runs = {run.id: run for run in session.scalars(
            select(Run).options(joinedload(Run.commit), joinedload(Run.chip)).where(Run.id.in_(names)))}
        exact_commits: dict[str, list[Commit]] = {}
        for commit in session.scalars(select(Commit).where(Commit.sha.in_(names)).order_by(Commit.id)):
            exact_commits.setdefault(commit.sha, []).append(commit)
        runs_of: dict[int, list[Run]] = {}
        for run in _commit_runs(session, [c for found in exact_commits.values() for c in found]):
            runs_of.setdefault(run.commit_id, []).append(run)
        for ref, chip in wanted:
            matched = _exact(exact_runs.get(ref), exact_commits.get(ref, []),
                             lambda commits: [r for c in commits for r in runs_of.get(c.id, [])])
            if matched is None:  # a prefix, or nothing: left to resolve_ref
                continue
            runs, kind, commits = matched
            on_chip = _on_chip(kind, runs, chip)
            if on_chip:  # else resolve_ref says why
                found = _resolved(kind, commits[0], on_chip)
                store.memo(("resolved ref", ref, chip), lambda found=found: found)


def _exact(run: Run | None, commits: list[Commit], commit_runs: Callable[[list[Commit]], list[Run]]
           ) -> tuple[list[Run], Literal["commit", "run"], list[Commit]] | None:
    """A ref that is a run id (``run``) or a commit sha (``commits``: every stored commit of that sha; a sha wins)
    as (its runs, its kind, its commits), the commits' runs from ``commit_runs``; None where it is neither."""
    if run is not None and not commits:
        return [run], "run", [run.commit]
    if commits:
        return commit_runs(commits), "commit", commits
    return None


def _on_chip(kind: str, runs: list[Run], chip: str | None) -> list[Run] | None:
    """``runs`` on ``chip`` (all of them without one); None where the ref is a run of another chip."""
    if chip is None:
        return runs
    if kind == "run" and runs[0].chip.key != chip:
        return None
    return [r for r in runs if r.chip.key == chip]


def _resolve_ref(store: Store, ref: str, chip: str | None) -> ResolvedRef:
    ref = ref.strip()
    if not ref:
        raise HarnessError("empty commit or run id")
    if chip is not None:  # once per chip within ``store.memoised``
        store.memo(("known chip", chip), lambda: check_chip(store, chip) or True)
    with store.session() as session:
        exact_run = session.get(Run, ref, options=[joinedload(Run.commit), joinedload(Run.chip)])
        exact_commits = session.scalars(select(Commit).where(Commit.sha == ref).order_by(Commit.id)).all()
        matched = _exact(exact_run, list(exact_commits), lambda commits: _commit_runs(session, commits))
        if matched is not None:
            runs, kind, commits = matched
        else:
            if len(ref) < MIN_PREFIX:
                raise HarnessError(f"no commit or run {ref!r} (prefixes need at least {MIN_PREFIX} characters)")
            # Commits are also stored without runs (ancestry between run commits): a prefix names one that has runs.
            commits = session.scalars(select(Commit).where(Commit.sha.startswith(ref, autoescape=True),
                                                           Commit.id.in_(select(Run.commit_id)))).all()
            prefix_runs = session.scalars(select(Run).where(Run.id.startswith(ref, autoescape=True))).all()
            shas = sorted({c.sha for c in commits})
            if len(shas) + len(prefix_runs) > 1:
                listed = [f"commit {s[:12]}" for s in shas] + [f"run {r.id[:12]}" for r in prefix_runs]
                more = f", ... ({len(listed)} in all)" if len(listed) > 3 else ""
                raise HarnessError(f"{ref!r} is ambiguous: {', '.join(listed[:3])}{more}")
            if not shas and not prefix_runs:
                unrun = session.scalars(select(Commit.sha).where(Commit.sha.startswith(ref, autoescape=True))).first()
                if unrun:
                    raise HarnessError(f"commit {unrun[:12]} has no runs")
                raise HarnessError(f"no commit or run {ref!r} in the database")
            if prefix_runs:
                runs, kind, commits = list(prefix_runs), "run", [prefix_runs[0].commit]
            else:
                runs, kind = _commit_runs(session, commits), "commit"
        on_chip = _on_chip(kind, runs, chip)
        if on_chip is None:
            raise HarnessError(f"run {runs[0].id} ran on chip {runs[0].chip.key!r}, not {chip!r}")
        runs = on_chip
        if not runs:
            where = f" on chip {chip!r}" if chip else ""
            raise HarnessError(f"commit {commits[0].sha[:12]} has no runs{where}")
        return _resolved(kind, commits[0], runs)
