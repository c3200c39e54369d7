"""A planted slowdown recorded on the H200: `harness variants` over two runs of bench/h200_trials/planted_gpu.toml.

sdpa_keys5 is SDPA over 5 % more keys in the same single launch (a real ~5 % slowdown of the same kernel),
sdpa_twin is SDPA under another name (a null). Each run (tests/data/recorded/h200-planted-gpu-{base,head}.bundle, two
commits of identical code, 3 trials each) times them interleaved with sdpa at 16 GPU-bound shapes (S 4096/8192,
0.1-2 ms a call) and 8 short ones (S 1024/2048, 25-160 us). The goal: the planted loss found in at least 90 % of the
GPU-bound cells, and the twin never called a winner or a loser.
"""

from __future__ import annotations

import re

import pytest

from testkit.recorded import import_examples, variant_cells

COMMITS = {"base": "1d8c492d90d1", "head": "717d25bcfd02"}


@pytest.fixture(scope="module")
def matrices(tmp_path_factory) -> dict[str, list[dict]]:
    folder = tmp_path_factory.mktemp("planted")
    db = import_examples(folder, [f"h200-planted-gpu-{side}.bundle" for side in COMMITS])
    return variant_cells(folder, db, COMMITS)


def gpu_bound(cell: dict) -> bool:
    return int(re.search(r"S_q=(\d+)", cell["shape_key"]).group(1)) >= 4096


@pytest.mark.parametrize("side", list(COMMITS))
def test_the_planted_loss_is_found_in_every_gpu_bound_cell_and_the_twin_in_none(matrices, side):
    cells = matrices[side]
    planted = [c for c in cells if c["variant"] == "sdpa_keys5"]
    twin = [c for c in cells if c["variant"] == "sdpa_twin"]
    assert len(planted) == len(twin) == 24
    bound = [c for c in planted if gpu_bound(c)]
    assert len(bound) == 16
    found = sum(c["outcome"] == "lose" for c in bound)
    assert found >= 0.9 * len(bound)  # 16 of 16 in both runs when recorded
    assert all(1.02 < c["ratio"] < 1.10 for c in bound if c["outcome"] == "lose")  # ~5 % more work: 1.04-1.07
    assert all(c["outcome"] in ("tie", "inconclusive") for c in twin)  # 24 ties in both runs when recorded
    short = [c for c in planted if not gpu_bound(c)]
    assert all(c["outcome"] in ("lose", "tie", "inconclusive") for c in short)  # never a "win": 5 of 8 found
