"""``query.samples._lexsorted``: ``np.lexsort``'s order through one combined key (the trials of a chip's cells)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.record.query.samples import _lexsorted


@pytest.mark.parametrize("seed", range(20))
def test_the_order_is_lexsorts(seed):
    """Negative, equal and one-valued keys included: equal combined keys keep their input order, as lexsort's."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    keys = [rng.integers(-3, int(rng.integers(-2, 6)), n) for _ in range(3)]
    assert _lexsorted(*keys).tolist() == np.lexsort(keys).tolist()


def test_keys_too_wide_for_one_integer_fall_back_to_lexsort():
    rng = np.random.default_rng(0)
    keys = [rng.integers(0, 2**40, 50), rng.integers(0, 2**40, 50)]
    assert _lexsorted(*keys).tolist() == np.lexsort(keys).tolist()
