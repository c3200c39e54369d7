"""Core: the vocabulary every stage shares (statuses, jobs and results, errors, chip identity, configuration, pure
statistics). Imports nothing else from harness."""
