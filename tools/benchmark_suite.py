"""Print the built-in suite with its benchmark sections only, optionally with another trial count.

    python tools/benchmark_suite.py --trials 1 > /tmp/bench.toml && harness run --suite /tmp/bench.toml

What "one run of the built-in benchmark sections" means in the trial-cost figures (bench/h200_trials/
trial_cost.sh); the suite's header (timing, calibration) is kept as it is, except ``trials``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.suites import benchmark_sections  # noqa: E402

BUILTIN = Path(__file__).resolve().parent.parent / "jobs" / "builtin.toml"


def benchmark_suite(text: str, trials: int | None) -> str:
    """The header and every ``[[benchmark]]`` section of a suite document (``testkit.suites.benchmark_sections``),
    with ``[timing] trials`` replaced when ``trials`` is given."""
    body = benchmark_sections(text)
    if trials is not None:
        body, count = re.subn(r"(?m)^trials = \d+", f"trials = {trials}", body, count=1)
        if not count:
            raise SystemExit("the suite's [timing] has no 'trials = N' line to replace")
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=None, help="replace [timing] trials (default: keep it)")
    args = parser.parse_args()
    sys.stdout.write(benchmark_suite(BUILTIN.read_text(), args.trials))


if __name__ == "__main__":
    main()
