"""A first settle round is sized to a time budget from the stored runs of both commits (no round measured yet)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from harness.pipeline.ab import ABRequest
from harness.pipeline.settle import Budget, SettleRequest, first_round_trials, fit_round, settle
from harness.record import outbox, query
from harness.record.models import Run
from testkit.analysis import add_run, grid_results, sha_of

RUN_S = 32.0  # each stored run: 8 series, one trial each, in 32 s: 4 s a trial a side, 8 s a pair


class Planned(Exception):
    """The fake measurer stops settling at its first round: the test reads what was planned."""


def stored_pair(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    db = outbox.open_store(url)
    try:
        rng = np.random.default_rng(3)
        ids = [add_run(db, "chip-a", commit, grid_results(rng, trials=1), minutes=10.0 * commit) for commit in (1, 2)]
        with db.session() as session:
            for run_id in ids:
                run = session.get(Run, run_id)
                run.status, run.finished_at = "finished", run.started_at + timedelta(seconds=RUN_S)
        assert query.trial_seconds(db, ids[:1]) == pytest.approx(RUN_S / 8)
    finally:
        db.close()
    return url


@pytest.mark.parametrize(("seconds", "trials", "series"),
                         [(1000.0, first_round_trials(0.05), 8), (100.0, 1, 8), (44.0, 1, 5), (5.0, 0, 0)])
def test_the_first_round_fits_a_time_budget(tmp_path: Path, seconds: float, trials: int, series: int):
    url, planned, said = stored_pair(tmp_path), [], []

    def measure(request: ABRequest, left_s: float | None) -> tuple[str, str]:
        planned.append((request.trials, len(request.series or ())))
        raise Planned

    request = SettleRequest(ABRequest(base=sha_of(1), head=sha_of(2), db_url=url, chip_label="chip-a"),
                            budget=Budget(seconds=seconds))
    if trials:
        with pytest.raises(Planned):
            settle(request, say=said.append, measure=measure)
        assert planned == [(trials, series)]
        assert trials * series * 2 * RUN_S / 8 <= seconds  # the round fits, at the stored runs' pace
    else:
        report, rounds = settle(request, say=said.append, measure=measure)
        assert not planned and not rounds and report.counts["inconclusive"] == 8
        assert any("budget of 5 s spent with 8 series undecided" in line for line in said)


def test_a_first_round_measures_the_fewest_pairs_that_can_decide_at_the_first_look():
    assert first_round_trials(0.05) == 9  # 2 / 2^9 <= 0.05 * 0.2 / 2 < 2 / 2^8


def test_fit_round_cuts_trials_then_series():
    assert fit_round(8, 4, None, 10.0) == (4, 8)  # no pace known: nothing cut
    assert fit_round(8, 4, 8.0, 1000.0) == (4, 8)
    assert fit_round(8, 4, 8.0, 130.0) == (2, 8)
    assert fit_round(8, 4, 8.0, 40.0) == (1, 5)
    assert fit_round(8, 4, 8.0, 7.9) == (0, 0)
