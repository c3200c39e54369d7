"""What `harness bisect` is asked to follow, and its check against the suite before anything runs.

The request (:class:`BisectRequest`), the rules that say which jobs it names (a benchmark series in perf mode, the
correctness jobs or pytest selection in correctness mode; :mod:`harness.bisect.probes` applies them to a run's
stored rows), and the two uses of those rules on a *planned* suite, before any run:

- :func:`check_against_suite`: the good commit's suite is planned (a checkout and the plan; no job runs) and a
  ``--kernel``, ``--gate`` or option it does not have is refused in one line with the valid names
  (:func:`check_selection`);
- :func:`probe_jobs`: the planned jobs a probe run needs (correctness mode: the install job and the jobs it reads).

Light on purpose (no numpy, no scipy): the CLI refuses a mistyped name before it loads the statistics stack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.core import defaults
from harness.core.errors import HarnessError
from harness.core.job import Job, shape_label
from harness.core.status import CORRECTNESS_KINDS
from harness.record.runs import StoredJob
from harness.spec import git
from harness.spec.plan import plan_jobs
from harness.spec.target import resolve_run

Mode = Literal["perf", "correctness"]


@dataclass
class BisectRequest:
    good: str
    bad: str
    kernel: str
    mode: Mode = "perf"
    chip: str | None = None  # default: this machine's chip (local executor); required with Ray
    variant: str | None = None
    shape: str | None = None  # "N=256" or "B=1,H=4,S=128,D=64" (any order)
    dtype: str | None = None
    check: str | None = None  # correctness mode: a check name, or a pytest test's node id (or "::name" suffix)
    repo: str = "."
    suite: str | None = None
    db_url: str | None = None
    executor: str = "local"
    address: str | None = None
    parallel: int = 1
    max_rounds: int | None = None
    probes_per_round: int | None = None  # default: 1 locally, the chip's live nodes with Ray
    max_runs: int = defaults.BISECT_MAX_RUNS  # perf: new runs of one commit at most while it is undecided
    confirm_runs: int = defaults.BISECT_CONFIRM_RUNS  # perf: agreeing runs the endpoints and the culprit's bounds need
    min_effect: float = defaults.MIN_EFFECT
    alpha: float = defaults.ALPHA
    gates: tuple[str, ...] = ()  # perf mode: more correctness jobs / pytest selections whose failure skips a commit
    reuse: bool = True


def normalize_shape(text: str | None) -> str | None:
    """'S=128, B=1' -> 'B=1,S=128' (the stored shape key)."""
    if text is None:
        return None
    shape: dict[str, int] = {}
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            shape[name.strip()] = int(value)
        except ValueError:
            raise HarnessError(f"--shape {text!r}: expected NAME=INT pairs, e.g. N=256 or B=1,H=4") from None
        if not sep or not name.strip():
            raise HarnessError(f"--shape {text!r}: expected NAME=INT pairs, e.g. N=256 or B=1,H=4")
    return shape_label(shape)


@dataclass(frozen=True)
class Series:
    kernel: str
    variant: str
    dtype: str
    shape_key: str

    def __str__(self) -> str:
        parts = [self.variant, self.dtype or "", self.shape_key or "no shape"]
        return f"{self.kernel} [{', '.join(p for p in parts if p)}]"


def is_named(job: StoredJob, name: str) -> bool:
    """The job row is the kernel (or job) ``name``."""
    return name in (job.kernel, job.name)


def benchmark_matches(job: StoredJob, request: BisectRequest, shape: str | None) -> bool:
    """A benchmark row of the series the request names (kernel, variant, dtype, shape)."""
    return (job.kind == "benchmark" and is_named(job, request.kernel) and request.variant in (None, job.variant)
            and request.dtype in (None, job.dtype) and shape in (None, job.shape_key))


def is_selection(job: StoredJob, request: BisectRequest) -> bool:
    """The ``pytest`` row of the selection the request names (a run holding it says whether a ``--check`` test
    exists at that commit: running the commit again would not change that)."""
    return job.kind == "pytest" and is_named(job, request.kernel)


def correctness_matches(job: StoredJob, request: BisectRequest, shape: str | None) -> bool:
    """A correctness row (check, test) the request names."""
    if job.kind not in CORRECTNESS_KINDS or not is_named(job, request.kernel):
        return False
    if request.variant not in (None, job.variant) or request.dtype not in (None, job.dtype):
        return False
    if shape is not None and job.kind == "correctness" and job.shape_key != shape:
        return False
    if request.check:
        if job.kind == "correctness":
            return job.check == request.check
        if job.kind == "test":
            return job.name == request.check or job.name.endswith("::" + request.check.removeprefix("::"))
        return False
    return True


def planned_row(job: Job) -> StoredJob:
    """A planned job as the row it will be stored as (no id, no status yet): the rules above apply to it."""
    labels = job.labels
    return StoredJob(0, "", job.kind, job.key, labels.kernel, job.name, labels.variant, labels.dtype, labels.shape_key,
                     labels.check, "", "")


def _listed(names: Sequence[str], most: int = 12) -> str:
    unique = sorted(dict.fromkeys(n for n in names if n))
    return ", ".join(unique[:most]) + (f", ... ({len(unique)} in all)" if len(unique) > most else "") or "none"


def _all_names(jobs: Sequence[StoredJob]) -> list[str]:
    return [name for job in jobs for name in (job.kernel, job.name)]


def check_selection(planned: Sequence[StoredJob], request: BisectRequest, where: str) -> None:
    """Refuse, before any run, a request that names nothing in the suite ``where`` (the good commit's) plans: an
    unknown ``--kernel`` or ``--gate``, or options that none of the kernel's jobs has; one line each, with the valid
    names. A ``--check`` of a pytest selection names a test, known only once the selection ran: :func:`follow`
    checks it at the good commit."""
    shape = normalize_shape(request.shape)
    wrong = [job for job in planned if job.kind in CORRECTNESS_KINDS]
    if request.mode == "perf":
        timed = [job for job in planned if job.kind == "benchmark"]
        named = [job for job in timed if is_named(job, request.kernel)]
        if not named:
            raise HarnessError(f"--kernel {request.kernel!r}: no benchmark of that name in the suite at {where} "
                               f"(its benchmarks: {_listed(_all_names(timed))})")
        if not any(benchmark_matches(job, request, shape) for job in named):
            series = [str(Series(j.kernel, j.variant, j.dtype, j.shape_key)) for j in named]
            raise HarnessError(f"no benchmark of {request.kernel!r} at {where} matches {_options(request)} "
                               f"(its series: {_listed(series, 8)})")
        for gate in request.gates:
            if not any(is_named(job, gate) for job in wrong):
                raise HarnessError(f"--gate {gate!r}: no correctness job or pytest selection of that name in the "
                                   f"suite at {where} (its correctness jobs: {_listed(_all_names(wrong))})")
        return
    named = [job for job in wrong if is_named(job, request.kernel)]
    if not named:
        raise HarnessError(f"--kernel {request.kernel!r}: no correctness job or pytest selection of that name in the "
                           f"suite at {where} (its correctness jobs and selections: {_listed(_all_names(wrong))})")
    if any(job.kind == "pytest" for job in named) or any(correctness_matches(job, request, shape) for job in named):
        return
    what = [f"{j.variant} {j.dtype} {j.shape_key or 'no shape'} check {j.check}" for j in named]
    raise HarnessError(f"no correctness job of {request.kernel!r} at {where} matches {_options(request)} "
                       f"(its jobs: {_listed(what, 8)})")


def _options(request: BisectRequest) -> str:
    parts = [f"--{name} {value}" for name, value in (("variant", request.variant), ("dtype", request.dtype),
                                                      ("shape", request.shape), ("check", request.check)) if value]
    return " ".join(parts) or "the options"


def probe_jobs(request: BisectRequest) -> Callable[[StoredJob], bool] | None:
    """Which planned jobs a probe run needs (None: the whole suite). Correctness mode: the install job and the jobs
    :func:`correctness_outcome` reads (the kernel's correctness jobs, or the pytest selection whose tests it
    follows): no calibration, no benchmark, no other selection. Perf mode runs the whole suite."""
    if request.mode != "correctness":
        return None
    shape = normalize_shape(request.shape)

    def needed(job: StoredJob) -> bool:
        return job.kind == "install" or is_selection(job, request) or correctness_matches(job, request, shape)

    return needed


def counted(n: int, noun: str) -> str:
    """'1 commit', '2 commits'."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def describe_selection(request: BisectRequest) -> str:
    parts = [f"variant {request.variant}" if request.variant else "", f"check {request.check}" if request.check else "",
             f"dtype {request.dtype}" if request.dtype else "", f"shape {request.shape}" if request.shape else ""]
    extra = ", ".join(p for p in parts if p)
    return f"{request.kernel}" + (f" ({extra})" if extra else "")


def check_request(request: BisectRequest) -> None:
    """The options' own values (one-line errors, exit 2)."""
    if request.mode not in ("perf", "correctness"):
        raise HarnessError(f"--mode must be perf or correctness, not {request.mode!r}")
    if request.executor not in ("local", "ray"):
        raise HarnessError(f"--executor must be local or ray, not {request.executor!r}")
    if request.max_rounds is not None and request.max_rounds < 1:
        raise HarnessError(f"--max-rounds must be at least 1, not {request.max_rounds}")
    if request.probes_per_round is not None and request.probes_per_round < 1:
        raise HarnessError(f"--probes-per-round must be at least 1, not {request.probes_per_round}")
    if request.max_runs < 1:
        raise HarnessError(f"--max-runs must be at least 1, not {request.max_runs}")
    if request.confirm_runs < 1:
        raise HarnessError(f"--confirm-runs must be at least 1, not {request.confirm_runs}")
    normalize_shape(request.shape)


def _good_sha(request: BisectRequest) -> str:
    """The good commit's full sha (the repository as `harness bisect` lists its commits: a path, or a URL fetched
    into the clone cache)."""
    if not git.is_local_path(request.repo):
        return git.fetch(request.repo, request.good)[1]
    path = Path(request.repo).expanduser()
    if not path.exists() or not git.is_repo(path):
        raise HarnessError(f"--repo {request.repo} is not a git repository")
    return git.resolve(git.toplevel(path), request.good).sha


def check_against_suite(request: BisectRequest, log: Callable[[str], None] = lambda line: None) -> None:
    """Check the request, then plan the good commit's suite (nothing runs) and refuse a selection it does not have
    (:func:`check_selection`), for either chip class (a name of the other class's jobs only is reported by the
    first run, as before): detecting this machine's class would load MLX."""
    check_request(request)
    good = _good_sha(request)
    where = f"the good commit {good[:12]}"
    _, suite = resolve_run(request.repo, good, request.suite)  # HarnessError: the good commit has no suite
    try:
        planned = [planned_row(job) for chip_class in ("cpu", "gpu")
                   for job in plan_jobs(suite, chip_class, plugin_dir=str(Path(suite.source).resolve().parent))]
    except Exception as exc:  # noqa: BLE001 - its kernels are not this install's: its runs will say what it has
        log(f"cannot plan the suite at {where} here ({type(exc).__name__}: {exc}): the selection is checked on its "
            "first run")
        return
    check_selection(planned, request, where)
