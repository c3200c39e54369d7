"""Bundle import: a bundle's runs added in one transaction (chips, machines and commits found by their natural keys
through the store's get-or-create, commits under their repository's identity, jobs and samples in bulk)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from harness.core.errors import HarnessError
from harness.record.bundle.format import (
    JOB_BATCH,
    OLD_DEFAULTS,
    RECORDS,
    REFERENCES,
    SAMPLE_BATCH,
    BundleInvalid,
    BundleReader,
    fields_in,
    open_bundle,
)
from harness.record.db import Database, mask_url
from harness.record.identity import canonical, unify
from harness.record.models import Commit, JobRecord, Run
from harness.record.trial_summary import sample_writer
from harness.record.writes import find_or_insert_chip, find_or_insert_commit, find_or_insert_machine


@dataclass
class ImportSummary:
    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    runs_added: int = 0
    runs_skipped: int = 0  # already present (their missing jobs are still merged)
    runs_completed: int = 0  # present but unfinished here, finished in the bundle: run columns taken from it
    jobs_added: int = 0
    jobs_skipped: int = 0
    samples_added: int = 0
    samples_skipped: int = 0
    chips_added: int = 0
    machines_added: int = 0
    commits_added: int = 0


class _Importer:
    """Applies records in bundle order inside one transaction: natural keys find existing rows, jobs are batched."""

    def __init__(self, session: Session, reader: BundleReader, summary: ImportSummary,
                 repo_name: str | None = None) -> None:
        self.session = session
        self.repo_name = repo_name
        self.reader = reader
        self.summary = summary
        self.chips: dict[str, int] = {}
        self.machines: dict[tuple[str, str], int] = {}
        self.commits: dict[tuple[str, str], int] = {}
        self.keys: dict[str, bool] = {}  # repository key -> whether no row had it before this import
        self.run_id: str | None = None
        self.run_keys: set[str] = set()
        self.jobs: list[dict[str, Any]] = []
        self.samples: list[tuple[list[float], list[int] | None, list[int] | None]] = []
        self.buffered = 0
        self.write_samples = sample_writer(session)

    def _check(self, record: dict[str, Any]) -> dict[str, Any]:
        kind = record["type"]
        absent = OLD_DEFAULTS.get(self.reader.version, {}).get(kind, {})
        expected = {"type", *RECORDS[kind].names, *REFERENCES[kind]} - absent.keys()
        optional = {"sample_idx", "sample_trial"} if kind == "job" else set()
        if missing := expected - record.keys():
            raise self.reader.invalid(f"a {kind} record lacks {', '.join(sorted(missing))}")
        if unknown := record.keys() - expected - optional:
            raise self.reader.invalid(f"a {kind} record has fields this harness does not know: "
                                      f"{', '.join(sorted(unknown))} (written by a newer harness?)")
        parents = record.get("parents")
        if kind == "commit" and parents is not None and (not isinstance(parents, list)
                                                         or not all(isinstance(p, str) for p in parents)):
            raise self.reader.invalid(f"commit {record['sha']}'s parents are not a list of shas")
        try:
            return fields_in(RECORDS[kind], {**absent, **record})
        except (TypeError, ValueError) as exc:
            raise self.reader.invalid(f"a {kind} record has a bad date: {exc}") from None

    def _chip_id(self, key: Any) -> int:
        if not isinstance(key, str) or key not in self.chips:
            raise self.reader.invalid(f"chip {key!r} is referenced before its chip record")
        return self.chips[key]

    def add(self, record: dict[str, Any]) -> None:
        getattr(self, f"_add_{record['type']}")(record, self._check(record))

    def _add_chip(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        chip_id, added = find_or_insert_chip(self.session, values)
        self.summary.chips_added += added
        self.chips[values["key"]] = chip_id

    def _add_machine(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        chip_id = self._chip_id(record["chip"])
        machine_id, added = find_or_insert_machine(self.session, {**values, "chip_id": chip_id})
        self.summary.machines_added += added
        self.machines[(record["chip"], values["hostname"])] = machine_id

    def _add_commit(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        ref = (values["repo"], values["sha"])  # as the bundle's runs refer to it
        values["repo"] = self.repo_name or canonical(values["repo"])  # an older bundle: a remote as it was spelled
        if values["repo"] not in self.keys:  # one look-up per key (the (repo, sha) index): is it a new one?
            self.keys[values["repo"]] = self.session.scalar(
                select(Commit.id).where(Commit.repo == values["repo"]).limit(1)) is None
        commit_id, added = find_or_insert_commit(self.session, values)  # a stored one gets only what it lacks
        self.summary.commits_added += added
        self.commits[ref] = commit_id

    def _add_run(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        self.flush()
        chip_id = self._chip_id(record["chip"])
        ref, machine_ref = record["commit"], record["machine"]
        try:
            commit_id = self.commits[(ref["repo"], ref["sha"])]
            machine_id = None if machine_ref is None else self.machines[(machine_ref["chip"],
                                                                         machine_ref["hostname"])]
        except (KeyError, TypeError):
            raise self.reader.invalid(f"run {values['id']} references a commit or machine the bundle does not "
                                      "define before it") from None
        row = {**values, "chip_id": chip_id, "commit_id": commit_id, "machine_id": machine_id}
        existing = self.session.execute(select(Run.chip_id, Run.commit_id, Run.finished_at)
                                        .where(Run.id == values["id"])).first()
        self.run_id = values["id"]
        if existing is None:
            self.session.execute(insert(Run.__table__), [row])
            self.run_keys = set()
            self.summary.runs_added += 1
            return
        if (existing.chip_id, existing.commit_id) != (chip_id, commit_id):
            raise HarnessError(f"run {values['id']} in bundle {self.reader.path} is for chip {record['chip']} at "
                               f"{ref['sha'][:12]}, but the database's run {values['id']} is not: not merging it")
        self.summary.runs_skipped += 1
        if existing.finished_at is None and values["finished_at"] is not None:
            self.session.execute(update(Run.__table__).where(Run.__table__.c.id == values["id"]).values(**row))
            self.summary.runs_completed += 1
        self.run_keys = set(self.session.scalars(select(JobRecord.key).where(JobRecord.run_id == values["id"])))

    def _add_job(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        samples, idx, trials = record["samples"], record.get("sample_idx"), record.get("sample_trial")
        if values["run_id"] != self.run_id:
            raise self.reader.invalid(f"job {values['key']} does not follow its run {values['run_id']}")
        if not isinstance(samples, list) or any(
                extra is not None and (not isinstance(extra, list) or len(extra) != len(samples))
                for extra in (idx, trials)):
            raise self.reader.invalid(f"job {values['key']} has malformed samples")
        if values["key"] in self.run_keys:
            self.summary.jobs_skipped += 1
            self.summary.samples_skipped += len(samples)
            return
        self.run_keys.add(values["key"])
        self.jobs.append(values)
        self.samples.append((samples, idx, trials))
        self.buffered += len(samples)
        if len(self.jobs) >= JOB_BATCH or self.buffered >= SAMPLE_BATCH:
            self.flush()

    def flush(self) -> None:
        """Insert the buffered jobs (ids come back in parameter order), then their samples in bulk."""
        if not self.jobs:
            return
        table = JobRecord.__table__
        ids = self.session.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True),
                                   self.jobs).scalars().all()
        rows: list[tuple[int, int, float, int]] = []
        for job_id, (samples, idx, trials) in zip(ids, self.samples, strict=True):
            rows.extend(zip(repeat(job_id), idx if idx is not None else range(len(samples)), samples,
                            trials if trials is not None else repeat(0), strict=False))
        self.write_samples(rows)  # in one call: a job's trials are summarised whole
        self.summary.jobs_added += len(self.jobs)
        self.summary.samples_added += len(rows)
        self.jobs, self.samples, self.buffered = [], [], 0


def import_bundle(store: Database, path: str | Path, attempts: int = 3, repo_name: str | None = None) -> ImportSummary:
    """Add a bundle's runs to ``store`` in one transaction: nothing is written unless the whole file checks out.

    Runs keep their ids; chips, machines and commits are found by their natural keys; a job already stored for its
    (run, key) is skipped, so importing twice adds nothing and a partially present run gets its missing jobs. A
    unique-key clash with a concurrent writer (another import, a run creating the same chip) rolls back and retries:
    the next attempt finds those rows.

    Commits go under their repository's identity (an older bundle's remote URL normalised; ``repo_name``: every
    commit of the bundle under that name instead), and rows that the bundle's keys split from stored ones are
    merged (``harness.record.identity.unify``): one row per (repository, sha). That merge reads every commit row, so
    it runs only when the bundle brings a repository key no stored row has (a new spelling, a new repository): under
    keys already known, the rows were merged when their key first came. Known parents are never overwritten.
    """
    path = Path(path)
    dbapi_error = store.engine.dialect.loaded_dbapi.Error
    integrity = (IntegrityError, store.engine.dialect.loaded_dbapi.IntegrityError)
    for attempt in range(1, attempts + 1):
        summary = ImportSummary(path)
        with open_bundle(path) as stream:
            reader = BundleReader(path, stream)
            summary.header = reader.read_header()
            records = reader.records()
            try:
                with store.session() as session:
                    importer = _Importer(session, reader, summary, repo_name)
                    for record in records:
                        importer.add(record)
                    importer.flush()
                    if any(importer.keys.values()):  # a key no row had: rows it splits from stored ones merge
                        unify(session.connection())
                return summary
            except (BundleInvalid, SQLAlchemyError, dbapi_error) as exc:
                # Damage shows as a failed checksum further on: prefer that verdict over the symptom.
                for _ in records:
                    pass
                if isinstance(exc, BundleInvalid):
                    raise
                if isinstance(exc, integrity) and attempt < attempts:
                    continue
                reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
                raise HarnessError(f"cannot import bundle {path} into {mask_url(store.url)}: {reason}") from None
    raise AssertionError("unreachable")
