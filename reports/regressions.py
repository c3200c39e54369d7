"""The regression list and its Atom feed: regressions grouped by series, with their ids and commit ranges."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reports.render import fmt_iso

# --- the regression list ------------------------------------------------------------------------------------------


def regression_id(reg: Any) -> str:
    """A regression's id, the same in every build (``harness ack ID``): 12 hex digits of a digest of its kind,
    chip, series (or check) and commits."""
    parts = (reg.kind, reg.chip, reg.kernel, reg.variant, reg.dtype, reg.shape_key, getattr(reg, "check", ""),
             reg.base_sha or "", reg.head_sha)
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:12]


@dataclass
class RegressionGroup:
    """The regressions of one kind at one commit of one chip (against one previous commit): one row of the list,
    its series inside. ``items``: (index in the list, regression, its id); ``acked``: the ids acknowledged."""

    kind: str
    chip: str
    head_sha: str
    base_sha: str | None
    items: list[tuple[int, Any, str]]
    acked: set[str]
    range_url: str | None = None

    @property
    def anchor(self) -> str:
        return f"g-{self.kind[0]}-" + hashlib.sha1("\0".join((self.chip, self.base_sha or "", self.head_sha))
                                                   .encode()).hexdigest()[:10]

    @property
    def first(self) -> Any:
        return self.items[0][1]

    @property
    def all_acked(self) -> bool:
        return all(rid in self.acked for _, _, rid in self.items)

    @property
    def worst(self) -> Any:
        """The largest slowdown (performance) or the first failure."""
        return max((r for _, r, _ in self.items), key=lambda r: r.ratio or 0.0)


def range_url(commit_url: str | None, head: str, base: str | None) -> str | None:
    """The repository host's view of the commits from ``base`` to ``head``, from ``head``'s commit page as
    ``harness.spec.weburl`` makes it (or a ``--commit-url`` of those hosts): GitHub's and GitLab's
    ``compare/BASE...HEAD``, Bitbucket's branch compare; None for any other host."""
    if not commit_url or not base or not commit_url.endswith(head) or not commit_url.startswith("https://"):
        return None
    stem = commit_url[:-len(head)]
    host = stem[len("https://"):].split("/", 1)[0]
    if host.startswith("gitlab.") and stem.endswith("/-/commit/"):
        return f"{stem[:-len('/-/commit/')]}/-/compare/{base}...{head}"
    if host.startswith("github.") and stem.endswith("/commit/"):
        return f"{stem[:-len('/commit/')]}/compare/{base}...{head}"
    if host == "bitbucket.org" and stem.endswith("/commits/"):
        return f"{stem[:-len('/commits/')]}/branches/compare/{head}%0D{base}"
    return None


def regression_groups(regressions: Sequence[Any], acks: Mapping[str, Any] | None = None,
                      commit_urls: Mapping[str, str] | None = None) -> list[RegressionGroup]:
    """The list grouped by (kind, chip, previous commit, commit), newest commit first within a kind (correctness
    first); ``commit_urls`` (sha -> its web page) give each group its range link (``range_url``)."""
    groups: dict[tuple[str, str, str | None, str], RegressionGroup] = {}
    for i, reg in enumerate(regressions):
        key = (reg.kind, reg.chip, reg.base_sha, reg.head_sha)
        group = groups.get(key)
        if group is None:
            url = range_url((commit_urls or {}).get(reg.head_sha), reg.head_sha, reg.base_sha)
            group = groups[key] = RegressionGroup(reg.kind, reg.chip, reg.head_sha, reg.base_sha, [], set(), url)
        rid = regression_id(reg)
        group.items.append((i, reg, rid))
        if acks and rid in acks:
            group.acked.add(rid)

    def when(group: RegressionGroup) -> float:
        started = group.first.head_started_at
        return started.timestamp() if started is not None else 0.0

    return sorted(groups.values(), key=lambda g: (g.kind != "correctness", -when(g)))


def regressions_context(regressions: Sequence[Any], acks: Mapping[str, Any] | None = None,
                        commit_urls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``regressions.html`` and ``regressions.atom`` read: the list (with indices), its groups, the
    acknowledgements (id -> record with ``note``, ``acked_at``, ``acked_by``), and the feed's id and time."""
    groups = regression_groups(regressions, acks, commit_urls)
    times = [r.head_started_at for r in regressions if r.head_started_at is not None]
    digest = hashlib.sha256("\0".join(sorted({r.chip for r in regressions})).encode()).hexdigest()[:16]
    return {"regressions": list(enumerate(regressions)), "groups": groups, "acks": dict(acks or {}),
            "acked_count": sum(len(g.acked) for g in groups), "feed_id": digest,
            "feed_updated": fmt_iso(max(times) if times else None)}
