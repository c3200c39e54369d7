"""One process per job: pass, fail, skip, crash and timeout all come back as results and the run goes on."""

from __future__ import annotations

from harness.core.job import KernelJob
from harness.execute.local import LocalExecutor, run_in_subprocess
from testkit.paths import PLUGINS


def toy_job(variant: str, kind: str = "correctness", timeout_s: float = 60.0, check: str = "reference") -> KernelJob:
    return KernelJob.of(kind, "toy", variant, {"N": 16}, "float32", check if kind == "correctness" else "",
                        timeout_s=timeout_s, timing={"warmup_s": 0.0, "warmup_calls": 1, "min_sample_s": 0.001,
                                                     "samples": 3},
                        plugins=("broken_kernels",), plugin_dir=str(PLUGINS))


def test_a_passing_correctness_job_reports_its_error():
    result = run_in_subprocess(toy_job("double"))
    assert result.status == "passed", result.output_tail
    assert result.max_error == 0.0 and result.tolerance == 1e-6


def test_a_benchmark_job_returns_raw_samples_and_roofline_work():
    result = run_in_subprocess(toy_job("double", kind="benchmark"))
    assert result.status == "passed", result.output_tail
    assert len(result.samples) == 3 and all(s > 0 for s in result.samples)
    assert result.inner >= 1 and result.flops == 16.0 and result.bytes_moved == 128.0


def test_an_aborting_job_is_a_crash_with_its_output_tail():
    result = run_in_subprocess(toy_job("last_words"))
    assert result.status == "crashed"
    assert "signal" in result.detail
    assert "last words of the job" in result.output_tail


def test_a_hanging_job_times_out_and_is_killed():
    result = run_in_subprocess(toy_job("hang", timeout_s=3))
    assert result.status == "timeout"
    assert 3 <= result.duration_s < 20


def test_a_raising_kernel_is_a_failure_with_the_traceback():
    result = run_in_subprocess(toy_job("raise"))
    assert result.status == "failed"
    assert "kernel exploded on purpose" in result.detail and "Traceback" in result.output_tail


def test_a_variant_that_cannot_run_here_is_skipped_with_the_reason():
    result = run_in_subprocess(toy_job("cuda_only"))
    assert result.status == "skipped" and result.detail == "CUDA not available"


def test_the_run_goes_on_after_crash_and_timeout_and_parallel_keeps_every_result():
    jobs = [toy_job("abort"), toy_job("hang", timeout_s=2), toy_job("double"),
            toy_job("double", kind="benchmark")]
    seen = {}
    LocalExecutor(parallel=2).execute(jobs, lambda job, result: seen.__setitem__(job.key, result.status))
    assert seen == {jobs[0].key: "crashed", jobs[1].key: "timeout", jobs[2].key: "passed", jobs[3].key: "passed"}
