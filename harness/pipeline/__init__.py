"""Pipeline: one run end to end (plan, execute, record) for the local chip or a planned job list."""
