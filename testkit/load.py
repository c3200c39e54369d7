"""Background CPU load that switches on and off at random, as on a shared CI runner (for scripts that measure how
verdicts hold up under load: tools/validate_stats.py --cpu-load, bench/ab_null_under_load.py)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


def burn_at_random(stop: float, seed: int, phase_s: tuple[float, float] = (0.2, 2.0)) -> None:
    """Until ``stop`` (epoch seconds): phases of ``phase_s`` seconds (uniform; default 0.2-2 s), each busy (a
    spinning core) or idle with probability 1/2."""
    rng = np.random.default_rng(seed)
    while time.time() < stop:
        phase_end = time.time() + rng.uniform(*phase_s)
        busy = rng.random() < 0.5
        while time.time() < phase_end:
            if not busy:
                time.sleep(0.05)


@contextmanager
def random_load(burners: int, *, seed: int = 0, limit_s: float = 3600.0,
                phase_s: tuple[float, float] = (0.2, 2.0)) -> Iterator[None]:
    """``burners`` processes of ``burn_at_random`` (phases of ``phase_s`` seconds) while the block runs (none when
    0); terminated on the way out."""
    stop = time.time() + limit_s
    processes = [multiprocessing.Process(target=burn_at_random, args=(stop, seed + i, phase_s), daemon=True)
                 for i in range(burners)]
    for process in processes:
        process.start()
    try:
        yield
    finally:
        for process in processes:
            process.terminate()
            process.join(5)


def abba_session(rng: np.random.Generator, rounds: int, *, effect: float, busy: float, stay: float,
                 within: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """A simulated ABBA session of two commits (tests and bench/settle_simulated.py): each trial 10 samples of
    lognormal ``within`` (log sd) around its level, x ``busy`` while a load is on, the head's x ``effect``; the load
    keeps its state from one trial to the next with probability ``stay`` (0: drawn afresh every trial). The pairs
    (base trial r, head trial r)."""
    from harness.pipeline.ab import abba

    loaded, measured = bool(rng.random() < 0.5), {}
    for side, number in abba(rounds):
        if rng.random() > stay:
            loaded = bool(rng.random() < 0.5)
        measured[side, number] = (np.exp(rng.normal(0.0, within, 10)) * (busy if loaded else 1.0)
                                  * (effect if side else 1.0))
    return [(measured[0, r], measured[1, r]) for r in range(rounds)]
