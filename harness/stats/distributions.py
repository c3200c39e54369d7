"""The few distribution functions the verdicts use, from ``scipy.special`` (~0.3 s to import) instead of
``scipy.stats`` (~1.2 s, most of a report's start-up): Student's t survival function and quantile, the normal
quantile and density, and Benjamini-Hochberg adjusted p-values.

Each returns what its ``scipy.stats`` counterpart returns, bit for bit (``scipy.stats.t.sf(x, df)`` is
``special.stdtr(df, -x)`` inside the argument checks of ``rv_continuous``, ``t.ppf`` is ``special.stdtrit``,
``norm.ppf`` is ``special.ndtri``; ``bh`` is ``scipy.stats.false_discovery_control(ps, method="bh")``'s algorithm),
including the values outside the domain (nan, the infinite ends); ``kendall_trend_p`` is ``scipy.stats.kendalltau``'s
p-value against the index, by its normal approximation or (no ties and at most 33 values, or all but one pair in
order) its exact distribution. tests/stats/test_distributions.py holds
them to it. Mann-Whitney imports ``scipy.stats`` when called. Where each is used: docs/statistics.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.core import compiled
from harness.stats.special import special

__all__ = ["bh", "kendall_trend_p", "norm_pdf", "norm_ppf", "t_ppf", "t_sf"]

_NORM_PDF_C = np.sqrt(2 * np.pi)


def _out(values: npt.NDArray[np.float64]) -> Any:
    """A 0-d result as a numpy scalar, as ``scipy.stats`` returns it."""
    return values[()] if values.ndim == 0 else values


def t_sf(x: Any, df: Any) -> Any:
    """``scipy.stats.t.sf(x, df)``."""
    x, df = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(df, dtype=np.float64))
    good_df = df > 0
    out = np.zeros(x.shape)
    out[~good_df | np.isnan(x)] = np.nan
    out[good_df & (x == -np.inf)] = 1.0
    inside = good_df & (x > -np.inf) & (x < np.inf)
    out[inside] = special.stdtr(df[inside], -x[inside])
    return _out(out)


def t_ppf(q: Any, df: Any) -> Any:
    """``scipy.stats.t.ppf(q, df)``."""
    q, df = np.broadcast_arrays(np.asarray(q, dtype=np.float64), np.asarray(df, dtype=np.float64))
    good_df = df > 0
    out = np.full(q.shape, np.nan)
    out[good_df & (q == 0)] = -np.inf
    out[good_df & (q == 1)] = np.inf
    inside = good_df & (q > 0) & (q < 1)
    q_inside, df_inside = q[inside], df[inside]
    if q_inside.size >= _DISTINCT_AT and (q_inside == q_inside[0]).all():  # one level, df repeated (a screen's
        # families): each distinct df's quantile once -- an elementwise function, so the same numbers
        distinct, where = np.unique(df_inside, return_inverse=True)
        out[inside] = special.stdtrit(distinct, np.full(distinct.size, q_inside[0]))[where.reshape(-1)]
    else:
        out[inside] = special.stdtrit(df_inside, q_inside)
    return _out(out)


_DISTINCT_AT = 4096  # t_ppf of at least this many values at one level: computed per distinct df


def norm_ppf(q: Any) -> Any:
    """``scipy.stats.norm.ppf(q)``."""
    q = np.asarray(q, dtype=np.float64)
    out = np.full(q.shape, np.nan)
    out[q == 0] = -np.inf
    out[q == 1] = np.inf
    inside = (q > 0) & (q < 1)
    out[inside] = special.ndtri(q[inside])
    return _out(out)


def norm_pdf(x: Any) -> Any:
    """``scipy.stats.norm.pdf(x)`` of finite ``x``."""
    x = np.asarray(x, dtype=np.float64)
    return _out(np.asarray(np.exp(-x**2 / 2.0) / _NORM_PDF_C))


def bh(ps: Any) -> npt.NDArray[np.float64]:
    """``scipy.stats.false_discovery_control(ps, method="bh")`` of a 1-d array of p-values in [0, 1]."""
    ps = np.asarray(ps)
    if not (np.issubdtype(ps.dtype, np.integer) or np.issubdtype(ps.dtype, np.floating)) \
            or not np.all(ps == np.clip(ps, 0.0, 1.0)):
        raise ValueError("`ps` must include only numbers between 0 and 1.")
    if ps.ndim != 1:
        raise ValueError("bh adjusts a 1-d array of p-values")
    if ps.size <= 1:
        return ps
    m = ps.shape[-1]
    order = np.argsort(ps, axis=-1)
    adjusted = np.take_along_axis(ps, order, axis=-1)
    adjusted = adjusted * (m / np.arange(1, m + 1, dtype=adjusted.dtype))
    np.minimum.accumulate(adjusted[::-1], out=adjusted[::-1])
    np.put_along_axis(adjusted, order, values=adjusted.copy(), axis=-1)
    return np.clip(adjusted, 0.0, 1.0)


_KENDALL_PAIRWISE_MAX = 20_000  # without numba: values counted pairwise (n^2 booleans in blocks); beyond, scipy's
_KENDALL_COMPILED_FROM = 4096  # from how many values the compiled count is worth numba's load (~0.1-0.4 s)


def _count_inversions(ranks: Any, tree: Any) -> int:  # pragma: no cover - runs compiled
    """Pairs i < j with ranks[i] > ranks[j] (ranks 1..len(tree) - 1), by a Fenwick tree of the ranks seen."""
    size = tree.size - 1
    total = 0
    for seen, rank in enumerate(ranks):
        not_greater = 0  # ranks seen so far that are <= rank
        at = rank
        while at > 0:
            not_greater += tree[at]
            at -= at & -at
        total += seen - not_greater
        at = rank
        while at <= size:
            tree[at] += 1
            at += at & -at
    return total


def _compiled_inversions() -> Any:
    return compiled.njit(_count_inversions)


def _discordant(ranks: npt.NDArray[np.intp]) -> int:
    """Discordant pairs of the index and ``ranks`` (the index has no ties): i < j with ranks[i] > ranks[j]. Counted
    pairwise up to ``_KENDALL_COMPILED_FROM`` values (a change point's segment: loading numba would cost more than the
    count), compiled beyond where numba can be had: the same count either way."""
    count = _compiled_inversions() if ranks.size > _KENDALL_COMPILED_FROM else None
    if count is not None:
        return int(count(ranks, np.zeros(int(ranks.max()) + 1, dtype=np.int64)))
    dis = 0
    for start in range(0, ranks.size, 1024):
        greater = ranks[start:start + 1024, None] > ranks[None, start:]
        dis += int(np.triu(greater, 1).sum())
    return dis


def kendall_trend_p(values: npt.NDArray[np.float64]) -> float:
    """``scipy.stats.kendalltau(np.arange(n), values).pvalue`` of finite ``values``, two-sided, tau-b."""
    values = np.asarray(values, dtype=np.float64).ravel()
    size = values.size
    if size < 2:
        return math.nan  # no pair: scipy's nan
    if size > _KENDALL_PAIRWISE_MAX and _compiled_inversions() is None:
        return _scipy_kendall_p(values)
    ranks = np.unique(values, return_inverse=True)[1].astype(np.intp) + 1  # dense ranks, as scipy's
    dis = _discordant(ranks)
    cnt = np.bincount(ranks).astype("int64", copy=False)
    cnt = cnt[cnt > 1]
    ytie = int((cnt * (cnt - 1) // 2).sum())
    y0 = int((cnt * (cnt - 1.0) * (cnt - 2)).sum())
    y1 = int((cnt * (cnt - 1.0) * (2 * cnt + 5)).sum())
    xtie, x0, x1, ntie = 0, 0, 0, 0
    tot = (size * (size - 1)) // 2
    if ytie == tot:
        return math.nan
    if ytie == 0 and (size <= 33 or min(dis, tot - dis) <= 1):
        return _kendall_exact_p(size, tot - dis)
    con_minus_dis = tot - xtie - ytie + ntie - 2 * dis
    m = size * (size - 1.0)
    var = ((m * (2 * size + 5) - x1 - y1) / 18 + (2 * xtie * ytie) / m + x0 * y0 / (9 * m * (size - 2)))
    z = con_minus_dis / np.sqrt(var)
    return float(2 * special.ndtr(-np.abs(z)))


def _kendall_exact_p(n: int, c: int) -> float:
    """The two-sided p-value of ``c`` concordant pairs among ``n`` values without ties, from the exact null
    distribution: ``scipy.stats._mstats_basic._kendall_p_exact``'s computation (Kendall 1970), step for step."""
    c = int(min(c, (n * (n - 1)) // 2 - c))
    if n <= 2:
        prob = 1.0
    elif c == 0:
        prob = 2.0 / math.factorial(n) if n < 171 else 0.0
    elif c == 1:
        prob = 2.0 / math.factorial(n - 1) if n < 172 else 0.0
    elif 4 * c == n * (n - 1):
        prob = 1.0
    elif n < 171:
        new = np.zeros(c + 1)
        new[0:2] = 1.0
        for j in range(3, n + 1):
            new = np.cumsum(new)
            if j <= c:
                new[j:] -= new[:c + 1 - j]
        prob = 2.0 * np.sum(new) / math.factorial(n)
    else:
        new = np.zeros(c + 1)
        new[0:2] = 1.0
        for j in range(3, n + 1):
            new = np.cumsum(new) / j
            if j <= c:
                new[j:] -= new[:c + 1 - j]
        prob = np.sum(new)
    return float(np.clip(prob, 0, 1))


def _scipy_kendall_p(values: npt.NDArray[np.float64]) -> float:
    from scipy import stats  # ~1 s to load: only for very long segments without numba

    return float(stats.kendalltau(np.arange(values.size, dtype=np.float64), values).pvalue)
