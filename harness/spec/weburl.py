"""Where a commit can be seen on the web: a git remote mapped to its host's commit page, or a configured template.

``commit_url_template(remote)`` knows the three big hosts' layouts (GitHub and GitHub Enterprise hosts named
``github.*``, GitLab and hosts named ``gitlab.*``, Bitbucket) for the remote forms git accepts (``git@host:o/r.git``,
``ssh://git@host[:port]/o/r``, ``https://[user@]host/o/r[.git]``, ``git://host/o/r``); anything else (a local path,
a bundle file, an unknown host) has no web page and gives None. Credentials in a remote URL never reach the result.
A template is a URL with ``{sha}`` where the full commit sha goes (``check_template``).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from harness.core.errors import HarnessError
from harness.spec import git

__all__ = ["check_template", "commit_url_template", "compare_url", "is_remote", "link", "remote_url"]

# user@host:path (scp-like syntax: no scheme, a colon before any slash)
_SCP = re.compile(r"^(?:[^@/]+@)?(?P<host>[^:/]+):(?P<path>(?!//).+)$")


def _host_path(remote: str) -> tuple[str, str] | None:
    remote = remote.strip()
    if "://" in remote:
        parts = urlsplit(remote)
        if parts.scheme not in ("https", "http", "ssh", "git", "git+ssh", "ssh+git") or not parts.hostname:
            return None
        return parts.hostname.lower(), parts.path
    match = _SCP.match(remote)
    if match is None or len(match["host"]) == 1:  # "C:\\repo" is a Windows path, not a host
        return None
    return match["host"].lower(), match["path"]


def is_remote(text: str | None) -> bool:
    """Whether ``text`` is a remote URL with a host (not a local path or a bare folder name)."""
    return _host_path(text or "") is not None


def commit_url_template(remote: str | None) -> str | None:
    """The web page of a commit of ``remote`` as a template with ``{sha}``; None when the host is not known."""
    found = _host_path(remote or "")
    if found is None:
        return None
    host, path = found
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[:-4]
    segments = [s for s in path.split("/") if s]
    if len(segments) < 2 or any(s in (".", "..") or not re.fullmatch(r"[A-Za-z0-9._~-]+", s) for s in segments):
        return None
    if host.startswith("ssh.") and host.count(".") >= 2:  # ssh.github.com (port 443 ssh) serves github.com
        host = host[len("ssh."):]
    base = f"https://{host}/{'/'.join(segments)}"
    if host == "github.com" or host.startswith("github."):
        return f"{base}/commit/{{sha}}" if len(segments) == 2 else None
    if host == "gitlab.com" or host.startswith("gitlab."):
        return f"{base}/-/commit/{{sha}}"  # groups nest: every segment is the project path
    if host == "bitbucket.org":
        return f"{base}/commits/{{sha}}" if len(segments) == 2 else None
    return None


def check_template(template: str) -> str:
    """A commit URL template: http(s), ``{sha}`` in it and no other field; HarnessError (one line) otherwise."""
    if "{sha}" not in template:
        raise HarnessError(f"--commit-url {template!r} has no {{sha}} (e.g. 'https://host/repo/commit/{{sha}}')")
    try:
        filled = template.format(sha="0" * 40)
    except (KeyError, IndexError, ValueError) as exc:
        raise HarnessError(f"--commit-url {template!r}: only {{sha}} may be in braces ({exc})") from None
    if urlsplit(filled).scheme not in ("http", "https") or not urlsplit(filled).netloc:
        raise HarnessError(f"--commit-url {template!r} is not an http(s) URL")
    return template


def link(template: str | None, sha: str) -> str | None:
    return template.format(sha=sha) if template else None


def remote_url(path: str | Path) -> str | None:
    """The ``origin`` remote URL of the git repository at ``path``; None when it is not one or has no origin."""
    if not Path(path).expanduser().is_dir() or not git.is_repo(path):
        return None
    return git.remote_get_url(path) or None


def compare_url(commit_url: str | None, head: str, base: str) -> str | None:
    """The host's view of the commits from ``base`` to ``head``, from ``head``'s commit page (``commit_url``, as
    ``commit_url_template`` makes it): GitHub's and GitLab's ``compare/BASE...HEAD``, Bitbucket's branch compare;
    None for any other page (a ``--commit-url`` template of another host)."""
    if not commit_url or not base or not commit_url.endswith(head):
        return None
    stem = commit_url[:-len(head)]
    for commit_part, compare_part in (("/-/commit/", "/-/compare/"), ("/commit/", "/compare/")):
        if stem.endswith(commit_part) and stem.startswith("https://"):
            return f"{stem[:-len(commit_part)]}{compare_part}{base}...{head}"
    if stem.startswith("https://bitbucket.org/") and stem.endswith("/commits/"):
        return f"{stem[:-len('/commits/')]}/branches/compare/{head}%0D{base}"
    return None
