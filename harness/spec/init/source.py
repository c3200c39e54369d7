"""Where this harness was installed from: the pinned pip requirement the generated workflows install."""

from __future__ import annotations

import json
from importlib import metadata

DISTRIBUTION = "mlx-kernel-harness"


def source_from_direct_url(direct_url: dict) -> str | None:
    """A pinned pip requirement for the harness from its PEP 610 ``direct_url.json``: a git install gives
    ``mlx-kernel-harness @ git+URL@COMMIT``; anything else (a local folder, an editable checkout) gives None."""
    vcs = direct_url.get("vcs_info") or {}
    url = direct_url.get("url", "")
    if vcs.get("vcs") == "git" and vcs.get("commit_id") and not url.startswith("file:"):
        return f"{DISTRIBUTION} @ git+{url}@{vcs['commit_id']}"
    return None


def installed_source() -> str | None:
    """Where this harness was installed from, pinned to the commit (None when not from a public git URL)."""
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None  # installed from an index: pin the version
    try:
        return source_from_direct_url(json.loads(text))
    except json.JSONDecodeError:
        return None


def index_source() -> str | None:
    """``mlx-kernel-harness==X`` when this harness came from a package index (no direct URL recorded)."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    if dist.read_text("direct_url.json") or not dist.read_text("INSTALLER"):  # a URL, or a source tree's egg-info
        return None
    return f"{DISTRIBUTION}=={dist.version}"
