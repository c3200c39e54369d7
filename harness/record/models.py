"""Record: the SQLAlchemy 2 models (one table per concept), shared by SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Chip(Base):
    """A chip generation, found by its stable key; the full identity record rides along."""

    __tablename__ = "chip"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    backend: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str] = mapped_column(String(200))
    architecture: Mapped[str] = mapped_column(String(100))
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gpu_cores: Mapped[int | None] = mapped_column(Integer, nullable=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Machine(Base):
    """A host that ran jobs; several machines may share one chip key."""

    __tablename__ = "machine"
    __table_args__ = (UniqueConstraint("hostname", "chip_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    chip_id: Mapped[int] = mapped_column(ForeignKey("chip.id"))
    facts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Commit(Base):
    """A commit of the repository under test.

    ``parents``: its parents' full shas, first parent first ([] for a root commit; NULL: unknown, as for rows
    written before revision 0002 until the repository is seen again). Besides the commits that were run, the
    store keeps the commits between them that never were (rows without runs: sha and parents only), so that the
    walk from any commit to its nearest ancestor with runs never leaves the database (harness/record/ancestry.py).
    ``branch``: the branch the commit's first run with a branch was made for ("" if none).
    """

    __tablename__ = "commit"
    __table_args__ = (UniqueConstraint("repo", "sha"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo: Mapped[str] = mapped_column(String(500), default="")
    sha: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(255), default="")
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    branch: Mapped[str] = mapped_column(String(255), default="")
    parents: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True, default=None)


class Run(Base):
    """One execution of a suite for one commit on one chip; running a commit again is a new run."""

    __tablename__ = "run"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commit.id"))
    chip_id: Mapped[int] = mapped_column(ForeignKey("chip.id"))
    machine_id: Mapped[int | None] = mapped_column(ForeignKey("machine.id"), nullable=True)
    suite: Mapped[str] = mapped_column(String(255))
    dirty: Mapped[bool] = mapped_column(Boolean, default=False)
    executor: Mapped[str] = mapped_column(String(32), default="local")
    status: Mapped[str] = mapped_column(String(32), default="running")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    peak_flops: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_bytes_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    planned_jobs: Mapped[int] = mapped_column(Integer, default=0)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The branch the run was made for: the branch named, or HEAD's branch; "" for a detached sha (a bisect probe).
    branch: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # Measured by `harness compare --settle` (a comparison's undecided series only): read by that comparison alone,
    # never a tip, a history point, a floor's run or a previous run (migration 0007_issue39)
    settling: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    commit: Mapped[Commit] = relationship()
    chip: Mapped[Chip] = relationship()
    machine: Mapped[Machine | None] = relationship()


class JobRecord(Base):
    """One job's outcome in one run; (run, key) is unique so a retried write never duplicates it."""

    __tablename__ = "job"
    __table_args__ = (
        UniqueConstraint("run_id", "key"),
        Index("ix_job_series", "kernel", "variant", "dtype", "shape_key"),
        Index("ix_job_run_kind", "run_id", "kind"),  # a run's jobs of one kind: its few checks among 400 benchmarks
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(400))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(255))
    kernel: Mapped[str] = mapped_column(String(100))
    variant: Mapped[str] = mapped_column(String(100))
    dtype: Mapped[str] = mapped_column(String(16))
    shape: Mapped[dict[str, int]] = mapped_column(JSON)
    shape_key: Mapped[str] = mapped_column(String(255))
    check_name: Mapped[str] = mapped_column(String(100), default="")
    status: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")
    output_tail: Mapped[str] = mapped_column(Text, default="")
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    tolerance: Mapped[float | None] = mapped_column(Float, nullable=True)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    node: Mapped[str] = mapped_column(String(100), default="")
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    # Benchmark summary (NULL for correctness jobs).
    n_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    inner: Mapped[int | None] = mapped_column(Integer, nullable=True)
    warmup_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    warmup_calls: Mapped[int | None] = mapped_column(Integer, nullable=True)
    median_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    ci_low_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    ci_high_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    iqr_rel: Mapped[float | None] = mapped_column(Float, nullable=True)
    flops: Mapped[float | None] = mapped_column(Float, nullable=True)
    bytes_moved: Mapped[float | None] = mapped_column(Float, nullable=True)
    achieved_flops: Mapped[float | None] = mapped_column(Float, nullable=True)
    achieved_bytes_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    pct_peak: Mapped[float | None] = mapped_column(Float, nullable=True)
    bound: Mapped[str] = mapped_column(String(16), default="")
    trials: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # trials whose samples are stored
    timing_mode: Mapped[str] = mapped_column(String(16), default="", server_default="")  # pipelined / per-call
    round_trip_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # host round trip, measured apart
    # pipelined: calls still queued on the device when the host had issued a sample's last one (the least over
    # the job's trials); below harness.stats.pacing.HOST_PACED_BACKLOG the host set the pace
    backlog_calls: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship()


class Sample(Base):
    """One raw timing sample (seconds per call) of a benchmark job."""

    __tablename__ = "sample"
    __table_args__ = (UniqueConstraint("job_id", "idx"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    idx: Mapped[int] = mapped_column(Integer)  # unique within the job, across its trials
    seconds: Mapped[float] = mapped_column(Float)
    trial: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # the process it came from


class TrialSummary(Base):
    """What the analysis of a history reads of a benchmark job's trials, derived from its samples and written with
    them (``harness.record.trial_summary.sample_writer``), so a chip's history is analysed without reading every sample:
    ``n``, the samples summarised, and ``trials``, per trial in trial order a ``store.TRIAL_RECORD`` (trial number,
    valid -- finite, positive -- sample count, their median as ``np.median`` computes it).  A job whose ``n`` is not
    its ``n_samples`` is read from its samples (``harness.record.query.load_cell_trials``)."""

    __tablename__ = "trial_summary"
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    trials: Mapped[bytes] = mapped_column(LargeBinary)


class _AnalysisRow:
    """What names a row of the analysis cache and what it is valid under (``AnalysisCache``, ``AnalysisStamp``):
    ``chip`` and ``kind`` say what it is (a commit's cell summaries, a series' change points, a chip's regression
    families, the chip's validation state), ``name`` which one; ``key`` is a digest of everything the result was
    computed from (the runs and jobs it read, the analysis code and parameters)."""

    __table_args__ = (UniqueConstraint("chip", "kind", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(400))
    key: Mapped[str] = mapped_column(String(128))


class AnalysisCache(_AnalysisRow, Base):
    """A derived analysis result kept so that ``harness report`` recomputes only what changed
    (``harness.analysis.cache``): never a source of truth, any row may be deleted at any time. A row is only used
    while its ``key`` is its inputs' (``_AnalysisRow``); ``watermark``: the highest sample id that existed when it
    was validated.
    """

    __tablename__ = "analysis_cache"
    watermark: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AnalysisStamp(_AnalysisRow, Base):
    """A raised watermark of an ``analysis_cache`` row (``harness.record.analysis_cache.stamp``): the row was found
    valid, under ``key``, up to sample id ``watermark``. Kept apart from the row, whose payload an update in place
    would write again whole (a chip's analysis is one 16 MB row at 1,000 commits). A row written again drops it."""

    __tablename__ = "analysis_stamp"
    watermark: Mapped[int] = mapped_column(BigInteger)


class RegressionAck(Base):
    """A regression of the report's list marked as seen (``harness ack``), by the id its page shows; the report
    shows it acknowledged with its note. Keyed by that id alone: acknowledging it again replaces the note."""

    __tablename__ = "regression_ack"
    ack_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    note: Mapped[str] = mapped_column(Text, default="", server_default="")
    acked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    acked_by: Mapped[str] = mapped_column(String(200), default="", server_default="")
