"""The optimal-partitioning search of ``stats.detect_change_points``, compiled (numba), for many histories at once.

``search(x, xx, ix, i, ii, segment, slope, min_segment, min_drift)`` returns, per history (row) and end, the start
the search chooses and whether that segment is linear: what ``harness.analysis.history._optimal_segments_many``
returns, from the same prefix sums, by the same floating-point operations in the same order (no fast-math, so no
fused multiply-adds or reassociation: the results are bit for bit the numpy ones; tests/analysis/test_segment_search.py
checks it).  The numpy search makes ~15 passes over a (rows x starts) array per end; this loop makes one, in
registers: about 10x less work on a 1,000-commit history.

numba is imported when a search first runs, not when the module is imported (it costs ~0.3 s to load); the compiled
code is cached on disk (``cache=True``: beside this file, or numba's per-user cache where that is read-only), so a
report pays the compile (~1 s) once per machine and numba version.  ``available()`` says whether numba can be had.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.core import compiled

__all__ = ["available", "finish_warm_up", "loaded", "search", "warm_up_in_background"]


def _loop(x: Any, xx: Any, ix: Any, i: Any, ii: Any, segment: Any, slope: Any, min_segment: int,
          min_drift: int, previous: Any, is_linear: Any) -> None:  # pragma: no cover - runs compiled
    rows, size = x.shape
    n = size - 1
    best = np.empty(size)
    total = np.empty(size)
    linear_wins = np.empty(size, dtype=np.bool_)
    for row in range(rows):
        best[:] = np.inf
        best[0] = -segment[row]
        row_segment, row_slope = segment[row], slope[row]
        for stop in range(min_segment, n + 1):
            k = stop - min_segment + 1
            drifts = max(0, min(k, stop - min_drift + 1))
            x_stop, xx_stop, ix_stop, i_stop, ii_stop = x[row, stop], xx[row, stop], ix[row, stop], i[stop], ii[stop]
            # branch-free, so that the compiler vectorises it: the totals first, then their first minimum
            for start in range(drifts):  # starts whose segment may be linear
                count = np.float64(stop - start)
                sx = x_stop - x[row, start]
                constant = max((xx_stop - xx[row, start]) - sx * sx / count, 0.0)
                si = i_stop - i[start]
                centred_ii = (ii_stop - ii[start]) - si * si / count
                centred_ix = (ix_stop - ix[row, start]) - si * sx / count
                explained = centred_ix * centred_ix / centred_ii if centred_ii > 0 else 0.0
                linear = max(constant - explained, 0.0) + row_slope
                linear_wins[start] = linear < constant
                total[start] = (best[start] + min(constant, linear)) + row_segment
            for start in range(drifts, k):
                count = np.float64(stop - start)
                sx = x_stop - x[row, start]
                constant = max((xx_stop - xx[row, start]) - sx * sx / count, 0.0)
                total[start] = (best[start] + constant) + row_segment
            chosen, lowest = 0, total[0]
            for start in range(1, k):
                if total[start] < lowest:  # the first minimum, as np.argmin (no nan: numbers or +inf)
                    chosen, lowest = start, total[start]
            best[stop] = lowest
            previous[row, stop] = chosen
            is_linear[row, stop] = chosen < drifts and linear_wins[chosen]


def _compiled() -> Callable[..., None] | None:
    finish_warm_up()  # one load: not one here and another in the warm-up's thread
    return compiled.njit(_loop)


_warming: threading.Thread | None = None
_ready = False  # a search has run: its machine code is loaded


def warm_up_in_background() -> None:
    """Load the compiled search in a thread of its own (numba's import and its cached machine code: ~0.5 s, much of
    it outside the GIL) while the caller reads what it will search; the first search, or ``finish_warm_up``, waits
    for it."""
    global _warming
    if _warming is None:
        _warming = threading.Thread(target=_warm_up, name="segment-search-warm-up", daemon=True)
        _warming.start()


def finish_warm_up() -> None:
    """Wait for ``warm_up_in_background``'s thread, if one runs (call it before a fork: no other thread may run)."""
    global _warming
    thread = _warming
    if thread is not None and thread is not threading.current_thread():
        thread.join()
        _warming = None


def _warm_up() -> None:
    if available():  # the smallest search of the types every search passes (so its machine code is loaded)
        size = 4
        zeros = np.zeros((1, size))
        search(zeros, zeros, zeros, np.arange(size, dtype=np.float64), np.arange(size, dtype=np.float64),
               np.ones(1), np.ones(1), min_segment=1, min_drift=2)


def loaded() -> bool:
    """Whether the compiled search is loaded, or loading (``warm_up_in_background``): using it costs no load."""
    return _warming is not None or _ready


def available() -> bool:
    """Whether the compiled search can run here (numba importable)."""
    return _compiled() is not None


def search(x: npt.NDArray[np.float64], xx: npt.NDArray[np.float64], ix: npt.NDArray[np.float64],
           i: npt.NDArray[np.float64], ii: npt.NDArray[np.float64], segment: npt.NDArray[np.float64],
           slope: npt.NDArray[np.float64], *, min_segment: int, min_drift: int
           ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """Per row and end: the chosen start and whether its segment is linear (``x``, ``xx``, ``ix``: each row's prefix
    sums of its centred values, their squares and index x value; ``i``, ``ii``: of the index and its square;
    ``segment``, ``slope``: each row's penalties)."""
    global _ready
    loop = _compiled()
    if loop is None:
        raise RuntimeError("numba is not importable: the compiled segment search cannot run")
    rows, size = x.shape
    previous = np.zeros((rows, size), dtype=np.intp)
    is_linear = np.zeros((rows, size), dtype=np.bool_)
    loop(np.ascontiguousarray(x), np.ascontiguousarray(xx), np.ascontiguousarray(ix), np.ascontiguousarray(i),
             np.ascontiguousarray(ii), np.ascontiguousarray(segment, dtype=np.float64),
             np.ascontiguousarray(slope, dtype=np.float64), int(min_segment), int(min_drift), previous, is_linear)
    _ready = True
    return previous, is_linear
