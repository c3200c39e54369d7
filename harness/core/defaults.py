"""Every default a user can override, in one place: the verdicts' thresholds and the timing protocol.

The statistics (harness.core.stats), the suite schema (harness.spec.suite), the timing protocol
(harness.execute.timing) and the CLI options all read them from here; the reasons for each value are in
harness.core.stats's docstring (thresholds) and harness.execute.timing's (timing).
"""

from __future__ import annotations

# Verdicts
MIN_EFFECT = 0.02  # the smallest relative change in a median that is reported as a change
ALPHA = 0.05  # false discovery rate across a grid (Benjamini-Hochberg), or one test's level
N_BOOT = 2000  # bootstrap resamples for the ratio-of-medians interval
MIN_SAMPLES = 5  # fewer samples on a side: inconclusive

# Timing protocol (per benchmark job)
WARMUP_S = 0.2  # at least this long warming up (JIT, caches, clocks) ...
WARMUP_CALLS = 3  # ... and at least this many calls
MIN_SAMPLE_S = 0.02  # one sample times enough back-to-back calls to last this long
SAMPLES = 10  # samples per job
MAX_INNER = 10_000  # at most this many calls per sample
TIMEOUT_S = 300.0  # a benchmark job is killed after this long
THREADS = None  # BLAS/OpenMP threads of a timed job process: None leaves OMP_NUM_THREADS & co. as inherited
