"""Helpers shared by the test suite and the benchmark scripts (not shipped): paths, scratch PostgreSQL
databases, loopback Ray clusters, CLI runners, synthetic analysis data. No test module imports another."""
