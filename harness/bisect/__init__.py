"""Bisect: the pure noise-aware search over commits (search), what one run says about a commit (probes), and the
driver that probes commits with real runs (run)."""
