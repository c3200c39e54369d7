"""Time `harness import` of one small bundle into a SQLite database that holds many commits of the same repository.

    PYTHONPATH=. python bench/bench_import_known_key.py [--commits 5000] [--repeat 3]

Fills a scratch database with ``--commits`` commit rows of one repository (``github.com/o/r``: rows without runs,
as the ancestry links a clone adds, and one run), then imports bundles of one run each of a new commit of that
repository, each into a fresh copy of that database, and prints the median import time. It also times the
repository-identity merge (``harness.record.identity.unify``) on the filled database alone: before the merge was
gated on a new repository key, every import paid it. Run it under each checkout to compare (the script uses the
code it is run with: ``PYTHONPATH=/path/to/checkout python bench/bench_import_known_key.py``).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert  # noqa: E402

from harness.core.chip import ChipIdentity  # noqa: E402
from harness.core.job import JobResult, KernelJob  # noqa: E402
from harness.record import identity, store  # noqa: E402
from harness.record.bundle import export_bundle, import_bundle  # noqa: E402
from harness.record.models import Commit  # noqa: E402

CHIP = ChipIdentity(key="bench-chip", backend="cuda", device_name="NVIDIA H200", architecture="sm90",
                    memory_bytes=141 << 30, os="Linux", mlx_version="0.32.4", device_info={"name": "H200"})
REPO = "github.com/o/r"


def sha(i: int) -> str:
    return f"{i + 1:040x}"


def one_run(db: store.Store, number: int, parent: str) -> str:
    """A run of commit ``number`` (its parent ``parent``) with 20 benchmark jobs of 10 samples."""
    rng = random.Random(number)
    run_id = store.create_run(db, ident=CHIP, facts={"hostname": "host"},
                              commit={"repo": REPO, "sha": sha(number), "message": f"c{number}", "parents": [parent]},
                              suite="bench", dirty=False, executor="local", planned_jobs=20)
    for j in range(20):
        job = KernelJob.of("benchmark", "k", f"v{j % 4}", {"N": 64 + j}, "float16", name="b")
        base = rng.uniform(1e-5, 1e-3)
        store.record_result(db, run_id, job, JobResult(job.key, "passed", inner=8, warmup_s=0.1, warmup_calls=3,
                                                       samples=[base * rng.lognormvariate(0, 0.05) for _ in range(10)]))
    store.finish_run(db, run_id, "passed")
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        filled = folder / "filled.db"
        db = store.open_database(f"sqlite:///{filled}")
        rows = [{"repo": REPO, "sha": sha(i), "message": "", "author": "", "branch": "", "committed_at": None,
                 "parents": [sha(i - 1)] if i else []} for i in range(args.commits)]
        with db.session() as session:
            session.execute(insert(Commit.__table__), rows)
        one_run(db, args.commits - 1 + 10**6, sha(args.commits - 1))  # the repository has runs too
        db.close()
        bundles = []
        for k in range(args.repeat):  # each a run of a new commit, made in a database of its own
            source = store.open_database(f"sqlite:///{folder / f'source{k}.db'}")
            run_id = one_run(source, args.commits + k, sha(args.commits - 1))
            bundles.append(folder / f"{k}.bundle")
            export_bundle(source, bundles[-1], run_ids=[run_id])
            source.close()
        seconds = []
        for k, path in enumerate(bundles):
            target = folder / f"target{k}.db"
            shutil.copy(filled, target)
            db = store.open_database(f"sqlite:///{target}")
            began = time.perf_counter()
            import_bundle(db, path)
            seconds.append(time.perf_counter() - began)
            db.close()
        target = folder / "merge.db"
        shutil.copy(filled, target)
        db = store.open_database(f"sqlite:///{target}")
        merges = []
        for _ in range(args.repeat):
            with db.session() as session:
                began = time.perf_counter()
                identity.unify(session.connection())
                merges.append(time.perf_counter() - began)
        db.close()
    print(f"import of one run (20 jobs, 200 samples) into a database of {args.commits} commits of the same "
          f"repository: median {statistics.median(seconds):.3f} s over {len(seconds)} "
          f"({', '.join(f'{s:.3f}' for s in seconds)})")
    print(f"the identity merge (identity.unify) alone on that database: median {statistics.median(merges):.3f} s")


if __name__ == "__main__":
    main()
