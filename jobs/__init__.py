"""Spec: the built-in job suites, declared as data (TOML)."""
