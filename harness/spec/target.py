"""Which commit a run executes, from which tree, with which suite: the harness's own kernels or another
repository's ``harness.toml`` (docs/external-repos.md).

The rules (``harness run [--repo PATH_OR_URL] [--commit REV] [--suite FILE]``):

- ``--repo`` a URL (``https://``, ``ssh://``, ``file://``, ``git@host:path``): fetched into the per-machine
  clone cache and checked out in a verified clean worktree of exactly the commit (``harness.spec.git.checkout``);
  ``--commit`` defaults to the remote's HEAD.
- ``--repo`` a local path (default ``.``): if the commit (default HEAD) has a ``harness.toml`` at its root and
  no ``--suite`` is given, or ``--suite`` is a repository suite (``[install]``, ``[[pytest]]``,
  ``[[function]]``), the commit is checked out the same way (a mirror clone in the cache: the user's
  repository gets no worktrees, and uncommitted changes are not run). Otherwise it is the harness's own
  kind of run, unchanged (:func:`harness.spec.target.resolve_target`: HEAD from the current install, dirty flag
  recorded; another commit from a clean worktree).
- The suite: ``--suite`` if given (a relative path is looked up in the commit's tree first), else the tree's
  ``harness.toml``, else the built-in suite (jobs/builtin.toml) for a harness checkout; another repository
  without ``harness.toml`` is an error. A repository suite's ``pytest.paths`` must exist in the tree.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harness.core.errors import HarnessError, SuiteError
from harness.spec import git
from harness.spec.suite import Suite, check_tree, load_suite


@dataclass(frozen=True)
class Target:
    """The commit to run and the tree its code is imported from (None: the current install)."""

    commit: dict
    dirty: bool
    tree: str | None


def resolve_target(repo: str, rev: str | None) -> Target:
    """HEAD of ``repo`` (dirty flag recorded) by default; any other commit runs from a clean worktree."""
    unversioned = Target({"sha": "unversioned", "repo": Path(repo).resolve().name}, True, None)
    if not git.is_repo(repo):
        if rev:
            raise HarnessError(f"--commit {rev} needs a git repository, and {Path(repo).resolve()} is not one")
        return unversioned
    top = git.toplevel(repo)
    if rev is None and not git.has_commits(top):
        return unversioned
    head = git.resolve(top, "HEAD")
    wanted = git.resolve(top, rev) if rev else head  # its branch: the one ``rev`` names ("" for a sha)
    dirty = git.is_dirty(top)
    if wanted.sha == head.sha and (rev is None or not dirty):
        return Target(wanted.as_row(), dirty, None)
    return Target(wanted.as_row(), False, str(git.worktree(top, wanted.sha)))


SUITE_FILE = "harness.toml"


def display_url(url: str) -> str:
    """The URL without any password or token (shown in errors)."""
    parts = urlsplit(url)
    if parts.password or (parts.username and parts.scheme in ("http", "https")):
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _in_commit(top: Path, sha: str, path: str) -> bool:
    done = subprocess.run(["git", "-C", str(top), "cat-file", "-e", f"{sha}:{path}"], capture_output=True,
                          check=False)
    return done.returncode == 0


def checkout_target(repo: str, rev: str, name: str | None = None, branch: str | None = None) -> Target:
    """A clean, verified worktree of exactly ``rev`` of ``repo`` (path or URL) in the cache, as a run target.

    ``name``: the repository's identity (None: the clone's, ``harness.spec.git.identity``: the URL's
    ``host/owner/name``, or the root commit for a local path). ``branch``: the branch the run is for (None: the
    branch ``rev`` names in the clone, "" for a sha).
    """
    try:
        tree, sha = git.checkout(repo, rev)
    except HarnessError as exc:
        message = str(exc).replace(repo, display_url(repo))
        raise HarnessError(f"cannot check out {rev} from {display_url(repo)}: {message}") from None
    git.verify_tree(tree, sha)
    info = git.resolve(tree, sha)
    if branch is None:
        branch = git.mirror_branch(repo, rev)
    return Target({**info.as_row(), "repo": name or info.repo, "branch": branch}, False, str(tree))


def _suite_file(tree: Path, suite: str) -> Path:
    candidate = Path(suite)
    if not candidate.is_absolute() and (tree / candidate).is_file():
        return tree / candidate
    return candidate


def _is_harness_tree(tree: Path) -> bool:
    return (tree / "jobs" / "builtin.toml").is_file() and (tree / "harness" / "worker.py").is_file()


def _tree_suite(target: Target, suite: str | None, repo: str) -> Suite:
    """The suite of a checked-out commit; its errors name the file as ``REPO@SHA:harness.toml``."""
    tree = Path(target.tree)
    try:
        return _load_tree_suite(target, tree, suite, repo)
    except SuiteError as exc:
        where = f"{display_url(repo)}@{target.commit['sha'][:12]}:"
        raise SuiteError(str(exc).replace(f"{tree}/", where)) from None


def _load_tree_suite(target: Target, tree: Path, suite: str | None, repo: str) -> Suite:
    if suite is not None:
        loaded = load_suite(_suite_file(tree, suite))
    elif (tree / SUITE_FILE).is_file():
        loaded = load_suite(tree / SUITE_FILE)
    elif _is_harness_tree(tree):
        return load_suite(None)
    else:
        raise HarnessError(f"{display_url(repo)} has no {SUITE_FILE} at {target.commit['sha'][:12]}: add one "
                           "(docs/external-repos.md) or pass --suite")
    if loaded.needs_tree:
        check_tree(loaded, tree)
    return loaded


def resolve_run(repo: str, rev: str | None, suite: str | None) -> tuple[Target, Suite]:
    """The run's target (commit row, dirty flag, tree) and its validated suite; one-line errors."""
    if not git.is_local_path(repo):
        target = checkout_target(repo, rev or "HEAD")
        return target, _tree_suite(target, suite, repo)
    path = Path(repo).expanduser()
    if not path.exists():
        raise HarnessError(f"--repo {repo}: no such directory (and not a git URL)")
    loaded = load_suite(suite) if suite is not None and Path(suite).is_file() else None
    if git.is_repo(path) and git.has_commits(path):
        top = git.toplevel(path)
        info = git.resolve(top, rev or "HEAD")
        wants_tree = (loaded.needs_tree if loaded is not None
                      else suite is None and _in_commit(top, info.sha, SUITE_FILE))
        if wants_tree:
            target = checkout_target(str(top), info.sha, info.repo, info.branch)
            return target, _tree_suite(target, suite, str(top))
    target = resolve_target(repo, rev)
    if loaded is None:
        loaded = load_suite(suite)
    if loaded.needs_tree:  # a repository suite with no commit to check out: run the folder as it is
        check_tree(loaded, target.tree or path.resolve())
        if target.tree is None:
                    target = Target(target.commit, target.dirty, str(path.resolve()))
    return target, loaded
