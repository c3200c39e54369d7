"""Render: static HTML reports (Jinja2, autoescaped) from plain data; no network needed to view them."""
