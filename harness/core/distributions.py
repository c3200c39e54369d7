"""The few distribution functions the verdicts use, from ``scipy.special`` (~0.3 s to import) instead of
``scipy.stats`` (~1.2 s, most of a report's start-up): Student's t survival function and quantile, the normal
quantile and density, and Benjamini-Hochberg adjusted p-values.

Each returns what its ``scipy.stats`` counterpart returns, bit for bit (``scipy.stats.t.sf(x, df)`` is
``special.stdtr(df, -x)`` inside the argument checks of ``rv_continuous``, ``t.ppf`` is ``special.stdtrit``,
``norm.ppf`` is ``special.ndtri``; ``bh`` is ``scipy.stats.false_discovery_control(ps, method="bh")``'s algorithm),
including the values outside the domain (nan, the infinite ends); tests/core/test_distributions.py holds them to it.
The functions that need more of ``scipy.stats`` (Mann-Whitney, Kendall's tau) import it when called.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special

__all__ = ["bh", "norm_pdf", "norm_ppf", "t_ppf", "t_sf"]

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
    out[inside] = special.stdtrit(df[inside], q[inside])
    return _out(out)


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
