"""Bisect: the pure noise-aware search over commits, and the driver that probes commits with real runs."""
