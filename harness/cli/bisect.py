"""`harness bisect`: the commit that made a kernel slower (noise-aware) or wrong, skipping broken commits."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.bisect.selection import BisectRequest, check_against_suite, counted
from harness.cli.common import DbOption, QuietOption, app, console
from harness.cli.tables import check_thresholds, interval, print_json, ratio, stdout_console
from harness.core import defaults
from harness.core.errors import HarnessError

HELP = "\n\n".join((
    "Find the first commit between --good and --bad that made a kernel slower (--mode perf) or wrong "
    "(--mode correctness) on one chip.",
    "Every probe is a run of the commit's suite, stored like any other (the history pages show it); commits "
    "already run on the chip are read from the database instead of run again. Perf mode compares trials (the "
    "independent processes of each run, as `harness compare`), never one process's samples, with the spread "
    "between runs of one commit as a floor: it first checks, on agreeing runs of each endpoint (2 of the good one, "
    "--confirm-runs of the bad one), that the bad commit is slower than the good one, then classifies each probe "
    "as good-like or bad-like against both, running it again while it is undecided (--max-runs new runs at most). "
    "A run slower than the commit's other runs beyond the run-to-run noise (a loaded machine, a stale result) is "
    "set aside, not pooled, and the commit then needs 2 agreeing runs. Before the culprit is named, it and the "
    "commit before it are re-checked (the culprit on --confirm-runs agreeing runs, at a Bonferroni-corrected "
    "level). A probe still undecided inside the range stops the bisect: status inconclusive, the range and each "
    "probe's evidence, exit 1; no culprit is guessed. Commits that do not install, cannot be run, crash, or (perf) "
    "fail correctness of the kernel are skipped like `git bisect skip`; when skips hide the culprit, the range it "
    "lies in is named.",
    "Correctness of a pytest selection follows the tests that pass at --good (or the one --check names): the "
    "culprit is the first commit where one of them fails or errors. Tests skipped or already failing at --good are "
    "ignored (the failing ones are listed as pre-existing failures); a followed test skipped or missing at a commit "
    "makes that commit a skip.",
    "With --executor ray, the probes of a round (default: one per live node of the chip) run at once: P probes "
    "cut the range into P+1 parts, so about log_(P+1) N rounds. Locally probes run one after another.",
    "Exit status: 0 one culprit named; 1 skips hide it, --max-rounds stopped the search, the evidence is "
    "inconclusive (status inconclusive: the range is named), or the bad commit is not slower (or not failing); 2 a "
    "usage error.",
))


@app.command(help=HELP)
def bisect(
    good: Annotated[str, typer.Option("--good", help="A commit where the kernel is fast / correct.")],
    bad: Annotated[str, typer.Option("--bad", help="A later commit where it is slow / wrong.")],
    kernel: Annotated[str, typer.Option("--kernel", help="Kernel, benchmark function (module:function or its "
                                                         "suite name), correctness job or pytest selection.")],
    chip: Annotated[str | None, typer.Option("--chip", help="Chip key. Default (local executor): this machine's; "
                                                            "required with --executor ray.")] = None,
    variant: Annotated[str | None, typer.Option("--variant", help="Tuning variant.")] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="Benchmark shape, e.g. N=256 or B=1,H=4,S=128.")
                     ] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="Benchmark dtype.")] = None,
    check: Annotated[str | None, typer.Option("--check", help="Correctness mode: the check name, or one pytest "
                                                              "test (node id, or ::test_name).")] = None,
    mode: Annotated[str, typer.Option("--mode", help="perf or correctness.")] = "perf",
    repo: Annotated[str, typer.Option("--repo", help="Repository under test: a path or a git URL "
                                                     "(docs/external-repos.md).")] = ".",
    suite: Annotated[str | None, typer.Option("--suite", help="Suite file (default: the commit's harness.toml, "
                                                              "else the built-in suite).")] = None,
    db: DbOption = None,
    executor: Annotated[str, typer.Option("--executor", help="local or ray.")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="With --executor ray: HEAD:PORT "
                                                                  "(default $RAY_ADDRESS).")] = None,
    format: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    max_rounds: Annotated[int | None, typer.Option("--max-rounds", help="Stop after N rounds.")] = None,
    probes_per_round: Annotated[int | None, typer.Option("--probes-per-round", help="Commits probed per round "
                                                         "(default: 1 locally, the chip's live nodes with Ray).")
                                ] = None,
    max_runs: Annotated[int, typer.Option("--max-runs", help="Perf: new runs of one commit at most while it is "
                                                             "undecided (stored runs it reuses do not count).")] = 5,
    confirm_runs: Annotated[int, typer.Option("--confirm-runs", help="Perf: agreeing runs the named culprit needs "
                                                                     "and the bad endpoint need (the good endpoint "
                                                                     "and the last good commit need 2; at most "
                                                                     "--max-runs).")] = 4,
    min_effect: Annotated[float, typer.Option("--min-effect", help="Smallest relative change that matters.")
                          ] = defaults.MIN_EFFECT,
    alpha: Annotated[float, typer.Option("--alpha", help="Significance level of each probe's test.")
                     ] = defaults.ALPHA,
    gate: Annotated[list[str] | None, typer.Option("--gate", help="Perf: also skip commits where this "
                                                                  "correctness job or pytest selection fails "
                                                                  "(repeatable).")] = None,
    parallel: Annotated[int, typer.Option("--parallel", help="Correctness jobs at once within a probe run.")] = 1,
    reuse: Annotated[bool, typer.Option("--reuse/--no-reuse", help="Read commits already run on the chip from the "
                                                                   "database instead of running them.")] = True,
    quiet: QuietOption = False,
) -> None:
    """Bisect (see HELP)."""
    if format not in ("text", "json"):
        raise HarnessError(f"--format must be text or json, not {format!r}")
    check_thresholds(min_effect, alpha)
    request = BisectRequest(good=good, bad=bad, kernel=kernel, mode=mode, chip=chip, variant=variant, shape=shape,
                            dtype=dtype, check=check, repo=repo, suite=suite, db_url=db, executor=executor,
                            address=address, parallel=parallel, max_rounds=max_rounds,
                            probes_per_round=probes_per_round, max_runs=max_runs, confirm_runs=confirm_runs,
                            min_effect=min_effect,
                            alpha=alpha, gates=tuple(gate or ()), reuse=reuse)
    def log(line: str) -> None:  # progress on stderr; --quiet: none (the result still goes to stdout)
        if not quiet:
            console.print(line, highlight=False, markup=False, soft_wrap=True)

    check_against_suite(request, log)  # a mistyped name is refused before the statistics stack loads

    from harness.bisect.run import run_bisect  # loads the statistics stack (scipy), the store and the pipeline

    report = run_bisect(request, log=log, checked=True)
    if format == "json":
        print_json(report.to_dict())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)


def _commit(ref) -> str:
    return f"{ref.sha[:12]} {ref.subject!r}" if ref is not None else "-"


def _comparison(c, what: str) -> str:
    if c is None:
        return ""
    return f"{ratio(c.ratio)}x {what} ({interval(c.ci_low, c.ci_high)}, {c.verdict})"


def _probe(line) -> str:
    head = f"  {'confirm' if line.step == 'confirm' else 'round'} {line.round}: {line.sha[:12]} {line.state}"
    if line.state == "skip" or line.vs_good is None:
        return head + (f", {line.runs} run(s)" if line.runs else "") + (f": {line.reason}" if line.reason else "")
    text = (f"{head}: {_comparison(line.vs_good, 'good')}, {_comparison(line.vs_bad, 'bad')}; {line.trials} "
            f"trial(s) of {len(line.run_ids)} run(s) {', '.join(r[:8] for r in line.run_ids)}")
    if line.set_aside:
        text += f"; set aside {', '.join(a.run_id[:8] for a in line.set_aside)}"
    if line.state == "inconclusive" and line.nearer:
        text += f"; nearer {line.nearer} (hint only)"
    return text


def print_report(report) -> None:
    """The report as text on stdout (``--format text``)."""
    out = stdout_console()
    out.print(f"bisect {report.mode} of {report.target} on {report.chip}: good {_commit(report.good)}, bad "
              f"{_commit(report.bad)} ({counted(report.commits, 'commit')})", markup=False)
    if report.endpoints is not None:
        e = report.endpoints
        runs = report.endpoint_runs
        kept = f", runs kept {len(runs.get('good', ()))}/{len(runs.get('bad', ()))}" if runs else ""
        floor = f", between-run floor {100 * report.floor['sd']:.1f} %" if report.floor else ""
        out.print(f"endpoints: bad / good = {ratio(e.ratio)} (95% CI {interval(e.ci_low, e.ci_high)}), "
                  f"{e.verdict}, {e.trials_base}/{e.trials_head} trials{kept}{floor}", markup=False)
    if report.followed_tests:
        out.print(f"following {report.followed_tests} test(s) of {report.target} that pass at the good commit "
                  f"({len(report.pre_existing_failures)} failing and {len(report.ignored_at_good)} skipped there: "
                  "ignored)", markup=False)
    for test in report.pre_existing_failures:
        reason = f": {test.reason}" if test.reason else ""
        out.print(f"pre-existing failure (ignored): {test.name} {test.status}{reason}", markup=False)
    for line in report.history:
        out.print(_probe(line), markup=False)
    if report.status == "found":
        out.print(f"culprit: {_commit(report.culprit)}", markup=False)
        out.print(f"  last good: {_commit(report.last_good or report.good)}", markup=False)
        if report.evidence is not None:
            e = report.evidence
            out.print(f"  evidence: {ratio(e.ratio)}x the last good commit (95% CI {interval(e.ci_low, e.ci_high)}, "
                      f"p {e.p_value:.2g}, {e.trials_base}/{e.trials_head} trials)", markup=False)
        if report.detail:
            out.print(f"  evidence: {report.detail}", markup=False)
    elif report.candidates:
        why = "undecided" if report.status == "inconclusive" else "hidden"
        out.print(f"culprit {why}: one of {counted(len(report.candidates), 'commit')}:", markup=False)
        for ref in report.candidates:
            out.print(f"  {_commit(ref)}", markup=False)
    for skipped in report.skipped:
        out.print(f"skipped: {_commit(skipped)}: {skipped.reason}", markup=False)
    for note in report.notes:
        out.print(f"note: {note}", markup=False)
    out.print(f"{report.rounds} round(s) (at most {report.round_bound} without skips at {report.probes_per_round} "
              f"probe(s) per round), {report.confirmations} confirmation(s), {report.probes} probe(s), {report.runs} "
              f"run(s) of which {report.reused_runs} reused", markup=False)
    label = "OK: " if report.exit_code == 0 else "INCONCLUSIVE: " if report.status == "inconclusive" else "NOT FOUND: "
    out.print(label + report.message, markup=False)
