"""`harness run`: run a suite on this machine's chip, record, report."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from harness.cli.common import DbOption, QuietOption, app, check_out_folder, console, out, styled
from harness.cli.tables import noise_used, runs_a_side, to_settle
from harness.cluster.driver import progress_line, run_on_cluster
from harness.core import defaults
from harness.core.errors import HarnessError
from harness.core.status import count_label, is_run_failure, run_failures
from harness.pipeline.run import ClusterRunRequest, LocalRunRequest, execute_run
from harness.record import outbox, query, store


@app.command()
def run(
    suite: Annotated[str | None, typer.Option(help="Suite file (TOML). Default: the built-in suite "
                                                   "jobs/builtin.toml.")] = None,
    db: DbOption = None,
    report: Annotated[Path, typer.Option(help="Folder for the HTML report.")] = Path("harness-out/report"),
    commit: Annotated[str | None, typer.Option(help="Commit to run. Default: HEAD of the repository under test "
                                                    "(uncommitted changes are recorded as a dirty flag); another "
                                                    "commit runs from a clean git worktree.")] = None,
    repo: Annotated[str, typer.Option(help="Repository under test: a path or a git URL. A commit with "
                                           "harness.toml at its root runs that suite from a clean checkout "
                                           "(docs/external-repos.md).")] = ".",
    chip_label: Annotated[str | None, typer.Option(help="Override the detected chip key.")] = None,
    repo_name: Annotated[str | None, typer.Option(help="The repository's identity in the database, instead of its "
                                                       "remote's host/owner/name (or root commit without a remote): "
                                                       "runs of any checkout share one history by it "
                                                       "(docs/many-machines.md).")] = None,
    parallel: Annotated[int, typer.Option(help="Correctness jobs run at once (benchmarks and calibration always "
                                               "run alone); 0: one per CPU core.", min=0,
                                          show_default="the number of CPU cores")] = 0,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip rendering the HTML report.")] = False,
    executor: Annotated[str, typer.Option(help="local (this machine) or ray (every chip of a Ray cluster: one "
                                               "run per chip, from a clean checkout of the commit on each node; "
                                               "--repo must be a git URL or a path every node sees).")] = "local",
    address: Annotated[str | None, typer.Option(help="With --executor ray: the cluster's HEAD:PORT "
                                                     "(default $RAY_ADDRESS).")] = None,
    chips: Annotated[str | None, typer.Option(help="With --executor ray: comma-separated chip keys "
                                                   "(default: every chip with a live node).")] = None,
    max_attempts: Annotated[int, typer.Option(help="With --executor ray: runs of a job whose node dies.")] = 2,
    resume: Annotated[str | None, typer.Option(help="An interrupted run's id: plan its suite, commit and chip "
                                                    "again and run only the jobs it has no result for.")] = None,
    prepare_ahead: Annotated[int, typer.Option(help="Benchmark job processes of a trial round that start together "
                                                    "and make their first calls (MLX compiles a CUDA/Metal source "
                                                    "kernel in every process) before any of them times; they then "
                                                    "time one after another. 1: one process at a time. Local runs "
                                                    "(on a Ray cluster each node runs one process at a time). "
                                                    "Default: this machine's CPU cores, at most 16.",
                                               min=1)] = defaults.PREPARE_AHEAD,
    quiet: QuietOption = False,
) -> None:
    """Run a suite on this machine's chip, store every result, render the report.

    The results (the run's counts, its failing tests, what it changed, where the report is) go to stdout;
    progress and each failure as it happens to stderr. Exit status (docs/exit-codes.md): 0 when every job passed
    or was skipped, 1 when any job or test failed, errored, crashed, timed out or was lost, 2 on bad input,
    3 when the results were spooled because the database was unreachable."""
    if executor not in ("local", "ray"):
        raise HarnessError(f"--executor must be local or ray, not {executor!r}")
    if not no_report:
        check_out_folder(report, "--report")
    parallel = parallel or os.cpu_count() or 1
    if executor == "ray":
        if chip_label:
            raise HarnessError("--chip-label is for local runs; on a cluster each node is labelled when it joins")
        if resume:
            raise HarnessError("--resume is for local runs; a cluster run is submitted again instead")
        _run_on_cluster(ClusterRunRequest(suite=suite, db_url=db, commit=commit, repo=repo, parallel=parallel,
                                          address=address, max_attempts=max_attempts, repo_name=repo_name,
                                          chips=tuple(c for c in (chips or "").split(",") if c)),
                        None if no_report else report)
        return
    request = LocalRunRequest(suite=suite, db_url=db, commit=commit, repo=repo, parallel=parallel,
                              repo_name=repo_name, chip_label=chip_label, resume=resume, ahead=prepare_ahead)
    failures: list[Text] = []  # also listed with the results: `harness run > log` and --quiet keep them
    with progress_display(quiet) as (planned, progress, abandon):
        def on_result(job, result, done: int, total: int) -> None:
            failures.extend(_failure_lines(job, result))
            if progress:
                progress(job, result, done, total)

        try:
            outcome = execute_run(request, progress=on_result, on_planned=planned)
        except HarnessError:
            abandon()  # a bad commit, repository or suite: just its one-line error
            raise
    db_url = db or store.default_db_url()
    counts = outcome.counts
    dirty = " (dirty)" if outcome.dirty else ""
    out.print(f"run {outcome.run_id} on {outcome.chip_key} at {outcome.sha[:12]}{dirty}")
    out.print(f"jobs: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
              f"{counts['crashed']} crashed, {counts['timeout']} timed out, {counts['lost']} lost"
              + "".join(f", {counts[s]} {s}" for s in ("error", "xfailed", "xpassed") if counts[s])
              + f" (of {outcome.planned})")
    if outcome.tests:
        out.print(f"tests: {sum(outcome.tests.values())} distinct: {count_label(outcome.tests)}")
        for name, selection in sorted(outcome.selections.items()):  # not `counts`: the exit status reads it below
            out.print(f"  {name}: {count_label(selection)}")
    for line in failures[:FAILURES_SHOWN]:
        out.print(line)
    if len(failures) > FAILURES_SHOWN:
        out.print(f"  ... and {len(failures) - FAILURES_SHOWN} more failure lines (harness report lists them all)")
    flops, bandwidth = outcome.peaks
    if flops or bandwidth:
        out.print(f"calibrated peak: {(flops or 0) / 1e9:.1f} GFLOP/s matmul, "
                  f"{(bandwidth or 0) / 1e9:.1f} GB/s copy")
    out.print(f"database: {store.mask_url(db_url)}")
    if not outcome.spooled:
        _print_verdicts(db_url, outcome.run_id, outcome.sha, repo)
    if not no_report and not outcome.spooled:
        _render_report(db_url, report)
    bad = run_failures(outcome.counts)
    if outcome.spooled:
        console.print(f"{outcome.spooled} results spooled to {outcome.spool_dir}: the database was unreachable; "
                      "they will be written on the next harness command", highlight=False, soft_wrap=True)
        raise typer.Exit(3)
    raise typer.Exit(1 if bad else 0)


@contextmanager
def progress_display(quiet: bool = False):
    """``(on_planned, progress, abandon)`` for :func:`execute_run`, on stderr: a rich bar with an ETA in a terminal;
    in a log (stderr not a terminal, as in CI) a plain line at a bounded rate (:class:`LineProgress`). Failures are
    printed as they happen either way; ``abandon`` drops the bar on an error so that only the error's line is left.
    ``quiet``: nothing (the results at the end say what failed)."""
    if quiet:
        yield None, None, lambda: None
        return
    if not console.is_interactive:
        lines = LineProgress(lambda text: console.print(text, highlight=False, soft_wrap=True))

        def line_progress(job, result, done, total) -> None:
            for text in _failure_lines(job, result):
                console.print(text, highlight=False, soft_wrap=True)
            lines.update(done, total)

        with lines.heartbeat():
            yield lines.planned, line_progress, lines.abandon
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("planning", total=None)

        def planned(n: int) -> None:
            bar.update(task, total=n, description="running jobs")

        def progress(job, result, done, total) -> None:
            bar.update(task, completed=done, description=f"{job.kind[:5]} {job.labels.kernel}/{job.labels.variant}")
            for text in _failure_lines(job, result):
                bar.console.print(text, highlight=False)

        yield planned, progress, lambda: bar.remove_task(task)


def _failure_lines(job, result) -> list[Text]:
    """A failed job's line, and a pytest job's failing tests, one line each (skips are not failures): plain text
    (a test id or message may hold ``[brackets]``), the status in red."""
    lines = [styled(result.status, "red") + styled(f" {job.key}: {_detail(job, result)}")
             ] if is_run_failure(result.status) else []
    for test in result.tests:
        if is_run_failure(test["outcome"]):
            first = (test.get("detail") or "").splitlines()[:1]
            lines.append(styled("  ") + styled(test["outcome"], "red")
                         + styled(f" {test['nodeid']}: {''.join(first)[:200]}"))
    return lines


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class LineProgress:
    """Progress as plain lines for a log: one when the jobs are planned, then one each time another ``1/steps`` of
    them is done or ``every_s`` seconds have passed (whichever comes first; a heartbeat says so while a long job
    runs), and one at the end: done/total, elapsed, and an ETA from the mean time per job so far."""

    def __init__(self, say: Callable[[str], None], *, steps: int = 10, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.steps, self.every_s, self.clock = say, steps, every_s, clock
        self.total: int | None = None
        self.done = 0
        self.started = self.last = clock()
        self._step = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def planned(self, total: int) -> None:
        with self._lock:
            self.total, self.started, self.last = total, self.clock(), self.clock()
            self.say(f"running {total} jobs")

    def update(self, done: int, total: int) -> None:
        with self._lock:
            self.done, self.total = done, total
            now = self.clock()
            step = done * self.steps // total if total else self.steps
            if step > self._step or now - self.last >= self.every_s or done >= total:
                self._step = max(step, self._step)
                self._say(now)

    def tick(self) -> None:
        """The heartbeat: a line if none was printed for ``every_s`` seconds (a long job is running)."""
        with self._lock:
            now = self.clock()
            if self.total is not None and self.done < self.total and now - self.last >= self.every_s:
                self._say(now)

    def abandon(self) -> None:
        self._stop.set()

    @contextmanager
    def heartbeat(self):
        """Call :meth:`tick` every few seconds in a background thread while the run goes on."""
        thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(timeout=5)

    def _beat(self) -> None:
        while not self._stop.wait(min(5.0, self.every_s)):
            self.tick()

    def _say(self, now: float) -> None:
        self.last = now
        total, done = self.total or 0, self.done
        elapsed = now - self.started
        line = f"progress: {done}/{total} jobs ({100 * done // total if total else 100}%), {duration(elapsed)} elapsed"
        if 0 < done < total:
            line += f", ETA {duration(elapsed / done * (total - done))}"
        self.say(line)


FAILURES_SHOWN = 30  # failure lines repeated with the results at the end of a run, at most
SHOWN = 10  # changed series and winning variants listed at the end of a run, at most


def _print_verdicts(db_url: str, run_id: str, sha: str, repo: str = ".") -> None:
    """What the run changed: its benchmarks against the previous run on this chip (the nearest ancestor's,
    ``query.previous_run_id``), as `harness compare` judges them, and the variants that win outright."""
    from harness.analysis.compare import compare, for_order  # loads scipy: only once a run has finished
    from harness.analysis.variants import variant_matrix  # loads scipy, as the line above

    db_store = outbox.open_store(db_url)
    try:
        previous, proven = query.previous_run(db_store, run_id)
        chip = query.get_run(db_store, run_id).chip_key
        # a previous run placed by commit time, not ancestry: no change decided
        report = for_order(compare(db_store, previous, run_id), proven) if previous else None
        best = [b for b in variant_matrix(db_store, sha).best if b.chip == chip and b.evidence is not None]
    finally:
        db_store.close()
    if report is None:
        out.print("against the previous run: no run of an earlier commit on this chip to compare with")
    elif report.rows:
        counts = report.counts
        guess = "" if proven else (f" ({query.NOT_PROVEN}: the commit before it by commit time; no change "
                                   "decided, regressed or improved series counted inconclusive)")
        out.print(f"against the previous run {previous} ({report.base.sha[:12]}){guess}: "
                  + ", ".join(f"{counts[v]} {v}" for v in ("regressed", "improved", "inconclusive", "unchanged",
                                                            "broken") if counts[v]), highlight=False)
        for row in [r for r in report.rows if r.verdict in ("regressed", "improved")][:SHOWN]:
            _print_row(row.verdict, row, f"{row.trials_base}/{row.trials_head} trials")
        for row in [r for r in report.rows if r.more_runs_needed][:SHOWN]:
            _print_row("held", row, f"inconclusive: {runs_a_side(report, row.key.chip)} and no history floor, and "
                                    f"it does not stand out from the run's other series; {row.more_runs_needed} more "
                                    + ("base runs give" if row.more_runs_needed != 1 else "base run gives")
                                    + " the floor")
        for row in [r for r in report.rows if r.verdict == "inconclusive" and not r.more_runs_needed][:SHOWN]:
            settle = to_settle(row)
            _print_row("inconclusive", row, f"noise {noise_used(row)}" + (f"; to settle: {settle}" if settle else ""))
        out.print(f"  (harness compare {previous} {run_id} for the evidence)", highlight=False)
        if counts["inconclusive"]:  # what settles them here: both commits measured interleaved
            out.print(f"  to settle the inconclusive: harness compare {report.base.sha} {sha} --settle"
                      + (f" --repo {repo}" if repo != "." else "") + ("" if db_url == store.default_db_url()
                                                                      else f" --db {store.mask_url(db_url)}"),
                      highlight=False, soft_wrap=True)
    for b in best[:SHOWN]:
        out.print(f"winning variant {b.kernel} {b.dtype} {b.shape_key}: {b.variant} x{b.evidence.ratio:.3f} "
                  f"against {b.default_variant}", highlight=False, soft_wrap=True)
    if len(best) > SHOWN:
        out.print(f"  ... and {len(best) - SHOWN} more (harness variants)", highlight=False)


def _print_row(label: str, row, detail: str) -> None:
    """One compare row at the end of a run: label, series, ratio and interval, then ``detail``."""
    out.print(f"  {label} {row.key.kernel}/{row.key.variant} {row.key.dtype} {row.key.shape_key}: "
                  f"x{row.ratio:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}], {detail}", highlight=False, soft_wrap=True)


def _render_report(db_url: str, folder: Path) -> None:
    """Render the HTML report from the database and say where it is."""
    from harness.pipeline.report import build_report  # loads scipy (the statistics stack): only when used

    db_store = outbox.open_store(db_url)
    try:
        index = build_report(db_store, folder)
    finally:
        db_store.close()
    out.print(f"report: {index.resolve()}")


def _run_on_cluster(request: ClusterRunRequest, report: Path | None) -> None:
    """`harness run --executor ray`: the cluster driver, in this process (CI uses `harness submit`)."""
    def progress(chip: str, job, result, done: int, total: int) -> None:  # stderr, as a local run's progress
        console.print(progress_line(chip, job, result, done, total), soft_wrap=True)

    outcome = run_on_cluster(request, progress=progress, log=lambda line: console.print(line, highlight=False))
    for run in outcome.runs:
        counts = run.counts
        out.print(f"run {run.run_id} on {run.chip_key} at {run.sha[:12]}: {counts['passed']} passed, "
                  f"{counts['failed']} failed, {counts['skipped']} skipped, {counts['crashed']} crashed, "
                  f"{counts['timeout']} timed out, {counts['lost']} lost (of {run.planned})")
    for chip, why in outcome.errors.items():
        console.print(styled(f"{chip}: {why}", "red"))
    if outcome.errors and not outcome.runs:
        raise HarnessError("; ".join(f"{chip}: {why}" for chip, why in outcome.errors.items()))
    db_url = request.db_url or store.default_db_url()
    out.print(f"database: {store.mask_url(db_url)}")
    if report is not None:
        _render_report(db_url, report)
    raise typer.Exit(outcome.exit_code)


def _detail(job, result) -> str:
    """A failed job's detail for the console: an install failure in full (its decisive line and its log's path),
    anything else cut at 200 characters (the database keeps it whole)."""
    return result.detail if job.kind == "install" else result.detail[:200]
