"""Fresh null pairs recorded on the H200: `harness compare` of two runs of identical kernels, as a user runs it.

- tests/data/recorded/h200-2d82df7.bundle (the whole built-in suite, 3 trials) and h200-trial-cost-r3-e5bd9ab.bundle
  (its benchmark sections, 3 trials, 9 minutes later), at two commits whose kernels are identical (e5bd9ab only adds
  scripts);
- h200-3c1c045.bundle (the whole built-in suite, 3 trials) and h200-trial-cost-r3-3c1c045.bundle (its benchmark
  sections with --prepare-ahead 4, started 10 minutes after the first ended and stopped at the call's time limit
  with 29 of 869 job executions left: 7 series have 2 trials on that side), two runs of one commit, compared by run id;
- h200-3c1c045.bundle and h200-trial-cost-r3-eaf66a7.bundle (the benchmark sections with --prepare-ahead 16, 8.4 hours
  later, another device session, at a later commit with the same kernels), compared by run id;
- h200-trial-cost-r3-eaf66a7.bundle and h200-trial-cost-r3-e2d503c.bundle (the benchmark sections again, 5.1 hours
  later, another device session, each job's backlog recorded), compared by run id.

The between-run noise is real: a Mann-Whitney test of one side's samples against the other's, the rule of evidence
from one process's samples, flags most of the series.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict

import pytest
from scipy.stats import mannwhitneyu

from testkit.e2e import harness
from testkit.paths import recorded

# (base bundle, head bundle, base ref, head ref, series, series with fewer than 3 trials on a side)
PAIRS = [
    ("h200-2d82df7.bundle", "h200-trial-cost-r3-e5bd9ab.bundle", "2d82df7", "e5bd9ab", 233, 0),
    ("h200-3c1c045.bundle", "h200-trial-cost-r3-3c1c045.bundle", "ec62ee687a1041a1884371abe93b6783",
     "9999100a2c5a43ddbadb0681cc33d463", 254, 7),
    ("h200-3c1c045.bundle", "h200-trial-cost-r3-eaf66a7.bundle", "ec62ee687a1041a1884371abe93b6783",
     "4171c4a2332244f1b690f90110a3d92d", 254, 0),
    ("h200-trial-cost-r3-eaf66a7.bundle", "h200-trial-cost-r3-e2d503c.bundle", "4171c4a2332244f1b690f90110a3d92d",
     "93a098ae7e66464d86bc6d0fb2499138", 254, 0),
]


@pytest.mark.parametrize(("base_bundle", "head_bundle", "base", "head", "series", "short"), PAIRS,
                         ids=["2d82df7-e5bd9ab", "3c1c045-runs", "3c1c045-eaf66a7", "eaf66a7-e2d503c"])
def test_two_h200_runs_of_identical_kernels_flag_nothing_and_leave_few_inconclusive(
        tmp_path, base_bundle, head_bundle, base, head, series, short):
    db = f"sqlite:///{tmp_path / 'null.db'}"
    for bundle in (base_bundle, head_bundle):
        assert harness("import", "--db", db, str(recorded(bundle)), cwd=tmp_path).returncode == 0
    done = harness("compare", base, head, "--db", db, "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    counts, rows = report["counts"], report["rows"]
    assert len(rows) == series and all(row["trials_base"] == 3 for row in rows)
    assert sum(row["trials_head"] < 3 for row in rows) == short
    assert counts["regressed"] == counts["improved"] == counts["broken"] == 0
    # the goal: at most 10 % (19 of 233, 7 of 254, 19 of 254 and 8 of 254 when recorded)
    assert counts["inconclusive"] <= 0.10 * len(rows)

    # The same data is a hard null for a rule that takes one process's samples as the whole noise
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with sqlite3.connect(tmp_path / "null.db") as con:
        for run, sha, key, seconds in con.execute(
                "SELECT r.id, c.sha, j.kernel || j.variant || j.dtype || j.shape_key, s.seconds FROM sample s "
                "JOIN job j ON j.id = s.job_id JOIN run r ON r.id = j.run_id JOIN \"commit\" c ON c.id = r.commit_id "
                "WHERE j.kind = 'benchmark' AND j.status = 'passed'"):
            side = base if base in (run, sha[:7]) else head
            samples[key][side].append(seconds)
    flagged = sum(mannwhitneyu(sides[base], sides[head]).pvalue < 0.05 for sides in samples.values())
    assert flagged > 0.4 * len(samples)  # 141 of 233, 126, 130 and 148 of 254 when recorded
