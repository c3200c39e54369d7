"""Process states, read from Linux's /proc, for tests that check what a command leaves running."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Running: a zombie has ended (its parent, or the new one of an orphan, may not have reaped it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
