"""Fixtures of the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.e2e import git


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty git repository to commit a suite into."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "T")
    return tmp_path
