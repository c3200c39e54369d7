"""CUDA source kernels compiled once per machine instead of once per process.

``mx.fast.cuda_kernel`` compiles its source with NVRTC the first time each process calls it (about 1.4 s per
(kernel, template) on the H200) and MLX 0.32 keeps no disk cache for such kernels. The harness measures every
benchmark in several fresh processes (trials), so a run paid that compile once per trial.

:func:`cuda_kernel` takes the same arguments and returns a callable with the same call signature. It builds the
same kernel as MLX does (the header, then a ``__global__`` function whose parameters are the inputs and outputs
and whose body starts with the template arguments as constants), compiles it with NVRTC for this device's
architecture (the options MLX passes), stores the cubin in a cache directory keyed by a hash of the full source,
the architecture and the NVRTC version, and launches it with ``mx.fast.precompiled_cuda_kernel``. Another process
finds the cubin and only loads it.

The cache directory is ``$HARNESS_CUDA_CACHE`` (``off`` disables it: MLX compiles as before), else
``~/.cache/mlx-kernel-harness/cuda``. Where NVRTC cannot be loaded or refuses the source, the call falls back to
``mx.fast.cuda_kernel`` and :data:`FALLBACKS` says why (``scripts/cuda_jit_cost.py`` prints it).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ENV = "HARNESS_CUDA_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "mlx-kernel-harness" / "cuda"
NAME_PLACEHOLDER = "HARNESS_KERNEL_NAME"

# The C type of each MLX dtype in a kernel signature (MLX's dtype_to_cuda_type).
CUDA_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "int32": "int32_t",
              "uint32": "uint32_t", "int16": "int16_t", "uint16": "uint16_t", "int8": "int8_t",
              "uint8": "uint8_t", "bool": "bool"}

# What MLX's default header gives a kernel that ours use: the half types and the fixed-width integers (NVRTC has
# no <cstdint>; a typedef that repeats one from a CUDA header names the same type, which C++ allows).
PRELUDE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
"""

# kernel name -> why it runs through mx.fast.cuda_kernel instead of a cached cubin
FALLBACKS: dict[str, str] = {}
# Options added to NVRTC's (part of the cache key). Empty, as MLX compiles; a probe may add e.g.
# "--ptxas-options=-v" (ptxas's register and spill report lands in the cubin's .log file) or "--maxrregcount=N".
EXTRA_OPTIONS: tuple[str, ...] = ()


class CompileError(RuntimeError):
    """NVRTC is missing or rejected a source."""


def dtype_name(dtype: Any) -> str:
    """``mx.float16`` -> ``"float16"``."""
    return str(dtype).rsplit(".", 1)[-1]


def cuda_type(dtype: Any) -> str:
    name = dtype_name(dtype)
    try:
        return CUDA_TYPES[name]
    except KeyError:
        raise CompileError(f"no CUDA type for dtype {name}") from None


def template_line(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"  constexpr bool {name} = {'true' if value else 'false'};"
    if isinstance(value, int):
        return f"  constexpr int {name} = {value};"
    return f"  using {name} = {cuda_type(value)};"


def kernel_source(header: str, source: str, inputs: Sequence[tuple[str, Any]], outputs: Sequence[tuple[str, Any]],
                  template: Sequence[tuple[str, Any]], launch_bounds: tuple[int, int] | None = None) -> str:
    """The whole translation unit, with :data:`NAME_PLACEHOLDER` for the function's name.

    ``launch_bounds``: (threads per block, minimum resident blocks per SM) for ``__launch_bounds__``, which lets
    ptxas trade registers for occupancy (``mx.fast.cuda_kernel`` cannot express it)."""
    params = [f"    const {cuda_type(dtype)}* {name}" for name, dtype in inputs]
    params += [f"    {cuda_type(dtype)}* {name}" for name, dtype in outputs]
    constants = "\n".join(template_line(name, value) for name, value in template)
    bounds = f"__launch_bounds__({launch_bounds[0]}, {launch_bounds[1]}) " if launch_bounds else ""
    return (f"{PRELUDE}{header}\n"
            f'extern "C" __global__ void {bounds}{NAME_PLACEHOLDER}(\n' + ",\n".join(params) + ") {\n"
            f"{constants}\n{source}\n}}\n")


@dataclass(frozen=True)
class Nvrtc:
    lib: ctypes.CDLL
    version: str

    def compile(self, source: str, arch: str, include: str | None) -> tuple[bytes, str]:
        """A cubin for ``arch`` (e.g. ``sm_90``) and NVRTC's log."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None),
                    "nvrtcCreateProgram")
        try:
            options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in EXTRA_OPTIONS)]
            if include:
                options.append(f"--include-path={include}".encode())
            argv = (ctypes.c_char_p * len(options))(*options)
            if self.lib.nvrtcCompileProgram(prog, len(options), argv) != 0:
                raise CompileError(f"NVRTC rejected the source: {self._log(prog)[-2000:]}")
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw, self._log(prog)
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        self.lib.nvrtcGetProgramLog(prog, log)
        return log.value.decode(errors="replace")

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise CompileError(f"{call} failed with NVRTC status {status}")


def cuda_home() -> str | None:
    """Where the CUDA toolkit's headers are (MLX looks in the same places)."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and Path(candidate, "include").is_dir():
            return candidate
    return None


@functools.cache
def nvrtc() -> Nvrtc:
    """NVRTC, as loaded by MLX itself or from the CUDA toolkit; CompileError when there is none."""
    home = cuda_home()
    names = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    if home:
        names += [str(p) for p in sorted(Path(home).glob("lib*/libnvrtc.so*"))]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return Nvrtc(lib, f"{major.value}.{minor.value}")
    raise CompileError("NVRTC not found (libnvrtc.so)")


def cache_dir() -> Path | None:
    """The cubin cache, or None when ``$HARNESS_CUDA_CACHE`` is ``off``."""
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() == "off":
        return None
    return Path(value) if value else DEFAULT_CACHE


@functools.cache
def device_arch() -> str:
    import mlx.core as mx

    arch = str(mx.device_info().get("architecture", ""))
    if not arch.startswith("sm_"):
        raise CompileError(f"unknown GPU architecture {arch!r}")
    return arch


def cached_cubin(source: str, directory: Path) -> tuple[str, bytes]:
    """(function name, cubin) for a source with :data:`NAME_PLACEHOLDER`, compiled once per machine."""
    compiler, arch = nvrtc(), device_arch()
    key = hashlib.sha256(f"{arch}\n{compiler.version}\n{EXTRA_OPTIONS}\n{source}".encode()).hexdigest()[:20]
    name = f"harness_kernel_{key}"
    path = directory / f"{name}.cubin"
    if path.is_file():
        return name, path.read_bytes()
    home = cuda_home()
    cubin, log = compiler.compile(source.replace(NAME_PLACEHOLDER, name), arch, f"{home}/include" if home else None)
    directory.mkdir(parents=True, exist_ok=True)
    if log.strip():
        (directory / f"{name}.log").write_text(log)
    with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".tmp") as tmp:
        tmp.write(cubin)
    os.replace(tmp.name, path)  # atomic: a process that compiles the same kernel at the same time writes the same
    return name, cubin


class CudaKernel:
    """``mx.fast.cuda_kernel``'s callable, served from the cubin cache."""

    def __init__(self, name: str, input_names: Sequence[str], output_names: Sequence[str], source: str,
                 header: str = "", ensure_row_contiguous: bool = True, shared_memory: int = 0,
                 min_blocks: int | None = None) -> None:
        self.name, self.input_names, self.output_names = name, list(input_names), list(output_names)
        self.min_blocks = min_blocks
        self.source, self.header = source, header
        self.ensure_row_contiguous, self.shared_memory = ensure_row_contiguous, shared_memory

    @functools.cached_property
    def _mlx_kernel(self):
        import mlx.core as mx

        return mx.fast.cuda_kernel(name=self.name, input_names=self.input_names, output_names=self.output_names,
                                   source=self.source, header=self.header,
                                   ensure_row_contiguous=self.ensure_row_contiguous,
                                   shared_memory=self.shared_memory)

    @functools.cache  # noqa: B019 -- one entry per (dtypes, template): the kernels live as long as the process
    def _compiled(self, input_dtypes: tuple[str, ...], output_dtypes: tuple[str, ...],
                  template: tuple[tuple[str, Any], ...], threads: int, directory: Path) -> tuple[str, bytes]:
        bounds = (threads, self.min_blocks) if self.min_blocks else None
        source = kernel_source(self.header, self.source, list(zip(self.input_names, input_dtypes, strict=True)),
                               list(zip(self.output_names, output_dtypes, strict=True)), template, bounds)
        return cached_cubin(source, directory)

    def __call__(self, *, inputs: Sequence[Any], output_shapes: Sequence[Sequence[int]],
                 output_dtypes: Sequence[Any], grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
                 template: Sequence[tuple[str, Any]] = ()) -> list[Any]:
        import mlx.core as mx

        directory = cache_dir()
        if directory is not None and self.name not in FALLBACKS:
            try:
                name, cubin = self._compiled(tuple(dtype_name(x.dtype) for x in inputs),
                                             tuple(dtype_name(d) for d in output_dtypes),
                                             tuple((n, v if isinstance(v, (bool, int)) else dtype_name(v))
                                                   for n, v in template),
                                             threadgroup[0] * threadgroup[1] * threadgroup[2], directory)
            except (CompileError, OSError) as error:
                FALLBACKS[self.name] = str(error)
            else:
                return mx.fast.precompiled_cuda_kernel(
                    name=name, compiled_source=cubin, inputs=list(inputs), output_shapes=list(output_shapes),
                    output_dtypes=list(output_dtypes), scalars=[], grid=grid, threadgroup=threadgroup,
                    shared_memory=self.shared_memory, ensure_row_contiguous=self.ensure_row_contiguous)
        return self._mlx_kernel(inputs=list(inputs), template=list(template), grid=grid, threadgroup=threadgroup,
                                output_shapes=list(output_shapes), output_dtypes=list(output_dtypes))


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str = "",
                ensure_row_contiguous: bool = True, shared_memory: int = 0) -> CudaKernel:
    """Drop-in for ``mx.fast.cuda_kernel`` whose compiled kernels outlive the process (see the module docstring)."""
    return CudaKernel(name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory)
