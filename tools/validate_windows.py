"""Windowed vs whole-history change-point search, on long histories built from real recorded H200 noise (not a test).

What it measures
----------------
``harness.stats.changepoints.detect_change_points`` searches a history longer than ``WINDOW`` (256) commits in windows
of 256 commits every 128 (``windows``), each on its own, and merges what they find (``stitched``); ``window=None``
searches the whole history at once. On the same histories, for both searches (default min effect and alpha,
``harness.stats.policy``):

1. null histories (nothing planted): changes reported per 1,000 commits, share of histories with any, and how often
   the two searches give the same list;
2. planted histories: 1-3 steps each (2, 3, 4, 6 sd of the history's noise, or 5, 10, 20 %, either sign), placed at
   random, at and near the windows' ownership boundaries (192, 320, 448, ... +/- 3) and within the newest 64
   commits; half the histories also get a drift (0.1-0.3 % per commit over 50-400 commits). A planted step is found
   if a reported step lies within +/- 2 commits, a drift if a reported drift starts within +/- 8; every other reported
   change is a false change. Recall per step size, per position and per drift length, position error, ratio error
   (reported / planted - 1), the paired picture (found by both, by one only) and agreement per history; why the
   windowed search misses what it misses (no window found it; only windows that do not own it found it; a carried-on
   drift starts early);
3. boundary sweeps: one clear drift (0.15-0.3 %/commit over 100-250 commits) or step (6 sd) a history, starting at
   an ownership boundary + offset (-8..+8 drifts, -3..+3 steps), and a minimal reproducer in plain Gaussian noise;
4. seconds per history: batched and compiled (``harness.analysis.history.detect_many``, the report's path; the whole
   search by patching ``changepoints.windows`` to give one window), and one history at a time in numpy
   (``detect_change_points(h)`` vs ``detect_change_points(h, window=None)``), with a check that both paths agree.

The noise
---------
From ../shared/data/h200-null/run{1,2,3}.db, beside the checkout (three runs of one commit on one H200: all noise).
Per benchmark series and run, the run's level is the median of its trials' medians (each trial: one job, 10 samples).
The between-run deviations of a series with k runs are its log levels about their mean, times sqrt(k / (k - 1)) (so
that their mean square is an unbiased variance; centring on the median of three would put a third of them at exactly
0). All series' deviations are pooled and divided by the pool's root mean square: a unit-variance pool with the real
shape, heavy tails included (``pooled``). A history's commit-to-commit noise is drawn from that pool with replacement
(bootstrap) and multiplied by one scale per history: ``h200``, the between-run sd of a real series (one of the series
with three runs, drawn at random: median ~4 %, p90 ~13 %); ``low``, uniform in 0.5-1 % (steadier kernels and chips).
Two more null shapes bracket the unknown within-series shape: ``self`` (each series' deviations divided by its own
sd: bounded, lighter than normal) and ``gauss`` (normal). Within-run noise is not added: a run's level is already a
10-sample median, so its sampling error is part of the between-run deviations (its size is printed).

Every history has a seed of its own (``--show`` regenerates one): the output is reproducible.

Run
---
    .venv/bin/python tools/validate_windows.py | tee bench/results/windows-validation.txt
    .venv/bin/python tools/validate_windows.py --show BLOCK INDEX [--save FILE.npy]   # one history, both searches
    --window N: the windowed search's window (default changepoints.WINDOW); --fraction F: a share of each block
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import platform
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.analysis import history as analysis_history  # noqa: E402
from harness.analysis import segment_search  # noqa: E402
from harness.stats import changepoints  # noqa: E402
from harness.stats.changepoints import ChangePoint  # noqa: E402
from harness.stats.policy import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "h200-null"  # the recorded runs, beside the checkout
RUNS = ("run1.db", "run2.db", "run3.db")
SEED = 20261130
STEP_TOLERANCE = 2  # a planted step is found if a reported step lies this close
DRIFT_TOLERANCE = 8  # a planted drift is found if a reported drift starts this close
SEPARATION = 25  # commits at least between planted changes (so that matching is unambiguous)
BOUNDARY_JITTER = 3  # "boundary" steps lie within this many commits of a window's ownership boundary
NEWEST = 64  # "newest" steps lie within the newest this many commits
STEP_SIZES: tuple[tuple[str, str, float], ...] = (
    ("2 sd", "sd", 2.0), ("3 sd", "sd", 3.0), ("4 sd", "sd", 4.0), ("6 sd", "sd", 6.0),
    ("5 %", "rel", 0.05), ("10 %", "rel", 0.10), ("20 %", "rel", 0.20),
)
POSITION_KINDS = ("boundary", "newest", "interior")
POSITION_WEIGHTS = (0.4, 0.2, 0.4)
DRIFT_SHARE = 0.5
DRIFT_RATE = (0.001, 0.003)  # relative change per commit
DRIFT_LENGTH = (50, 400)
DRIFT_LENGTH_CLASSES = ((50, 128), (128, 256), (256, 401))
LOW_SCALE = (0.005, 0.010)
METHODS = ("windowed", "whole")
TIMED_ONE_BY_ONE = 10  # histories per block timed one at a time in numpy


@dataclass(frozen=True)
class Block:
    name: str
    kind: str  # "null" or "planted"
    family: str  # "h200" or "low": the scale of a history's noise
    shape: str  # "pooled", "self" or "gauss": the shape of its noise
    n: int
    count: int


BLOCKS = (
    Block("null-h200-1000", "null", "h200", "pooled", 1000, 6000),
    Block("null-low-1000", "null", "low", "pooled", 1000, 6000),
    Block("null-h200-1000-self", "null", "h200", "self", 1000, 1500),
    Block("null-h200-1000-gauss", "null", "h200", "gauss", 1000, 1500),
    Block("null-h200-400", "null", "h200", "pooled", 400, 3000),
    Block("null-low-400", "null", "low", "pooled", 400, 3000),
    Block("planted-h200-1000", "planted", "h200", "pooled", 1000, 5000),
    Block("planted-low-1000", "planted", "low", "pooled", 1000, 5000),
    Block("planted-h200-400", "planted", "h200", "pooled", 400, 2000),
    Block("planted-low-400", "planted", "low", "pooled", 400, 2000),
    # one clear change a history, placed at an ownership boundary + offset (history i: offset from i), to isolate
    # what the stitching does there: drifts of 0.15-0.3 %/commit over 100-250 commits, steps of 6 sd
    Block("boundary-drift-low-1000", "sweep-drift", "low", "pooled", 1000, 17 * 200),
    Block("boundary-drift-h200-1000", "sweep-drift", "h200", "pooled", 1000, 17 * 200),
    Block("boundary-step-low-1000", "sweep-step", "low", "pooled", 1000, 7 * 150),
    Block("boundary-step-h200-1000", "sweep-step", "h200", "pooled", 1000, 7 * 150),
)
SWEEP_DRIFT_OFFSETS = 8  # sweep-drift: starts at boundary -8 .. +8
SWEEP_DRIFT_RATE = (0.0015, 0.003)
SWEEP_DRIFT_LENGTH = (100, 250)
SWEEP_STEP_SIZE = 6.0  # sd


# ---------------------------------------------------------------------------------------------------------------
# The recorded noise
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    pooled: npt.NDArray[np.float64]  # unit mean square: every series' between-run deviations
    self_standardised: npt.NDArray[np.float64]  # each series' deviations / its own sd (unit mean square)
    spreads: npt.NDArray[np.float64]  # between-run sd (log) of each series with 3 runs
    facts: list[str]  # what was read, for the output


def load_noise(directory: Path = DATA) -> Noise:
    levels: dict[str, dict[str, float]] = defaultdict(dict)  # series key -> run id -> level
    trials_per_cell: dict[int, int] = defaultdict(int)
    within: list[float] = []
    jobs = 0
    for name in RUNS:
        with sqlite3.connect(f"file:{directory / name}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT j.id, j.key, j.run_id, s.seconds FROM job j JOIN sample s ON s.job_id = j.id "
                "WHERE j.kind = 'benchmark' AND j.status = 'passed' AND s.seconds > 0 ORDER BY j.id, s.idx"
            ).fetchall()
        samples: dict[int, list[float]] = defaultdict(list)
        cell_of: dict[int, tuple[str, str]] = {}
        for job, key, run, seconds in rows:
            samples[job].append(seconds)
            cell_of[job] = (key, run)
        medians: dict[tuple[str, str], list[float]] = defaultdict(list)
        for job, values in samples.items():
            medians[cell_of[job]].append(float(np.median(values)))
            if len(values) >= 3:
                within.append(float(np.std(np.log(values), ddof=1)))
        jobs += len(samples)
        for (key, run), trial_medians in medians.items():
            levels[key][run] = float(np.median(trial_medians))
            trials_per_cell[len(trial_medians)] += 1
    pooled, self_standardised, spreads = [], [], []
    runs_per_series: dict[int, int] = defaultdict(int)
    for per_run in levels.values():
        runs_per_series[len(per_run)] += 1
        if len(per_run) < 2:
            continue
        logs = np.log(np.array(list(per_run.values())))
        k = logs.size
        deviations = (logs - logs.mean()) * math.sqrt(k / (k - 1))
        pooled.append(deviations)
        sd = float(np.std(logs, ddof=1))
        if sd > 0:
            self_standardised.append(deviations / sd)
        if k == 3:
            spreads.append(sd)
    pool = np.concatenate(pooled)
    rms = float(np.sqrt(np.mean(pool * pool)))
    own = np.concatenate(self_standardised)
    spread = np.sort(np.array(spreads))
    unit = pool / rms
    within_sd = float(np.median(within))
    facts = [
        f"read: {', '.join(str(directory / r) for r in RUNS)}: {jobs} passed benchmark jobs, {len(levels)} series; "
        f"runs per series {dict(sorted(runs_per_series.items()))}; trials (jobs) per (series, run) "
        f"{dict(sorted(trials_per_cell.items()))}",
        f"pooled between-run deviations: {pool.size} from {len(pooled)} series; rms {rms:.4f} (log), "
        f"1.4826 MAD {1.4826 * float(np.median(np.abs(pool))):.4f}; unit-rms pool: kurtosis {kurtosis(unit):.2f}, "
        f"|z| p50/p90/p99/max {' / '.join(f'{q:.2f}' for q in np.percentile(np.abs(unit), [50, 90, 99, 100]))}",
        f"self-standardised pool (each series by its own sd): kurtosis {kurtosis(own):.2f}, max |z| "
        f"{float(np.max(np.abs(own))):.2f} (bounded: 2 or 3 runs a series) -- kept only as a light-tailed null shape",
        f"per-history scale 'h200': between-run sd of the {spread.size} series with 3 runs: min {spread[0]:.4f}, "
        f"median {float(np.median(spread)):.4f}, p90 {float(np.percentile(spread, 90)):.4f}, max {spread[-1]:.4f}; "
        f"'low': uniform {LOW_SCALE[0]:.3f}-{LOW_SCALE[1]:.3f}",
        f"within-run: median sd of a job's log samples {within_sd:.4f}, so ~{1.2533 * within_sd / math.sqrt(10):.4f} "
        "for a 10-sample median: already inside the between-run deviations, not added again",
    ]
    return Noise(unit, own / float(np.sqrt(np.mean(own * own))), spread, facts)


def kurtosis(values: npt.NDArray[np.float64]) -> float:
    centred = values - values.mean()
    return float(np.mean(centred**4) / np.mean(centred**2) ** 2)


# ---------------------------------------------------------------------------------------------------------------
# Histories
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planted:
    kind: str  # "step" or "drift"
    index: int  # first commit at the new level (step) or first commit of the ramp (drift)
    end_index: int
    log_change: float
    label: str  # step: size class; drift: length class
    where: str  # step: position kind; drift: "boundary" or "interior"


@dataclass
class History:
    values: npt.NDArray[np.float64]
    scale: float  # sd (log) of its noise
    planted: list[Planted] = field(default_factory=list)


def history_rng(block: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([SEED, block, index]))


def ownership_boundaries(n: int) -> list[int]:
    return [w.own_start for w in windows_of(n) if w.own_start > 0]


def make_history(noise: Noise, spec: Block, rng: np.random.Generator, number: int) -> History:
    n = spec.n
    scale = float(rng.choice(noise.spreads)) if spec.family == "h200" else float(rng.uniform(*LOW_SCALE))
    if spec.shape == "gauss":
        shape = rng.standard_normal(n)
    else:
        shape = rng.choice(noise.pooled if spec.shape == "pooled" else noise.self_standardised, size=n)
    level = np.full(n, math.log(rng.uniform(1e-5, 1e-2)))
    planted: list[Planted] = []
    if spec.kind == "planted":
        taken: list[tuple[int, int]] = []  # spans kept clear of further changes
        boundaries = ownership_boundaries(n)
        if rng.random() < DRIFT_SHARE:
            length = int(rng.integers(DRIFT_LENGTH[0], min(DRIFT_LENGTH[1], n - 60) + 1))
            rate = math.log1p(rng.uniform(*DRIFT_RATE)) * (1 if rng.random() < 0.5 else -1)
            near = rng.random() < 0.3 and boundaries
            candidates = [b + j for b in boundaries for j in range(-8, 9) if 10 <= b + j <= n - length - 5]
            start = int(rng.choice(candidates)) if near and candidates else int(rng.integers(10, n - length - 4))
            ramp = rate * np.arange(length)
            level[start:start + length] += ramp
            level[start + length:] += ramp[-1]
            label = next(f"{lo}-{hi - 1}" for lo, hi in DRIFT_LENGTH_CLASSES if lo <= length < hi)
            planted.append(Planted("drift", start, start + length - 1, float(ramp[-1]), label,
                                   "boundary" if near and candidates else "interior"))
            taken.append((start - SEPARATION, start + length - 1 + SEPARATION))
        for _ in range(int(rng.integers(1, 4))):
            label, unit, size = STEP_SIZES[int(rng.integers(len(STEP_SIZES)))]
            jump = (size * scale if unit == "sd" else math.log1p(size)) * (1 if rng.random() < 0.5 else -1)
            for _attempt in range(100):
                where = POSITION_KINDS[int(rng.choice(len(POSITION_KINDS), p=POSITION_WEIGHTS))]
                if where == "boundary":
                    index = int(rng.choice(boundaries)) + int(rng.integers(-BOUNDARY_JITTER, BOUNDARY_JITTER + 1))
                elif where == "newest":
                    index = int(rng.integers(n - NEWEST, n - 2))  # at least 3 commits at the new level
                else:
                    index = int(rng.integers(10, n - 2))
                if all(not lo <= index <= hi for lo, hi in taken):
                    break
            else:
                continue
            level[index:] += jump
            planted.append(Planted("step", index, index, jump, label, where))
            taken.append((index - SEPARATION, index + SEPARATION))
        planted.sort(key=lambda p: p.index)
    elif spec.kind == "sweep-drift":
        offsets = 2 * SWEEP_DRIFT_OFFSETS + 1
        start = int(rng.choice(ownership_boundaries(n))) + number % offsets - SWEEP_DRIFT_OFFSETS
        length = min(int(rng.integers(SWEEP_DRIFT_LENGTH[0], SWEEP_DRIFT_LENGTH[1] + 1)), n - 10 - start)
        rate = math.log1p(rng.uniform(*SWEEP_DRIFT_RATE)) * (1 if rng.random() < 0.5 else -1)
        ramp = rate * np.arange(length)
        level[start:start + length] += ramp
        level[start + length:] += ramp[-1]
        label = next(f"{lo}-{hi - 1}" for lo, hi in DRIFT_LENGTH_CLASSES if lo <= length < hi)
        planted.append(Planted("drift", start, start + length - 1, float(ramp[-1]), label, "boundary"))
    elif spec.kind == "sweep-step":
        index = int(rng.choice(ownership_boundaries(n))) + number % (2 * BOUNDARY_JITTER + 1) - BOUNDARY_JITTER
        jump = SWEEP_STEP_SIZE * scale * (1 if rng.random() < 0.5 else -1)
        level[index:] += jump
        planted.append(Planted("step", index, index, jump, f"{SWEEP_STEP_SIZE:g} sd", "boundary"))
    return History(np.exp(level + scale * shape), scale, planted)


# ---------------------------------------------------------------------------------------------------------------
# The two searches
# ---------------------------------------------------------------------------------------------------------------

_WINDOWS = changepoints.windows
WINDOW = changepoints.WINDOW  # the window under test (--window; main sets it)


def windows_of(n: int, window: int | None = None) -> list[changepoints.Window]:
    """The windowed search's windows: ``changepoints.windows`` with the window under test."""
    return _WINDOWS(n, WINDOW)


def _one_window(n: int, window: int | None = None) -> list[changepoints.Window]:
    return _WINDOWS(n, None)


def search_many(histories: Sequence[npt.NDArray[np.float64]], method: str,
                record: list[list[ChangePoint]] | None = None) -> list[list[ChangePoint]]:
    """``detect_many`` of the histories: windowed (as the report runs it) or whole (one window per history);
    ``record`` gets what each window found (indices into the window; histories and windows in order)."""

    def search(stretches: Sequence[npt.NDArray[np.float64]]) -> list[list[ChangePoint]]:
        found = analysis_history.detect_windows(stretches, min_effect=DEFAULT_MIN_EFFECT, alpha=DEFAULT_ALPHA)
        if record is not None:
            record.extend(found)
        return found

    changepoints.windows = windows_of if method == "windowed" else _one_window
    try:
        return analysis_history.detect_many(histories, min_effect=DEFAULT_MIN_EFFECT, alpha=DEFAULT_ALPHA,
                                            search=search)
    finally:
        changepoints.windows = _WINDOWS


def per_window(histories: Sequence[History], record: list[list[ChangePoint]]
               ) -> list[list[tuple[changepoints.Window, list[ChangePoint]]]]:
    """``record`` (``search_many``'s) per history: each window and what it found, indices into the history."""
    found = iter(record)
    out = []
    for h in histories:
        out.append([(w, [dataclasses.replace(c, index=c.index + w.start, end_index=c.end_index + w.start)
                         for c in next(found)]) for w in windows_of(h.values.size)])
    return out


def miss_cause(kind: str, index: int, windows: list[tuple[changepoints.Window, list[ChangePoint]]],
               stitched: list[ChangePoint]) -> str:
    """Why the windowed search (``stitched``: its result) does not report a change of ``kind`` at ``index``: no window
    found one there; or the windows that did found it outside the commits they own, so none kept it; or one kept it
    but the stitching carried an earlier window's drift on through it (the drift then starts where the earlier window
    put it); or something else."""
    tolerance = STEP_TOLERANCE if kind == "step" else DRIFT_TOLERANCE
    seen = [(w, c) for w, found in windows for c in found if c.kind == kind and abs(c.index - index) <= tolerance]
    if not seen:
        return MISS_CAUSES[0]
    if all(not w.own_start <= c.index < w.own_stop for w, c in seen):
        return MISS_CAUSES[1]
    if any(c.kind == "drift" and c.index < index - tolerance <= c.end_index for c in stitched):
        return MISS_CAUSES[2]
    return MISS_CAUSES[3]


MISS_CAUSES = ("no window found it", "found outside own only", "early start (carry-on)", "other")
MISS_LEGEND = ("causes of a change the windowed search lacks: 'no window found it' (within +/-2 commits for a step, "
               "+/-8 for a drift); 'found outside own only': the windows that found it found it outside the commits "
               "they own, so none kept it; 'early start (carry-on)': a window kept it, but an earlier window's drift "
               "was carried on through it and starts before it; 'other'")


def search_one(values: npt.NDArray[np.float64], method: str) -> list[ChangePoint]:
    window = WINDOW if method == "windowed" else None
    return changepoints.detect_change_points(values, min_effect=DEFAULT_MIN_EFFECT, alpha=DEFAULT_ALPHA,
                                             window=window)


# ---------------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Score:
    hits: list[ChangePoint | None]  # per planted change, the reported change matched to it
    false: list[tuple[ChangePoint, str]]  # unmatched reported changes and what they lie near


def score(planted: list[Planted], reported: list[ChangePoint]) -> Score:
    used: set[int] = set()
    hits: list[ChangePoint | None] = []
    for p in planted:
        tolerance = STEP_TOLERANCE if p.kind == "step" else DRIFT_TOLERANCE
        best = None
        for j, c in enumerate(reported):
            if j in used or c.kind != p.kind or abs(c.index - p.index) > tolerance:
                continue
            if best is None or abs(c.index - p.index) < abs(reported[best].index - p.index):
                best = j
        if best is not None:
            used.add(best)
        hits.append(None if best is None else reported[best])
    false = []
    for j, c in enumerate(reported):
        if j in used:
            continue
        if any(p.kind == "drift" and p.index - DRIFT_TOLERANCE <= c.index <= p.end_index + DRIFT_TOLERANCE
               for p in planted):
            near = "in a planted drift"
        elif any(p.kind == "step" and abs(c.index - p.index) <= 10 for p in planted):
            near = "near a planted step"
        else:
            near = "elsewhere"
        false.append((c, near))
    return Score(hits, false)


def agreement(a: list[ChangePoint], b: list[ChangePoint]) -> str:
    if len(a) == len(b) and all(x.kind == y.kind and x.index == y.index and x.end_index == y.end_index
                                and math.isclose(x.ratio, y.ratio, rel_tol=1e-9) for x, y in zip(a, b, strict=True)):
        return "identical"
    if [(c.kind, c.index) for c in a] == [(c.kind, c.index) for c in b]:
        return "same indices"
    return "differ"


def poisson_upper(count: int) -> float:
    """One-sided 95 % upper bound of a Poisson mean after ``count`` events (Wilson-Hilferty; 3.0 at 0)."""
    k = count + 1
    return k * (1.0 - 1.0 / (9.0 * k) + 1.6449 / (3.0 * math.sqrt(k))) ** 3


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:5.1f} %" if whole else "    -  "


def quantile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def pct(values: Sequence[float], q: float, digits: int = 2) -> str:
    """The q-th percentile of relative errors, in per cent ("-" when there are none)."""
    return f"{100 * quantile(values, q):.{digits}f} %" if len(values) else "-"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for k, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                    strict=True))))
        if k == 0:
            print("  " + "  ".join("-" * w for w in widths))


# ---------------------------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    histories: list[History]
    found: dict[str, list[list[ChangePoint]]]
    seconds: dict[str, float]  # batched, per history
    windows: list[list[tuple[changepoints.Window, list[ChangePoint]]]]  # windowed: what each window found


SUMMARY: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)  # (block, method) -> figure -> text
REPRODUCERS: list[str] = []


def run_block(number: int, spec: Block, noise: Noise) -> Outcome:
    histories = [make_history(noise, spec, history_rng(number, i), i) for i in range(spec.count)]
    values = [h.values for h in histories]
    found: dict[str, list[list[ChangePoint]]] = {}
    seconds: dict[str, float] = {}
    record: list[list[ChangePoint]] = []
    for method in METHODS:
        started = time.perf_counter()
        found[method] = search_many(values, method, record if method == "windowed" else None)
        seconds[method] = (time.perf_counter() - started) / len(values)
    return Outcome(histories, found, seconds, per_window(histories, record))


def report_lost(spec: Block, outcome: Outcome) -> None:
    """Changes of the whole search with no same-kind change of the windowed one within tolerance, by cause; and the
    converse count."""
    causes: dict[str, dict[str, int]] = {kind: defaultdict(int) for kind in changepoints.CHANGE_KINDS}
    converse: dict[str, int] = defaultdict(int)
    for i, (windowed, whole) in enumerate(zip(outcome.found["windowed"], outcome.found["whole"], strict=True)):
        for a, b, count in ((whole, windowed, True), (windowed, whole, False)):
            for c in a:
                tolerance = STEP_TOLERANCE if c.kind == "step" else DRIFT_TOLERANCE
                if any(d.kind == c.kind and abs(d.index - c.index) <= tolerance for d in b):
                    continue
                if count:
                    causes[c.kind][miss_cause(c.kind, c.index, outcome.windows[i], windowed)] += 1
                else:
                    converse[c.kind] += 1
    commits = spec.count * spec.n / 1000.0
    rows = [[kind, sum(causes[kind].values()), f"{sum(causes[kind].values()) / commits:.3f}",
             *[causes[kind][cause] for cause in MISS_CAUSES], converse[kind]] for kind in changepoints.CHANGE_KINDS]
    print("  changes of the whole search that the windowed one lacks (none of its kind within +/-2 steps, +/-8 "
          "drifts), by cause; and the converse")
    table(["kind", "lacking", "per 1000 commits", *MISS_CAUSES, "windowed has, whole lacks"], rows)


def report_null(number: int, spec: Block, outcome: Outcome) -> None:
    commits = spec.count * spec.n
    rows = []
    for method in METHODS:
        found = outcome.found[method]
        total = sum(len(f) for f in found)
        steps = sum(c.kind == "step" for f in found for c in f)
        rate = 1000.0 * total / commits
        upper = 1000.0 * poisson_upper(total) / commits
        rows.append([method, total, steps, total - steps, f"{rate:.4f}", f"{upper:.4f}",
                     percent(sum(bool(f) for f in found), len(found)), f"{outcome.seconds[method] * 1000:.2f}"])
        SUMMARY[(spec.name, method)]["false / 1000 commits"] = f"{rate:.4f} (95 % upper {upper:.4f})"
        SUMMARY[(spec.name, method)]["ms / history"] = f"{outcome.seconds[method] * 1000:.2f}"
    table(["method", "changes", "steps", "drifts", "per 1000 commits", "95 % upper bound", "histories with any",
           "ms/history (batched)"], rows)
    print_agreement(outcome)
    extra = [i for i, (w, a) in enumerate(zip(outcome.found["windowed"], outcome.found["whole"], strict=True))
             if len(w) > len(a)]
    fewer = [i for i, (w, a) in enumerate(zip(outcome.found["windowed"], outcome.found["whole"], strict=True))
             if len(w) < len(a)]
    print(f"  histories where windowed reports more changes than whole: {len(extra)}; fewer: {len(fewer)}")
    for i in extra[:3]:
        line = (f"{spec.name} #{i} (seed [{SEED}, {number}, {i}], scale {outcome.histories[i].scale:.4f}): "
                f"windowed {brief(outcome.found['windowed'][i])}; whole {brief(outcome.found['whole'][i])}")
        print(f"    e.g. {line}")
        REPRODUCERS.append(f"null, windowed extra: {line}")


def brief(changes: Sequence[ChangePoint]) -> str:
    if not changes:
        return "none"
    return ", ".join(f"{c.kind}@{c.index}" + (f"-{c.end_index}" if c.kind == "drift" else "") + f" x{c.ratio:.3f}"
                     for c in changes)


def print_agreement(outcome: Outcome) -> None:
    kinds = [agreement(w, a) for w, a in zip(outcome.found["windowed"], outcome.found["whole"], strict=True)]
    total = len(kinds)
    print("  agreement per history (windowed vs whole): "
          + ", ".join(f"{k} {kinds.count(k)} ({percent(kinds.count(k), total).strip()})"
                      for k in ("identical", "same indices", "differ")))


def report_planted(number: int, spec: Block, outcome: Outcome) -> None:
    scores = {m: [score(h.planted, f) for h, f in zip(outcome.histories, outcome.found[m], strict=True)]
              for m in METHODS}
    planted = [(i, k, p) for i, h in enumerate(outcome.histories) for k, p in enumerate(h.planted)]
    steps = [(i, k, p) for i, k, p in planted if p.kind == "step"]
    drifts = [(i, k, p) for i, k, p in planted if p.kind == "drift"]
    commits = spec.count * spec.n
    print(f"  planted: {len(steps)} steps, {len(drifts)} drifts in {spec.count} histories of {spec.n} commits; "
          f"noise sd median {np.median([h.scale for h in outcome.histories]):.4f}")

    def hit(method: str, i: int, k: int) -> ChangePoint | None:
        return scores[method][i].hits[k]

    # recall per step size, paired
    rows = []
    for label, _, _ in STEP_SIZES:
        chosen = [(i, k) for i, k, p in steps if p.label == label]
        if not chosen:
            continue
        both = sum(hit("windowed", i, k) is not None and hit("whole", i, k) is not None for i, k in chosen)
        only_w = sum(hit("windowed", i, k) is not None and hit("whole", i, k) is None for i, k in chosen)
        only_a = sum(hit("windowed", i, k) is None and hit("whole", i, k) is not None for i, k in chosen)
        rows.append([label, len(chosen), percent(both + only_w, len(chosen)), percent(both + only_a, len(chosen)),
                     both, only_w, only_a])
        for method, count in (("windowed", both + only_w), ("whole", both + only_a)):
            SUMMARY[(spec.name, method)][f"recall {label}"] = percent(count, len(chosen)).strip()
    if rows:
        print("  step recall per size (found: a reported step within +/-2 commits)")
        table(["size", "planted", "windowed", "whole", "both", "windowed only", "whole only"], rows)

    rows = []
    for where in POSITION_KINDS:
        chosen = [(i, k) for i, k, p in steps if p.where == where]
        if not chosen:
            continue
        rows.append([where, len(chosen), *[percent(sum(hit(m, i, k) is not None for i, k in chosen), len(chosen))
                                            for m in METHODS],
                     sum(hit("windowed", i, k) is not None and hit("whole", i, k) is None for i, k in chosen),
                     sum(hit("windowed", i, k) is None and hit("whole", i, k) is not None for i, k in chosen)])
    offsets = defaultdict(list)
    boundaries = ownership_boundaries(spec.n)
    for i, k, p in steps:
        if p.where == "boundary":
            offset = min((p.index - b for b in boundaries), key=abs)
            offsets[offset].append((i, k))
    for offset in sorted(offsets):
        chosen = offsets[offset]
        rows.append([f"  boundary {offset:+d}", len(chosen),
                     *[percent(sum(hit(m, i, k) is not None for i, k in chosen), len(chosen)) for m in METHODS],
                     sum(hit("windowed", i, k) is not None and hit("whole", i, k) is None for i, k in chosen),
                     sum(hit("windowed", i, k) is None and hit("whole", i, k) is not None for i, k in chosen)])
    if rows:
        print(f"  step recall per position (all sizes; boundaries {boundaries}, newest = last {NEWEST} commits)")
        table(["position", "planted", "windowed", "whole", "windowed only", "whole only"], rows)

    rows = []
    for method in METHODS:
        found = [(p, hit(method, i, k)) for i, k, p in steps if hit(method, i, k) is not None]
        position = [abs(c.index - p.index) for p, c in found if c is not None]
        ratio = [abs(c.ratio / math.exp(p.log_change) - 1.0) for p, c in found if c is not None]
        rows.append([method, len(found), f"{np.mean(position):.3f}" if position else "-",
                     percent(sum(e == 0 for e in position), len(position)),
                     pct(ratio, 50), pct(ratio, 90)])
        SUMMARY[(spec.name, method)]["step position error"] = f"{np.mean(position):.3f}" if position else "-"
        SUMMARY[(spec.name, method)]["step ratio error p50 / p90"] = f"{pct(ratio, 50)} / {pct(ratio, 90)}"
    both = [(hit("windowed", i, k), hit("whole", i, k)) for i, k, _ in steps
            if hit("windowed", i, k) is not None and hit("whole", i, k) is not None]
    same_index = sum(w.index == a.index for w, a in both if w is not None and a is not None)
    between = [abs(w.ratio / a.ratio - 1.0) for w, a in both if w is not None and a is not None]
    if steps:
        print("  found steps: position error (mean |reported - planted| commits, share exact) and ratio error "
              "|reported / planted - 1|")
        table(["method", "found", "mean |pos err|", "exact", "ratio err p50", "ratio err p90"], rows)
        print(f"  steps found by both: {len(both)}; same index {percent(same_index, len(both)).strip()}; "
              f"|windowed ratio / whole ratio - 1| p50 {pct(between, 50, 3)}, p90 {pct(between, 90, 3)}, "
              f"max {pct(between, 100, 3)}")

    rows = []
    classes = sorted({p.label for _, _, p in drifts}, key=lambda s: int(s.split("-")[0]))
    for method in METHODS:
        found = [(p, hit(method, i, k)) for i, k, p in drifts]
        row: list[object] = [method]
        for label in [*classes, "all"]:
            chosen = [c for p, c in found if label in ("all", p.label)]
            row.append(percent(sum(c is not None for c in chosen), len(chosen)))
        near = [c for p, c in found if p.where == "boundary"]
        row.append(percent(sum(c is not None for c in near), len(near)))
        got = [(p, c) for p, c in found if c is not None]
        start = [abs(c.index - p.index) for p, c in got if c is not None]
        end = [abs(c.end_index - p.end_index) for p, c in got if c is not None]
        ratio = [abs(c.ratio / math.exp(p.log_change) - 1.0) for p, c in got if c is not None]
        row += [f"{np.mean(start):.2f}" if start else "-", f"{quantile(end, 50):.0f}" if end else "-",
                percent(sum(e <= 16 for e in end), len(end)), pct(ratio, 50)]
        rows.append(row)
        SUMMARY[(spec.name, method)]["drift recall"] = str(row[len(classes) + 1]).strip()
        SUMMARY[(spec.name, method)]["drift |start err|"] = f"{np.mean(start):.2f}" if start else "-"
        SUMMARY[(spec.name, method)]["drift end within 16"] = percent(sum(e <= 16 for e in end), len(end)).strip()
        SUMMARY[(spec.name, method)]["drift ratio error p50"] = pct(ratio, 50)
    if drifts:
        print(f"  drift recall per length (found: a reported drift starting within +/-8), {len(drifts)} drifts "
              f"({sum(p.where == 'boundary' for _, _, p in drifts)} starting within 8 of a boundary)")
        table(["method", *[f"{c}" for c in classes], "all", "near boundary", "mean |start err|", "|end err| p50",
               "end within 16", "ratio err p50"], rows)

    near_offsets = defaultdict(list)
    for i, k, p in drifts:
        offset = min((p.index - b for b in boundaries), key=abs)
        if abs(offset) <= DRIFT_TOLERANCE:
            near_offsets[offset].append((i, k))
    if near_offsets:
        rows = [[f"{offset:+d}", len(chosen),
                 *[percent(sum(hit(m, i, k) is not None for i, k in chosen), len(chosen)) for m in METHODS],
                 sum(hit("windowed", i, k) is not None and hit("whole", i, k) is None for i, k in chosen),
                 sum(hit("windowed", i, k) is None and hit("whole", i, k) is not None for i, k in chosen)]
                for offset, chosen in sorted(near_offsets.items())]
        print("  drift recall by where the drift starts: offset from the nearest ownership boundary")
        table(["offset", "planted", "windowed", "whole", "windowed only", "whole only"], rows)

    rows = []
    for kind, chosen in (("step", steps), ("drift", drifts)):
        if not chosen:
            continue
        missed = [(i, k, p) for i, k, p in chosen if hit("windowed", i, k) is None]
        for label, subset in (("whole found it", [m for m in missed if hit("whole", m[0], m[1]) is not None]),
                              ("whole missed it too", [m for m in missed if hit("whole", m[0], m[1]) is None])):
            causes = defaultdict(int)
            for i, _, p in subset:
                causes[miss_cause(kind, p.index, outcome.windows[i], outcome.found["windowed"][i])] += 1
            rows.append([f"{kind}, {label}", len(subset), *[causes[c] for c in MISS_CAUSES]])
    print("  planted changes the windowed search missed, by cause (what its windows found within +/-2 steps, +/-8 "
          "drifts)")
    table(["missed", "count", *MISS_CAUSES], rows)

    rows = []
    for method in METHODS:
        false = [(c, near) for s in scores[method] for c, near in s.false]
        by = defaultdict(int)
        for _, near in false:
            by[near] += 1
        rate = 1000.0 * len(false) / commits
        rows.append([method, len(false), f"{rate:.3f}", by["elsewhere"], by["near a planted step"],
                     by["in a planted drift"], f"{outcome.seconds[method] * 1000:.2f}"])
        SUMMARY[(spec.name, method)]["false / 1000 commits"] = f"{rate:.3f}"
        SUMMARY[(spec.name, method)]["ms / history"] = f"{outcome.seconds[method] * 1000:.2f}"
    print("  false changes (reported, matching no planted change)")
    table(["method", "false", "per 1000 commits", "elsewhere", "near a planted step", "in a planted drift",
           "ms/history (batched)"], rows)
    print_agreement(outcome)

    # reproducers: a planted step found by the whole search only, or a false change of the windowed search only
    missed = [(i, p) for i, k, p in steps if hit("windowed", i, k) is None and hit("whole", i, k) is not None]
    missed_drift = [(i, p) for i, k, p in drifts if hit("windowed", i, k) is None and hit("whole", i, k) is not None]
    surplus = [i for i in range(spec.count)
               if len(scores["windowed"][i].false) > len(scores["whole"][i].false)]
    deficit = [i for i in range(spec.count)
               if len(scores["windowed"][i].false) < len(scores["whole"][i].false)]
    print(f"  histories where windowed has more false changes than whole: {len(surplus)}; fewer: {len(deficit)}")
    def reproducer(label: str, kind: str, i: int, planted: str) -> None:
        h = outcome.histories[i]
        line = (f"{spec.name} #{i} (seed [{SEED}, {number}, {i}], scale {h.scale:.4f}): planted {planted}; windowed "
                f"{brief(outcome.found['windowed'][i])}; whole {brief(outcome.found['whole'][i])}")
        print(f"    {label}: {line}")
        REPRODUCERS.append(f"planted, {kind}: {line}")

    for i, p in missed[:2] + missed_drift[:2]:
        reproducer("whole only", "found by whole only", i,
                   f"{p.kind}@{p.index} x{math.exp(p.log_change):.3f} ({p.label}, {p.where})")
    for i in surplus[:2]:
        reproducer("windowed more false", "windowed more false", i, brief_planted(outcome.histories[i].planted))


def brief_planted(planted: Sequence[Planted]) -> str:
    return ", ".join(f"{p.kind}@{p.index}" + (f"-{p.end_index}" if p.kind == "drift" else "")
                     + f" x{math.exp(p.log_change):.3f}" for p in planted) or "none"


def time_one_by_one(spec: Block, outcome: Outcome) -> tuple[float, float, bool]:
    """Seconds per history of ``detect_change_points`` one history at a time (numpy), windowed and whole, on the
    first histories of a block; and whether they equal ``detect_many``'s results."""
    chosen = outcome.histories[:TIMED_ONE_BY_ONE]
    seconds, same = [], True
    for method in METHODS:
        started = time.perf_counter()
        results = [search_one(h.values, method) for h in chosen]
        seconds.append((time.perf_counter() - started) / len(chosen))
        same = same and results == outcome.found[method][:len(chosen)]
    return seconds[0], seconds[1], same


# ---------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------


def show(block_name: str, index: int, save: str | None, noise: Noise) -> None:
    number, spec = next((k, b) for k, b in enumerate(BLOCKS) if b.name == block_name)
    h = make_history(noise, spec, history_rng(number, index), index)
    print(f"{spec.name} #{index}: seed [{SEED}, {number}, {index}], n {spec.n}, noise sd {h.scale:.4f} "
          f"({spec.family}, {spec.shape}); robust_noise of its logs {changepoints.robust_noise(np.log(h.values)):.4f}")
    print(f"planted: {brief_planted(h.planted)}")
    print(f"windows: {[(w.start, w.stop, w.own_start, w.own_stop) for w in windows_of(spec.n)]}")
    for method in METHODS:
        print(f"{method}: {brief(search_one(h.values, method))}")
    for w in windows_of(spec.n):
        inside = changepoints.detect_change_points(h.values[w.start:w.stop], min_effect=DEFAULT_MIN_EFFECT,
                                                   alpha=DEFAULT_ALPHA, window=None)
        shifted = [ChangePoint(c.index + w.start, c.kind, c.before, c.after, c.ratio, c.end_index + w.start)
                   for c in inside]
        print(f"  window {w.start}-{w.stop - 1} (owns {w.own_start}-{w.own_stop - 1}): {brief(shifted)}")
    if save:
        np.save(save, h.values)
        print(f"values saved to {save} (np.load; pass to detect_change_points)")


def minimal_reproducer(seeds: int = 200) -> None:
    """A drift at an ownership boundary in plain Gaussian noise (no recorded data): how often each search reports no
    drift starting within +/-8 of it, at the boundary and in the middle of a window's own commits."""
    n, sd, rate, length = 1000, 0.005, -0.0025, 200
    boundary = ownership_boundaries(n)[1]
    print(f"== minimal reproducer: n {n}, Gaussian noise sd {sd}, a drift of {rate:+.2%}/commit over {length} commits "
          f"(x{math.exp(rate * (length - 1)):.3f}); history of seed s: x = {sd} * np.random.default_rng(s)"
          f".standard_normal({n}); x[b:b+{length}] += {rate} * np.arange({length}); x[b+{length}:] += "
          f"{rate} * {length - 1}; detect_change_points(np.exp(x)) vs detect_change_points(np.exp(x), window=None); "
          f"s = 0..{seeds - 1}")
    rows = []
    for start in (boundary, boundary + WINDOW // 4):
        histories = []
        for seed in range(seeds):
            x = sd * np.random.default_rng(seed).standard_normal(n)
            x[start:start + length] += rate * np.arange(length)
            x[start + length:] += rate * (length - 1)
            histories.append(np.exp(x))
        found = {m: search_many(histories, m) for m in METHODS}
        missed = {m: [s for s, f in enumerate(found[m])
                      if not any(c.kind == "drift" and abs(c.index - start) <= DRIFT_TOLERANCE for c in f)]
                  for m in METHODS}
        only = [s for s in missed["windowed"] if s not in missed["whole"]]
        rows.append([f"b = {start}" + (" (ownership boundary)" if start == boundary else " (middle of own commits)"),
                     len(missed["windowed"]), len(missed["whole"]), ", ".join(map(str, only[:8])) or "-"])
        for s in only[:1]:
            print(f"  e.g. b = {start}, s = {s}: windowed {brief(found['windowed'][s])}; whole "
                  f"{brief(found['whole'][s])}")
    table(["drift start", f"windowed: missed of {seeds}", f"whole: missed of {seeds}", "seeds missed by windowed only"],
          rows)


def source_state() -> str:
    """The code under test: the commit, and whether harness/ differs from it (another change in progress)."""
    path = Path(changepoints.__file__)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "diff", "--stat", "HEAD", "--", "harness"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.CalledProcessError):
        head, changed = "?", ["(git not available)"]
    state = "harness/ as committed" if not changed else "harness/ differs from HEAD: " + "; ".join(
        line.strip() for line in changed)
    return (f"{path} (sha256 {digest}), changepoints.WINDOW {changepoints.WINDOW}; HEAD {head}, {state}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", nargs=2, metavar=("BLOCK", "INDEX"), help="regenerate one history and search it")
    parser.add_argument("--save", help="with --show: save the history's values (.npy)")
    parser.add_argument("--fraction", type=float, default=1.0, help="run this share of each block (a quick look)")
    parser.add_argument("--window", type=int, default=changepoints.WINDOW,
                        help=f"window of the windowed search (default changepoints.WINDOW, {changepoints.WINDOW})")
    args = parser.parse_args(argv)
    global WINDOW
    WINDOW = args.window
    noise = load_noise()
    if args.show:
        show(args.show[0], int(args.show[1]), args.save, noise)
        return
    started = time.perf_counter()
    blocks = [dataclasses.replace(b, count=max(10, round(b.count * args.fraction))) for b in BLOCKS]
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}  (cwd {Path.cwd()})")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cores; min effect "
          f"{DEFAULT_MIN_EFFECT}, alpha {DEFAULT_ALPHA}, window under test {WINDOW}, penalty "
          f"{changepoints.detect_change_points.__kwdefaults__['penalty']}")
    print(f"harness: {source_state()}")
    print(MISS_LEGEND)
    print(f"seed {SEED}: history i of block b is drawn from np.random.SeedSequence([{SEED}, b, i]) "
          "(--show BLOCK INDEX regenerates one)")
    print("blocks: " + "; ".join(f"{k} {b.name} ({b.count} x {b.n})" for k, b in enumerate(blocks)))
    print()
    print("noise, from the recorded runs")
    for fact in noise.facts:
        print(f"  {fact}")
    for shape, pool in (("pooled", noise.pooled), ("self", noise.self_standardised)):
        rng = np.random.default_rng([SEED, 99])
        ratio = [changepoints.robust_noise(pool[rng.integers(pool.size, size=1000)]) for _ in range(200)]
        print(f"  robust_noise / true sd of 1000-commit {shape} noise: median {np.median(ratio):.3f} "
              "(below 1: heavy tails, which the detector's trimmed estimate leaves out)" if shape == "pooled" else
              f"  robust_noise / true sd of 1000-commit {shape} noise: median {np.median(ratio):.3f}")
    print()
    segment_search.warm_up_in_background()
    segment_search.finish_warm_up()
    warm = [np.exp(0.01 * np.random.default_rng([SEED, 98, i]).standard_normal(1000)) for i in range(4)]
    for method in METHODS:  # compiled search loaded and compiled before any timing
        search_many(warm, method)
    one_by_one: list[tuple[str, float, float, bool]] = []
    for number, spec in enumerate(blocks):
        stretches = [(w.start, w.stop) for w in windows_of(spec.n)]
        print(f"== block {number}: {spec.name}: {spec.count} {spec.kind} histories of {spec.n} commits, noise "
              f"{spec.family} scale, {spec.shape} shape; windows {stretches}")
        outcome = run_block(number, spec, noise)
        (report_null if spec.kind == "null" else report_planted)(number, spec, outcome)
        report_lost(spec, outcome)
        if spec.kind == "planted" or spec.name.endswith(("h200-1000", "h200-400")):
            one_by_one.append((spec.name, *time_one_by_one(spec, outcome)))
        print()
    print("== seconds per history, one at a time in numpy (detect_change_points; first "
          f"{TIMED_ONE_BY_ONE} histories of a block), and whether its results equal detect_many's")
    table(["block", "windowed s", "whole s", "whole / windowed", "same as batched"],
          [[name, f"{w:.4f}", f"{a:.4f}", f"{a / w:.2f}", "yes" if same else "NO"] for name, w, a, same in one_by_one])
    print()
    print("== summary (method x figure; recall per planted step size, false changes per 1000 commits)")
    figures = ["false / 1000 commits", *[f"recall {label}" for label, _, _ in STEP_SIZES], "drift recall",
               "drift |start err|", "drift end within 16", "step position error", "step ratio error p50 / p90",
               "drift ratio error p50",
               "ms / history"]
    for spec in blocks:
        rows = [[f"{spec.name} {m}", *[SUMMARY[(spec.name, m)].get(f, "") for f in figures]] for m in METHODS]
        if spec.kind == "null":
            rows = [[r[0], r[1], r[-1]] for r in rows]
            table(["block / method", figures[0], figures[-1]], rows)
        else:
            table(["block / method", *figures], rows)
        print()
    minimal_reproducer()
    print()
    if REPRODUCERS:
        print("== examples where the windowed search did worse (regenerate: --show BLOCK INDEX)")
        for line in REPRODUCERS:
            print(f"  {line}")
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
