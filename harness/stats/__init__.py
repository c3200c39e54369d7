"""The statistics that decide every verdict (compare, regressions, variants, bisect, settle): pure functions of
timings, no database and no rendering. The model, each rule and its validation: docs/statistics.md.

Modules: ``policy`` (the thresholds), ``samples`` (robust summaries of samples), ``decide`` (the decision rules),
``trials`` (trial-level comparison and moderation), ``runshift`` (history floor, run-shift hold), ``noise`` (the
noise meter), ``variants`` (variant verdicts), ``modes`` (timing modes alike), ``settling`` (the settle rules),
``changepoints``, ``distributions``, ``pacing``, ``summary``.
"""
