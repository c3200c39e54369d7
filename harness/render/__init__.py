"""Render: write the static site from plain records (``harness.analysis.site_inputs``); no database query."""
