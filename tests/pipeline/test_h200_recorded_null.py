"""A fresh null pair recorded on the H200: `harness compare` of two runs of identical kernels, as a user runs it.

reports/examples/h200-2d82df7.bundle (the whole built-in suite, 3 trials) and h200-trial-cost-r3-e5bd9ab.bundle (its
benchmark sections, 3 trials, 9 minutes later) were measured at two commits whose kernels are identical (e5bd9ab
only adds scripts). The between-run noise is real: a Mann-Whitney test of one side's samples against the other's,
the rule of evidence from one process's samples, flags most of the series.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict

from scipy.stats import mannwhitneyu

from testkit.e2e import harness
from testkit.paths import ROOT

EXAMPLES = ROOT / "reports" / "examples"
BASE, HEAD = "2d82df7", "e5bd9ab"


def test_two_h200_runs_of_identical_kernels_flag_nothing_and_leave_few_inconclusive(tmp_path):
    db = f"sqlite:///{tmp_path / 'null.db'}"
    for bundle in ("h200-2d82df7.bundle", "h200-trial-cost-r3-e5bd9ab.bundle"):
        assert harness("import", "--db", db, str(EXAMPLES / bundle), cwd=tmp_path).returncode == 0
    done = harness("compare", BASE, HEAD, "--db", db, "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    counts, rows = report["counts"], report["rows"]
    assert len(rows) == 233 and all(row["trials_base"] == row["trials_head"] == 3 for row in rows)
    assert counts["regressed"] == counts["improved"] == counts["broken"] == 0
    assert counts["inconclusive"] <= 0.10 * len(rows)  # the goal: at most 10 % (19 of 233 when recorded)

    # The same data is a hard null for a rule that takes one process's samples as the whole noise
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with sqlite3.connect(tmp_path / "null.db") as con:
        for sha, series, seconds in con.execute(
                "SELECT c.sha, j.kernel || j.variant || j.dtype || j.shape_key, s.seconds FROM sample s "
                "JOIN job j ON j.id = s.job_id JOIN run r ON r.id = j.run_id JOIN \"commit\" c ON c.id = r.commit_id "
                "WHERE j.kind = 'benchmark' AND j.status = 'passed'"):
            samples[series][sha[:7]].append(seconds)
    flagged = sum(mannwhitneyu(sides[BASE], sides[HEAD]).pvalue < 0.05 for sides in samples.values())
    assert flagged > 0.4 * len(samples)  # 141 of 233 when recorded
