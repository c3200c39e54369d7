"""Spec and plan: load a suite (jobs/*.toml or a repository's harness.toml), resolve the commit to run, expand into
jobs with stable keys; `harness init`'s scan and generated files (init)."""
