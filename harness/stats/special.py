"""``scipy.special`` (the distribution functions the verdicts use), imported without the numpy submodules scipy's
array-API layer loads for nothing: ``scipy._lib.array_api_compat.numpy`` star-imports numpy, which loads every
submodule numpy lists in ``__all__`` -- ``numpy.f2py``, ``numpy.testing``, ``numpy.ma``, ``numpy.random`` and more,
none of which the harness uses. Those not loaded yet are made to load on first use instead
(``importlib.util.LazyLoader``: the module object is there, its code runs when an attribute is first read), so a
statistics import -- every report, compare and run, before a report's analysis forks -- takes ~0.05 s instead of
~0.1-0.16 s (measured: ``scipy.special`` 0.096-0.164 s after numpy, 0.042-0.053 s so). Who uses one of them later
gets it whole, as before."""

from __future__ import annotations

import importlib.util
import sys

import numpy

__all__ = ["LAZY_NUMPY_SUBMODULES", "special"]

LAZY_NUMPY_SUBMODULES = ("f2py", "testing", "ma", "polynomial", "random", "char", "rec", "strings", "ctypeslib")


def _load_on_first_use(names: tuple[str, ...]) -> None:
    """Each numpy submodule of ``names`` not imported yet, put in place to be imported when first used."""
    for name in names:
        full = f"numpy.{name}"
        if full in sys.modules or name in vars(numpy):
            continue
        spec = importlib.util.find_spec(full)
        if spec is None or spec.loader is None:
            continue
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(numpy, name, module)


_load_on_first_use(LAZY_NUMPY_SUBMODULES)

from scipy import special  # noqa: E402 - after the submodules are put in place
