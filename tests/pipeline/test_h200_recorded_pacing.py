"""The planted slowdown recorded again on the H200 with each job's backlog (harness.stats.pacing): two runs of
bench/h200_trials/planted_gpu.toml at commit 719f91e (tests/data/recorded/h200-planted-paced-{base,head}.bundle,
identical code, 3 trials each).

sdpa_keys5 is SDPA over 5 % more keys in the same single launch, sdpa_twin SDPA under another name. The recorded
backlog separates the cells: the device-paced ones (the device had calls queued) must show the planted loss in at
least 90 % of cells; the host-paced ones (causal SDPA at S=1024: the device waited for each call) are marked, since
their time is the host's pace; the twin is never a winner or a loser, and the base-vs-head null flags nothing.
"""

from __future__ import annotations

import pytest

from testkit.recorded import import_examples, variant_cells, verb_json

RUNS = {"base": "23bdc77b162940f4908fba24132e8f64", "head": "fbcf6d6624e04943bbd13c8e52193dcd"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, dict, dict]:
    folder = tmp_path_factory.mktemp("paced")
    db = import_examples(folder, [f"h200-planted-paced-{side}.bundle" for side in RUNS])
    return db, variant_cells(folder, db, RUNS), verb_json(folder, db, "compare", RUNS["base"], RUNS["head"])


@pytest.mark.parametrize("side", list(RUNS))
def test_the_planted_loss_shows_in_at_least_90_percent_of_device_paced_cells(recorded, side):
    planted = [c for c in recorded[1][side] if c["variant"] == "sdpa_keys5"]
    assert len(planted) == 24
    device_paced = [c for c in planted if not c["host_paced"]]
    assert len(device_paced) >= 16  # every S >= 2048 cell at least (20 and 21 when recorded)
    found = [c for c in device_paced if c["outcome"] == "lose"]
    assert len(found) >= 0.9 * len(device_paced)  # 20 of 20 and 20 of 21 when recorded
    assert all(1.02 < c["ratio"] < 1.15 for c in found)  # 5 % more keys: S >= 4096 1.05-1.08, S=2048 1.09-1.12
    assert all(c["outcome"] != "win" for c in planted)


@pytest.mark.parametrize("side", list(RUNS))
def test_the_host_paced_cells_are_the_short_kernels_and_the_twin_never_differs(recorded, side):
    cells = recorded[1][side]
    paced = {c["shape_key"] for c in cells if c["host_paced"]}
    assert paced and all("S_q=1024" in shape for shape in paced)  # 25-45 us a call; S >= 2048 never
    twin = [c for c in cells if c["variant"] == "sdpa_twin"]
    assert len(twin) == 24 and all(c["outcome"] in ("tie", "inconclusive") for c in twin)


def test_the_null_pair_flags_nothing_and_marks_the_host_paced_series(recorded):
    report = recorded[2]
    assert report["counts"]["regressed"] == report["counts"]["improved"] == 0
    assert report["counts"]["inconclusive"] <= 0.1 * len(report["rows"])  # 1 of 72 when recorded
    paced = [row for row in report["rows"] if row["host_paced"]]
    assert paced and all(row["key"]["shape_key"].endswith("S_q=1024") for row in paced)
