"""Benchmark functions in another repository: what a ``[[function]]`` job calls, and the decorator that adds
roofline metadata.

The convention: a function (by habit named ``bench_<what>``) takes one grid point as keyword arguments, builds
its inputs once, and returns the zero-argument callable to time::

    from harness.bench import benchmark

    @benchmark(flops=lambda N, **_: 2 * N**3, bytes=lambda N, **_: 3 * 4 * N * N)
    def bench_matmul(N):
        a = mx.random.normal((N, N))
        mx.eval(a)
        return lambda: a @ a

A plain, undecorated function returning the callable works too (then the job has no FLOP or byte count, so
no roofline fraction). ``flops`` and ``bytes`` are numbers or callables given the same keyword arguments as
the function (the grid point, plus ``dtype`` when the suite lists ``dtypes``).

The harness times the callable with the suite's timing protocol (harness/execute/timing.py): if one call returns an
``mx.array`` (or a list / tuple / dict of them), each timed call is ``mx.async_eval(fn())``, with
``mx.synchronize()`` after every call or once per sample as the suite's ``[timing] mode`` says (``measure_mlx``);
otherwise the callable is timed as it is, with a no-op sync (it
must finish its work before returning: numpy does). A benchmark that cannot run here raises
:func:`skip` (or ``unittest.SkipTest``, or ``pytest.skip``): the job is stored as skipped with the reason.

A repository that must not import the harness can set the metadata itself:
``bench_matmul.__harness_benchmark__ = {"flops": ..., "bytes": ...}``.
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import Any, TypeVar

META = "__harness_benchmark__"
F = TypeVar("F", bound=Callable[..., Any])
Count = float | int | Callable[..., float] | None


class BenchmarkSkipped(unittest.SkipTest):
    """Raised by a benchmark function that cannot run on this machine (wrong backend, missing feature)."""


def skip(reason: str) -> None:
    """Skip this benchmark here, with a reason stored on the job (e.g. ``skip("Metal not available")``)."""
    raise BenchmarkSkipped(reason)


def benchmark(fn: F | None = None, *, flops: Count = None, bytes: Count = None) -> Any:  # noqa: A002 - the field's name
    """Mark a benchmark function and attach its FLOP and byte counts (numbers or callables of the grid point).

    Usable bare (``@benchmark``) or with arguments (``@benchmark(flops=..., bytes=...)``).
    """

    def mark(function: F) -> F:
        setattr(function, META, {"flops": flops, "bytes": bytes})
        return function

    return mark(fn) if fn is not None else mark


def counts(function: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[float | None, float | None]:
    """The function's (flops, bytes) at this grid point, None where it declares none."""
    meta = getattr(function, META, None) or {}

    def value(count: Count) -> float | None:
        if count is None:
            return None
        return float(count(**kwargs) if callable(count) else count)

    return value(meta.get("flops")), value(meta.get("bytes"))
