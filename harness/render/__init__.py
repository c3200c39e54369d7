"""Render: load analysed data and hand plain records to reports/ (Jinja2) to write the static site."""
