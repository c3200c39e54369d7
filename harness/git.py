"""The repository under test: which commit, whether the tree is dirty, and a clean worktree of any commit."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harness.errors import HarnessError

CACHE_DIR = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "mlx-harness"))


def _git(repo: str | Path, *args: str, check: bool = True) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise HarnessError("git is not installed") from None
    if check and done.returncode != 0:
        raise HarnessError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout.strip()


@dataclass(frozen=True)
class CommitInfo:
    """A resolved commit: full sha plus what the report shows about it."""

    sha: str
    message: str
    author: str
    committed_at: datetime | None
    branch: str
    repo: str

    def as_row(self) -> dict:
        return {"sha": self.sha, "message": self.message, "author": self.author,
                "committed_at": self.committed_at, "branch": self.branch, "repo": self.repo}


def is_repo(path: str | Path) -> bool:
    return _git(path, "rev-parse", "--git-dir", check=False) != ""


def has_commits(repo: str | Path) -> bool:
    return bool(_git(repo, "rev-parse", "--verify", "--quiet", "HEAD", check=False))


def resolve(repo: str | Path, rev: str = "HEAD") -> CommitInfo:
    """Resolve ``rev`` in ``repo`` to a full sha with its message; a clear error if it does not exist."""
    if not is_repo(repo):
        raise HarnessError(f"{repo} is not a git repository")
    sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if not sha:
        raise HarnessError(f"commit {rev!r} does not exist in {repo}")
    fmt = _git(repo, "show", "-s", "--format=%an%x00%cI%x00%B", sha)
    author, date, message = (fmt.split("\x00", 2) + ["", ""])[:3]
    branch = _git(repo, "rev-parse", "--abbrev-ref", "HEAD", check=False)
    return CommitInfo(sha, message.strip(), author, datetime.fromisoformat(date) if date else None,
                      "" if branch == "HEAD" else branch, origin(repo))


def origin(repo: str | Path) -> str:
    """A name for the repository: its origin URL if any, else its folder name."""
    url = _git(repo, "remote", "get-url", "origin", check=False)
    return url or Path(_git(repo, "rev-parse", "--show-toplevel")).name


def is_dirty(repo: str | Path) -> bool:
    """Uncommitted changes to tracked files (untracked files do not change what runs)."""
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))


def toplevel(path: str | Path) -> Path:
    return Path(_git(path, "rev-parse", "--show-toplevel"))


def worktree(repo: str | Path, sha: str) -> Path:
    """A clean, detached worktree of exactly ``sha`` (created once, reused, verified every time)."""
    key = hashlib.sha1(str(Path(repo).resolve()).encode()).hexdigest()[:10]
    path = CACHE_DIR / "worktrees" / f"{key}-{sha[:12]}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _git(repo, "worktree", "prune", check=False)
        _git(repo, "worktree", "add", "--detach", "--force", str(path), sha)
    verify_tree(path, sha)
    return path


def verify_tree(path: str | Path, sha: str) -> None:
    """Refuse a tree that is not exactly ``sha`` or has local changes."""
    head = _git(path, "rev-parse", "HEAD")
    if head != sha:
        raise HarnessError(f"tree {path} is at {head[:12]}, not the requested {sha[:12]}")
    if is_dirty(path):
        raise HarnessError(f"tree {path} has local changes; refusing to run a dirty tree as {sha[:12]}")
