"""The GitHub workflows: valid against GitHub's workflow schema, and doing what docs/cluster.md says they do.

actionlint's pip wrapper downloads its binary from GitHub when installed, which CI cannot reach; check-jsonschema
validates against GitHub's published workflow schema, vendored in the package (no network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from testkit.paths import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
HOSTED_LIMIT_MIN = 360  # GitHub-hosted runners stop a job after 6 hours
CLUSTER_RUNNER = "${{ fromJSON(vars.HARNESS_RUNNER || '[\"self-hosted\"]') }}"


def check_jsonschema() -> str:
    found = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    assert found, "check-jsonschema is in the test extra (pyproject.toml)"
    return found


def validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([check_jsonschema(), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def load(name: str) -> dict:
    return YAML(typ="safe").load((ROOT / ".github" / "workflows" / name).read_text())


def steps_text(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", "")) for step in job["steps"])


def test_every_workflow_is_valid_against_githubs_schema():
    assert {p.name for p in WORKFLOWS} >= {"bench.yml", "pr-gate.yml", "mac.yml", "test.yml"}
    done = validate(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_validator_rejects_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  j:\n    timeout-minutes: ten\n    steps:\n      - run: true\n")
    assert validate(broken).returncode != 0  # no runs-on, a timeout that is not a number


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_job_has_a_timeout_within_the_hosted_limit(path: Path):
    for name, job in load(path.name)["jobs"].items():
        assert 0 < int(job["timeout-minutes"]) <= HOSTED_LIMIT_MIN, (path.name, name)


def test_cluster_jobs_take_runner_and_address_from_repository_variables():
    for name in ("bench.yml", "pr-gate.yml"):
        jobs = load(name)["jobs"]
        assert jobs["off"]["runs-on"] == "ubuntu-latest"  # only says the workflow is off
        cluster = [job for job in jobs.values() if "HARNESS_RAY_ADDRESS" in job.get("env", {})]
        assert cluster, name
        for job in cluster:
            assert job["runs-on"] == CLUSTER_RUNNER, name  # not a hard-coded hosted runner
            assert job["env"]["HARNESS_RAY_ADDRESS"] == "${{ vars.HARNESS_RAY_ADDRESS }}", name


def test_the_pull_request_gate_posts_the_comparison_and_gates_on_its_exit_status():
    workflow = load("pr-gate.yml")
    assert "pull_request" in workflow["on"]
    job = workflow["jobs"]["gate"]
    text = steps_text(job)
    assert 'harness submit --address "$HARNESS_RAY_ADDRESS" --commit "$HEAD_SHA"' in text
    assert 'harness compare "$BASE_SHA" "$HEAD_SHA"' in text and "--format markdown" in text
    assert "--settle" not in text  # it measures where it runs: this runner is no benchmark chip
    assert 'git merge-base "origin/$BASE_REF" "$HEAD_SHA"' in text  # the merge base, not the base branch's tip
    assert "pull_request.base.sha" not in str(job["env"])
    assert '>> "$GITHUB_STEP_SUMMARY"' in text and "gh pr comment" in text
    assert "1) echo" in text and "exit 1" in text  # a regression fails the check
    assert workflow["permissions"]["pull-requests"] == "write"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_a_job_that_reads_history_checks_out_the_whole_history(path: Path):
    """bench.yml compared with `git rev-parse HEAD^` in a depth-1 clone: never a parent, the comparison skipped on
    every push (and continue-on-error hid it)."""
    for name, job in load(path.name)["jobs"].items():
        text = steps_text(job)
        if any(word in text for word in ("rev-parse", "merge-base", "rev-list")):
            (checkout,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout")]
            assert checkout.get("with", {}).get("fetch-depth") == 0, (path.name, name)
        assert not any("continue-on-error" in step for step in job["steps"]), (path.name, name)


@pytest.mark.parametrize("name, setting", [("bench.yml", "HARNESS_RAY_ADDRESS"), ("pr-gate.yml", "HARNESS_RAY_ADDRESS"),
                                           ("mac.yml", "HARNESS_MAC_RUNNERS")])
def test_without_its_setting_a_workflow_is_off_by_design_and_says_so(name: str, setting: str):
    """Without a Ray address bench.yml and pr-gate.yml failed on every push and pull request; now one job says
    the workflow is off (a notice), and the measuring jobs do not start."""
    jobs = load(name)["jobs"]
    assert f"vars.{setting} == ''" in jobs["off"]["if"] and "::notice::" in steps_text(jobs["off"])
    for job_name, job in jobs.items():
        if job_name not in ("off", "pages", "collect"):
            assert f"vars.{setting} != ''" in job["if"], (name, job_name)


def test_bench_publishes_the_report_as_an_artifact_and_to_pages_where_enabled():
    jobs = load("bench.yml")["jobs"]
    text = steps_text(jobs["bench"])
    assert "actions/upload-artifact" in text and "actions/upload-pages-artifact" in text
    assert "vars.HARNESS_PAGES" in jobs["pages"]["if"] and "actions/deploy-pages" in steps_text(jobs["pages"])


def test_the_mac_workflow_runs_on_the_teams_own_macs_and_ends_in_one_report():
    jobs = load("mac.yml")["jobs"]
    runners = jobs["run"]["strategy"]["matrix"]["runner"]
    assert "self-hosted" in runners and "macos-" not in runners  # hosted macOS: a paravirtual GPU (docs/macs.md)
    assert jobs["run"]["runs-on"] == "${{ matrix.runner }}" and "harness run" in steps_text(jobs["run"])
    assert "harness export" in steps_text(jobs["run"]) and "actions/upload-artifact" in steps_text(jobs["run"])
    collect = steps_text(jobs["collect"])
    assert "actions/download-artifact" in collect and 'harness import --db "$HARNESS_DB"' in collect
    assert collect.count("harness report") == 1


def test_the_test_workflow_runs_exactly_the_ci_script():
    (job,) = load("test.yml")["jobs"].values()
    assert "bash .ci/run" in steps_text(job)
