"""`harness init`'s generated texts: the harness.toml loads through the suite loader, the workflows of every
topology are valid against GitHub's schema and do what docs/ci.md says; existing files are refused."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from harness.spec import suite
from harness.spec.init.files import GATE_WORKFLOW, MEASURE_WORKFLOW, TOPOLOGIES, render_files
from harness.spec.init.repo import scan
from harness.spec.init.source import source_from_direct_url
from harness.spec.init.suite_toml import render_toml
from harness.spec.init.workflows import gate_workflow, measure_workflow
from testkit.paths import ROOT
from tests.test_workflows import validate

SOURCE = "mlx-kernel-harness @ git+https://github.com/OWNER/mlx-kernel-harness@v0.1.0"
KERNEL = '''from mykern.base import Kernel, Variant, register

def make_inputs(shape, dtype):
    return {"x": shape["M"] * shape["K"]}

register(Kernel(name="rmsnorm", default_variant="plain",
                variants={"plain": Variant(name="plain", fn=None), "fused": Variant(name="fused", fn=None)}))
'''
BENCH = '''from harness.bench import benchmark

@benchmark(flops=lambda N, **_: N)
def bench_scale(N, M=64, dtype="float32"):
    return lambda: None

def helper():
    return 1

def bench_plain(N=128):
    return lambda: None
bench_plain.__harness_benchmark__ = {"flops": 1}
'''


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src" / "mykern").mkdir(parents=True)
    (tmp_path / "src" / "mykern" / "__init__.py").write_text("")
    (tmp_path / "src" / "mykern" / "norm.py").write_text(KERNEL)
    (tmp_path / "src" / "mykern" / "bench.py").write_text(BENCH)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("import pytest\n@pytest.mark.gpu\ndef test_a():\n    pass\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mykern"\nversion = "0"\n'
                                             '[tool.pytest.ini_options]\nmarkers = ["slow: long tests"]\n')
    return tmp_path


def test_the_scan_finds_tests_markers_benchmark_functions_and_kernels(repo):
    found = scan(repo)
    assert found.test_dirs == ("tests",) and found.markers == ("slow", "gpu") and found.installable
    targets = {f.target: f for f in found.functions}
    assert set(targets) == {"mykern.bench:bench_scale", "mykern.bench:bench_plain"}  # src layout; helper is not
    assert targets["mykern.bench:bench_scale"].params == (("N", None), ("M", 64))
    assert targets["mykern.bench:bench_scale"].takes_dtype
    (kernel,) = found.kernels
    assert (kernel.name, kernel.module, kernel.variants, kernel.shape_keys) == (
        "rmsnorm", "mykern.norm", ("plain", "fused"), ("K", "M"))


def test_the_generated_toml_loads_through_the_suites_own_loader(repo):
    text = render_toml(scan(repo))
    loaded = suite.parse_suite(tomllib.loads(text), source="harness.toml", base_dir=repo)
    assert loaded.suite.name == repo.name and loaded.install is not None
    assert [p.paths for p in loaded.pytest] == [["tests"]] and loaded.pytest[0].m == "not slow"
    grids = {f.target: f.grid for f in loaded.function}
    assert grids["mykern.bench:bench_scale"]["gpu"] == {"N": [1024, 4096], "M": [64]}
    assert grids["mykern.bench:bench_plain"]["cpu"] == {"N": [128]}
    suite.check_tree(loaded, repo)
    # the kernel's example, uncommented, is valid TOML naming the kernel, its variants and its shape keys
    example = "\n".join(line[2:] for line in text.splitlines() if line.startswith(("# [[", "# name", "# kernel",
                                                                                   "# variants", "# dtypes",
                                                                                   "# checks", "# shapes",
                                                                                   "# grid")))
    sections = tomllib.loads(example.split("[[pytest]]")[-1] if "[[pytest]]" in example else example)
    assert sections["correctness"][0]["kernel"] == "rmsnorm"
    assert sections["correctness"][0]["shapes"] == [{"K": 1, "M": 1}]
    assert sections["benchmark"][0]["variants"] == ["plain", "fused"]


def test_an_empty_repository_gets_a_loadable_toml_with_examples(tmp_path):
    text = render_toml(scan(tmp_path))
    assert suite.parse_suite(tomllib.loads(text), source="harness.toml").pytest == []
    assert "# [[function]]" in text and "# [[pytest]]" in text


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_topologys_workflows_are_valid_and_pinned(repo, tmp_path, topology):
    files = render_files(scan(repo), topology, SOURCE, "main")
    paths = []
    for name in (MEASURE_WORKFLOW, GATE_WORKFLOW):
        path = tmp_path / topology / Path(name).name
        path.parent.mkdir(exist_ok=True)
        path.write_text(files[name])
        paths.append(path)
        workflow = YAML(typ="safe").load(files[name])
        assert workflow["env"]["HARNESS_SOURCE"] == SOURCE
        for job in workflow["jobs"].values():
            assert 0 < job["timeout-minutes"] <= 360
            for step in job["steps"]:
                assert "continue-on-error" not in step  # nothing fails quietly
                if step.get("uses", "").startswith("actions/checkout"):
                    assert step["with"]["fetch-depth"] == 0  # parents and merge bases are in the clone
                if step.get("name") == "Install the harness":
                    assert step["run"] == 'python -m pip install "$HARNESS_SOURCE"'
    done = validate(*paths)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_the_gate_compares_with_the_merge_base_and_posts_a_comment(repo, topology):
    text = gate_workflow(topology, SOURCE)
    assert 'git merge-base "origin/$BASE_REF" "$HEAD_SHA"' in text
    assert 'harness compare "$BASE_SHA" "$HEAD_SHA"' in text
    assert ("--settle" in text) == (topology == "shared-db")  # settling measures: on the chip itself
    assert "gh pr comment \"$PR\" --body-file comment.md" in text and "required status check" in text
    workflow = YAML(typ="safe").load(text)
    assert workflow["permissions"]["pull-requests"] == "write"


def test_shared_db_measures_on_self_hosted_macs_not_hosted_runners(repo):
    workflow = YAML(typ="safe").load(measure_workflow("shared-db", SOURCE, "trunk"))
    assert workflow["on"]["push"]["branches"] == ["trunk"]
    runners = workflow["jobs"]["measure"]["strategy"]["matrix"]["runner"]
    assert "self-hosted" in runners and "macos-14" not in runners
    assert "commits" in workflow["on"]["workflow_dispatch"]["inputs"]  # backfill


def test_the_pinned_source_comes_from_a_git_install():
    assert source_from_direct_url({"url": "https://github.com/o/r", "vcs_info": {
        "vcs": "git", "commit_id": "a" * 40, "requested_revision": "v0.1.0"}}) == \
        f"mlx-kernel-harness @ git+https://github.com/o/r@{'a' * 40}"
    assert source_from_direct_url({"url": "file:///work/h", "dir_info": {"editable": True}}) is None


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", "init", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_init_refuses_to_overwrite_without_force(repo):
    assert cli("--harness-source", SOURCE, cwd=repo).returncode == 0
    (repo / "harness.toml").write_text("# mine\n")
    done = cli("--harness-source", SOURCE, cwd=repo)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "already exist" in done.stderr and "--force" in done.stderr
    assert (repo / "harness.toml").read_text() == "# mine\n"
    assert cli("--harness-source", SOURCE, "--force", cwd=repo).returncode == 0
    assert (repo / "harness.toml").read_text() != "# mine\n"


def test_init_from_a_local_checkout_asks_for_the_source(repo):
    done = cli(cwd=repo)  # this harness is an editable checkout: no source CI could install from
    assert done.returncode == 2 and "--harness-source" in done.stderr
    assert not (repo / "harness.toml").exists()


def test_an_unknown_topology_is_refused(repo):
    done = cli("--topology", "mesh", "--harness-source", SOURCE, cwd=repo)
    assert done.returncode == 2 and "shared-db, bundles, cluster" in done.stderr
