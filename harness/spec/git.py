"""The repository under test: which commit, whether the tree is dirty, and a clean worktree of any commit."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from harness.core.config import cache_dir
from harness.core.errors import HarnessError
from harness.core.proc import exclusive_lock

FULL_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def _git(repo: str | Path, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout,
                              input=stdin)
    except FileNotFoundError:
        raise HarnessError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise HarnessError(f"git {' '.join(args)} in {repo} took longer than {timeout:g} s") from None
    if check and done.returncode != 0:
        raise HarnessError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout.strip()


@dataclass(frozen=True)
class CommitInfo:
    """A resolved commit: full sha plus what the report shows about it, its parents (full shas, first parent
    first), the branch it was asked for (``branch_name``) and the repository folder it was resolved in."""

    sha: str
    message: str
    author: str
    committed_at: datetime | None
    branch: str
    repo: str
    parents: tuple[str, ...] | None = ()  # None: unknown (the edge of a shallow clone)
    git_dir: str = ""

    def as_row(self) -> dict:
        """The commit row a run is recorded with (``harness.record.store.create_run``): ``git_dir`` is not stored,
        it tells the store where to look up the ancestry of the repository's stored commits."""
        return {"sha": self.sha, "message": self.message, "author": self.author,
                "committed_at": self.committed_at, "branch": self.branch, "repo": self.repo,
                "parents": None if self.parents is None else list(self.parents), "git_dir": self.git_dir}


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
    fmt = _git(repo, "show", "-s", "--format=%an%x00%cI%x00%P%x00%B", sha)
    author, date, parents, message = (fmt.split("\x00", 3) + ["", "", ""])[:4]
    return CommitInfo(sha, message.strip(), author, datetime.fromisoformat(date) if date else None,
                      branch_name(repo, rev), identity(repo),
                      None if sha in shallow_boundary(repo) else tuple(parents.split()),
                      str(Path(repo).expanduser().resolve()))


def shallow_boundary(repo: str | Path) -> set[str]:
    """The commits of a shallow clone whose parents were not fetched (``git clone --depth``, CI checkouts): git
    shows them without parents, which is not the same as a root commit."""
    path = _git(repo, "rev-parse", "--path-format=absolute", "--git-path", "shallow", check=False)
    try:
        return set(Path(path).read_text().split()) if path else set()
    except OSError:
        return set()


def branch_name(repo: str | Path, rev: str = "HEAD") -> str:
    """The branch a run of ``rev`` is made for: ``rev`` itself when it names a branch (``main``,
    ``refs/heads/main``; a remote-tracking ``origin/main`` gives ``main``), HEAD's branch when ``rev`` is HEAD and
    HEAD is on one; "" for anything else (a sha, a tag, a detached HEAD)."""
    if rev == "HEAD":
        return _git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    name = rev.removeprefix("refs/heads/")
    if _git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}", check=False):
        return name
    remote = rev.removeprefix("refs/remotes/")
    if "/" in remote and _git(repo, "rev-parse", "--verify", "--quiet", f"refs/remotes/{remote}", check=False):
        return remote.split("/", 1)[1]
    return ""


def default_branch(repo: str | Path) -> str:
    """origin's default branch where the clone knows it (``origin/HEAD``), else HEAD's branch, else ""."""
    remote_head = _git(repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", check=False)
    return remote_head.split("/", 1)[1] if "/" in remote_head else branch_name(repo)


def ancestry(repo: str | Path, shas: list[str], limit: int, timeout: float = 300) -> dict[str, tuple[str, ...]]:
    """Parents (first parent first) of the given commits and of their ancestors, newest first, at most ``limit``
    commits (one ``git rev-list --parents``); names the repository does not have are left out."""
    if not shas:
        return {}
    out = _git(repo, "rev-list", "--parents", "--ignore-missing", f"--max-count={limit}", "--stdin",
               stdin="\n".join(shas) + "\n", timeout=timeout)
    graph: dict[str, tuple[str, ...]] = {}
    boundary = shallow_boundary(repo)
    for line in out.splitlines():
        sha, *parents = line.split()
        if sha not in boundary:  # a shallow clone's last commits: parents unknown, not none
            graph[sha] = tuple(parents)
    return graph


def present(repo: str | Path, shas: list[str], timeout: float = 300) -> set[str]:
    """Which of ``shas`` (full shas) are commits of the repository (one ``git cat-file --batch-check``)."""
    if not shas:
        return set()
    out = _git(repo, "cat-file", "--batch-check=%(objectname) %(objecttype)", stdin="\n".join(shas) + "\n",
               timeout=timeout, check=False)
    return {line.split()[0] for line in out.splitlines() if line.endswith(" commit")}


def remote_url(repo: str | Path, name: str = "origin") -> str:
    """The URL of remote ``name`` ("" when there is none)."""
    return _git(repo, "remote", "get-url", name, check=False)


def remote_get_url(repo: str | Path, remote: str = "origin") -> str:
    """The URL of ``remote`` in ``repo`` ("" when there is no such remote)."""
    return _git(repo, "remote", "get-url", remote, check=False)


def origin(repo: str | Path) -> str:
    """A name for the repository: its origin URL if any, else its folder name."""
    url = _git(repo, "remote", "get-url", "origin", check=False)
    return url or Path(_git(repo, "rev-parse", "--show-toplevel")).name


# --- repository identity (one history across machines) ------------------------------------------------------

_SCP_REMOTE = re.compile(r"^(?:[^@/:]+@)?(?P<host>[^:/]{2,}):(?P<path>(?!//).+)$")  # git@host:owner/name
ROOT_PREFIX = "root:"  # the identity of a repository without a remote: "root:" + its root commit's sha


def remote_key(url: str) -> str | None:
    """A remote URL as the repository's identity, ``host/owner/name``, however it is spelled: ``https://``,
    ``ssh://``, ``git://``, scp-like ``git@host:owner/name``; the host lower-cased; credentials, port, a trailing
    ``/`` and ``.git`` removed (owner and name keep their case: hosts differ on it). None for what names no host:
    a local path, ``file://``, a bare folder name. An identity already in this form is returned unchanged."""
    url = url.strip()
    if not url or url.startswith(ROOT_PREFIX):
        return None
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http", "ssh", "git", "git+ssh", "ssh+git") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
    elif (match := _SCP_REMOTE.match(url)) and "/" not in match["host"]:
        host, path = match["host"], match["path"]
    elif re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]*/[^/]", url) and not url.startswith(("./", "../")) \
            and "." in url.split("/", 1)[0]:  # host/owner/name already (a host has a dot)
        host, path = url.split("/", 1)
    else:
        return None
    path = path.strip("/")
    path = path.removesuffix(".git").rstrip("/")
    if not path:
        return None
    return f"{host.lower()}/{path}"


def is_identity(key: str) -> bool:
    """Whether a stored repository key is an identity by the rule of :func:`identity` (a normalised remote or a
    root commit), not a checkout path or folder name as rows written before it carry."""
    return key.startswith(ROOT_PREFIX) or (remote_key(key) == key and "://" not in key)


def root_commit(repo: str | Path) -> str:
    """The root commit on HEAD's first-parent line ("" for a repository without commits)."""
    roots = _git(repo, "rev-list", "--first-parent", "--max-parents=0", "HEAD", check=False).split()
    return min(roots) if roots else ""


def identity(repo: str | Path) -> str:
    """The repository's identity, the same on every machine and checkout: its ``origin`` remote (else its only
    remote) normalised by :func:`remote_key`; without a remote that names a host, ``root:<sha>`` of its root
    commit; for a repository without commits, its folder name."""
    url = _git(repo, "remote", "get-url", "origin", check=False)
    if not url:
        remotes = _git(repo, "remote", check=False).split()
        url = remote_url(repo, remotes[0]) if len(remotes) == 1 else ""
    key = remote_key(url) if url else None
    if key:
        return key
    root = root_commit(repo)
    return f"{ROOT_PREFIX}{root}" if root else Path(_git(repo, "rev-parse", "--show-toplevel")).name


def is_dirty(repo: str | Path) -> bool:
    """Uncommitted changes to tracked files (untracked files do not change what runs)."""
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))


def toplevel(path: str | Path) -> Path:
    return Path(_git(path, "rev-parse", "--show-toplevel"))


def worktree(repo: str | Path, sha: str) -> Path:
    """A clean, detached worktree of exactly ``sha`` (created once, reused, verified every time)."""
    key = hashlib.sha1(str(Path(repo).resolve()).encode()).hexdigest()[:10]
    path = cache_dir() / "worktrees" / f"{key}-{sha[:12]}"
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


# --- history between two commits (harness bisect) ------------------------------------------------------------


def is_ancestor(repo: str | Path, ancestor: str, descendant: str) -> bool:
    """Whether commit ``ancestor`` is ``descendant`` or one of its ancestors (``git merge-base --is-ancestor``)."""
    sha = _has_commit(Path(repo), ancestor)
    return bool(sha) and _git(repo, "merge-base", ancestor, descendant, check=False) == sha


def ancestry_path(repo: str | Path, good: str, bad: str, timeout: float = 300) -> list[tuple[str, str]]:
    """(sha, subject) of the commits after ``good`` up to ``bad`` on the ancestry path, oldest first."""
    out = _git(repo, "log", "--reverse", "--ancestry-path", "--format=%H%x00%s", f"{good}..{bad}", timeout=timeout)
    return [(sha, subject) for sha, _, subject in (line.partition("\x00") for line in out.splitlines() if line)]


def subject(repo: str | Path, rev: str, timeout: float = 300) -> str:
    """The first line of ``rev``'s commit message."""
    return _git(repo, "log", "-1", "--format=%s", rev, timeout=timeout)


# --- a repository reached by URL (cluster nodes) ------------------------------------------------------------


def is_local_path(repo: str) -> bool:
    """A path on this machine rather than a URL (``https://``, ``ssh://``, ``file://``, ``git@host:path``)."""
    if "://" in repo:
        return False
    return not re.match(r"^[\w.-]+@[\w.-]+:", repo)


def _has_commit(repo: Path, rev: str) -> str:
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)


def mirror_path(url: str) -> Path:
    """Where this machine keeps its bare clone of ``url`` (one per URL, shared by every run)."""
    return cache_dir() / "repos" / hashlib.sha1(url.encode()).hexdigest()[:16]


def _clone_url(url: str) -> str:
    return str(Path(url).expanduser().resolve()) if is_local_path(url) else url


def mirror_branch(url: str, rev: str) -> str:
    """``branch_name`` of ``rev`` in this machine's clone of ``url`` (after ``fetch``): the remote's branches are
    the clone's, and its HEAD names the remote's default branch; "" when there is no clone."""
    mirror = mirror_path(_clone_url(url))
    return branch_name(mirror, rev) if (mirror / "HEAD").exists() else ""


def fetch(url: str, rev: str, timeout: float = 900) -> tuple[Path, str]:
    """Make sure the per-machine bare clone of ``url`` has ``rev``; return (clone, full sha). Locked per clone."""
    url = _clone_url(url)
    mirror = mirror_path(url)
    with exclusive_lock(mirror.with_suffix(".lock")):
        if not (mirror / "HEAD").exists():
            shutil.rmtree(mirror, ignore_errors=True)  # what an interrupted clone left behind
            mirror.parent.mkdir(parents=True, exist_ok=True)
            _git(mirror.parent, "clone", "--bare", "--quiet", url, str(mirror), timeout=timeout)
        if FULL_SHA.match(rev):  # a full sha never changes meaning: fetch it only when missing
            sha = _has_commit(mirror, rev)
            if not sha:
                _git(mirror, "fetch", "--quiet", url, rev, check=False, timeout=timeout)
                sha = _has_commit(mirror, rev)
        else:  # a branch, tag or short sha: the remote's refs may have moved since the last fetch
            sha = ""
        if not sha:
            _git(mirror, "fetch", "--quiet", "--force", "--prune", url, "+refs/heads/*:refs/heads/*",
                 "+refs/tags/*:refs/tags/*", check=False, timeout=timeout)
            sha = _has_commit(mirror, rev)
        if not sha:
            raise HarnessError(f"commit {rev!r} is not in {url} (or this machine cannot fetch it)")
    return mirror, sha


def checkout(url: str, rev: str, timeout: float = 900) -> tuple[Path, str]:
    """A verified, clean worktree of exactly ``rev`` from ``url``: clone once per machine, a worktree per commit."""
    mirror, sha = fetch(url, rev, timeout)
    with exclusive_lock(mirror.with_suffix(".lock")):
        tree = worktree(mirror, sha)
    return tree, sha
