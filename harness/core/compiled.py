"""Functions compiled with numba where it can be imported: one home for how (no fast-math, so the compiled code does
the floating-point operations it is written with, in order; machine code cached on disk; the GIL released) and for
what happens without numba (None: the caller runs its numpy path)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["njit"]


@functools.cache
def njit(function: Callable[..., Any]) -> Callable[..., Any] | None:
    """``function`` compiled (once per process; numba's cache keeps the machine code between processes, beside the
    source or in its per-user folder), or None when numba cannot be imported."""
    try:
        import numba  # heavy (~0.5 s with its first cached load): only when a compiled function is first needed
    except ImportError:
        return None
    return numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")(function)
