"""The worker: runs one job (or a batch of benchmark jobs) in its own process and writes the results; it only
measures, never decides.

Usage (by the executors): ``python -m harness.execute.worker JOB.json RESULT.json``, or
``python -m harness.execute.worker --batch JOBS.json RESULTS_DIR [--gate GO]`` (one result file ``RESULTS_DIR/<i>.json``
per job, written as each finishes). A batch shares one process's start-up (MLX and the GPU take about a second to
start); a crash or hang here kills only this process, and the executor re-runs the batch's unfinished jobs one per
process. With ``--gate`` the process first compiles its jobs' source kernels (:func:`prepare`), writes
``RESULTS_DIR/ready`` and waits until the file ``GO`` exists before it times anything: the executor starts a few
batches together so their compiles overlap, and opens their gates one at a time (harness/execute/local.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

from harness.core.job import FunctionJob, Job, JobResult, KernelJob, PytestJob, job_from_dict
from harness.core.proc import die_with_parent
from harness.execute import repo_jobs
from harness.execute.timing import TimingProtocol, measure_mlx

PROTOCOL_FIELDS = set(TimingProtocol.__dataclass_fields__)


def _load_kernel(job: KernelJob):
    if job.plugin_dir and job.plugin_dir not in sys.path:
        sys.path.insert(0, job.plugin_dir)
    from kernels import REGISTRY  # loads mlx: only when needed

    for module in job.plugins:
        importlib.import_module(module)
    kernel = REGISTRY[job.kernel]
    return kernel, kernel.variants[job.variant]


def skip_reason(job: Job) -> str | None:
    """Why the job's variant cannot run on this machine, or None (also None if it cannot be loaded:
    the job process then reports that failure properly)."""
    if not isinstance(job, KernelJob):
        return None  # a repository's job: it decides in its own process (harness/execute/repo_jobs.py)
    try:
        _, variant = _load_kernel(job)
    except Exception:  # noqa: BLE001 - reported by the job process itself
        return None
    return variant.unsupported(job.dtype)


def _correctness(job: KernelJob, kernel, variant) -> JobResult:
    check = kernel.checks[job.check]
    outcome = check(kernel, variant, job.shape, job.dtype)
    return JobResult(job.key, "passed" if outcome.passed else "failed", outcome.detail,
                     max_error=outcome.max_error, tolerance=outcome.tolerance)


def _benchmark(job: KernelJob, kernel, variant) -> JobResult:
    inputs = kernel.make_inputs(job.shape, job.dtype, job.seed)
    protocol = TimingProtocol(**{k: v for k, v in job.timing.items() if k in PROTOCOL_FIELDS})
    measurement = measure_mlx(lambda: variant.fn(**inputs), protocol)
    return JobResult(job.key, "passed",
                     f"{len(measurement.samples)} samples x {measurement.inner} calls, {measurement.mode}",
                     samples=measurement.samples, inner=measurement.inner, warmup_s=measurement.warmup_s,
                     warmup_calls=measurement.warmup_calls, flops=float(kernel.flops(job.shape)),
                     bytes_moved=float(kernel.bytes_moved(job.shape, job.dtype)), mode=measurement.mode,
                     round_trip_s=measurement.round_trip_s, backlog_calls=measurement.backlog_calls)


def run_job(job: Job) -> JobResult:
    """Run one job in this process; a Python exception from the kernel is a failure, not a crash."""
    start = time.perf_counter()
    try:
        if isinstance(job, PytestJob | FunctionJob):
            result = repo_jobs.run_pytest(job) if isinstance(job, PytestJob) else repo_jobs.run_function(job)
            result.duration_s = time.perf_counter() - start
            return result
        if not isinstance(job, KernelJob):  # an install job: the executor does it (harness/execute/local.py)
            return JobResult(job.key, "failed", f"a {job.kind} job runs no job process")
        kernel, variant = _load_kernel(job)
        reason = variant.unsupported(job.dtype)
        if reason:
            result = JobResult(job.key, "skipped", reason)
        elif job.kind == "correctness":
            result = _correctness(job, kernel, variant)
        else:
            result = _benchmark(job, kernel, variant)
    except Exception as exc:  # noqa: BLE001 - the kernel under test may raise anything
        tail = "".join(traceback.format_exception(exc))[-2000:]
        result = JobResult(job.key, "failed", f"{type(exc).__name__}: {exc}"[:500], output_tail=tail)
    result.duration_s = time.perf_counter() - start
    return result


def write_result(result: JobResult, path: Path) -> None:
    write_result_text(json.dumps(result.to_dict()), path)


def write_result_text(text: str, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a half-written result is never read


def prepare(jobs: list[Job]) -> int:
    """One call of each benchmark job whose variant is a source kernel (not the MLX ops'), its result discarded:
    MLX compiles such a kernel at its first call in a process (1.3-3.3 s on the H200, and MLX keeps none across
    processes: kernels/cuda_compile.py). Returns how many ran; a failure is left for the job itself to report."""
    prepared = 0
    for job in jobs:
        if not isinstance(job, KernelJob) or job.kind != "benchmark":
            continue
        try:
            kernel, variant = _load_kernel(job)
            if variant.backend == "mlx" or variant.unsupported(job.dtype):
                continue
            import mlx.core as mx  # heavy, and loaded by _load_kernel already: only a job process needs it

            mx.eval(variant.fn(**kernel.make_inputs(job.shape, job.dtype, job.seed)))
            mx.synchronize()
            prepared += 1
        except Exception:  # noqa: BLE001 - the job reports it when it runs
            continue
    if prepared:
        import mlx.core as mx  # heavy: as above

        mx.clear_cache()  # the inputs' buffers: the processes waiting at their gates hold only their compiled kernels
    return prepared


def wait_for(gate: Path, poll_s: float = 0.02) -> bool:
    """Wait until ``gate`` exists; False if the process that started this one is gone (nobody will open it)."""
    parent = os.getppid()
    while not gate.exists():
        if os.getppid() != parent:
            return False
        time.sleep(poll_s)
    return True


def main(argv: list[str]) -> int:
    die_with_parent()  # a harness killed outright (SIGKILL) leaves no job process, pytest or xdist worker behind
    if argv[0] == "--batch":
        jobs = [job_from_dict(data) for data in json.loads(Path(argv[1]).read_text())]
        results = Path(argv[2])
        if argv[3:4] == ["--gate"]:
            prepared = prepare(jobs)
            write_result_text(f"{prepared}\n", results / "ready")
            if not wait_for(Path(argv[4])):
                return 1
        for index, job in enumerate(jobs):
            write_result(run_job(job), results / f"{index}.json")
        return 0
    job_path, result_path = Path(argv[0]), Path(argv[1])
    write_result(run_job(job_from_dict(json.loads(job_path.read_text()))), result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
