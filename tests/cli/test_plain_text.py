"""No text from the outside world is markup. Test ids, failure messages, commit subjects, kernel and selection names
print as the plain text they are on every path: `[/x/y]` in a failure message raised MarkupError inside
`harness run` (the run stored as failed, its other jobs never run) and in `compare` text (exit 1, read by a gate as
a regression); `[metal_kernel]` vanished. A property test drives the consoles and the printing functions with
hostile strings; a synthetic database drives compare (text, markdown, json), variants, noise and the report through
the real entry point. Control characters come out visible (``\\x1b``), never as a colour change, and text that was
not UTF-8 never raises an encoding error."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness.cli.compare  # noqa: F401 - registers the verbs driven below
import harness.cli.noise  # noqa: F401
import harness.cli.report  # noqa: F401
import harness.cli.variants  # noqa: F401
from harness.cli.common import console, out, plain
from harness.cli.main import main
from harness.cli.run import progress_display
from harness.cli.tables import emit_table, stdout_console
from harness.core.job import JobResult
from harness.record import outbox
from testkit.analysis import SHAPES, add_run, bench_job, check_job, timings

INVALID_BYTES = b"caf\xc3 \xff\xfe end"
HOSTILE = ("[/x]", "[/x/y]", "[bold]", "[link=http://x]", "[metal_kernel]", "\x1b[31m", ":thumbs_up:", "[red]",
           "\\[", "[", "]", "\r", "\x00", "\x7f", "<b>&amp;</b>", "|", "`", "*", "é", "🙂",
           INVALID_BYTES.decode("utf-8", "replace"), INVALID_BYTES.decode("utf-8", "surrogateescape"),
           "x" * 3000 + "[/x]")
hostile = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(st.characters(exclude_characters="\t"), max_size=12)),
                   min_size=1, max_size=6).map("".join)


def printed(console_, *objects) -> str:
    with console_.capture() as captured:
        console_.print(*objects)
    return captured.get()


@settings(max_examples=300, deadline=None)
@given(hostile)
def test_both_consoles_print_any_string_as_its_plain_text(text: str):
    for console_ in (console, out, stdout_console()):
        assert printed(console_, text) == plain(text) + "\n"
    shown = plain(text)
    assert "\x1b" not in shown  # no escape reaches a terminal
    shown.encode("utf-8")  # and it can be written (strict UTF-8: no lone surrogate)


@settings(max_examples=100, deadline=None)
@given(hostile, hostile)
def test_a_table_cell_and_a_title_keep_their_text(cell: str, title: str):
    console_ = stdout_console()
    with console_.capture() as captured:
        emit_table(console_, "text", title, ("what",), [(cell,)])
    shown = captured.get()
    assert plain(title) in shown  # the title is one soft-wrapped line
    if len(plain(cell)) < 150 and "\n" not in cell:  # a longer cell is folded between the table's borders
        assert plain(cell).strip() in shown
    with redirect_stdout(io.StringIO()) as markdown:
        emit_table(console_, "markdown", title, ("what",), [(cell,)])
    assert "\x1b" not in markdown.getvalue()


class _Job:
    kind, name = "pytest", "selection"

    def __init__(self, key: str) -> None:
        self.key = key


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile, hostile)
def test_run_prints_a_failing_test_and_a_failed_job_as_they_happen_verbatim(message: str, nodeid: str):
    result = JobResult("pytest/sel", "failed", detail=message,
                       tests=[{"nodeid": nodeid, "outcome": "failed", "detail": message}])
    with console.capture() as captured, progress_display() as (planned, progress, _abandon):
        planned(2)
        progress(_Job(f"pytest/{nodeid}"), result, 1, 2)
    shown = captured.get()
    first = message.splitlines()[0] if message.splitlines() else ""
    assert f"failed {plain(nodeid)}: {plain(first[:200])}" in shown
    assert f"failed pytest/{plain(nodeid)}: {plain(message[:200])}" in shown


# --- the analysis verbs and the report, from a database holding such text ------------------------------------

STORED = ("[/x/y] [metal_kernel]", "[bold]b[link=http://x]l", "\x1b[31mred", INVALID_BYTES.decode("utf-8", "replace"),
          "<script>alert(1)</script> & \"q\"")
LONG = "y" * 2000 + " [/x] tail"


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory) -> str:
    """Two commits on one chip: kernels named with the strings above, a regression of one, failing checks whose
    detail and commit subjects hold them too."""
    url = f"sqlite:///{tmp_path_factory.mktemp('plain') / 'results.db'}"
    db = outbox.open_store(url)
    rng = np.random.default_rng(0)
    try:
        for commit, slower in ((1, 1.0), (2, 1.5)):
            results = []
            for kernel in STORED:
                for variant in ("default", f"v {kernel}"):
                    job = bench_job(kernel, variant, SHAPES[0])
                    factor = slower if kernel == STORED[0] else 1.0
                    for trial in range(3):
                        results.append((job, JobResult(job.key, "passed", samples=timings(rng, 1e-3 * factor),
                                                       inner=1, trial=trial)))
                check = check_job(kernel, "default")
                results.append((check, JobResult(check.key, "failed" if commit == 2 else "passed",
                                                 detail=f"{kernel} {LONG}" if commit == 2 else "")))
            add_run(db, "chip-a", commit, results, minutes=commit, message=f"subject {' '.join(STORED)} {LONG}")
    finally:
        db.close()
    return url


def cli(*args: str) -> tuple[int, str, str]:
    """The real entry point in-process: (exit status, stdout, stderr)."""
    argv, stdout, stderr = sys.argv, sys.stdout, sys.stderr
    sys.argv, sys.stdout, sys.stderr = ["harness", *args], io.StringIO(), io.StringIO()
    try:
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return code, sys.stdout.getvalue(), sys.stderr.getvalue()
    finally:
        sys.argv, sys.stdout, sys.stderr = argv, stdout, stderr


def _sha(i: int) -> str:
    from testkit.analysis import sha_of

    return sha_of(i)


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_compare_prints_names_messages_and_subjects_verbatim(hostile_db: str, fmt: str):
    code, stdout, stderr = cli("compare", _sha(1), _sha(2), "--db", hostile_db, "--format", fmt)
    assert code == 1, stderr  # the failing checks (and the slowdown): never a crash
    assert "Traceback" not in stderr and "MarkupError" not in stderr
    assert "\x1b" not in stdout
    if fmt == "json":
        report = json.loads(stdout)
        assert {f["kernel"] for f in report["correctness_failures"]} == set(STORED)
        assert report["head"]["message"].startswith(f"subject {' '.join(STORED)}")
        return
    flat = "".join(stdout.split())
    for name in STORED:
        shown = plain(name)
        if fmt == "markdown":
            shown = shown.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|")
        assert "".join(shown.split()) in flat, (name, stdout)
    if fmt == "text":
        assert f"subject {plain(' '.join(STORED))} {LONG}" in stdout  # the subject line whole, on one line


def test_the_report_escapes_every_such_string_as_html(hostile_db: str, tmp_path: Path):
    code, _stdout, stderr = cli("report", "--db", hostile_db, "--out", str(tmp_path / "site"), "--no-change-points")
    assert code == 0, stderr
    pages = "".join(page.read_text() for page in (tmp_path / "site").glob("*.html"))
    assert "<script>alert(1)</script>" not in pages  # autoescaped by Jinja
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages
    assert "[/x/y] [metal_kernel]" in pages and "[bold]b[link=http://x]l" in pages
