"""Which variant wins on which chip, as the report shows it: the cross-chip matrix page, the chip pages built from
the newest run that has each job, per-test results of pytest selections, and the built-in suite's cross-chip grid.

Synthetic runs through the real store, rendered by ``harness.pipeline.report.build_report``:

- chip-a: a full run at commit 1 (flash at the shared shape and at its own shape, swiglu, the flash correctness
  matrix of every variant), then a flash-only run at commit 2 (a partial run: it must hide nothing);
- chip-b: flash at the shared shape (the variant loses there: divergent), a CUDA-only variant skipped, and a
  pytest selection whose tests change between its two runs (a new failure, one already failing).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from harness.core.job import JobResult, KernelJob, PytestJob
from harness.pipeline.report import ReportOptions, build_report
from harness.record import outbox
from kernels import REGISTRY
from reports.chip import MAX_VARIANT_COLUMNS
from reports.render import chip_page_name
from testkit.analysis import add_run, bench_job, sha_of, timings

SHARED = {"B": 1, "H": 1, "S": 64, "D": 32}
ONLY_A = {"B": 1, "H": 1, "S": 128, "D": 32}
FLASH, VARIANT, CUDA = "flash_prefill", "flash_bq16_bk32", "cuda_bq64_bk64"


def bench(rng: np.random.Generator, kernel: str, variant: str, shape: dict[str, int], seconds: float) -> list:
    job = bench_job(kernel, variant, shape)
    return [(job, JobResult(job.key, "passed", samples=timings(rng, seconds * float(np.exp(rng.normal(0, 0.005))),
                                                               10, 0.01), inner=1, trial=trial))
            for trial in range(3)]


def flash_row(rng, shape, factor: float) -> list:
    return bench(rng, FLASH, "sdpa", shape, 1e-3) + bench(rng, FLASH, VARIANT, shape, factor * 1e-3)


def flash_checks() -> list:
    """The reference check of every flash variant at two dtypes: a correctness matrix as wide as the registry."""
    out = []
    for variant in REGISTRY[FLASH].variants:
        for dtype, tolerance in (("float32", 1e-4), ("float16", 5e-3)):
            job = KernelJob.of("correctness", FLASH, variant, {"B": 1, "H": 2, "S_q": 13, "S_kv": 37, "D": 32},
                               dtype, "reference", name="flash-check")
            out.append((job, JobResult(job.key, "passed", max_error=tolerance / 7, tolerance=tolerance)))
    return out


def selection(outcomes: dict[str, str]) -> list:
    job = PytestJob.of({"selection": "unit", "paths": ["tests"]})
    tests = [{"nodeid": nodeid, "outcome": outcome, "duration_s": 0.01,
              "detail": "assert 1 == 2" if outcome == "failed" else ""} for nodeid, outcome in outcomes.items()]
    status = "failed" if "failed" in outcomes.values() else "passed"
    return [(job, JobResult(job.key, status, tests=tests))]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("cross-chip")
    url = f"sqlite:///{tmp / 'results.db'}"
    store = outbox.open_store(url)
    rng = np.random.default_rng(11)
    try:
        full = (flash_row(rng, SHARED, 0.8) + flash_row(rng, ONLY_A, 0.8) + bench(rng, "swiglu", "unfused", SHARED,
                                                                                 1e-3)
                + bench(rng, "swiglu", "fused_gateup", SHARED, 0.7e-3) + flash_checks())
        runs = {"a1": add_run(store, "chip-a", 1, full, minutes=0)}
        cuda_skip = bench_job(FLASH, CUDA, SHARED)
        runs["b1"] = add_run(store, "chip-b", 1, flash_row(rng, SHARED, 1.25) + selection(
            {"tests/t.py::test_old": "failed", "tests/t.py::test_new": "passed"}), minutes=1)
        runs["a2"] = add_run(store, "chip-a", 2, flash_row(rng, SHARED, 0.8), minutes=10)  # flash only: partial
        runs["b2"] = add_run(store, "chip-b", 2, flash_row(rng, SHARED, 1.25) + [
            (cuda_skip, JobResult(cuda_skip.key, "skipped", detail=f"variant {CUDA} needs CUDA: CUDA not available"))]
            + selection({"tests/t.py::test_old": "failed", "tests/t.py::test_new": "failed",
                         "tests/t.py::test_skip": "skipped", "tests/t.py::test_ok": "passed"}), minutes=11)
        build_report(store, tmp / "latest", ReportOptions(change_points=False))
        build_report(store, tmp / "at-2", ReportOptions(change_points=False, commit=sha_of(2)))
    finally:
        store.close()
    return {"tmp": tmp, "runs": runs, "url": url}


def page(site: dict, folder: str, name: str) -> str:
    return (site["tmp"] / folder / name).read_text(encoding="utf-8")


def section(html: str, start: str, end: str = "</table>") -> str:
    part = html[html.index(start):]
    return part[:part.index(end)]


# --- the variant matrix page ---------------------------------------------------------------------------------------


def test_the_divergent_variant_is_listed_first_with_both_chips(site):
    html = page(site, "latest", "variants.html")
    divergent = section(html, 'id="divergent-list"')
    assert VARIANT in divergent and "chip-a" in divergent and "chip-b" in divergent
    assert html.index('id="divergent-list"') < html.index('id="matrix"')
    assert "measured on two chips or more" in section(html, 'id="divergence-note"', "</p>")


def test_rows_measured_on_two_chips_come_first_and_an_absent_chip_says_why(site):
    matrix = section(page(site, "latest", "variants.html"), 'id="matrix"')
    shared = matrix.index("B=1,<wbr>D=32,<wbr>H=1,<wbr>S=64")
    single = matrix.index("B=1,<wbr>D=32,<wbr>H=1,<wbr>S=128")
    assert shared < single  # one line per variant, the rows of two chips first: their "On" column says 2
    assert re.search(r'S=64</code></td><td class="num">2</td>', matrix)
    assert re.search(r'S=128</code></td><td class="num">1</td>', matrix)
    one_chip = matrix[single:]
    assert "not measured: never run on this chip" in one_chip
    # the skipped CUDA-only variant: not measured on chip-b, with the skip reason; measured nowhere else
    assert "not measured: skipped: the variant needs CUDA: CUDA not available" in matrix[shared:single]
    # each chip's verdict for the variant at the shared shape, the best one starred on chip-a
    row = matrix[shared:single]
    assert '<span class="badge win">win</span>' in row and '<span class="badge lose">lose</span>' in row
    assert "★ <span class=\"badge win\">win</span>" in row


def test_verdicts_from_an_older_run_name_its_commit(site):
    matrix = section(page(site, "latest", "variants.html"), 'id="matrix"')
    swiglu = [line for line in matrix.split("<tr ") if line.startswith('class="vline') and "<td>swiglu</td>" in line
              and 'data-verdict="1"' in line]
    assert swiglu and all(f"chip-a: from the older run at {sha_of(1)[:12]}" in line for line in swiglu)


def test_without_a_shared_shape_the_page_says_why_nothing_diverges(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = outbox.open_store(url)
    rng = np.random.default_rng(12)
    try:
        add_run(store, "chip-a", 1, flash_row(rng, ONLY_A, 0.8), minutes=0)
        add_run(store, "chip-b", 1, flash_row(rng, SHARED, 1.25), minutes=1)
        build_report(store, tmp_path / "site", ReportOptions(change_points=False))
    finally:
        store.close()
    html = (tmp_path / "site" / "variants.html").read_text(encoding="utf-8")
    note = section(html, 'id="divergence-note"', "</p>")
    assert "None: no (kernel, dtype, shape) was measured on two chips" in note
    assert 'id="divergent-list"' not in html


# --- chip pages: the newest run that has each job ------------------------------------------------------------------


def test_a_newer_partial_run_hides_no_kernel_of_the_chip_page(site):
    html = page(site, "latest", chip_page_name("chip-a"))
    benchmarks = section(html, 'id="benchmarks"')
    assert "swiglu" in benchmarks and FLASH in benchmarks
    swiglu_rows = [row for row in benchmarks.split("<tr>") if row.startswith("<td>swiglu</td>")]
    assert swiglu_rows and all(f"from {sha_of(1)[:8]}" in row for row in swiglu_rows)
    flash_rows = [row for row in benchmarks.split("<tr>") if row.startswith(f"<td>{FLASH}</td>")]
    assert any("from " not in row for row in flash_rows)  # the shared shape: from the newest run itself
    # every row's noise meter, the older run's rows included (measured in that run: its trials' spread)
    assert all(re.search(r'class="num noise">\d+\.\d%', row) for row in swiglu_rows + flash_rows)
    older = section(html, 'id="older-runs"', "</tr>")
    assert site["runs"]["a1"][:12] in older and sha_of(1)[:12] in older and "swiglu" in older
    assert sha_of(2) in section(html, 'id="run"')  # the newest run is the page's run


def test_report_commit_shows_only_that_commits_runs(site):
    html = page(site, "at-2", chip_page_name("chip-a"))
    assert "swiglu" not in section(html, 'id="benchmarks"') and 'id="older-runs"' not in html
    matrix = section(page(site, "at-2", "variants.html"), 'id="matrix"')
    assert "<strong>swiglu</strong>" not in matrix


def test_the_correctness_matrix_is_cut_to_the_page_and_labels_its_numbers(site):
    html = page(site, "latest", chip_page_name("chip-a"))
    correctness = html[html.index('id="correctness"'):html.index("</div>", html.index('id="correctness"'))]
    assert "max |error|" in correctness and "Tolerance</th>" in correctness
    tables = correctness.split('<table class="cmatrix">')[1:]
    widths = [table.count('<th class="variant">') for table in tables]
    flash_variants = len(REGISTRY[FLASH].variants)
    assert flash_variants > MAX_VARIANT_COLUMNS  # wide enough to be cut
    assert sum(widths) == flash_variants and max(widths) <= MAX_VARIANT_COLUMNS, widths
    assert f"from the older run at {sha_of(1)[:12]}" in correctness  # the flash checks ran in the full run only
    assert re.search(r'<td class="num">0\.005</td>', correctness)  # the float16 case's tolerance, in its row


def test_every_test_of_a_selection_is_listed_new_failures_first(site):
    html = page(site, "latest", chip_page_name("chip-b"))
    tests = section(html, 'id="test-results"', "</details>")
    names = re.findall(r"<code>(tests/t\.py::\w+)</code>", tests)
    assert names == ["tests/t.py::test_new", "tests/t.py::test_old", "tests/t.py::test_skip", "tests/t.py::test_ok"]
    rows = tests.split("<tr class=")[1:]
    assert "new failure" in rows[0] and "already failing" in rows[1] and "new failure" not in rows[1]
    assert "new failures 1" in section(html, 'id="selections"')


# --- the built-in suite's cross-chip grid -------------------------------------------------------------------------


def test_the_builtin_suite_plans_one_cross_chip_shape_per_kernel_identical_on_cpu_and_gpu():
    from harness.core.job import shape_label
    from harness.spec.plan import plan_suite
    from harness.spec.suite import load_suite


    suite = load_suite()

    def cross_chip(chip_class: str) -> set[tuple[str, str, str, str]]:
        return {(job.kernel, job.variant, job.dtype, shape_label(job.shape)) for job in plan_suite(suite, chip_class)
                if job.kind == "benchmark" and job.name.endswith("-cross-chip")}

    cpu, gpu = cross_chip("cpu"), cross_chip("gpu")
    assert cpu == gpu and cpu
    benchmarked = {spec.kernel for spec in suite.benchmark}
    with_variants = {name for name in benchmarked | {spec.kernel for spec in suite.correctness}
                     if len(REGISTRY[name].variants) > 1}
    assert {kernel for kernel, *_ in cpu} == with_variants
    for kernel in with_variants:  # every variant, at one shape, so the matrix compares each on every chip
        assert {variant for k, variant, *_ in cpu if k == kernel} == set(REGISTRY[kernel].variants)
        assert len({(dtype, shape) for k, _, dtype, shape in cpu if k == kernel}) == 1


# --- the recorded examples: the H200 run and a CPU run of the cross-chip sections (bench/results/README.md) ------


def test_on_the_recorded_runs_the_matrix_names_variants_that_win_on_the_cpu_and_lose_on_the_h200(tmp_path):
    """The question the matrix exists for, on real runs: the op-by-op MLX flash variants beat SDPA on the CPU
    backend and are launch-bound, many times slower, on the H200 -- at the same (kernel, dtype, shape)."""
    from harness.analysis.variants import variant_matrix
    from harness.record.bundle import import_bundle
    from testkit.paths import EXAMPLES

    examples = EXAMPLES
    db = outbox.open_store(f"sqlite:///{tmp_path / 'examples.db'}")
    try:
        for bundle in ("h200-202d829.bundle", "cpu-cross-chip-ee285b2.bundle"):
            import_bundle(db, examples / bundle)
        matrix = variant_matrix(db)
    finally:
        db.close()
    assert matrix.shared  # cells measured on both chips
    flash = {(d.variant, d.winning_chip, d.losing_chip) for d in matrix.divergent if d.kernel == "flash_prefill"}
    assert flash and all(win.startswith("cpu-") and lose == "nvidia-h200-sm90" for _, win, lose in flash)
    for d in matrix.divergent:
        assert d.win.outcome == "win" and d.lose.outcome == "lose" and d.win.ratio < 1 < d.lose.ratio
