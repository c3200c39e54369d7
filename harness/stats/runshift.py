"""Between-run noise: a series' history floor on the base branch, or, without one, the hold of its flag against the
common shift of its run (docs/statistics.md, sections 3 and 4)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from harness.stats import distributions
from harness.stats.decide import TrialComparison, band, benjamini_hochberg
from harness.stats.measure import Measured, Spread
from harness.stats.policy import FLOOR_MIN_RUNS, MAD_TO_SIGMA, NOISE_FLOOR, Policy
from harness.stats.samples import mad_correction

__all__ = ["Beyond", "Floor", "beyond_shift", "floor_terms", "history_floor", "hold_run_shifts", "lacks_run_noise",
           "run_counts", "sorted_median"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Floor:
    """A series' between-run noise from its history on the base branch."""

    sd: float  # robust sd of log run medians
    runs: int  # how many runs it came from



def history_floor(run_medians: Sequence[float], min_runs: int = FLOOR_MIN_RUNS) -> Floor | None:
    """Robust sd of the log run medians (1.4826 x MAD, small-n corrected); None below ``min_runs`` valid runs."""
    values = np.asarray(run_medians, dtype=np.float64).ravel()
    values = values[np.isfinite(values) & (values > 0)]
    if values.size < max(min_runs, 2):
        return None
    logs = np.sort(np.log(values))
    deviations = np.sort(np.abs(logs - sorted_median(logs)))
    mad = float(sorted_median(deviations))
    sd = MAD_TO_SIGMA * mad * mad_correction(int(values.size))
    return Floor(max(sd, NOISE_FLOOR), int(values.size))



def sorted_median(ordered: npt.NDArray[np.float64]) -> np.float64:
    """``np.median`` of a sorted 1-d array of finite values, bit for bit (the mean of its middle two, ``(a + b) / 2``;
    ``(a + a) / 2`` is ``a``), without np.median's partition and checks (a screen takes thousands)."""
    n = ordered.size
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def floor_terms(
    keys: Sequence[K], floors: Mapping[K, Floor] | None, runs: Mapping[K, tuple[int, int]] | None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per series: the floor term of SE^2 (0 without a floor), its df and the floor sd (nan without)."""
    floors, runs = floors or {}, runs or {}
    term, df, sd = np.zeros(len(keys)), np.zeros(len(keys)), np.full(len(keys), math.nan)
    for i, key in enumerate(keys):
        floor = floors.get(key)
        if floor is None or not math.isfinite(floor.sd) or floor.sd <= 0:
            continue
        base_runs, head_runs = runs.get(key, (1, 1))
        term[i] = floor.sd**2 * (1.0 / max(base_runs, 1) + 1.0 / max(head_runs, 1))
        df[i], sd[i] = max(1.0, floor.runs - 1.0), floor.sd
    return term, df, sd


def lacks_run_noise(floor_term: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Per series of a comparison of separate runs: no history floor, whatever the runs behind each side. Trials of
    a run share its conditions, and trials pooled from two runs of a side hold one draw of the between-run noise per
    run, too few to measure it (a floor needs ``FLOOR_MIN_RUNS``); so a shift of a whole run, or of one series in it,
    is measured (the floor) or held (docs/statistics.md, section 4). In CI a second base run of one
    commit turned the hold off: an untouched kernel came out "improved" x0.808 [0.678, 0.964]."""
    return floor_term <= 0


def _scatter(deviations: npt.NDArray[np.float64]) -> float:
    """Robust sd (1.4826 x MAD about 0, small-n corrected) of the other series' effects about their common shift:
    how far one series' run-level effect strays from its run's, on this machine now; nan below 2 series."""
    if deviations.size < 2:
        return math.nan
    mad = float(np.median(np.abs(deviations)))
    return MAD_TO_SIGMA * mad * mad_correction(int(deviations.size))


@dataclass(frozen=True)
class Beyond:
    """One series' effect beyond its run's common shift (``beyond_shift``)."""

    shift: float  # the common shift exp(c); nan without other series
    p_value: float  # two-sided, of d - c; nan where nothing tells (fewer than two other series)
    low: float  # interval of exp(d - c)
    high: float


def beyond_shift(i: int, others: Sequence[int], effect: npt.NDArray[np.float64], se: npt.NDArray[np.float64],
                  df: npt.NDArray[np.float64], alpha: float) -> Beyond:
    """Series ``i``'s effect against the common shift of its run, the median effect ``c`` of the ``others`` measured
    in the same runs. Each series of a run also strays from ``c`` by a run-level effect of its own (a load phase over
    its jobs), which no trial spread holds: the others' scatter about ``c`` measures it, so ``d - c`` is tested with
    the larger of its own variance and that scatter's, on the degrees of freedom of the larger (``k - 1`` for the
    scatter). With
    fewer than two other series nothing tells a change from a shift of the whole run or of the series in it."""
    if len(others) < 2:
        return Beyond(math.exp(float(effect[others[0]])) if others else math.nan, math.nan, math.nan, math.nan)
    members = list(others)
    centre = float(np.median(effect[members]))
    k = len(members)
    scatter = _scatter(effect[members] - centre) ** 2
    null_variance = np.maximum(se[members] ** 2, scatter)
    # the variance of a median of k estimates: (pi / 2) x that of their mean for large k; a mean up to 2
    centre_variance = (math.pi / 2 if k >= 3 else 1.0) * float(np.mean(null_variance)) / k
    se_beyond = math.sqrt(max(float(se[i]) ** 2, scatter) + centre_variance)
    beyond = float(effect[i]) - centre
    by_scatter = scatter > float(se[i]) ** 2  # as the floor: the larger term gives the degrees of freedom
    df_i = np.array([min(float(df[i]), k - 1.0) if by_scatter else float(df[i])])
    p_value = float(2.0 * distributions.t_sf(np.array([abs(beyond) / se_beyond]), df_i)[0])
    half = float(distributions.t_ppf(1.0 - alpha / 2.0, df_i)[0]) * se_beyond
    return Beyond(math.exp(centre), p_value, math.exp(beyond - half), math.exp(beyond + half))




def hold_run_shifts(keys: Sequence[K], result: dict[K, TrialComparison], measured: Measured, spread: Spread,
                     unmeasured: npt.NDArray[np.bool_], in_family: npt.NDArray[np.bool_],
                     groups: Mapping[K, Hashable] | None, history_runs: Mapping[K, int] | None,
                     runs_base: npt.NDArray[np.int64], policy: Policy) -> None:
    """A flag of a series without between-run noise (``unmeasured``: no floor) must also stand out from its run's
    common shift (``beyond_shift``, BH across the flags so tested; ``groups``:
    series of one value share their runs, default all) with its interval beyond the band in the flag's direction;
    else ``inconclusive``, asking for the base runs that would give it a floor (``FLOOR_MIN_RUNS`` less its
    history's runs). An ``unchanged`` series with fewer than two other series is held too: nothing measures its
    run's noise, so it has no verdict either way."""
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if in_family[i]:
            members.setdefault((groups or {}).get(key), []).append(i)
    tested = [i for i, key in enumerate(keys)
              if unmeasured[i] and in_family[i] and result[key].verdict in ("regressed", "improved")]
    beyond = {i: beyond_shift(i, [j for j in members.get((groups or {}).get(keys[i]), []) if j != i],
                               measured.effect, spread.se, spread.df, policy.alpha) for i in tested}
    p_values = np.array([beyond[i].p_value for i in tested])
    adjusted = dict(zip(tested, benjamini_hochberg(p_values, np.isfinite(p_values)), strict=True))
    for i, key in enumerate(keys):
        comparison = result[key]
        if not unmeasured[i] or not in_family[i]:
            continue
        others = [j for j in members.get((groups or {}).get(key), []) if j != i]
        if comparison.verdict == "unchanged":
            # nothing measures its run's noise (no floor, fewer than two other series): no verdict either way
            clear = len(others) >= 2
            found = Beyond(math.exp(float(measured.effect[others[0]])) if others else math.nan, math.nan,
                            math.nan, math.nan)
        elif comparison.verdict in ("regressed", "improved"):
            found = beyond[i]
            if comparison.verdict == "regressed":
                clear = found.low > 1.0 + policy.min_effect and adjusted[i] <= policy.alpha
            else:
                clear = found.high < band(policy.min_effect)[0] and adjusted[i] <= policy.alpha
        else:
            continue
        if not clear:
            known = (history_runs or {}).get(key, int(runs_base[i]))
            result[key] = dataclasses.replace(comparison, verdict="inconclusive", more_samples_needed=0,
                                              more_trials_needed=0,
                                              more_runs_needed=max(1, policy.floor_min_runs - known),
                                              run_shift=found.shift)


def run_counts(keys: Sequence[K], runs: Mapping[K, tuple[int, int]] | None
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per series: the distinct runs behind the base side and the head side ((1, 1) where not given)."""
    counts = np.array([(runs or {}).get(key, (1, 1)) for key in keys], dtype=np.int64).reshape(len(keys), 2)
    return counts[:, 0], counts[:, 1]

