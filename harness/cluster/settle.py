"""`harness compare BASE HEAD --settle --address HEAD:PORT`: settle on the cluster, each chip on a node of its own.

For every chip with a series to settle (``harness.pipeline.settle.undecided_chips``), each settling round is one
Ray task on a node labelled with that chip (``label_selector={"chip": key}``, the node's ``harness_node`` resource
whole, as a timed job takes it): the task runs the round's ABBA session there (``harness.pipeline.ab.execute_ab``,
the chip key as the node's label) and stores the two settling runs in the database given, which the node must
reach (a PostgreSQL URL, or an SQLite file on a disk the node shares). The repository and the suite are passed as
absolute paths: a local path must be at the same path on the node (one machine, shared disk); a URL is fetched.
A round that gives no result in the time left of the budget plus ``SETUP_S`` (``ROUND_TIMEOUT_S`` plus that with a
trial budget) is cancelled and ends settling with a one-line error (exit 2); so does a chip with no live node,
before anything is measured.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.core.errors import HarnessError
from harness.pipeline.ab import ABRequest, execute_ab
from harness.pipeline.settle import Measure
from harness.record import store
from harness.spec import git

SETUP_S = 300.0  # beyond the round's measuring: the node's checkout of both commits, imports, warm-up
ROUND_TIMEOUT_S = 1800.0  # a round's measuring when the budget is in trials, not seconds
CANCEL_WAIT_S = 10.0  # after cancelling a round that overran, how long to wait for its task to stop


def for_nodes(request: ABRequest) -> ABRequest:
    """``request`` with its local paths absolute (repository, suite, SQLite file): a task runs in another folder."""
    repo = str(Path(request.repo).expanduser().resolve()) if git.is_local_path(request.repo) else request.repo
    suite = request.suite
    if suite is not None and Path(suite).expanduser().is_file():
        suite = str(Path(suite).expanduser().resolve())
    db_url = request.db_url or store.default_db_url()
    prefix = "sqlite:///"
    if db_url.startswith(prefix) and not db_url[len(prefix):].startswith("/") and db_url != "sqlite:///:memory:":
        db_url = prefix + str(Path(db_url[len(prefix):]).expanduser().resolve())
    return replace(request, repo=repo, suite=suite, db_url=db_url)


def check_chips(chips: list[str]) -> None:
    """A one-line error naming the first of ``chips`` that no live node of the cluster is labelled with."""
    from harness.execute.ray_executor import chip_label_value, live_chips, no_node_message  # loads ray

    present = live_chips()
    for chip in chips:
        if chip_label_value(chip) not in present:
            raise HarnessError(no_node_message(chip, present))


def measure_round(request: ABRequest) -> tuple[str, str]:
    """On the node: one settling round, ABBA, stored; the (base, head) run ids."""
    import ray  # on a node, in a Ray worker: ray is loaded

    base, head = execute_ab(replace(request, node=ray.get_runtime_context().get_node_id()))
    return base.run_id, head.run_id


def measure_on(chip: str) -> Measure:
    """A ``Measure`` running each round as a Ray task on a node labelled ``chip`` (module docstring)."""
    import ray  # loads ray: only with --address

    from harness.execute.ray_executor import (  # loads ray: only with --address
        CHIP_LABEL,
        NODE_RESOURCE,
        chip_label_value,
    )

    task = ray.remote(num_cpus=0, max_retries=0)(measure_round)

    def measure(request: ABRequest, left_s: float | None) -> tuple[str, str]:
        timeout_s = (ROUND_TIMEOUT_S if left_s is None else left_s) + SETUP_S
        ref = task.options(label_selector={CHIP_LABEL: chip_label_value(chip)}, resources={NODE_RESOURCE: 1.0},
                           name=f"harness-settle:{chip}").remote(request)
        ready, _ = ray.wait([ref], timeout=timeout_s)
        if not ready:
            ray.cancel(ref)  # KeyboardInterrupt in the task: execute_ab kills the jobs it started
            ray.wait([ref], timeout=CANCEL_WAIT_S)
            raise HarnessError(f"settling on chip {chip}: the round gave no result within {timeout_s:.0f} s "
                               "on its node (cancelled)")
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[-1]
            raise HarnessError(f"settling on chip {chip} failed on its node: {first}") from None

    return measure
