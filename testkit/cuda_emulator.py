"""Run an ``mx.fast.cuda_kernel`` source on the CPU: every thread of a block is a host thread, ``__syncthreads``
a barrier, ``__shared__`` a per-block static array. Slow and float32-only, but it executes the kernel's own
indexing, masking and reductions, so a CI machine without a GPU can check a CUDA kernel's logic against the
numpy reference. What it cannot check: half-precision conversions, the real compiler's code, timing.

``EmulatedKernel(name, source, inputs, outputs, template)`` mirrors the arguments of ``mx.fast.cuda_kernel``
(input names with numpy arrays, output names with (shape, dtype)); ``run(grid, threadgroup)`` compiles the
kernel with g++ (cached by source hash) and returns the outputs.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

CACHE = Path(tempfile.gettempdir()) / "harness-cuda-emulator"
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.uint8): "uint8_t", np.dtype(np.int32): "int32_t"}

PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
struct Dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 gridDim, blockDim;
std::barrier<>* block_barrier;
#define __syncthreads() block_barrier->arrive_and_wait()
#define __shared__ static
#define __align__(n)
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
"""


def available() -> str | None:
    """Why the emulator cannot run here, or None."""
    return None if shutil.which("g++") else "g++ not found"


class EmulatedKernel:
    def __init__(self, name: str, source: str, header: str, inputs: Mapping[str, np.ndarray],
                 outputs: Mapping[str, tuple[Sequence[int], type]], template: Mapping[str, int | str]):
        self.name = name
        self.inputs = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        self.outputs = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in outputs.items()}
        self.template = dict(template)
        self.source = source
        self.header = "\n".join(line for line in header.splitlines() if not line.lstrip().startswith("#include"))

    def _program(self, grid: tuple[int, int, int], threadgroup: tuple[int, int, int]) -> str:
        consts = "\n".join(f"using {k} = {v};" if isinstance(v, str) else f"constexpr int {k} = {int(v)};"
                           for k, v in self.template.items())
        params = [f"const {_CTYPES[a.dtype]}* {n}" for n, a in self.inputs.items()]
        params += [f"{_CTYPES[dt]}* {n}" for n, (_, dt) in self.outputs.items()]
        reads = "".join(
            f"  std::vector<{_CTYPES[a.dtype]}> {n}_buf({a.size});\n"
            f"  read_file(argv[1], \"{n}\", {n}_buf.data(), {a.nbytes});\n" for n, a in self.inputs.items())
        allocs = "".join(
            f"  std::vector<{_CTYPES[dt]}> {n}_buf({int(np.prod(shape))});\n"
            for n, (shape, dt) in self.outputs.items())
        args = ", ".join(f"{n}_buf.data()" for n in [*self.inputs, *self.outputs])
        writes = "".join(
            f"  write_file(argv[1], \"{n}\", {n}_buf.data(), {int(np.prod(shape)) * dt.itemsize});\n"
            for n, (shape, dt) in self.outputs.items())
        bx, by, bz = (g // t for g, t in zip(grid, threadgroup, strict=True))
        nt = threadgroup[0] * threadgroup[1] * threadgroup[2]
        return f"""{PRELUDE}
{self.header}
{consts}
void kernel_body({", ".join(params)}) {{
{self.source}
}}
static void read_file(const char* dir, const char* name, void* data, size_t n) {{
  char path[4096]; std::snprintf(path, sizeof path, "%s/%s.bin", dir, name);
  FILE* f = std::fopen(path, "rb"); if (!f || std::fread(data, 1, n, f) != n) std::exit(3); std::fclose(f);
}}
static void write_file(const char* dir, const char* name, const void* data, size_t n) {{
  char path[4096]; std::snprintf(path, sizeof path, "%s/%s.out", dir, name);
  FILE* f = std::fopen(path, "wb"); if (!f || std::fwrite(data, 1, n, f) != n) std::exit(4); std::fclose(f);
}}
int main(int, char** argv) {{
{reads}{allocs}  gridDim = Dim3{{{bx}u, {by}u, {bz}u}};
  blockDim = Dim3{{{threadgroup[0]}u, {threadgroup[1]}u, {threadgroup[2]}u}};
  for (unsigned z = 0; z < {bz}u; ++z) for (unsigned y = 0; y < {by}u; ++y) for (unsigned x = 0; x < {bx}u; ++x) {{
    std::barrier<> bar({nt});
    block_barrier = &bar;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < {nt}u; ++t) threads.emplace_back([&, t] {{
      blockIdx = Dim3{{x, y, z}};
      threadIdx = Dim3{{t % {threadgroup[0]}u, (t / {threadgroup[0]}u) % {threadgroup[1]}u,
                        t / ({threadgroup[0]}u * {threadgroup[1]}u)}};
      kernel_body({args});
    }});
    for (auto& th : threads) th.join();
  }}
{writes}  return 0;
}}
"""

    def run(self, grid: tuple[int, int, int], threadgroup: tuple[int, int, int]) -> dict[str, np.ndarray]:
        program = self._program(grid, threadgroup)
        digest = hashlib.sha256(program.encode()).hexdigest()[:20]
        CACHE.mkdir(parents=True, exist_ok=True)
        binary = CACHE / f"{self.name}-{digest}"
        if not binary.exists():
            src = CACHE / f"{self.name}-{digest}.cpp"
            src.write_text(program)
            tmp = binary.with_suffix(".tmp")
            subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-ffp-contract=off", "-o", str(tmp), str(src)],
                           check=True, capture_output=True, text=True)
            tmp.replace(binary)
        with tempfile.TemporaryDirectory() as tmp_dir:
            for name, array in self.inputs.items():
                array.tofile(Path(tmp_dir) / f"{name}.bin")
            subprocess.run([str(binary), tmp_dir], check=True, timeout=600)
            return {name: np.fromfile(Path(tmp_dir) / f"{name}.out", dtype=dt).reshape(shape)
                    for name, (shape, dt) in self.outputs.items()}
