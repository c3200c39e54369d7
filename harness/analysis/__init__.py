"""Analyse: compare, variant verdicts, history and regressions, built on record's queries and harness.stats."""
