"""`harness report`: re-render the HTML report from a database."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import DbOption, app, check_out_folder, console
from harness.core.collector import loading_modules
from harness.record.outbox import open_store
from harness.record.store import link_repository
from harness.spec import git
from harness.spec.weburl import check_template


@app.command()
def report(
    db: DbOption = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("harness-out/report"),
    change_points: Annotated[bool, typer.Option(
        "--change-points/--no-change-points",
        help="Search every history for change points (O(commits²) per series: the slow part on long histories)."),
    ] = True,
    last: Annotated[int | None, typer.Option(
        min=2, help="Histories and regressions cover each chip's last N commits only (default: all).")] = None,
    commit: Annotated[str | None, typer.Option(
        help="Show this commit's runs on the chip pages, the variant matrix and the noise (full sha or unique "
             "prefix), instead of each chip's latest run: e.g. the full-suite run rather than a later bisect probe "
             "or a partial run.")] = None,
    commit_url: Annotated[str | None, typer.Option(
        "--commit-url", envvar="HARNESS_COMMIT_URL",
        help="Link every commit to this URL, {sha} replaced by the full sha (e.g. "
             "'https://github.com/o/r/commit/{sha}'). Default: from the git remote the runs recorded (GitHub, GitLab, "
             "Bitbucket), else from --repo's.")] = None,
    repo: Annotated[str | None, typer.Option(
        help="The git repository whose origin remote names the commits' web pages (default: each commit's recorded "
             "remote, else the current folder's repository when it is one; no links without a known host); the "
             "ancestry between its stored commits is read from it too (history order where bundles lacked it).")
    ] = None,
    cache: Annotated[bool, typer.Option(
        "--cache/--no-cache",
        help="Reuse the analysis stored in the database for what no new run changed, and store what was computed "
             "(--no-cache: compute everything from the samples and store nothing; the pages are the same).")] = True,
    timings: Annotated[bool, typer.Option(
        "--timings", help="Print, as one JSON line on stdout, the seconds each phase took (loading, analysis, "
                          "evidence, render), the command's total and what the caches reused. Where the analysis "
                          "and the history pages run in a process of their own (Linux), their phases overlap the "
                          "others; 'waiting for the analysis' is the time this process waited for them.")] = False,
) -> None:
    """Re-render the HTML report from a database: index, chip pages, variant matrix, histories, regressions, a
    compare page per chip (its run against the previous run) and per regression, the samples behind them."""
    began = time.perf_counter()
    with loading_modules():
        from harness.pipeline.report import ReportOptions, build_report  # loads scipy: only when this command runs

    notes: list[str] = []
    if timings:  # what the caches reused and computed, and the pages kept (their INFO lines)
        handler = logging.Handler(logging.INFO)
        handler.emit = lambda record: notes.append(record.getMessage())  # type: ignore[method-assign]
        for name in ("harness.analysis.cache", "harness.render.pages"):
            logging.getLogger(name).addHandler(handler)
            logging.getLogger(name).setLevel(logging.INFO)
    if commit_url is not None:
        check_template(commit_url)  # a bad template is a usage error before the database is opened
    check_out_folder(out, "--out")
    store = open_store(db, must_exist=True)  # reading only: a missing database is an error, not created empty
    phases: dict[str, float] = {}
    try:
        if repo is not None and git.is_repo(repo):
            link_repository(store, git.identity(repo), git.toplevel(repo))
        options = ReportOptions(change_points=change_points, last=last, commit=commit, commit_url=commit_url,
                                repo=repo, cache=cache)
        index = build_report(store, out, options, timings=phases)
    finally:
        store.close()
    console.print(f"report: {index.resolve()}")
    if timings:
        print(json.dumps({"timings": phases, "command_s": time.perf_counter() - began, "cache": "; ".join(notes)}))
