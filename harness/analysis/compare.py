"""Compare BASE with HEAD: resolve each side to its runs, then give every series on both sides (per chip) a
verdict with ``stats.compare_grid`` (BH across the whole grid), ``broken`` where the head failed a correctness job
of the kernel on that chip.  Samples, failures and references come from ``harness.record.query``."""

from __future__ import annotations

from harness.analysis.records import CompareReport, CompareRow, CorrectnessFailure, Side
from harness.core import stats
from harness.record import query
from harness.record.store import Store

__all__ = ["VERDICT_ORDER", "compare", "resolve_side"]

VERDICT_ORDER = ("broken", "regressed", "improved", "inconclusive", "unchanged")
"""Display order of compare rows: what needs attention first."""


def resolve_side(store: Store, ref: str, chip: str | None = None) -> Side:
    """A commit sha (full or unique prefix: all its runs, pooled per chip) or a run id (full or unique prefix)."""
    return Side(ref.strip(), *query.resolve_ref(store, ref, chip))


def _row_order(row: CompareRow) -> tuple:
    return (VERDICT_ORDER.index(row.verdict), row.key.chip, row.key.kernel, row.key.variant, row.key.dtype,
            row.key.shape_key)


def compare(
    store: Store,
    base: str,
    head: str,
    chip: str | None = None,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    alpha: float = stats.DEFAULT_ALPHA,
) -> CompareReport:
    """Every benchmark series present on both sides (per chip): pooled samples, BH across the whole grid, gated.

    Correctness failures on the head side (kernel checks and repository tests, ``harness.core.status``) are listed,
    each marked new or already failing at base; any of them fails the gate. A kernel whose correctness check failed
    on the head side on a chip has every series of it on that chip ``broken``. Comparing a commit with itself pools
    the same runs on both sides (trivially unchanged): compare two run ids to compare runs.
    """
    base_side, head_side = resolve_side(store, base, chip), resolve_side(store, head, chip)
    base_samples = query.series_samples(store, base_side.run_ids)
    head_samples = query.series_samples(store, head_side.run_ids)
    failing_at_base = {(row.chip, row.key) for row in query.correctness_failures(store, base_side.run_ids)}
    failures = [CorrectnessFailure(*row, new=(row.chip, row.key) not in failing_at_base)
                for row in query.correctness_failures(store, head_side.run_ids)]
    failures.sort(key=lambda f: not f.new)  # newly failing first
    broken_kernels = {(f.chip, f.kernel) for f in failures if f.kind == "correctness"}
    common = sorted(base_samples.keys() & head_samples.keys())
    pairs = {key: (base_samples[key], head_samples[key]) for key in common}
    broken = {key for key in common if (key.chip, key.kernel) in broken_kernels}
    verdicts = stats.compare_grid(pairs, min_effect=min_effect, alpha=alpha, broken=broken)
    rows = sorted((CompareRow(key, c.verdict, c.ratio, c.ci_low, c.ci_high, c.p_value, c.p_adjusted, c.n_base,
                              c.n_head, c.more_samples_needed, stats.median_ci(pairs[key][0])[0],
                              stats.median_ci(pairs[key][1])[0])
                   for key, c in verdicts.items()), key=_row_order)
    counts = {verdict: 0 for verdict in stats.VERDICTS}
    for row in rows:
        counts[row.verdict] += 1
    return CompareReport(base_side, head_side, tuple(rows), tuple(failures), counts,
                         len(base_samples.keys() - head_samples.keys()), len(head_samples.keys() - base_samples.keys()),
                         min_effect, alpha)
