"""Jobs and their results: a planned job with its stable key (the unit of idempotency), and the result record
one job produces (the same shape from every executor, and what the store writes)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from harness.core.status import Status

JobKind = Literal["install", "calibration", "correctness", "pytest", "benchmark"]

# The order executors run the kinds in, and whether a kind is timed (runs alone) or may share the machine.
# "install" prepares a repository suite's environment (once per install key) before anything else.
PHASES: tuple[tuple[str, bool], ...] = (("install", True), ("calibration", True), ("correctness", False),
                                        ("pytest", False), ("benchmark", True))


@dataclass(frozen=True)
class Job:
    """One concrete job: what to run, where its result goes (``key`` is stable across runs and machines)."""

    key: str
    kind: JobKind
    name: str
    kernel: str
    variant: str
    shape: dict[str, int]
    dtype: str
    check: str = ""
    seed: int = 0
    timeout_s: float = 120.0
    timing: dict[str, Any] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()
    plugin_dir: str = ""
    spec: dict[str, Any] = field(default_factory=dict)  # a repository job: its pytest selection or function target
    install: dict[str, Any] = field(default_factory=dict)  # the suite's [install] (empty: the harness's python)

    @property
    def shape_key(self) -> str:
        return shape_label(self.shape)

    @property
    def is_function(self) -> bool:
        """A benchmark of a repository's function (harness/bench.py) rather than of a registered kernel."""
        return bool(self.spec.get("target"))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        return cls(**{**data, "plugins": tuple(data.get("plugins", ()))})


def shape_label(shape: dict[str, int]) -> str:
    """Human-readable and stable: 'B=1,D=64,H=4,S_kv=256,S_q=256'."""
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))


def job_key(kind: str, kernel: str, variant: str, shape: dict[str, int], dtype: str, check: str = "") -> str:
    """Readable stable id: kind/kernel/variant/dtype/shape[/check]; same inputs give the same key everywhere."""
    parts = [kind, kernel, variant, dtype, shape_label(shape)]
    if check:
        parts.append(check)
    return "/".join(parts)


KEY_CHARS = 400  # the job key column's width


def per_test_key(selection: str, nodeid: str) -> str:
    """A pytest test's stable key, ``test/<selection>/<nodeid>`` (a long one keeps a digest of the whole)."""
    key = f"test/{selection}/{nodeid}"
    if len(key) <= KEY_CHARS:
        return key
    return f"{key[:KEY_CHARS - 17]}#{hashlib.sha1(key.encode()).hexdigest()[:16]}"


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
