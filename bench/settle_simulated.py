"""Settling rules on simulated ABBA sessions under on/off load (not a test): pooled trials against pairs.

Each session measures identical code (null) or a 2x slowdown in ABBA rounds of 9, 16, 16, ... trials a side (the
first as ``--first`` says); every trial's level is x ``busy`` while a load is on, and the load keeps its state from
one trial to the next with probability ``stay`` (0: independent per trial). After each round the series is decided
at that look's level, as ``harness compare --settle`` does, until it is flagged, settled unchanged (an interval
within [0.8, 1.25]) or five rounds are spent. Printed: the share of null sessions flagged and left undecided, and of
2x sessions regressed, for the pooled rule (``trials.compare_trials``, same session) and the paired one
(``paired.compare_paired``), at levels spending all of alpha and a fifth of it.

    python bench/settle_simulated.py --sessions 300
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.stats import paired, trials  # noqa: E402
from harness.stats.policy import Policy  # noqa: E402
from harness.stats.settling import excludes_a_real_change, look_alpha  # noqa: E402
from testkit.load import abba_session  # noqa: E402


def session(rng: np.random.Generator, rounds: int, effect: float, busy: float, stay: float):
    pairs = abba_session(rng, rounds, effect=effect, busy=busy, stay=stay, within=0.03)
    return [base for base, _ in pairs], [head for _, head in pairs]


def settle(rng, rule: str, share: float, first: int, effect: float, busy: float, stay: float, looks: int = 5) -> str:
    base: list = []
    head: list = []
    for look in range(1, looks + 1):
        more_base, more_head = session(rng, min(16, first * 2 ** (look - 1)), effect, busy, stay)
        base += more_base
        head += more_head
        alpha = look_alpha(0.05, look, Policy(settle_share=share))
        if rule == "paired":
            result = paired.compare_paired({0: list(zip(base, head, strict=True))}, alpha=alpha)[0]
        else:
            result = trials.compare_trials({0: (base, head)}, same_session=True, alpha=alpha)[0]
        if result.verdict in ("regressed", "improved"):
            return result.verdict
        if result.verdict == "unchanged" and excludes_a_real_change(result.ci_low, result.ci_high):
            return "unchanged"
    return "inconclusive"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for busy in (1.8, 3.0):
        for stay in (0.0, 0.7):
            for rule, share, first in (("pooled", 1.0, 4), ("paired", 1.0, 7), ("paired", 0.2, 9)):
                null = [settle(rng, rule, share, first, 1.0, busy, stay) for _ in range(args.sessions)]
                slow = [settle(rng, rule, share, first, 2.0, busy, stay) for _ in range(args.sessions)]
                flagged = sum(v in ("regressed", "improved") for v in null) / args.sessions
                print(f"load x{busy} stay {stay}: {rule} at {share:g} alpha (first round {first}): null flagged "
                      f"{flagged:.1%}, undecided {null.count('inconclusive') / args.sessions:.0%}; 2x regressed "
                      f"{slow.count('regressed') / args.sessions:.1%}", flush=True)


if __name__ == "__main__":
    main()
