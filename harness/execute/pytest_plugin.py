"""A pytest plugin that records every test's outcome as a JSON line: what a pytest job stores, per test.

Loaded by the harness's pytest jobs with ``-p harness.execute.pytest_plugin`` (the harness source root on PYTHONPATH);
standard library and pytest only, since it runs inside the repository's own environment. The output file is
``$HARNESS_PYTEST_OUT`` (nothing is recorded when it is unset, so loading the plugin is otherwise harmless).

One line per test (node id), written when its teardown report arrives, so a killed run keeps what finished::

    {"nodeid": "tests/test_ops.py::test_add[2]", "outcome": "passed", "duration_s": 0.01, "detail": "",
     "longrepr": ""}

Outcomes come from the reports, never from console text:

- ``passed``; ``failed`` (the call failed, or a strict xfail passed: ``[XPASS(strict)]``);
- ``error``: setup or teardown failed (a fixture error), or a collection error (then the node id is the
  file or class that failed to collect);
- ``skipped`` with its reason (``pytest.skip("Metal not available")`` gives detail ``Metal not available``);
- ``xfailed`` (``report.wasxfail`` on a skipped report) and ``xpassed`` (``wasxfail`` on a passed call).

A test that failed in its call and then errored in teardown stays ``failed``. Durations add setup, call and
teardown (as pytest's junit XML does). With pytest-xdist only the controller records: the workers' reports
reach it through the same hooks, serialized with ``wasxfail`` and the long report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

OUT_ENV = "HARNESS_PYTEST_OUT"
DETAIL_LINES = 12
DETAIL_CHARS = 1500
LONGREPR_CHARS = 4000


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _failure_lines(report: Any) -> str:
    """The crash message (``AssertionError: assert 3 == 4``) and where, else the report's last lines."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = f"{crash.message}\n  at {crash.path}:{crash.lineno}"
    else:
        text = str(report.longrepr or "").strip()
        if text.count("\n") > DETAIL_LINES:
            text = "\n".join(text.splitlines()[-DETAIL_LINES:])
    lines = text.splitlines()[:DETAIL_LINES]
    return "\n".join(lines)[:DETAIL_CHARS]


class Recorder:
    """Folds each test's setup / call / teardown reports into one outcome and appends it to the output file."""

    def __init__(self, path: str):
        self.path = path
        self.pending: dict[str, dict[str, Any]] = {}
        Path(self.path).touch()  # the file exists even when nothing is collected

    def _write(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def _entry(self, nodeid: str) -> dict[str, Any]:
        return self.pending.setdefault(nodeid, {"nodeid": nodeid, "outcome": "", "duration_s": 0.0, "detail": "",
                                                "longrepr": ""})

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: Any) -> None:
        entry = self._entry(report.nodeid)
        entry["duration_s"] += float(getattr(report, "duration", 0.0) or 0.0)
        xfail = hasattr(report, "wasxfail")
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.passed:
                entry["outcome"] = "xpassed" if xfail else "passed"
                entry["detail"] = str(report.wasxfail) if xfail else ""
            elif report.skipped:
                entry["outcome"] = "xfailed" if xfail else "skipped"
                entry["detail"] = str(report.wasxfail) if xfail else _skip_reason(report)
            elif report.when == "setup":
                entry["outcome"] = "error"
                entry["detail"] = "setup failed: " + _failure_lines(report)
                entry["longrepr"] = str(report.longrepr)[-LONGREPR_CHARS:]
            else:
                entry["outcome"] = "failed"
                entry["detail"] = _failure_lines(report)
                entry["longrepr"] = str(report.longrepr)[-LONGREPR_CHARS:]
        elif report.when == "teardown":
            if report.failed and entry["outcome"] != "failed":
                entry["outcome"] = "error"
                entry["detail"] = "teardown failed: " + _failure_lines(report)
                entry["longrepr"] = str(report.longrepr)[-LONGREPR_CHARS:]
            self._finish(report.nodeid)
        elif report.failed:  # xdist's report for a test whose worker died ("???"): the test crashed its process
            entry["outcome"] = "failed"
            entry["detail"] = _failure_lines(report)
            entry["longrepr"] = str(report.longrepr)[-LONGREPR_CHARS:]
            self._finish(report.nodeid)

    def _finish(self, nodeid: str) -> None:
        entry = self.pending.pop(nodeid, None)
        if entry is not None:
            entry["outcome"] = entry["outcome"] or "error"
            entry["duration_s"] = round(entry["duration_s"], 6)
            self._write(entry)

    @pytest.hookimpl(trylast=True)
    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self._write({"nodeid": report.nodeid or "<collection>", "outcome": "error",
                         "duration_s": 0.0, "detail": "collection failed: " + _failure_lines(report),
                         "longrepr": str(report.longrepr)[-LONGREPR_CHARS:]})

    def pytest_sessionfinish(self) -> None:
        # A test whose teardown report never came (its xdist worker crashed, say) is still recorded.
        for nodeid in list(self.pending):
            entry = self.pending[nodeid]
            if not entry["outcome"]:
                entry["detail"] = entry["detail"] or "no final report (the test process may have crashed)"
            self._finish(nodeid)


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(OUT_ENV)
    if path and not hasattr(config, "workerinput"):  # xdist workers: their reports reach the controller
        config.pluginmanager.register(Recorder(path), "harness-recorder")
