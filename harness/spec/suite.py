"""Suite specs: the declarative job suite (TOML) and its validation, with errors that name the bad field.

A suite document looks like::

    [suite]
    name = "builtin"
    plugins = []                 # modules imported first: they may register kernels or variants

    [timing]                     # default timing protocol for every benchmark
    samples = 10                 # samples per job process
    trials = 3                   # independent job processes per benchmark and run (the unit of evidence)
    mode = "pipelined"           # or "per-call" (latency incl. the host round trip), "auto" (a pilot per job),
                                 # "device" (CUDA: queued calls timed on the GPU's clock; else pipelined)
    threads = 4                  # optional: BLAS/OpenMP threads of the job process (default: inherited)

    [calibration.cpu]            # roofline calibration sizes per chip class (cpu | gpu)
    matmul_n = [256, 512]
    copy_n = [4194304]

    [[correctness]]
    name = "flash-boundaries"
    kernel = "flash_prefill"
    variants = "all"             # or a list of variant names
    dtypes = ["float32", "float16"]
    checks = ["reference"]
    shapes = [{B = 1, H = 2, S_q = 1, S_kv = 1, D = 32}]

    [[benchmark]]
    name = "flash-grid"
    kernel = "flash_prefill"
    variants = "all"
    dtypes = ["float16"]
    grid.cpu = {B = [1], H = [4], S = [128, 256], D = [32, 64]}
    grid.gpu = {B = [1], H = [32], S = [2048, 8192], D = [64, 128]}

Another repository's suite (``harness.toml`` at its root; docs/external-repos.md) uses the same schema with
three more sections, which need the repository's tree (``harness run --repo PATH_OR_URL --commit SHA``)::

    [install]                    # optional: an isolated environment per install key (harness/execute/envs.py)
    command = "pip install -e . --no-deps"   # pip builds in isolation: a current setuptools and wheel per build
    key_files = ["pyproject.toml", "setup.py", "setup.cfg", "requirements*.txt", "*.lock"]   # the default
    timeout_s = 900
    per_commit = false           # true: a fresh environment for every commit (compiled extensions)

    [[pytest]]                   # a pytest selection: one job, stored per test (kind "test") and per selection
    name = "unit"
    paths = ["tests"]            # relative to the repository root; node ids ("tests/t.py::test_x") too
    k = "not slow"               # -k expression ("" none)
    m = ""                       # -m expression ("" none)
    args = ["-x"]                # more pytest arguments
    workers = 0                  # pytest-xdist workers (-n): 0 off, a number, or "auto"
    chips = ["cpu", "gpu"]       # chip classes that run it (default both)
    timeout_s = 900

    [[function]]                 # a benchmark function (harness/bench.py): one job per grid point
    name = "matmul"              # default: the target
    target = "tinykern.bench:bench_matmul"   # module:function; called with the grid point as keywords
    grid.cpu = {N = [128, 256]}  # per chip class, as [[benchmark]]; no grid at all: one call without arguments
    grid.gpu = {N = [2048, 4096]}
    dtypes = []                  # optional: also pass dtype="..." (one job per dtype)
    timing = {samples = 5, threads = 1}   # overrides [timing]
"""

from __future__ import annotations

import importlib
import itertools
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.core import defaults
from harness.core.config import SOURCE_ROOT
from harness.core.errors import SuiteError

CHIP_CLASSES = ("cpu", "gpu")
DTYPES = ("float32", "float16", "bfloat16")
BUILTIN_SUITE = SOURCE_ROOT / "jobs" / "builtin.toml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SuiteMeta(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    plugins: list[str] = []


class TimingSpec(_Strict):
    warmup_s: float = Field(defaults.WARMUP_S, ge=0)
    warmup_calls: int = Field(defaults.WARMUP_CALLS, ge=0)
    min_sample_s: float = Field(defaults.MIN_SAMPLE_S, gt=0)
    samples: int = Field(defaults.SAMPLES, ge=1, le=10_000)
    max_inner: int = Field(defaults.MAX_INNER, ge=1)
    timeout_s: float = Field(defaults.TIMEOUT_S, gt=0)
    mode: Literal["auto", "pipelined", "per-call", "device"] = defaults.TIMING_MODE
    trials: int = Field(defaults.TRIALS, ge=1, le=100)
    # BLAS/OpenMP threads of the job process (harness.execute.local.thread_env): None inherits the harness's env.
    threads: int | None = Field(defaults.THREADS, ge=1)


class CalibrationSpec(_Strict):
    matmul_n: list[int] = Field(min_length=1)
    copy_n: list[int] = Field(min_length=1)
    dtype: Literal["float32", "float16", "bfloat16"] = "float16"


class _JobSpec(_Strict):
    name: str = Field(min_length=1)
    kernel: str = Field(min_length=1)
    variants: Literal["all"] | list[str] = "all"
    dtypes: list[Literal["float32", "float16", "bfloat16"]] = Field(["float32"], min_length=1)
    timeout_s: float = Field(120.0, gt=0)

    @field_validator("variants")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one variant (or be \"all\")")
        return value


class CorrectnessSpec(_JobSpec):
    checks: list[str] = Field(["reference"], min_length=1)
    shapes: list[dict[str, int]] = Field(min_length=1)
    seed: int = 0


class BenchmarkSpec(_JobSpec):
    grid: dict[Literal["cpu", "gpu"], dict[str, list[int]]] = Field(min_length=1)
    timing: dict[str, float | int | str] = {}

    @field_validator("grid")
    @classmethod
    def _grids_not_empty(cls, grid: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
        return _check_grid(grid)


def _check_grid(grid: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
    for chip_class, axes in grid.items():
        if not axes:
            raise ValueError(f"grid.{chip_class} has no axes")
        for axis, values in axes.items():
            if not values:
                raise ValueError(f"grid.{chip_class}.{axis} is empty")
    return grid


DEFAULT_KEY_FILES = ["pyproject.toml", "setup.py", "setup.cfg", "requirements*.txt", "*.lock"]
TARGET = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class InstallSpec(_Strict):
    command: str = Field(min_length=1)
    key_files: list[str] = DEFAULT_KEY_FILES
    timeout_s: float = Field(900.0, gt=0)
    per_commit: bool = False

    @field_validator("command")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a shell command")
        return value

    @field_validator("key_files")
    @classmethod
    def _relative_globs(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or pattern.startswith("/") or ".." in Path(pattern).parts:
                raise ValueError(f"{pattern!r} must be a file name or glob relative to the repository root")
        return value


class PytestSpec(_Strict):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[^/\s]+$")  # test keys: test/<name>/<nodeid>
    paths: list[str] = []
    k: str = ""
    m: str = ""
    args: list[str] = []
    workers: Any = 0  # int >= 0 or "auto" (validated below: one message, no union member names)
    chips: list[Literal["cpu", "gpu"]] = Field(["cpu", "gpu"], min_length=1)
    timeout_s: float = Field(900.0, gt=0)

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        raise ValueError(f"must be a number of xdist workers (0: none) or \"auto\", not {value!r}")

    @field_validator("paths")
    @classmethod
    def _relative_paths(cls, value: list[str]) -> list[str]:
        for path in value:
            file = path.split("::", 1)[0]
            if not file or file.startswith("/") or ".." in Path(file).parts:
                raise ValueError(f"{path!r} must be a path relative to the repository root")
        return value


class FunctionSpec(_Strict):
    name: str = Field("", max_length=255)
    target: str = Field(max_length=100)
    grid: dict[Literal["cpu", "gpu"], dict[str, list[int]]] = {}
    dtypes: list[Literal["float32", "float16", "bfloat16"]] = []
    timing: dict[str, float | int | str] = {}
    timeout_s: float = Field(120.0, gt=0)

    @field_validator("target")
    @classmethod
    def _module_function(cls, value: str) -> str:
        if not TARGET.match(value):
            raise ValueError(f"{value!r} must be module:function (e.g. mypkg.bench:bench_matmul)")
        return value

    @field_validator("grid")
    @classmethod
    def _grids_not_empty(cls, grid: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
        return _check_grid(grid)

    @property
    def label(self) -> str:
        return self.name or self.target


class Suite(_Strict):
    suite: SuiteMeta
    timing: TimingSpec = TimingSpec()
    calibration: dict[Literal["cpu", "gpu"], CalibrationSpec] = {}
    correctness: list[CorrectnessSpec] = []
    benchmark: list[BenchmarkSpec] = []
    install: InstallSpec | None = None
    pytest: list[PytestSpec] = []
    function: list[FunctionSpec] = []
    source: str = ""

    @property
    def needs_tree(self) -> bool:
        """A suite of another repository's code: it runs from a checkout of the commit (install, pytest, functions)."""
        return bool(self.install or self.pytest or self.function)

    def grid_shapes(self, bench: BenchmarkSpec | FunctionSpec, chip_class: str) -> list[dict[str, int]]:
        """The grid for one chip class expanded into shape dicts (empty when the class has no grid)."""
        axes = bench.grid.get(chip_class, {})
        if not axes:
            return []
        names = list(axes)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]

    def function_shapes(self, spec: FunctionSpec, chip_class: str) -> list[dict[str, int]]:
        """A function's grid points on one chip class; a function with no grid at all is called once, bare."""
        return self.grid_shapes(spec, chip_class) if spec.grid else [{}]


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(str(item))
    return ".".join(parts)


def _format_validation(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    more = len(error.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {_field_path(first['loc'])}: {first['msg']}{tail}"


def load_plugins(modules: list[str], base_dir: Path | None = None) -> None:
    """Import plugin modules (they register kernels/variants); the suite's folder is importable."""
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's plugin problem
            raise SuiteError(f"suite.plugins: cannot import {module!r}: {exc}") from exc


def _check_repo_sections(suite: Suite, source: str) -> None:
    """Names unique across [[pytest]] and [[function]], and function timing overrides valid."""
    seen: set[str] = {spec.name for spec in (*suite.correctness, *suite.benchmark)}
    for section, specs in (("pytest", suite.pytest), ("function", suite.function)):
        for index, spec in enumerate(specs):
            where = f"{source}: {section}[{index}]"
            name = spec.name if isinstance(spec, PytestSpec) else spec.label
            if name in seen:
                raise SuiteError(f"{where}.name: duplicate job name {name!r}")
            seen.add(name)
            if isinstance(spec, FunctionSpec):
                try:
                    TimingSpec(**{**suite.timing.model_dump(), **spec.timing})
                except ValidationError as exc:
                    raise SuiteError(_format_validation(exc, f"{where}.timing")) from None


def check_tree(suite: Suite, tree: str | Path) -> None:
    """The suite's repository paths exist in the commit's tree (``tree``): errors name ``pytest[i].paths``."""
    root = Path(tree)
    for index, spec in enumerate(suite.pytest):
        for path in spec.paths:
            file = path.split("::", 1)[0]
            if not (root / file).exists():
                raise SuiteError(f"{suite.source}: pytest[{index}].paths: {file!r} does not exist in the "
                                 "repository at this commit")


def _check_against_registry(suite: Suite, source: str) -> None:
    if not (suite.correctness or suite.benchmark or suite.calibration):
        return  # a repository suite without built-in kernel sections never needs the kernel registry
    from kernels import REGISTRY  # loads mlx: only when needed

    seen: set[str] = set()
    for section, specs in (("correctness", suite.correctness), ("benchmark", suite.benchmark)):
        for index, spec in enumerate(specs):
            where = f"{source}: {section}[{index}]"
            if spec.name in seen:
                raise SuiteError(f"{where}.name: duplicate job name {spec.name!r}")
            seen.add(spec.name)
            kernel = REGISTRY.get(spec.kernel)
            if kernel is None:
                known = ", ".join(sorted(REGISTRY))
                raise SuiteError(f"{where}.kernel: unknown kernel {spec.kernel!r} (known: {known})")
            if spec.variants != "all":
                for variant in spec.variants:
                    if variant not in kernel.variants:
                        known = ", ".join(sorted(kernel.variants))
                        raise SuiteError(f"{where}.variants: unknown variant {variant!r} of {spec.kernel} "
                                         f"(known: {known})")
            shapes: list[tuple[str, dict[str, int]]] = []
            if isinstance(spec, CorrectnessSpec):
                for check in spec.checks:
                    if check not in kernel.checks:
                        known = ", ".join(sorted(kernel.checks))
                        raise SuiteError(f"{where}.checks: unknown check {check!r} of {spec.kernel} (known: {known})")
                shapes = [(f"shapes[{i}]", shape) for i, shape in enumerate(spec.shapes)]
            else:
                for chip_class in spec.grid:
                    shapes += [(f"grid.{chip_class}", s) for s in suite.grid_shapes(spec, chip_class)]
                try:
                    TimingSpec(**{**suite.timing.model_dump(), **spec.timing})
                except ValidationError as exc:
                    raise SuiteError(_format_validation(exc, f"{where}.timing")) from None
            for label, shape in shapes:
                try:
                    kernel.normalize_shape(shape)
                except (ValueError, KeyError, TypeError) as exc:
                    raise SuiteError(f"{where}.{label}: {exc}") from None


def parse_suite(document: Any, source: str = "<suite>", base_dir: Path | None = None) -> Suite:
    """Validate a parsed suite document; raise SuiteError naming the first bad field."""
    if not isinstance(document, dict):
        raise SuiteError(f"{source}: a suite must be a table, got {type(document).__name__}")
    try:
        suite = Suite(**document, source=source)
    except ValidationError as exc:
        raise SuiteError(_format_validation(exc, source)) from None
    except TypeError as exc:
        raise SuiteError(f"{source}: {exc}") from None
    load_plugins(suite.suite.plugins, base_dir)
    _check_against_registry(suite, source)
    _check_repo_sections(suite, source)
    return suite


def load_suite(path: str | Path | None = None) -> Suite:
    """Read and validate a suite file (the built-in suite when ``path`` is None)."""
    path = Path(path) if path else BUILTIN_SUITE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SuiteError(f"cannot read suite {path}: {exc.strerror or exc}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    return parse_suite(document, str(path), base_dir=path.resolve().parent)
