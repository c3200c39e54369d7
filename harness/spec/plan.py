"""Plan: expand a suite for one chip into concrete jobs with stable keys (the unit of idempotency)."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from typing import Any

from harness.core.job import CALIBRATION_COPY, CALIBRATION_MATMUL, FunctionJob, InstallJob, Job, KernelJob, PytestJob
from harness.spec.suite import BenchmarkSpec, CorrectnessSpec, Suite, TimingSpec


def _variants(spec: CorrectnessSpec | BenchmarkSpec, kernel) -> list[str]:
    return list(kernel.variants) if spec.variants == "all" else list(spec.variants)


def plan_suite(suite: Suite, chip_class: str, plugin_dir: str = "") -> list[Job]:
    """All jobs of a suite for one chip class: calibration first, then correctness, then benchmarks."""
    return _enough_trials_alone(plan_jobs(suite, chip_class, plugin_dir))


def plan_jobs(suite: Suite, chip_class: str, plugin_dir: str = "") -> list[Job]:
    """:func:`plan_suite` before the benchmarks' trial counts are settled: which jobs the suite has (what `harness
    bisect` checks its selection against before anything runs; neither scipy nor, for a repository suite, MLX)."""
    if suite.calibration or suite.correctness or suite.benchmark:
        from kernels import REGISTRY  # imports mlx: only when a suite of kernels is planned
    common = {"plugins": tuple(suite.suite.plugins), "plugin_dir": plugin_dir}  # what a kernel job imports first
    jobs: list[Job] = []
    calibration = suite.calibration.get(chip_class)
    if calibration is not None:
        timing = suite.timing.model_dump()
        for kernel_name, sizes in ((CALIBRATION_MATMUL, calibration.matmul_n), (CALIBRATION_COPY, calibration.copy_n)):
            kernel = REGISTRY[kernel_name]
            for n in sizes:
                shape = kernel.normalize_shape({"N": n})
                jobs.append(KernelJob.of("calibration", kernel_name, kernel.default_variant, shape, calibration.dtype,
                                         name="calibration", timeout_s=suite.timing.timeout_s, timing=timing,
                                         **common))
    for spec in suite.correctness:
        kernel = REGISTRY[spec.kernel]
        for variant in _variants(spec, kernel):
            for dtype in spec.dtypes:
                for raw_shape in spec.shapes:
                    shape = kernel.normalize_shape(raw_shape)
                    for check in spec.checks:
                        jobs.append(KernelJob.of("correctness", spec.kernel, variant, shape, dtype, check,
                                                 name=spec.name, seed=spec.seed, timeout_s=spec.timeout_s, **common))
    for spec in suite.benchmark:
        kernel = REGISTRY[spec.kernel]
        timing = TimingSpec(**{**suite.timing.model_dump(), **spec.timing}).model_dump()
        for variant in _variants(spec, kernel):
            for dtype in spec.dtypes:
                for raw_shape in suite.grid_shapes(spec, chip_class):
                    shape = kernel.normalize_shape(raw_shape)
                    jobs.append(KernelJob.of("benchmark", spec.kernel, variant, shape, dtype, name=spec.name,
                                             timeout_s=max(spec.timeout_s, timing["timeout_s"]), timing=timing,
                                             **common))
    jobs += _plan_repo_sections(suite, chip_class)
    return _dedupe(jobs)


def _enough_trials_alone(jobs: list[Job]) -> list[Job]:
    """With fewer benchmark series than ``policy.MIN_SERIES_TO_MODERATE`` there is no grid to borrow a spread from:
    each series is judged on its own trials, and a change must also show by rank, which takes
    ``trials.min_trials_alone()`` (4) trials a side. So such a suite measures at least that many (a suite asking for
    a single trial, no spread at all, keeps it)."""
    from harness.stats import policy, trials  # scipy: only when a suite is planned (the CLI starts without it)

    least = trials.min_trials_alone()
    if not 0 < sum(job.kind == "benchmark" for job in jobs) < policy.MIN_SERIES_TO_MODERATE:
        return jobs
    return [replace(job, timing={**job.timing, "trials": least})  # type: ignore[call-arg]
            if job.kind == "benchmark" and 2 <= job.trials < least else job for job in jobs]


PYTEST_GRACE_S = 60.0  # the job process outlives pytest's own timeout by this much, to report partial results


def install_spec(suite: Suite) -> dict[str, Any]:
    """The job-side form of [install]; ``nonce`` identifies this plan, so a failed install is retried by the next
    run but not by every job of this one."""
    if suite.install is None:
        return {}
    return {**suite.install.model_dump(), "nonce": uuid.uuid4().hex}


def _plan_repo_sections(suite: Suite, chip_class: str) -> list[Job]:
    """The install job, pytest selections and benchmark functions of a repository suite."""
    install = install_spec(suite)
    jobs: list[Job] = []
    if install:
        jobs.append(InstallJob.of(install, timeout_s=install["timeout_s"] + PYTEST_GRACE_S))
    for spec in suite.pytest:
        if chip_class not in spec.chips:
            continue
        selection = {"selection": spec.name, "paths": spec.paths, "k": spec.k, "m": spec.m, "args": spec.args,
                     "workers": spec.workers, "timeout_s": spec.timeout_s}
        jobs.append(PytestJob.of(selection, timeout_s=spec.timeout_s + PYTEST_GRACE_S, install=install))
    for spec in suite.function:
        timing = TimingSpec(**{**suite.timing.model_dump(), **spec.timing}).model_dump()
        for dtype in spec.dtypes or [""]:
            for shape in suite.function_shapes(spec, chip_class):
                jobs.append(FunctionJob.of(spec.target, shape, dtype, name=spec.label, timing=timing, install=install,
                                           timeout_s=max(spec.timeout_s, timing["timeout_s"])))
    return jobs


def _dedupe(jobs: list[Job]) -> list[Job]:
    """Two suite entries that expand to the same job run it once (the key is the identity)."""
    seen: dict[str, Job] = {}
    for job in jobs:
        seen.setdefault(job.key, job)
    return list(seen.values())


def compile_group(job: Job) -> tuple[str, ...]:
    """The jobs that can share compiled kernels in one process: one (kernel, variant, dtype).

    A source variant (``mx.fast.cuda_kernel``) is compiled by NVRTC once per process and template, and MLX 0.32.4
    caches nothing across processes (bench/results/README.md: 1.4-2.7 s per kernel, in every process), so a
    round runs each group's jobs next to each other, in one process where they fit (``execute.local.batches``)."""
    return tuple(str(getattr(job, field, "")) for field in ("kernel", "variant", "dtype"))


def _shuffled_groups(jobs: list[Job], rng: random.Random) -> list[Job]:
    groups: dict[tuple[str, ...], list[Job]] = {}
    for job in jobs:
        groups.setdefault(compile_group(job), []).append(job)
    order = list(groups.values())
    rng.shuffle(order)
    for group in order:
        rng.shuffle(group)
    return [job for group in order for job in group]


def plan_trials(jobs: list[Job], seed: int) -> list[Job]:
    """Every job once, then each benchmark job again for each of its further trials, interleaved in rounds.

    Round r holds every benchmark job with more than r trials (``[timing] trials``), in an order shuffled with
    ``seed`` (the run records it): a drift of clocks, temperature or load during the run then spreads over every
    series instead of landing on the ones that happened to run last. The shuffle is by ``compile_group`` (the groups
    in a shuffled order, each group's jobs shuffled and kept together) so that a round compiles each source kernel
    once, not once per shape. Round 0 keeps the planned order's place among the other kinds (executors run kinds
    in phases); the rounds after it follow in order.
    """
    rng = random.Random(seed)
    benchmarks = [job for job in jobs if job.kind == "benchmark"]
    rounds = max((job.trials for job in benchmarks), default=1)
    planned = [job for job in jobs if job.kind != "benchmark"] + _shuffled_groups(benchmarks, rng)
    for trial in range(1, rounds):
        planned.extend(_shuffled_groups([replace(job, trial=trial) for job in benchmarks if job.trials > trial], rng))
    return planned


def trial_seed() -> int:
    """A fresh seed for a run's trial order (recorded with the run, so the order can be replayed)."""
    return random.SystemRandom().randrange(2**31)
