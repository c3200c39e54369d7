"""CUDA source kernels compiled once per machine instead of once per process.

``mx.fast.cuda_kernel`` compiles its source with NVRTC the first time each process calls it (about 1.4 s per
(kernel, template) on the H200) and MLX 0.32 writes no disk cache for such kernels. The harness measures every
benchmark in several fresh processes (trials), so a run paid that compile once per trial.

MLX does *read* its compiled-kernel folder (``$MLX_PTX_CACHE_DIR``, else ``<tmp>/mlx/<version>/ptx``) before it
compiles any kernel, custom ones included: ``<module>.ptx`` (PTX or a cubin) and ``<module>.txt`` (kernel name, tab,
symbol), where a custom kernel's module is ``custom_kernel_<name><template suffix>``. :func:`cuda_kernel` takes the
same arguments as ``mx.fast.cuda_kernel`` and returns a callable with the same call signature that launches through
MLX's own kernel, so nothing changes per launch. Before the first launch of a (kernel, template) in a process it
makes sure that folder holds the module: it builds the same kernel MLX would (the header, then a ``__global__``
function whose parameters are the inputs and outputs and whose body starts with the template arguments as
constants), compiles it with NVRTC for this device's architecture (the options MLX passes) and writes the cubin
there. Later processes find it and only load it.

The kernel's name carries a digest of its source, header, dtypes and compile settings, so an edited kernel is
another module and a stale cubin is never loaded. ``HARNESS_CUDA_CACHE=off`` turns this off (MLX compiles in every
process, as before). Where NVRTC cannot be loaded or refuses the source, MLX compiles it as before and
:data:`FALLBACKS` says why (``scripts/cuda_jit_cost.py`` prints it).
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
NAME_PLACEHOLDER = "HARNESS_KERNEL_NAME"

# The C type of each MLX dtype in a kernel signature (MLX's dtype_to_cuda_type).
CUDA_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "int32": "int32_t",
              "uint32": "uint32_t", "int16": "int16_t", "uint16": "uint16_t", "int8": "int8_t",
              "uint8": "uint8_t", "bool": "bool"}

# MLX's get_type_string: how a dtype template argument reads in a module name.
MLX_TYPE_STRINGS = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t", "bool": "bool",
                    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t",
                    "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t"}

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

# kernel name -> why MLX compiles it in this process instead of loading a cubin compiled here
FALLBACKS: dict[str, str] = {}
# Options added to NVRTC's (part of the cache key). Empty, as MLX compiles; a probe may add e.g.
# "--ptxas-options=-v" (ptxas's register and spill report lands in the module's .log file) or "--maxrregcount=N".
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


def enabled() -> bool:
    """False when ``$HARNESS_CUDA_CACHE`` is ``off``."""
    return os.environ.get(CACHE_ENV, "").lower() != "off"


def mlx_cache_dir() -> Path:
    """The folder MLX reads compiled kernels from before it compiles one (what MLX's ``ptx_cache_dir`` returns:
    ``$MLX_PTX_CACHE_DIR``, else ``<tmp>/mlx/<version>/ptx``). MLX reads the variable once, at its first compile;
    setting it here when unset pins MLX to this same folder even if its own version string or temporary folder
    were spelled differently."""
    import mlx.core as mx

    default = str(Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "ptx")
    return Path(os.environ.setdefault("MLX_PTX_CACHE_DIR", default))


def template_suffix(template: Sequence[tuple[str, Any]]) -> str:
    """MLX's ``template_arguments_hash``: the end of a custom kernel's module name."""
    parts = []
    for _, value in template:
        if isinstance(value, bool):
            parts.append("_t" if value else "_f")
        elif isinstance(value, int):
            parts.append(f"_{value}")
        else:
            parts.append("_" + MLX_TYPE_STRINGS[dtype_name(value)])
    return "".join(parts)


@functools.cache
def device_arch() -> str:
    import mlx.core as mx

    arch = str(mx.device_info().get("architecture", ""))
    if not arch.startswith("sm_"):
        raise CompileError(f"unknown GPU architecture {arch!r}")
    return arch


def write_atomically(path: Path, data: bytes) -> None:
    """Another process reading ``path`` sees all of it or nothing (one compiling the same kernel writes the same)."""
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)


def prefill(directory: Path, module: str, source: str, arch_suffix: str = "") -> None:
    """Compile ``source`` (with :data:`NAME_PLACEHOLDER`) into ``<directory>/<module>.ptx`` with the index MLX reads,
    unless it is there. The index goes first: MLX takes the module as present once its ``.ptx`` exists.
    ``arch_suffix``: "a" compiles for the architecture-specific target (``sm_90a``: wgmma, setmaxnreg)."""
    ptx = directory / f"{module}.ptx"
    if ptx.is_file():
        return
    compiler, arch = nvrtc(), device_arch() + arch_suffix
    symbol = "harness_" + hashlib.sha256(f"{module}\n{source}".encode()).hexdigest()[:20]
    home = cuda_home()
    cubin, log = compiler.compile(source.replace(NAME_PLACEHOLDER, symbol), arch, f"{home}/include" if home else None)
    directory.mkdir(parents=True, exist_ok=True)
    if log.strip():
        (directory / f"{module}.log").write_text(log)
    write_atomically(directory / f"{module}.txt", f"mlx::core::cu::{module}\t{symbol}\n".encode())
    write_atomically(ptx, cubin)


class CudaKernel:
    """``mx.fast.cuda_kernel``'s callable, whose compiled modules MLX finds on disk (see the module docstring).

    ``min_blocks``: ``__launch_bounds__(threads, min_blocks)`` in the compiled kernel; ``arch_suffix``: "a" for
    the architecture-specific target (``sm_90a``). Both only where this module compiles the kernel: MLX's own
    compile has neither, so a kernel that needs ``sm_90a`` fails there."""

    def __init__(self, name: str, input_names: Sequence[str], output_names: Sequence[str], source: str,
                 header: str = "", ensure_row_contiguous: bool = True, shared_memory: int = 0,
                 min_blocks: int | None = None, arch_suffix: str = "") -> None:
        self.name, self.input_names, self.output_names = name, list(input_names), list(output_names)
        self.source, self.header, self.min_blocks, self.arch_suffix = source, header, min_blocks, arch_suffix
        self.ensure_row_contiguous, self.shared_memory = ensure_row_contiguous, shared_memory
        self._prefilled: set[str] = set()

    @functools.cache  # noqa: B019 -- one MLX kernel per dtype signature, for the life of the process
    def _mlx_kernel(self, dtypes: tuple[tuple[str, ...], tuple[str, ...]]):
        import mlx.core as mx

        settings = (f"{self.source}\n{self.header}\n{dtypes}\n{self.min_blocks}\n{self.arch_suffix}\n"
                    f"{EXTRA_OPTIONS}\n{mx.__version__}")
        name = f"{self.name}_{hashlib.sha256(settings.encode()).hexdigest()[:12]}"
        return name, mx.fast.cuda_kernel(name=name, input_names=self.input_names, output_names=self.output_names,
                                         source=self.source, header=self.header,
                                         ensure_row_contiguous=self.ensure_row_contiguous,
                                         shared_memory=self.shared_memory)

    def _prefill(self, module: str, dtypes: tuple[tuple[str, ...], tuple[str, ...]],
                 template: Sequence[tuple[str, Any]], threads: int) -> None:
        bounds = (threads, self.min_blocks) if self.min_blocks else None
        source = kernel_source(self.header, self.source, list(zip(self.input_names, dtypes[0], strict=True)),
                               list(zip(self.output_names, dtypes[1], strict=True)), template, bounds)
        prefill(mlx_cache_dir(), module, source, self.arch_suffix)

    def __call__(self, *, inputs: Sequence[Any], output_shapes: Sequence[Sequence[int]],
                 output_dtypes: Sequence[Any], grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
                 template: Sequence[tuple[str, Any]] = ()) -> list[Any]:
        dtypes = (tuple(dtype_name(x.dtype) for x in inputs), tuple(dtype_name(d) for d in output_dtypes))
        name, kernel = self._mlx_kernel(dtypes)
        module = f"custom_kernel_{name}{template_suffix(template)}"
        if module not in self._prefilled and enabled() and self.name not in FALLBACKS:
            try:
                self._prefill(module, dtypes, template, threadgroup[0] * threadgroup[1] * threadgroup[2])
            except (CompileError, OSError, KeyError) as error:
                FALLBACKS[self.name] = str(error)
            self._prefilled.add(module)
        return kernel(inputs=list(inputs), template=list(template), grid=grid, threadgroup=threadgroup,
                      output_shapes=list(output_shapes), output_dtypes=list(output_dtypes))


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str = "",
                ensure_row_contiguous: bool = True, shared_memory: int = 0) -> CudaKernel:
    """Drop-in for ``mx.fast.cuda_kernel`` whose compiled kernels outlive the process (see the module docstring)."""
    return CudaKernel(name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory)
