"""The report's history and regression analysis, cached in the database so that a report after a new run recomputes
only what the run changed (``harness.record.analysis_cache`` stores the rows; ``analyse`` is the entry point).

Modules: ``common`` (code version, digests, payload frame, the rows to write, log and counts), ``cells`` (per
commit), ``families`` (change points and regression families), ``chips`` (a chip's whole analysis and ``analyse``),
``jobs`` (the job catalogue) and ``pages`` (compare reports, noise meters, the variant matrix's cells).

What is kept, per chip (``analysis_cache.kind``):

- ``cells`` (``cells+dirty`` with dirty runs), one row per commit: for every series measured at the commit,
  everything the analysis reads of that cell's samples -- the history point's level, interval and sample count
  (``history.trial_levels``) and the trial and run summaries the regression screen works on
  (``regressions.cell_summaries``).  Each depends on the cell's own samples only, so a commit's row holds while its
  runs do.  Key: the code version and the fingerprints of the commit's included runs (``analysis_cache.chip_state``:
  id, dirty, start, finish, status, branch and the count/min/max/sum of their job ids -- a new, deleted, reaped,
  finished, re-dated or re-flagged run, a run gaining or losing jobs, a bundle's runs all change it).  A later trial
  appended to a stored job adds samples and no job: each row carries the highest sample id when it was checked
  (``watermark``, advanced by the ``stamps`` row), and a sample of its runs above it (``touched_since``) makes it
  stale.  A commit with a run not finished is computed every time and never stored (its samples may still come, and
  on PostgreSQL commit with ids below a watermark already read).
- ``series``: the series lists the ``cells`` rows refer to, named by their digest (content-addressed).
- ``changes``, one row per window searched (``stats.changepoints.windows``: a line of up to ``WINDOW`` commits is
  one window; a longer one is searched in half-overlapping windows, all but the newest ending at a fixed commit): what
  the search found in it, named and keyed by a digest of exactly what ``stats.changepoints.detect_in_window`` is
  given (the window's levels, bit for bit, and the parameters).  After a new run each series searches its newest
  window only, at times one more; rows of windows no longer searched are deleted.  Each set of options (``last``,
  dirty runs) keeps its windows under a kind of its own (``changes_kind``).
- ``families``, one row per chip and window: each commit's confirmed regressions (its family: every series against
  its previous point, BH across the commit's grid), keyed per commit by a digest of the commits the family reads
  (the head and, up its chain of previous commits, as far as the bases and history floors reach) with their cells'
  identities, the kernels broken at the head and the parameters.
- ``correctness``: the chip's correctness job statuses and failures, keyed by all its runs' fingerprints (a
  correctness job is written once).
- ``compare``, one row per pair of run sets a compare page the report shows compares (``ComparePages``): the
  ``harness compare`` report, keyed by the fingerprints of everything it reads -- both sides' runs and the runs the
  base side's history floors come from (``analysis_cache.run_prints``: a run's fingerprint plus its highest sample id,
  read once per report) -- and the parameters.  A row is named by the runs, not by the refs: a regression's (base,
  head) commits reuse the chip page's compare of the same two runs, named by run ids, with the sides as resolved now.
  Rows of pairs the report no longer shows are deleted.
- ``noise``, one row per chip page's (chip, runs) (``NoiseRows``): its noise meters, keyed as a compare page is (the
  runs and their history runs with their fingerprints).
- ``variants``, one row per chip (``VariantCells``): what the variant matrix reads of the samples of its cells on
  the chip (each cell's trial log medians and counts, ``measure.measure``), keyed by the cells with their runs, the
  default variants and the runs' fingerprints; the matrix's verdicts (moderation and BH across every chip's cells)
  are computed from all chips' rows each time.
- ``chip``, one row per chip and options (dirty runs, window, change points): the chip's whole analysis -- every
  series' history points and change points, and its regression list -- keyed by the code version, the parameters,
  the history order with each commit's identity (``analysis_cache.arrangement``) and the fingerprints of all its
  included runs, with the watermark: a chip none of whose runs changed (after a new run on another chip, or a report
  with nothing new) is read from this one row instead of assembled from its commits' rows; a sample of its runs above
  the watermark (a later trial) or any other change recomputes it from the rows above.  Found unchanged, its
  watermark is raised to the report's (``analysis_cache.stamp``), as is the ``jobs`` row's: the next check reads
  only the samples written since, however many runs other chips gain meanwhile.  The row holds a SHA-256 of its
  contents: with the key (which holds the commits) it stands for everything the chip's histories are made of, so
  the report's history pages are fingerprinted by it (``CacheStats.whole``), the same when the chip is computed and
  when it is reused.  A report's forked analysis hands the rows it computed to the report's process
  (``ChipRows``), which stores them while the history pages are drawn.
- ``jobs``: the chip's distinct jobs (``job_catalogue``: the chip pages' units, the variant matrix's series), keyed
  by the fingerprints of all its runs, dirty ones too, with the watermark (a later trial may give a job its median);
  a chip that only gained runs reads the new runs' jobs alone.

The history order, window, commit messages and correctness events are derived afresh every time (no samples read);
histories are rebuilt from the cells.  The code version (``code_version``) hashes the analysis sources, numpy's and
scipy's versions: any change recomputes everything.  A row that is missing, unreadable or under another key is
recomputed; rows are written after the analysis (a failed write costs only time).  Results equal those of
``history.history`` and ``regressions.regressions`` bit for bit (both take the series in key order).
"""

from harness.analysis.cache.chips import analyse
from harness.analysis.cache.common import CacheStats, cache_log, code_version, log, replay_log
from harness.analysis.cache.jobs import JobCatalogue, job_catalogue
from harness.analysis.cache.pages import ComparePages, NoiseRows, RunPrints, VariantCells, job_ids

__all__ = ["CacheStats", "ComparePages", "JobCatalogue", "NoiseRows", "RunPrints", "VariantCells", "analyse",
           "cache_log", "code_version", "job_catalogue", "job_ids", "log", "replay_log"]
