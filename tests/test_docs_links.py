"""Every relative link of the README, the docs pages and the measurement index resolves: to a file or folder of the
checkout, and a ``#anchor`` to a heading of the page it names (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.paths import ROOT

PAGES = sorted({ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md",
                ROOT / "bench" / "results" / "README.md", ROOT / "reports" / "examples" / "README.md"})
# Pages linked before they are written (the docs of issues 36-42, merged one by one): a link to one of these may not
# resolve yet. Empty this once they are all merged.
NOT_YET_WRITTEN: set[str] = set()

FENCE = re.compile(r"^ {0,3}(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def links(text: str) -> list[str]:
    return [m.group(1) for line in prose(text) for m in LINK.finditer(CODE_SPAN.sub("", line))]


def slug(heading: str) -> str:
    """GitHub's id of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(page.read_text(encoding="utf-8")):
        if m := re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line):
            base, n = slug(m.group(1)), 0
            while (name := base if n == 0 else f"{base}-{n}") in found:
                n += 1
            found.add(name)
    return found


def broken(page: Path, text: str | None = None) -> list[str]:
    """The relative links of ``page`` (its ``text``, default the file's) that do not resolve, each with why."""
    problems = []
    for target in links(page.read_text(encoding="utf-8") if text is None else text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...: not checked here
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        name = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if name in NOT_YET_WRITTEN:
            continue
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert page.is_file()
    assert broken(page) == []


def test_the_allow_list_holds_only_pages_not_yet_written():
    written = sorted(name for name in NOT_YET_WRITTEN if (ROOT / name).is_file())
    assert written == [], f"written now: take {written} off NOT_YET_WRITTEN"


def test_a_broken_link_and_a_missing_anchor_are_caught():
    text = ("[gone](nowhere.md) [bad](#nope) [fine](#harness-run) [file](../README.md#what-it-answers)\n"
            "```\n[in code](ignored.md)\n```\n[ext](https://example.com) `[code](span.md)` [later](tutorial.md)\n"
            "[dir](../bench/) [no anchor there](../README.md#nope)\n")
    assert broken(ROOT / "docs" / "reference.md", text) == [
        "nowhere.md: no such file", "#nope: no heading #nope in docs/reference.md",
        "../README.md#nope: no heading #nope in README.md"]


def test_heading_ids_follow_github():
    assert slug("What it answers") == "what-it-answers"
    assert slug("`harness run` options, and more!") == "harness-run-options-and-more"
    assert slug("1. The head") == "1-the-head"
