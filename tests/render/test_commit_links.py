"""Commit links: a git remote mapped to its host's commit page, a configured template, and every sha of the site
linked to one of them (``harness report --commit-url / --repo``)."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from harness.analysis.site_evidence import commit_urls
from harness.core.errors import HarnessError
from harness.pipeline.report import ReportOptions, build_report
from harness.record.query import RunBrief
from harness.spec.weburl import check_template, commit_url_template, is_remote
from reports.render import chip_page_name, history_page_name
from testkit.e2e import git, harness
from tests.render.test_compare_page import APPLE, NVIDIA, REMOTE, SHAS, build_store, check_links

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(("remote", "expected"), [
    ("git@github.com:octo/kernels.git", "https://github.com/octo/kernels/commit/{sha}"),
    ("git@github.com:octo/kernels", "https://github.com/octo/kernels/commit/{sha}"),
    ("ssh://git@github.com/octo/kernels.git", "https://github.com/octo/kernels/commit/{sha}"),
    ("ssh://git@ssh.github.com:443/octo/kernels.git", "https://github.com/octo/kernels/commit/{sha}"),
    ("https://github.com/octo/kernels", "https://github.com/octo/kernels/commit/{sha}"),
    ("https://github.com/octo/kernels.git", "https://github.com/octo/kernels/commit/{sha}"),
    ("https://github.com/octo/kernels/", "https://github.com/octo/kernels/commit/{sha}"),
    ("https://user:s3cret@github.com/octo/kernels.git", "https://github.com/octo/kernels/commit/{sha}"),
    ("git://github.com/octo/kernels.git", "https://github.com/octo/kernels/commit/{sha}"),
    ("git@github.example.com:team/kernels.git", "https://github.example.com/team/kernels/commit/{sha}"),
    ("git@gitlab.com:group/sub/kernels.git", "https://gitlab.com/group/sub/kernels/-/commit/{sha}"),
    ("https://gitlab.com/group/kernels.git", "https://gitlab.com/group/kernels/-/commit/{sha}"),
    ("https://gitlab.example.org/group/kernels", "https://gitlab.example.org/group/kernels/-/commit/{sha}"),
    ("git@bitbucket.org:team/kernels.git", "https://bitbucket.org/team/kernels/commits/{sha}"),
    ("https://bitbucket.org/team/kernels", "https://bitbucket.org/team/kernels/commits/{sha}"),
    ("git@git.example.com:team/kernels.git", None),  # unknown host
    ("https://example.com/team/kernels.git", None),
    ("https://github.com/octo", None),  # no repository
    ("https://github.com/octo/kernels/tree/main", None),  # not a repository URL
    ("/srv/git/kernels.git", None),  # local paths and files
    ("file:///srv/git/kernels.git", None),
    ("../kernels", None),
    ("C:\\src\\kernels", None),
    ("kernels", None),  # a folder name (recorded when the repository had no origin)
    ("", None),
    (None, None),
])
def test_remote_to_commit_url(remote, expected):
    assert commit_url_template(remote) == expected
    assert "s3cret" not in str(commit_url_template(remote))


def test_is_remote_tells_urls_from_paths():
    assert is_remote("git@github.com:o/r.git") and is_remote("https://example.com/o/r")
    assert not is_remote("/srv/git/r.git") and not is_remote("r") and not is_remote("")


def test_template_must_have_sha_and_nothing_else():
    assert check_template("https://host/repo/commit/{sha}") == "https://host/repo/commit/{sha}"
    for bad, says in (("https://host/repo/commit/", "{sha}"), ("https://host/{repo}/commit/{sha}", "braces"),
                      ("javascript:alert('{sha}')", "http"), ("/commit/{sha}", "http"), ("https://x/{sha", "{sha}")):
        with pytest.raises(HarnessError, match=re.escape(says)):
            check_template(bad)


def _brief(sha: str, repo: str) -> RunBrief:
    return RunBrief("r" + sha[:7], "chip", sha, repo, datetime(2026, 1, 1), False)


def test_where_the_links_come_from(tmp_path, monkeypatch):
    recorded = _brief("a" * 40, "https://github.com/octo/kernels.git")
    unnamed = _brief("b" * 40, "kernels")  # recorded without an origin
    elsewhere = _brief("c" * 40, "git@git.example.com:x/y.git")  # a remote without a known web page
    briefs = [recorded, unnamed, elsewhere]
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "remote", "add", "origin", "git@gitlab.com:team/kernels.git")
    monkeypatch.chdir(tmp_path)  # not a repository: commits recorded without a remote stay plain
    assert commit_urls(briefs) == {recorded.sha: f"https://github.com/octo/kernels/commit/{recorded.sha}"}
    monkeypatch.chdir(repo)  # the current folder's remote names the commits recorded without one
    assert commit_urls(briefs) == {recorded.sha: f"https://github.com/octo/kernels/commit/{recorded.sha}",
                                   unnamed.sha: f"https://gitlab.com/team/kernels/-/commit/{unnamed.sha}"}
    monkeypatch.chdir(tmp_path)
    gitlab = {b.sha: f"https://gitlab.com/team/kernels/-/commit/{b.sha}" for b in briefs}
    assert commit_urls(briefs, repo=str(repo)) == gitlab  # an explicit --repo names them all
    template = "https://mirror.example.com/k/{sha}"
    assert commit_urls(briefs, template=template, repo=str(repo)) == {b.sha: template.format(sha=b.sha)
                                                                      for b in briefs}
    with pytest.raises(HarnessError, match="not a git repository"):
        commit_urls(briefs, repo=str(tmp_path / "missing"))
    with pytest.raises(HarnessError, match="{sha}"):
        commit_urls(briefs, template="https://mirror.example.com/k/")


def test_every_sha_of_the_site_links_to_the_recorded_remote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = build_store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        out = tmp_path / "site"
        build_report(store, out, ReportOptions(change_points=False))
    finally:
        store.close()
    web = "https://github.com/octo/kernels/commit/"
    assert REMOTE.startswith("git@github.com:octo/kernels")
    pages = ["index.html", "regressions.html", chip_page_name(APPLE.key), chip_page_name(NVIDIA.key),
             history_page_name("flash_prefill", NVIDIA.key)]
    pages += [p.name for p in out.glob("compare-*.html")]
    assert len(pages) == 7
    for name in pages:
        html = (out / name).read_text(encoding="utf-8")
        shown = set(re.findall(r"\b([0-9a-f]{40})\b", html)) & set(SHAS)
        linked = set(re.findall(rf'href="{re.escape(web)}([0-9a-f]{{40}})"', html))
        assert shown and shown <= linked, name
        for match in re.finditer(r'<code title="([0-9a-f]{40})">', html):  # each sha written as code is a link
            assert html[:match.start()].endswith(f'<a class="commit-link" href="{web}{match[1]}" rel="noreferrer">'), (
                name, match[1])
    compare = "https://github.com/octo/kernels/compare/"
    assert check_links(out, external=(web, compare)) > 50
    # a regression's commits as a range on the host: compare/BASE...HEAD (the planted regression's two commits)
    ranges = re.findall(rf'class="range-link" href="{re.escape(compare)}([0-9a-f]{{40}})\.\.\.([0-9a-f]{{40}})"',
                        (out / "regressions.html").read_text(encoding="utf-8"))
    assert ranges and all(base in SHAS and head in SHAS and base != head for base, head in ranges)


def test_cli_commit_url_and_repo(tmp_path):
    store = build_store(f"sqlite:///{tmp_path / 'r.db'}", remote="kernels")
    store.close()
    db = f"sqlite:///{tmp_path / 'r.db'}"
    bad = harness("report", "--db", db, "--out", "site", "--commit-url", "https://host/repo/commit/", cwd=tmp_path)
    assert bad.returncode == 2 and "{sha}" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    missing = harness("report", "--db", db, "--out", "site", "--repo", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 2 and "not a git repository" in missing.stderr and "Traceback" not in missing.stderr
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "remote", "add", "origin", "https://bitbucket.org/team/kernels.git")
    done = harness("report", "--db", db, "--out", "site", "--no-change-points", "--repo", str(repo), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = next((tmp_path / "site").glob("compare-*.html")).read_text(encoding="utf-8")
    assert f'href="https://bitbucket.org/team/kernels/commits/{SHAS[1]}"' in page


def test_commit_ref_is_the_escaped_link_every_time_it_is_asked():
    """``Links.commit_ref`` is made once per sha and length: the same markup as ``Markup.format`` makes of it,
    escaped (a template's URL with ``&`` and quotes), linked only where a URL is known, and unchanged when asked
    again."""
    from markupsafe import Markup

    from reports.evidence import Links

    urls = {"a" * 40: "https://h/r/commit/aaa?x=1&y=\"2\"", "b" * 40: "https://h/r/commit/b<c>"}
    links = Links(urls)
    for sha in ("a" * 40, "b" * 40, "c" * 40, "d<&>" * 10):
        for length in (12, 8):
            code = Markup('<code title="{}">{}</code>').format(sha, sha[:length])
            url = urls.get(sha)
            expected = (Markup('<a class="commit-link" href="{}" rel="noreferrer">{}</a>').format(url, code)
                        if url else code)
            assert links.commit_ref(sha, length) == expected and isinstance(links.commit_ref(sha, length), Markup)
            assert links.commit_ref(sha, length) == expected  # memoised: the same again
    assert links.commit_ref(None) == "" and links.commit_ref("") == ""
