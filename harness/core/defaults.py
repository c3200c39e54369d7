"""Every default a user can override, in one place: the verdicts' thresholds and the timing protocol.

The statistics (harness.stats), the suite schema (harness.spec.suite), the timing protocol
(harness.execute.timing) and the CLI options all read them from here; the reasons for each value are in
docs/statistics.md (thresholds) and harness.execute.timing's docstring (timing).
"""

from __future__ import annotations

import os

# Verdicts
MIN_EFFECT = 0.02  # the smallest relative change in a median that is reported as a change
ALPHA = 0.05  # false discovery rate across a grid (Benjamini-Hochberg), or one test's level
BISECT_MAX_RUNS = 5  # harness bisect, perf: new runs of one commit at most while it is undecided
BISECT_CONFIRM_RUNS = 4  # harness bisect, perf: agreeing runs the named culprit (and the bad endpoint) need
# An observed ratio beyond x2 or /2 is never "unchanged": not significant means its noise is too wide to tell (in
# CI, x2+ slower code on a 3-run floor of a loaded machine came out "unchanged"). Identical H200 runs reach x1.55.
LARGEST_UNCHANGED = 2.0
HISTORY_RUNS = 20  # a series' noise floor: the spread of its medians over at most this many recent base-branch runs

# Timing protocol (per benchmark job)
WARMUP_S = 0.2  # at least this long warming up (JIT, caches, clocks) ...
WARMUP_CALLS = 3  # ... and at least this many calls
MIN_SAMPLE_S = 0.02  # one sample times enough back-to-back calls to last this long
SAMPLES = 10  # samples per job
MAX_INNER = 10_000  # at most this many calls per sample
TIMEOUT_S = 300.0  # a benchmark job is killed after this long
TRIALS = 3  # independent trials (fresh processes) per benchmark job and run, interleaved in rounds
TIMING_MODE = "pipelined"  # "pipelined": async_eval, one sync per sample; "per-call": wait for each call; "auto":
# per job, a pilot picks per-call where pipelining raises the spread (launch-bound op chains). Not the default: on
# the H200 the pilot picked differently from run to run for 16 of 104 series, and the two modes' timings differ by
# 5-15 % (ms kernels) to 3x (30 us kernels), so such series cannot be compared (harness.stats.modes.same_mode)
ROUND_BATCH = 24  # a job process times up to this many benchmark jobs of one round (amortises MLX start-up)
# Job processes of one round that start and compile their source kernels together (one core each), then time in
# turn. The H200's built-in benchmark sections (16 cores), 3 trials: 16 at once 482.5 s, 4 at once not done in
# 560.5 s (about 580 s); 1 trial: 169.0 s and 187.2 s, one after the other. More than 16: not measured.
PREPARE_AHEAD = min(16, os.cpu_count() or 1)
THREADS = None  # BLAS/OpenMP threads of a timed job process: None leaves OMP_NUM_THREADS & co. as inherited
# The thread pools a process's numpy / BLAS / OpenMP / numexpr size from their environment when they load.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")
