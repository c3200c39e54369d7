"""Bisect: the pure noise-aware search over commits (search, perf, prober), what one run says about a commit (probes,
selection), and the driver that probes commits with real runs (run, runner, report)."""
