"""A virtual GPU's runs (GitHub's hosted macOS runners: "Apple Paravirtual device") carry no timing verdict in
`harness compare` and `harness variants`, and no perf bisect; their correctness failures still fail the gate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.core import chip
from harness.record import outbox
from testkit import analysis
from testkit.analysis import add_run, checks, grid_results, sha_of
from testkit.paths import TESTS
from tests.cli.test_compare_cli import cli

VM = "vm-metal-apple-paravirtual-device"


@pytest.fixture
def on_a_vm(db_url, monkeypatch):
    """Commit 1 -> 2 on a virtual GPU and a real chip: swiglu/fused_gateup 50 % slower on both."""
    info = json.loads((TESTS / "data" / "macos" / "device_info_paravirtual.json").read_text())
    ident = chip.identity_from_facts("metal", info, gpu_cores=None, os_name="Darwin 23.6.0", mlx_version="0.32.4")
    assert ident.key == VM
    monkeypatch.setitem(analysis.CHIPS, VM, ident)
    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(7)
    for commit in (1, 2):
        for key in (VM, "chip-a"):
            factors = {("swiglu", "fused_gateup", 1): 1.5} if commit == 2 else {}
            add_run(handle, key, commit, grid_results(rng, factors) + checks(), minutes=10 * commit)
    handle.close()
    return db_url


def test_compare_gives_a_virtual_gpu_no_timing_verdict(on_a_vm, capsys):
    code, out, _ = cli(capsys, "compare", sha_of(1)[:8], sha_of(2)[:8], "--db", on_a_vm, "--format", "json")
    rows = json.loads(out)["rows"]
    verdicts = {(r["key"]["chip"], r["key"]["variant"], r["key"]["shape_key"]): r for r in rows}
    slowed = [r for (c, v, _), r in verdicts.items() if v == "fused_gateup" and r["ratio"] > 1.3]
    assert {r["key"]["chip"] for r in slowed} == {VM, "chip-a"}
    for row in slowed:
        expected = "inconclusive" if row["key"]["chip"] == VM else "regressed"
        assert row["verdict"] == expected, row
    assert code == 1  # the real chip's regression
    code, out, _ = cli(capsys, "compare", sha_of(1)[:8], sha_of(2)[:8], "--db", on_a_vm, "--chip", VM)
    assert code == 0 and f"{VM} is a virtual GPU: its timings carry no verdict" in out + _


def test_a_virtual_gpus_correctness_failure_still_fails_the_gate(db_url, monkeypatch, capsys):
    info = json.loads((TESTS / "data" / "macos" / "device_info_paravirtual.json").read_text())
    monkeypatch.setitem(analysis.CHIPS, VM, chip.identity_from_facts("metal", info, gpu_cores=None, os_name="",
                                                                      mlx_version=""))
    handle = outbox.open_store(db_url)
    rng = np.random.default_rng(3)
    add_run(handle, VM, 1, grid_results(rng) + checks(), minutes=10)
    add_run(handle, VM, 2, grid_results(rng) + checks({("swiglu", "unfused"): "failed"}), minutes=20)
    handle.close()
    code, out, _ = cli(capsys, "compare", sha_of(1)[:8], sha_of(2)[:8], "--db", db_url)
    assert code == 1 and "Newly failing on head (1)" in out


def test_the_regression_list_has_no_slowdown_of_a_virtual_gpu(on_a_vm):
    from harness.analysis import regressions

    handle = outbox.open_store(on_a_vm)
    try:
        found = regressions.regressions(handle)
    finally:
        handle.close()
    slowdowns = {(e.chip, e.variant) for e in found if e.kind == "performance"}
    assert ("chip-a", "fused_gateup") in slowdowns and not any(c == VM for c, _ in slowdowns)


def test_variants_give_a_virtual_gpu_no_verdict(on_a_vm, capsys):
    code, out, err = cli(capsys, "variants", "--commit", sha_of(2)[:8], "--db", on_a_vm, "--format", "json", "--all")
    assert code == 0, err
    cells = json.loads(out)["cells"]
    on_vm = [c for c in cells if c["chip"] == VM]
    assert on_vm and {c["outcome"] for c in on_vm} == {"inconclusive"}
    assert any(c["outcome"] != "inconclusive" for c in cells if c["chip"] == "chip-a")


def test_a_perf_bisect_refuses_a_virtual_gpu(tmp_path, monkeypatch):
    import subprocess

    from harness.bisect import run as bisect_run
    from harness.bisect.probes import BisectRequest
    from harness.core.errors import HarnessError

    for n in (1, 2):
        subprocess.run(["git", "init", "-q"] if n == 1 else ["true"], cwd=tmp_path, check=True)
        (tmp_path / "f.txt").write_text(str(n))
        subprocess.run(["git", "add", "f.txt"], cwd=tmp_path, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", str(n)], cwd=tmp_path,
                       check=True)
    shas = subprocess.run(["git", "rev-list", "--reverse", "HEAD"], cwd=tmp_path, check=True, capture_output=True,
                          text=True).stdout.split()
    monkeypatch.setattr(bisect_run, "_local_chip", lambda wanted: VM)
    request = BisectRequest(good=shas[0], bad=shas[1], kernel="k", repo=str(tmp_path),
                            db_url=f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(HarnessError, match="virtual GPU: its timings are not fit for a perf bisect"):
        bisect_run.run_bisect(request, run_one=lambda *a, **k: None)
