"""Jobs and their results: a planned job with its stable key (the unit of idempotency), and the result record
one job produces (the same shape from every executor, and what the store writes).

A job has one type per thing it runs, each with only the fields that thing uses: :class:`KernelJob` (calibration,
correctness or benchmark of a registered kernel), :class:`FunctionJob` (a benchmark of a repository's function),
:class:`PytestJob` (a pytest selection) and :class:`InstallJob` (a repository suite's environment); :data:`Job` is
any of them. ``job.labels`` is what the store writes besides key, kind and name; ``job.to_json()`` and
:func:`job_from_dict` carry a job to a job process, a Ray node or the spool and back."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, NamedTuple

from harness.core.chip import ChipIdentity
from harness.core.status import Status

JobKind = Literal["install", "calibration", "correctness", "pytest", "benchmark"]
KernelKind = Literal["calibration", "correctness", "benchmark"]

# The order executors run the kinds in, and whether a kind is timed (runs alone) or may share the machine.
# "install" prepares a repository suite's environment (once per install key) before anything else.
PHASES: tuple[tuple[str, bool], ...] = (("install", True), ("calibration", True), ("correctness", False),
                                        ("pytest", False), ("benchmark", True))

INSTALL_KEY = "install"  # the install job's key (one per plan)
DEFAULT_VARIANT = "default"  # the variant label of the jobs that have no variants (all but a kernel's)
# The roofline calibration kernels (kernels/calibration.py): a suite's [calibration] plans them
# (harness.spec.plan), and a run's peak FLOP/s is the best the first reaches, its peak B/s the best of the second
# (harness.record.writes.finalize_roofline).
CALIBRATION_MATMUL = "calib_matmul"
CALIBRATION_COPY = "calib_copy"


class JobLabels(NamedTuple):
    """What a job is stored under besides its key, kind and name (the job table's kernel, variant, shape,
    shape_key, dtype and check_name columns): each job type says what they are in its ``labels``."""

    kernel: str
    variant: str
    shape: dict[str, int]
    dtype: str
    check: str = ""

    @property
    def shape_key(self) -> str:
        return shape_label(self.shape)


@dataclass(frozen=True, kw_only=True)
class JobBase(ABC):
    """What every job has: ``key`` (stable across runs and machines: the unit of idempotency), ``name`` (the suite
    entry it came from) and ``timeout_s`` (the job process's limit). ``kind`` is the phase it runs in
    (:data:`PHASES`); ``TYPE`` names the job type in its JSON (:func:`job_from_dict`)."""

    TYPE: ClassVar[str]
    kind: ClassVar[JobKind]

    key: str
    name: str
    timeout_s: float = 120.0
    trial: int = 0  # which of a benchmark's independent trials (fresh processes) this is; 0 for any other job

    @property
    def unit(self) -> str:
        """What one execution of the job is known by (:func:`unit_key`)."""
        return unit_key(self.key, self.trial)

    @property
    def trials(self) -> int:
        """Independent trials a run measures this job in (``[timing] trials``; 1 for an untimed job)."""
        timing = getattr(self, "timing", None) or {}
        return int(timing.get("trials", 1)) if self.kind == "benchmark" else 1

    @property
    @abstractmethod
    def labels(self) -> JobLabels:
        """What the database stores for this job (kernel, variant, shape, dtype, check)."""

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "kind": self.kind, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def _fields_of(cls, data: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in fields(cls)}
        return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True, kw_only=True)
class KernelJob(JobBase):
    """Calibration, correctness or benchmark of a registered kernel's variant (harness/execute/worker.py):
    ``plugins`` are imported from ``plugin_dir`` first (they register kernels); ``check`` names a correctness
    check; ``timing`` is a benchmark's protocol (harness.execute.timing.TimingProtocol's fields)."""

    TYPE: ClassVar[str] = "kernel"

    kind: KernelKind
    kernel: str
    variant: str
    shape: dict[str, int]
    dtype: str
    check: str = ""
    seed: int = 0
    timing: dict[str, Any] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()
    plugin_dir: str = ""

    @classmethod
    def of(cls, kind: KernelKind, kernel: str, variant: str, shape: dict[str, int], dtype: str, check: str = "", *,
           name: str = "", **rest: Any) -> KernelJob:
        """The job with its key computed (:func:`job_key`); ``name`` defaults to the kernel's."""
        return cls(key=job_key(kind, kernel, variant, shape, dtype, check), kind=kind, name=name or kernel,
                   kernel=kernel, variant=variant, shape=shape, dtype=dtype, check=check, **rest)

    @property
    def labels(self) -> JobLabels:
        return JobLabels(self.kernel, self.variant, self.shape, self.dtype, self.check)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelJob:
        return cls(**{**cls._fields_of(data), "plugins": tuple(data.get("plugins", ()))})


@dataclass(frozen=True, kw_only=True)
class FunctionJob(JobBase):
    """A benchmark of a repository's function (``target`` = ``module:function``, harness/bench.py) at one grid
    point (``shape`` its keyword arguments, plus ``dtype`` unless empty), run by harness/execute/repo_jobs.py with
    the python of the suite's ``install`` (empty: the harness's own)."""

    TYPE: ClassVar[str] = "function"
    kind: ClassVar[JobKind] = "benchmark"

    target: str
    shape: dict[str, int]
    dtype: str = ""
    timing: dict[str, Any] = field(default_factory=dict)
    install: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, target: str, shape: dict[str, int], dtype: str = "", *, name: str = "", **rest: Any) -> FunctionJob:
        """The job with its key computed (no dtype is ``-`` in the key); ``name`` defaults to the target."""
        return cls(key=job_key(cls.kind, target, DEFAULT_VARIANT, shape, dtype or "-"), name=name or target,
                   target=target, shape=shape, dtype=dtype, **rest)

    @property
    def labels(self) -> JobLabels:
        return JobLabels(self.target, DEFAULT_VARIANT, self.shape, self.dtype)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FunctionJob:
        if "target" not in data:  # the previous version's form: the target in "spec"
            data = {**data, "target": data["spec"]["target"]}
        return cls(**cls._fields_of(data))


@dataclass(frozen=True, kw_only=True)
class PytestJob(JobBase):
    """A pytest selection of a repository suite (``selection``: its name, paths, -k, -m, args, workers and pytest's
    own timeout_s: harness/execute/repo_jobs.py), run with the python of ``install``; ``name`` is the selection's."""

    TYPE: ClassVar[str] = "pytest"
    kind: ClassVar[JobKind] = "pytest"

    selection: dict[str, Any]
    install: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, selection: dict[str, Any], **rest: Any) -> PytestJob:
        """The job of ``selection`` (its ``selection`` entry names it): key ``pytest/<name>``."""
        name = selection["selection"]
        return cls(key=f"pytest/{name}", name=name, selection=selection, **rest)

    @property
    def labels(self) -> JobLabels:
        return JobLabels(self.name, DEFAULT_VARIANT, {}, "")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PytestJob:
        if "selection" not in data:  # the previous version's form: the selection in "spec"
            data = {**data, "selection": data.get("spec") or {}}
        return cls(**cls._fields_of(data))


@dataclass(frozen=True, kw_only=True)
class InstallJob(JobBase):
    """Prepares the environment of a repository suite's ``[install]`` (harness/execute/envs.py), once per plan."""

    TYPE: ClassVar[str] = "install"
    kind: ClassVar[JobKind] = "install"

    install: dict[str, Any]

    @classmethod
    def of(cls, install: dict[str, Any], **rest: Any) -> InstallJob:
        return cls(key=INSTALL_KEY, name="install", install=install, **rest)

    @property
    def labels(self) -> JobLabels:
        return JobLabels("install", DEFAULT_VARIANT, {}, "")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InstallJob:
        return cls(**cls._fields_of(data))


Job = KernelJob | FunctionJob | PytestJob | InstallJob
JOB_TYPES: dict[str, type[Job]] = {cls.TYPE: cls for cls in (KernelJob, FunctionJob, PytestJob, InstallJob)}


def job_from_dict(data: dict[str, Any]) -> Job:
    """The job that ``job.to_dict()`` (or ``json.loads(job.to_json())``) gave. A dict without ``type`` is the
    previous version's single Job type (spool files, a commit planned by an older harness): its kind says the
    type, and a benchmark with a ``spec["target"]`` is a function's."""
    if "type" in data:
        cls = JOB_TYPES.get(data["type"])
        if cls is None:
            raise ValueError(f"unknown job type {data['type']!r} (known: {', '.join(JOB_TYPES)})")
    elif data.get("kind") == "install":
        cls = InstallJob
    elif data.get("kind") == "pytest":
        cls = PytestJob
    elif (data.get("spec") or {}).get("target"):
        cls = FunctionJob
    else:
        cls = KernelJob
    return cls.from_dict(data)


def shape_label(shape: dict[str, int]) -> str:
    """Human-readable and stable: 'B=1,D=64,H=4,S_kv=256,S_q=256'."""
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))


def job_key(kind: str, kernel: str, variant: str, shape: dict[str, int], dtype: str, check: str = "") -> str:
    """Readable stable id: kind/kernel/variant/dtype/shape[/check]; same inputs give the same key everywhere."""
    parts = [kind, kernel, variant, dtype, shape_label(shape)]
    if check:
        parts.append(check)
    return "/".join(parts)


def unit_key(key: str, trial: int) -> str:
    """One execution of a job: its key, plus the trial for a benchmark's later trials (trial 0 is the key alone)."""
    return key if trial == 0 else f"{key}#trial{trial}"


KEY_CHARS = 400  # the job key column's width


def per_test_key(selection: str, nodeid: str) -> str:
    """A pytest test's stable key, ``test/<selection>/<nodeid>`` (a long one keeps a digest of the whole)."""
    key = f"test/{selection}/{nodeid}"
    if len(key) <= KEY_CHARS:
        return key
    return f"{key[:KEY_CHARS - 17]}#{hashlib.sha1(key.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class RunContext:
    """One run apart from its jobs: the chip and machine, the commit, the suite, the executor, and the options
    that `harness run --resume` needs to plan the same jobs again."""

    ident: ChipIdentity
    facts: dict[str, Any]
    commit: dict[str, Any]  # sha, repo, message... (a commit row)
    dirty: bool
    suite: str
    executor: str  # "local" or "ray", stored with the run
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TestOutcome:
    """One pytest test's outcome, as harness/execute/pytest_plugin.py records it (the JSON lines it writes)."""

    __test__ = False  # not a pytest test class
    nodeid: str
    outcome: str  # one of TEST_OUTCOMES
    duration_s: float = 0.0
    detail: str = ""  # skip / xfail reason, or the first lines of the failure
    longrepr: str = ""  # the failure's full report (tail kept)


@dataclass
class JobResult:
    """What happened to one job. Benchmarks carry raw samples (seconds per call) and the protocol used."""

    key: str
    status: Status
    detail: str = ""
    max_error: float | None = None
    tolerance: float | None = None
    samples: list[float] = field(default_factory=list)
    inner: int | None = None
    warmup_s: float | None = None
    warmup_calls: int | None = None
    flops: float | None = None
    bytes_moved: float | None = None
    duration_s: float = 0.0
    output_tail: str = ""
    node: str = ""
    attempts: int = 1
    tests: list[dict[str, Any]] = field(default_factory=list)  # a pytest job's per-test outcomes (TestOutcome)
    trial: int = 0  # the job's trial these samples are from (harness.core.job.JobBase.trial)
    mode: str = ""  # how the samples were timed: "pipelined" or "per-call" (harness.execute.timing)
    round_trip_s: float | None = None  # the host's round trip (a trivial eval + sync), measured apart
    backlog_calls: float | None = None  # pipelined: calls queued on the device as the host issued a sample's last

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
