"""Read side of the store: every database read of the analysis and the report, returned as plain data.

``harness.analysis`` turns these rows and arrays into verdicts without touching SQLAlchemy or the models. Callers
import the package (``from harness.record import query``; ``query.chip_history(...)``): the names below are its
public read API, grouped by the module that owns them:

- ``refs``: the run views (``RunView``, ``runs``, ``latest_run``, ``get_run``, ``latest_runs``), the chips
  (``chips``, ``chip_keys``, ``check_chip``) and the resolution of commit and run references (``resolve_ref``);
- ``order``: order by ancestry: the run a run is compared with (``previous_run``), whether stored ancestry puts one
  commit before another (``ancestry_proves``) and each chip's tip per suite (``chip_tip``, ``chip_tips``);
- ``series``: the comparison reads of compare, variants and noise: the samples, history medians, timing modes and
  correctness failures of given runs (``series_trials``, ``history_medians``, ``correctness_failures``), and the
  wall seconds of their trials (``trial_seconds``, what a settle round of them may take);
- ``presence``: which run has which job, no samples read (``job_presence``, ``job_units``, ``benchmark_series``);
- ``history``: one chip's whole history as arrays (``chip_history``, cached per database state), its commit order,
  timing modes and correctness jobs (history and regressions);
- ``samples``: a chip's samples read and arranged per (commit, series) cell and per trial (``load_samples``,
  ``load_cell_trials``, ``arrange_samples``);
- ``report``: the report's evidence path (``run_briefs``, ``job_samples``);
- ``common``: what the modules share (``SeriesKey``, ``plain_rows``, ``run_filter``); ``harness.record.analysis_cache``
  reads through ``plain_rows``, ``run_filter`` and ``history.arranged`` too.
"""

from harness.record.query.common import SeriesKey, plain_rows, run_filter
from harness.record.query.history import (
    EVENT_KINDS,
    ChipHistory,
    arranged,
    arranged_in,
    chip_history,
    chip_order_proven,
    commit_timing_modes,
    correctness_statuses,
    failing_correctness_jobs,
    guessed_commits,
)
from harness.record.query.order import (
    NOT_PROVEN,
    SuiteTip,
    ancestry_proves,
    chip_tip,
    chip_tips,
    previous_run,
    previous_run_id,
)
from harness.record.query.presence import (
    SELECTION_KINDS,
    JobPresence,
    benchmark_series,
    job_presence,
    job_units,
    measured_series,
    runs_with_jobs,
    unit_of,
)
from harness.record.query.refs import (
    JOB_FIELDS,
    MIN_PREFIX,
    ResolvedRef,
    RunView,
    check_chip,
    chip_keys,
    chips,
    get_run,
    latest_run,
    latest_runs,
    prefetch_refs,
    resolve_ref,
    runs,
)
from harness.record.query.report import JobSamples, RunBrief, job_samples, run_briefs
from harness.record.query.samples import SampleLayout, arrange_samples, load_cell_trials, load_samples
from harness.record.query.series import (
    FailureRow,
    SeriesTrials,
    correctness_failures,
    history_medians,
    history_run_ids,
    host_paced_series,
    series_trials,
    timing_modes,
    trial_seconds,
)

__all__ = [
    # refs: runs, chips, references
    "JOB_FIELDS", "MIN_PREFIX", "ResolvedRef", "RunView", "check_chip", "chip_keys", "chips", "get_run", "latest_run",
    "latest_runs", "prefetch_refs", "resolve_ref", "runs",
    # order: by ancestry
    "NOT_PROVEN", "SuiteTip", "ancestry_proves", "chip_tip", "chip_tips", "previous_run", "previous_run_id",
    # series: the comparison reads
    "FailureRow", "SeriesTrials", "correctness_failures", "history_medians", "history_run_ids", "host_paced_series",
    "series_trials", "timing_modes", "trial_seconds",
    # presence: which run has which job
    "SELECTION_KINDS", "JobPresence", "benchmark_series", "job_presence", "job_units", "measured_series",
    "runs_with_jobs", "unit_of",
    # history: one chip's history
    "EVENT_KINDS", "ChipHistory", "arranged", "arranged_in", "chip_history", "chip_order_proven", "guessed_commits",
    "commit_timing_modes",
    "correctness_statuses", "failing_correctness_jobs",
    # samples: a chip's samples as arrays
    "SampleLayout", "arrange_samples", "load_cell_trials", "load_samples",
    # report: the evidence path
    "JobSamples", "RunBrief", "job_samples", "run_briefs",
    # common
    "SeriesKey", "plain_rows", "run_filter",
]
