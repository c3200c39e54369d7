"""``harness.stats.distributions`` returns what ``scipy.stats`` returns, bit for bit, domain edges included."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from harness.stats import distributions

EDGES = [-np.inf, -1e300, -40.0, -3.0, -1.0, -1e-12, -0.0, 0.0, 1e-300, 0.5, 1.0, 2.5, 40.0, 1e300, np.inf, np.nan]
DFS = [-1.0, 0.0, 1e-3, 0.5, 1.0, 2.0, 3.7, 10.0, 1e6, np.inf, np.nan]
QS = [-0.1, 0.0, 1e-300, 1e-12, 0.025, 0.2, 0.5, 0.8, 0.975, 1 - 1e-12, 1.0, 1.1, np.nan]


def _same(ours, theirs) -> None:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)  # nan where nan, bit for bit elsewhere
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))


def test_t_sf_and_ppf_equal_scipy_on_grids_and_edges():
    rng = np.random.default_rng(3)
    x = np.concatenate([EDGES, rng.normal(0, 5, 300)])
    q = np.concatenate([QS, rng.uniform(0, 1, 300)])
    for df in [*DFS, rng.uniform(0.1, 60, x.size)]:
        _same(distributions.t_sf(x, df), stats.t.sf(x, df))
        _same(distributions.t_ppf(q, df if np.ndim(df) == 0 else df[:q.size]), stats.t.ppf(
            q, df if np.ndim(df) == 0 else df[:q.size]))
    for value in (1.7, -2.2, np.inf):  # scalars come back as numpy scalars, as scipy's
        assert distributions.t_sf(value, 4.0) == stats.t.sf(value, 4.0)
        assert np.ndim(distributions.t_sf(value, 4.0)) == 0
    assert distributions.t_ppf(0.975, 3.0) == stats.t.ppf(0.975, 3.0)



def test_t_ppf_of_many_dfs_at_one_level_equals_scipy():
    """A screen's quantiles: one level, hundreds of thousands of dfs, few distinct (computed once each)."""
    rng = np.random.default_rng(6)
    df = np.repeat(rng.uniform(0.1, 60, 50), 200) + rng.integers(0, 3, 10_000)
    df[rng.integers(df.size, size=len(DFS))] = DFS
    for q in (0.975, np.full(df.size, 0.2), 1.0, 0.0):
        _same(distributions.t_ppf(q, df), stats.t.ppf(q, df))

def test_norm_ppf_and_pdf_equal_scipy():
    q = np.concatenate([QS, np.random.default_rng(4).uniform(0, 1, 500)])
    _same(distributions.norm_ppf(q), stats.norm.ppf(q))
    assert distributions.norm_ppf(0.9) == stats.norm.ppf(0.9)
    x = np.random.default_rng(5).normal(0, 3, 500)
    _same(distributions.norm_pdf(x), stats.norm.pdf(x))
    assert float(distributions.norm_pdf(1.2815515655446004)) == float(stats.norm.pdf(1.2815515655446004))


@pytest.mark.parametrize("ps", [
    [0.5], [], [0.01, 0.04], [0.2, 0.2, 0.2, 0.01], [0.0, 1.0, 0.5, 0.03, 0.03, 0.9],
    list(np.random.default_rng(6).uniform(0, 1, 400)), list(np.random.default_rng(7).uniform(0, 1e-3, 57))])
def test_bh_equals_false_discovery_control(ps):
    ps = np.asarray(ps, dtype=np.float64)
    _same(distributions.bh(ps), stats.false_discovery_control(ps, method="bh"))


def test_bh_refuses_what_scipy_refuses():
    for bad in ([0.5, 1.5], [-0.1], [np.nan, 0.2]):
        with pytest.raises(ValueError):
            stats.false_discovery_control(np.asarray(bad), method="bh")
        with pytest.raises(ValueError, match="between 0 and 1"):
            distributions.bh(np.asarray(bad))


def test_median_ci_ranks_equal_scipy_binomial_ones():
    from harness.stats import samples as ours

    for confidence in (0.95, 0.9, 0.99, 0.5):
        for n in [*range(3, 400), 999, 1000, 1001, 2048]:
            below = np.arange(n // 2 + 1)
            admissible = below[stats.binom.cdf(below, n, 0.5) <= (1.0 - confidence) / 2.0 + 1e-12]
            assert ours.lower_rank(n, confidence) == (int(admissible[-1]) + 1 if admissible.size else None)


def test_running_median_equals_scipy_median_filter():
    from scipy import ndimage

    from harness.stats import changepoints as ours

    rng = np.random.default_rng(8)
    for n in (1, 2, 3, 4, 5, 6, 17, 1000):
        values = rng.normal(0, 1, n)
        values[n // 2:] = values[0] if n > 3 else values[n // 2:]  # ties
        _same(ours._running_median(values, 5), ndimage.median_filter(values, size=5, mode="nearest"))


def _kendall_cases():
    rng = np.random.default_rng(9)
    for trial in range(240):
        n = int(rng.choice([2, 3, 5, 33, 34, 60, 257, 1001, 5000]))  # 5000: counted compiled (where numba is)
        values = rng.normal(0, 1, n)
        if trial % 3 == 0:
            values = np.round(values, 1)  # ties
        if trial % 7 == 0:
            values = np.sort(values)  # all in order: the exact distribution
        if trial % 5 == 0:
            values = values + np.linspace(0, 0.5, n)  # a trend
        yield values


@pytest.mark.parametrize("compiled", [True, False])
def test_kendall_trend_p_equals_scipy_kendalltau(compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(distributions, "_compiled_inversions", lambda: None)
    for values in _kendall_cases():
        ours = distributions.kendall_trend_p(values)
        theirs = float(stats.kendalltau(np.arange(values.size, dtype=np.float64), values).pvalue)
        assert ours == theirs or (np.isnan(ours) and np.isnan(theirs)), values.size
    assert np.isnan(distributions.kendall_trend_p(np.ones(40)))
    for short in ([], [1.5]):  # no pair: nan, as scipy's (which warns)
        assert np.isnan(distributions.kendall_trend_p(np.array(short)))
        with pytest.warns(Warning):
            assert np.isnan(stats.kendalltau(np.arange(len(short), dtype=float), short).pvalue)


def test_change_points_and_trial_verdicts_do_not_load_scipy_stats_or_numba():
    """scipy.stats costs ~1 s to import: the report's analysis must not need it (Mann-Whitney on one process's
    samples is the only caller left); nor numba (~0.1-0.4 s) to test a segment's trend (a report after a new run
    searches one window of 256 commits a series)."""
    import subprocess
    import sys

    from testkit.paths import ROOT

    code = """
import sys
import numpy as np
from harness.stats import changepoints, samples, trials
rng = np.random.default_rng(1)
for n in (20, 30, 200):  # ramps: the trend test, short (exact distribution) and long
    changepoints.detect_change_points(np.exp(np.r_[np.zeros(n), np.linspace(0, 0.3, n)] + rng.normal(0, 0.01, 2 * n)))
samples.median_ci(rng.normal(1, 0.1, 30))
print("scipy.stats" in sys.modules, "numba" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False False"
