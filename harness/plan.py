"""Plan: expand a suite for one chip into concrete jobs with stable keys (the unit of idempotency)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the job processes import this module; keep pydantic out of them
    from harness.suite import BenchmarkSpec, CorrectnessSpec, Suite

JobKind = Literal["correctness", "benchmark", "calibration"]


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

    @property
    def shape_key(self) -> str:
        return shape_label(self.shape)

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


def key_digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def _variants(spec: CorrectnessSpec | BenchmarkSpec, kernel) -> list[str]:
    return list(kernel.variants) if spec.variants == "all" else list(spec.variants)


def plan_suite(suite: Suite, chip_class: str, plugin_dir: str = "") -> list[Job]:
    """All jobs of a suite for one chip class: calibration first, then correctness, then benchmarks."""
    from harness.suite import TimingSpec
    from kernels import REGISTRY

    plugins = tuple(suite.suite.plugins)
    common = {"plugins": plugins, "plugin_dir": plugin_dir}
    jobs: list[Job] = []
    calibration = suite.calibration.get(chip_class)
    if calibration is not None:
        timing = suite.timing.model_dump()
        for kernel_name, sizes in (("calib_matmul", calibration.matmul_n), ("calib_copy", calibration.copy_n)):
            kernel = REGISTRY[kernel_name]
            for n in sizes:
                shape = kernel.normalize_shape({"N": n})
                jobs.append(Job(job_key("calibration", kernel_name, kernel.default_variant, shape, calibration.dtype),
                                "calibration", "calibration", kernel_name, kernel.default_variant, shape,
                                calibration.dtype, timeout_s=suite.timing.timeout_s, timing=timing, **common))
    for spec in suite.correctness:
        kernel = REGISTRY[spec.kernel]
        for variant in _variants(spec, kernel):
            for dtype in spec.dtypes:
                for raw_shape in spec.shapes:
                    shape = kernel.normalize_shape(raw_shape)
                    for check in spec.checks:
                        jobs.append(Job(job_key("correctness", spec.kernel, variant, shape, dtype, check),
                                        "correctness", spec.name, spec.kernel, variant, shape, dtype, check,
                                        seed=spec.seed, timeout_s=spec.timeout_s, **common))
    for spec in suite.benchmark:
        kernel = REGISTRY[spec.kernel]
        timing = TimingSpec(**{**suite.timing.model_dump(), **spec.timing}).model_dump()
        for variant in _variants(spec, kernel):
            for dtype in spec.dtypes:
                for raw_shape in suite.grid_shapes(spec, chip_class):
                    shape = kernel.normalize_shape(raw_shape)
                    jobs.append(Job(job_key("benchmark", spec.kernel, variant, shape, dtype), "benchmark",
                                    spec.name, spec.kernel, variant, shape, dtype,
                                    timeout_s=max(spec.timeout_s, timing["timeout_s"]), timing=timing, **common))
    return _dedupe(jobs)


def _dedupe(jobs: list[Job]) -> list[Job]:
    """Two suite entries that expand to the same job run it once (the key is the identity)."""
    seen: dict[str, Job] = {}
    for job in jobs:
        seen.setdefault(job.key, job)
    return list(seen.values())
