"""harness.stats.settling: the level of each settling look, and which series another round can settle."""

from __future__ import annotations

import pytest

from harness.stats.policy import SETTLE_SHARE, SETTLED_WITHIN, Policy
from harness.stats.settling import excludes_a_real_change, look_alpha, to_settle


def test_every_look_together_spends_at_most_the_settle_share_of_alpha():
    assert SETTLE_SHARE == Policy().settle_share == 0.2
    assert sum(look_alpha(0.05, k) for k in range(1, 30)) < 0.05 * SETTLE_SHARE
    assert look_alpha(0.05, 1) == pytest.approx(0.005)
    assert look_alpha(0.05, 1, Policy(settle_share=1.0)) == 0.025


def test_a_settled_unchanged_stands_only_within_a_25_percent_change():
    assert SETTLED_WITHIN == Policy().settled_within == 0.25
    assert excludes_a_real_change(0.8, 1.25) and excludes_a_real_change(0.95, 1.05)
    assert not excludes_a_real_change(0.7, 1.1) and not excludes_a_real_change(0.9, 1.3)
    assert excludes_a_real_change(0.7, 1.4, Policy(settled_within=0.5))


def test_to_settle_inconclusive_timed_alike_or_a_wide_unchanged_being_settled():
    assert to_settle("inconclusive", "trials", 0.9, 1.5, settling=False)
    assert not to_settle("inconclusive", "incomparable", 0.9, 1.5, settling=True)  # no trials settle mixed modes
    assert not to_settle("unchanged", "trials", 0.7, 1.4, settling=False)  # the stored comparison's unchanged stands
    assert to_settle("unchanged", "trials", 0.7, 1.4, settling=True)
    assert not to_settle("unchanged", "trials", 0.95, 1.05, settling=True)
    assert not to_settle("regressed", "trials", 1.5, 2.5, settling=True)
