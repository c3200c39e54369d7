"""`harness variants`: each tuning variant vs its kernel's default, per chip; divergent variants first."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.common import DbOption, FdrOption, MinEffectOption, app
from harness.cli.tables import (
    HOST_PACED_NOTE,
    change,
    check_format,
    check_thresholds,
    emit_table,
    interval,
    markdown_text,
    print_json,
    pvalue,
    ratio,
    stdout_console,
)
from harness.core import defaults
from harness.core.collector import loading_modules
from harness.record.outbox import open_store

CELL_HEADERS = ("outcome", "kernel", "variant", "vs default", "dtype", "shape", "change", "ratio", "95% CI",
                "p (BH)", "n default/variant", "paced by")


HELP = "\n\n".join((
    "Per-chip verdicts of every tuning variant against its kernel's default variant.",
    "Each cell compares a variant with the default at one dtype and shape on one chip (win: the variant is faster; "
    "lose; tie; inconclusive; broken: it or the default failed a correctness job there), with Benjamini-Hochberg "
    "control across the whole matrix. Each cell compares the newest run of its chip that measured both the variant "
    "and the default (a newer run of other kernels hides nothing), or all runs of --commit on each chip.",
    "Variants that win on one chip and lose on another are listed first, with both cells' evidence; then the best "
    "variant per chip and shape where it is not the default, then each chip's cells (ties only with --all).",
))


@app.command(help=HELP)
def variants(
    db: DbOption = None,
    commit: Annotated[str | None, typer.Option("--commit", help="Use this commit's runs (sha or unique prefix) on "
                                                                "each chip instead of each chip's latest run.")
                      ] = None,
    format: Annotated[str, typer.Option("--format", help="text, json or markdown.")] = "text",
    min_effect: MinEffectOption = defaults.MIN_EFFECT,
    alpha: FdrOption = defaults.ALPHA,
    all_cells: Annotated[bool, typer.Option("--all", help="List ties too.")] = False,
) -> None:
    """Variant verdicts per chip (see HELP)."""
    with loading_modules():
        from harness.analysis.variants import variant_matrix  # loads scipy: not at CLI start-up

    check_format(format)
    check_thresholds(min_effect, alpha)
    store = open_store(db, must_exist=True)  # reading only: a missing database is an error, not created empty
    try:
        matrix = variant_matrix(store, commit, min_effect=min_effect, alpha=alpha)
    finally:
        store.close()
    if format == "json":
        print_json(matrix.to_dict())
        return
    _render(matrix, format, all_cells)


def _render(matrix, fmt: str, all_cells: bool) -> None:
    from harness.analysis.variants import OUTCOME_ORDER  # loads scipy: not at CLI start-up

    console = stdout_console()
    runs = [f"{chip}: {matrix.shas[chip][:12]} ({len(ids)} run{'s' if len(ids) != 1 else ''})"
            for chip, ids in matrix.runs.items()]
    header = "Variant verdicts on " + ("; ".join(runs) if runs else "no runs")
    if fmt == "markdown":
        print(f"### {markdown_text(header)}")
    else:
        console.print(header)
    if not matrix.divergent:
        line = f"Divergent: none ({matrix.divergence_note})"
        print(f"\n_{markdown_text(line)}_" if fmt == "markdown" else line)
    if matrix.divergent:
        emit_table(console, fmt, f"Divergent: wins on one chip, loses on another ({len(matrix.divergent)})",
                   ("kernel", "variant", "dtype", "shape", "wins on", "ratio [95% CI]", "p (BH)", "loses on",
                    "ratio [95% CI]", "p (BH)"),
                   [(d.kernel, d.variant, d.dtype, d.shape_key,
                     d.winning_chip, f"{ratio(d.win.ratio)} [{interval(d.win.ci_low, d.win.ci_high)}]",
                     pvalue(d.win.p_adjusted),
                     d.losing_chip, f"{ratio(d.lose.ratio)} [{interval(d.lose.ci_low, d.lose.ci_high)}]",
                     pvalue(d.lose.p_adjusted)) for d in matrix.divergent])
    tuned = [b for b in matrix.best if b.variant != b.default_variant]
    if tuned:
        emit_table(console, fmt, f"Best variant where it is not the default ({len(tuned)})",
                   ("chip", "kernel", "dtype", "shape", "best", "default", "change", "95% CI"),
                   [(b.chip, b.kernel, b.dtype, b.shape_key, b.variant, b.default_variant,
                     change(b.evidence.ratio), interval(b.evidence.ci_low, b.evidence.ci_high)) for b in tuned])
    for chip in matrix.runs:
        cells = [c for c in matrix.cells if c.chip == chip and (all_cells or c.outcome != "tie")]
        cells.sort(key=lambda c: (OUTCOME_ORDER.index(c.outcome), c.kernel, c.variant, c.dtype, c.shape_key))
        ties = sum(c.chip == chip and c.outcome == "tie" for c in matrix.cells)
        title = f"{chip}: {len(cells)} cell(s)" + ("" if all_cells or not ties else f", {ties} ties not listed")
        if cells:
            emit_table(console, fmt, title, CELL_HEADERS,
                       [(c.outcome, c.kernel, c.variant, c.default_variant, c.dtype, c.shape_key, change(c.ratio),
                         ratio(c.ratio), interval(c.ci_low, c.ci_high), pvalue(c.p_adjusted),
                         f"{c.n_default}/{c.n_variant}", "host" if c.host_paced else "") for c in cells])
        elif fmt == "markdown":
            print(f"\n_{markdown_text(title)}_")
        else:
            console.print(title)
    if paced := sum(c.host_paced for c in matrix.cells):
        line = f"{paced} cell(s) host-paced (the variant or its default): {HOST_PACED_NOTE}"
        print(f"\n_{line}_" if fmt == "markdown" else line)
    if matrix.correctness_failures:
        line = f"{len(matrix.correctness_failures)} correctness failure(s) in these runs: their cells are broken"
        print(f"\n_{line}_" if fmt == "markdown" else line)
