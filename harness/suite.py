"""Suite specs: the declarative job suite (TOML) and its validation, with errors that name the bad field.

A suite document looks like::

    [suite]
    name = "builtin"
    plugins = []                 # modules imported first: they may register kernels or variants

    [timing]                     # default timing protocol for every benchmark
    samples = 10

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
"""

from __future__ import annotations

import importlib
import itertools
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import SuiteError

CHIP_CLASSES = ("cpu", "gpu")
DTYPES = ("float32", "float16", "bfloat16")
BUILTIN_SUITE = Path(__file__).resolve().parent.parent / "jobs" / "builtin.toml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SuiteMeta(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    plugins: list[str] = []


class TimingSpec(_Strict):
    warmup_s: float = Field(0.2, ge=0)
    warmup_calls: int = Field(3, ge=0)
    min_sample_s: float = Field(0.02, gt=0)
    samples: int = Field(10, ge=1, le=10_000)
    max_inner: int = Field(10_000, ge=1)
    timeout_s: float = Field(300.0, gt=0)


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
    timing: dict[str, float | int] = {}

    @field_validator("grid")
    @classmethod
    def _grids_not_empty(cls, grid: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
        for chip_class, axes in grid.items():
            if not axes:
                raise ValueError(f"grid.{chip_class} has no axes")
            for axis, values in axes.items():
                if not values:
                    raise ValueError(f"grid.{chip_class}.{axis} is empty")
        return grid


class Suite(_Strict):
    suite: SuiteMeta
    timing: TimingSpec = TimingSpec()
    calibration: dict[Literal["cpu", "gpu"], CalibrationSpec] = {}
    correctness: list[CorrectnessSpec] = []
    benchmark: list[BenchmarkSpec] = []
    source: str = ""

    def grid_shapes(self, bench: BenchmarkSpec, chip_class: str) -> list[dict[str, int]]:
        """The grid for one chip class expanded into shape dicts (empty when the class has no grid)."""
        axes = bench.grid.get(chip_class, {})
        if not axes:
            return []
        names = list(axes)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]


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


def _check_against_registry(suite: Suite, source: str) -> None:
    from kernels import REGISTRY

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
