"""CUDA source kernels launched through ``mx.fast.cuda_kernel``, named by a digest of their source, and a ptxas report.

**What a CUDA source kernel costs per process (measured on the H200, MLX 0.32.4).** MLX compiles each (custom
kernel, template) with NVRTC the first time a process calls it: 1.3-1.7 s for a flash mma kernel, 2.6-3.3 s for
split-K decode's two kernels (``bench/cuda_jit_cost.py``, bench/results/h200-jit-proof.json). It does not load
a compiled custom kernel from disk: a module written into its compiled-kernel folder (``$MLX_PTX_CACHE_DIR``) under
the name it builds, holding a kernel that adds 2 where MLX's source adds 1, was not loaded (the output was MLX's 1),
and the first call took as long with the folder filled as without. Since MLX PR #4273 a custom kernel's module name
carries a hash of its source, and custom kernels skip MLX's disk cache. ``mx.fast.precompiled_cuda_kernel`` does
load a cubin compiled here, but its host cost per launch grows by about 0.4 us per KB of cubin (MLX copies and hashes
the image on every call: bench/results/h200-precompiled-launch-cost.json; our kernels' cubins are 11-54 KB, and
``loop_cuda_splitk``'s 64 launches went 2.96 -> 6.39 ms), which a timing harness cannot add to the kernels it times.
So a trial pays MLX's compile once per
(kernel, template) and process, and the planner keeps a round's jobs of one kernel in one process
(``harness.spec.plan.compile_group``).

What :func:`cuda_kernel` adds to ``mx.fast.cuda_kernel`` (same arguments, same call):

- the name MLX sees carries a digest of the source, header and dtypes, so two kernels that share a name never share
  a compiled module (MLX before PR #4273 ran the first one's code for both);
- for probes, :data:`REPORT_OPTIONS` (e.g. ``--ptxas-options=-v``): each (kernel, template) is also compiled here
  with NVRTC, from the source MLX builds (:func:`kernel_source`: a small prelude in place of MLX's device header),
  and NVRTC's log (ptxas's registers and spills) lands in ``report_dir()/<module>.log``. That is a report on the
  same source, compiled with the probe's options (``min_blocks`` adds ``__launch_bounds__``); the kernel that runs
  is always MLX's own compile, which takes neither.

:func:`prefill` writes a cubin where MLX's disk cache would look; ``bench/cuda_jit_cost.py`` uses it to check
whether a later MLX loads such a module again.
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

REPORT_DIR_ENV = "HARNESS_CUDA_REPORT_DIR"
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

# NVRTC options of the report compile (see the module docstring); empty: no report compile. A probe sets e.g.
# ("--ptxas-options=-v",) or ("--ptxas-options=-v", "--maxrregcount=168").
REPORT_OPTIONS: tuple[str, ...] = ()
# kernel name -> why its report compile failed (NVRTC missing or rejecting the source; the kernel still runs)
REPORT_FAILURES: dict[str, str] = {}


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

    def compile(self, source: str, arch: str, include: str | None,
                options: Sequence[str] = ()) -> tuple[bytes, str]:
        """A cubin for ``arch`` (e.g. ``sm_90``) and NVRTC's log."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None),
                    "nvrtcCreateProgram")
        try:
            argv_options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
            if include:
                argv_options.append(f"--include-path={include}".encode())
            argv = (ctypes.c_char_p * len(argv_options))(*argv_options)
            if self.lib.nvrtcCompileProgram(prog, len(argv_options), argv) != 0:
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


def report_dir() -> Path:
    """Where the report compile writes ``<module>.log``: ``$HARNESS_CUDA_REPORT_DIR``, else
    ``<tmp>/mlx-kernel-harness/cuda-reports``."""
    default = Path(tempfile.gettempdir()) / "mlx-kernel-harness" / "cuda-reports"
    return Path(os.environ.get(REPORT_DIR_ENV) or default)


def mlx_cache_dir() -> Path:
    """The folder MLX's disk cache uses (what MLX's ``ptx_cache_dir`` returns: ``$MLX_PTX_CACHE_DIR``, else
    ``<tmp>/mlx/<version>/ptx``). MLX reads the variable once, at its first compile; setting it here when unset pins
    MLX to this same folder even if its own version string or temporary folder were spelled differently."""
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


def compile_report(directory: Path, module: str, source: str, arch_suffix: str = "",
                   options: Sequence[str] = ()) -> Path:
    """Compile ``source`` (with :data:`NAME_PLACEHOLDER`) with NVRTC for this device and keep its log in
    ``<directory>/<module>.log`` (returned); once per module and folder. ``arch_suffix`` "a": the
    architecture-specific target (``sm_90a``: wgmma, setmaxnreg)."""
    log_path = directory / f"{module}.log"
    if not log_path.is_file():
        home = cuda_home()
        _, log = nvrtc().compile(source.replace(NAME_PLACEHOLDER, "harness_report"), device_arch() + arch_suffix,
                                 f"{home}/include" if home else None, options)
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(log_path, log.encode())
    return log_path


def prefill(directory: Path, module: str, source: str, arch_suffix: str = "") -> None:
    """Compile ``source`` (with :data:`NAME_PLACEHOLDER`) into ``<directory>/<module>.ptx`` with the index MLX's
    disk cache reads (``<module>.txt``: kernel name, tab, symbol), unless it is there. MLX 0.32.4 does not read it
    for custom kernels (see the module docstring); ``bench/cuda_jit_cost.py`` checks whether MLX does."""
    ptx = directory / f"{module}.ptx"
    if ptx.is_file():
        return
    compiler, arch = nvrtc(), device_arch() + arch_suffix
    symbol = "harness_" + hashlib.sha256(f"{module}\n{source}".encode()).hexdigest()[:20]
    home = cuda_home()
    cubin, _ = compiler.compile(source.replace(NAME_PLACEHOLDER, symbol), arch, f"{home}/include" if home else None)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / f"{module}.txt", f"mlx::core::cu::{module}\t{symbol}\n".encode())
    write_atomically(ptx, cubin)


class CudaKernel:
    """``mx.fast.cuda_kernel``'s callable under a digest name, with the report compile of the module docstring.

    ``min_blocks`` (``__launch_bounds__(threads, min_blocks)``) and ``arch_suffix`` ("a": ``sm_90a``) apply to the
    report compile only: MLX's compile takes neither (it targets ``sm_90a`` itself on the H200: the wgmma kernels
    compile and pass there)."""

    def __init__(self, name: str, input_names: Sequence[str], output_names: Sequence[str], source: str,
                 header: str = "", ensure_row_contiguous: bool = True, shared_memory: int = 0,
                 min_blocks: int | None = None, arch_suffix: str = "") -> None:
        self.name, self.input_names, self.output_names = name, list(input_names), list(output_names)
        self.source, self.header, self.min_blocks, self.arch_suffix = source, header, min_blocks, arch_suffix
        self.ensure_row_contiguous, self.shared_memory = ensure_row_contiguous, shared_memory
        self._reported: set[tuple[str, tuple[str, ...]]] = set()

    @functools.cache  # noqa: B019 -- one MLX kernel per dtype signature, for the life of the process
    def _mlx_kernel(self, dtypes: tuple[tuple[str, ...], tuple[str, ...]]):
        import mlx.core as mx

        digest = hashlib.sha256(f"{self.source}\n{self.header}\n{dtypes}".encode()).hexdigest()[:12]
        name = f"{self.name}_{digest}"
        return name, mx.fast.cuda_kernel(name=name, input_names=self.input_names, output_names=self.output_names,
                                         source=self.source, header=self.header,
                                         ensure_row_contiguous=self.ensure_row_contiguous,
                                         shared_memory=self.shared_memory)

    def source_for(self, dtypes: tuple[tuple[str, ...], tuple[str, ...]], template: Sequence[tuple[str, Any]],
                   threads: int) -> str:
        """The translation unit of one (dtypes, template), as :func:`kernel_source` builds it."""
        bounds = (threads, self.min_blocks) if self.min_blocks else None
        return kernel_source(self.header, self.source, list(zip(self.input_names, dtypes[0], strict=True)),
                             list(zip(self.output_names, dtypes[1], strict=True)), template, bounds)

    def _report(self, module: str, dtypes: tuple[tuple[str, ...], tuple[str, ...]],
                template: Sequence[tuple[str, Any]], threads: int) -> None:
        options = REPORT_OPTIONS
        if (module, options) in self._reported or self.name in REPORT_FAILURES:
            return
        self._reported.add((module, options))
        # the report's file name carries the options: a probe compares settings of one module side by side
        tag = hashlib.sha256(f"{options}\n{self.min_blocks}\n{self.arch_suffix}".encode()).hexdigest()[:8]
        try:
            compile_report(report_dir(), f"{module}.{tag}", self.source_for(dtypes, template, threads),
                           self.arch_suffix, options)
        except (CompileError, OSError, KeyError) as error:
            REPORT_FAILURES[self.name] = str(error)

    def __call__(self, *, inputs: Sequence[Any], output_shapes: Sequence[Sequence[int]],
                 output_dtypes: Sequence[Any], grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
                 template: Sequence[tuple[str, Any]] = ()) -> list[Any]:
        dtypes = (tuple(dtype_name(x.dtype) for x in inputs), tuple(dtype_name(d) for d in output_dtypes))
        name, kernel = self._mlx_kernel(dtypes)
        if REPORT_OPTIONS:
            self._report(f"custom_kernel_{name}{template_suffix(template)}", dtypes, template,
                         threadgroup[0] * threadgroup[1] * threadgroup[2])
        return kernel(inputs=list(inputs), template=list(template), grid=grid, threadgroup=threadgroup,
                      output_shapes=list(output_shapes), output_dtypes=list(output_dtypes))


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str = "",
                ensure_row_contiguous: bool = True, shared_memory: int = 0) -> CudaKernel:
    """Drop-in for ``mx.fast.cuda_kernel`` (see the module docstring)."""
    return CudaKernel(name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory)
