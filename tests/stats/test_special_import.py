"""``harness.stats.special``: scipy.special imported without running the numpy submodules scipy's array-API layer
star-imports (loaded on first use instead), in a fresh interpreter as a command starts."""

from __future__ import annotations

import subprocess
import sys

from testkit.paths import ROOT

_PROBE = """
import sys, types
import harness.stats.distributions as d
import numpy as np
from harness.stats.special import LAZY_NUMPY_SUBMODULES
ran = [n for n in LAZY_NUMPY_SUBMODULES if type(sys.modules.get("numpy." + n)) is types.ModuleType]
print("ran", ran)
print("t_sf", float(d.t_sf(np.array([1.5]), np.array([3.0]))[0]))
print("ma", int(np.ma.masked_array([1, 2, 3], mask=[0, 1, 0]).sum()))
print("rng", float(np.random.default_rng(7).random()))
import scipy.stats
print("scipy_t_sf", float(scipy.stats.t.sf(1.5, 3)))
"""


def test_statistics_load_without_running_numpys_unused_submodules_which_work_when_used():
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert out["ran"] == "[]"  # none of them ran at import: f2py, testing, ma, random, ...
    assert out["t_sf"] == out["scipy_t_sf"]  # the functions are scipy's, bit for bit
    assert out["ma"] == "4" and 0 < float(out["rng"]) < 1  # used later, each loads whole
