"""A generated kernel repository for `harness bisect` on a real GPU (bench/h200_bisect/run.sh).

17 commits on one branch (c0 .. c16), each one a real change of the repository:
- ``gpukern/rowsum.py``: a row sum over ``x[R, C]`` as one ``mx.fast.cuda_kernel`` launch (one block of 256 threads
  per row); off CUDA, the same arithmetic in MLX ops (so the flow can be tried on a CPU).
- c{PERF}: the kernel also reads ``pad[R, C/32]`` (about 3 % more bytes, in the same launch) and adds
  ``sum(pad row) * scale[0]`` with ``scale = 0``: the values are unchanged, the work is 3 % larger.
- c{BREAK}: the column loop stops at the last multiple of the tile (256): a row whose length is not a multiple of
  256 loses its tail (``tests/test_rowsum.py::test_tail`` fails); the benchmark's C is a multiple of 256, so its
  speed is unchanged.
- every other commit edits the changelog only.

Usage: ``python make_repo.py DEST [--perf 6] [--break 11] [--commits 17]``; prints the shas, one per line.

``--pairs``: instead, three commits for null and planted pairs: ``base``; ``null`` (the changelog only: identical
code) on top of it; ``planted`` (a branch from ``base``: the kernel reads ``pad[R, C/50]`` too, about 2 % more
bytes in the same launch). Its suite times the kernel twice per shape, pipelined and on the device clock.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

HARNESS_TOML = """[suite]
name = "gpukern"

[timing]
trials = 3

[[function]]
target = "gpukern.bench:bench_rowsum"
name = "rowsum"
grid.cpu = { R = [256], C = [8192] }
grid.gpu = { R = [8192], C = [32768] }

[[pytest]]
name = "unit"
paths = ["tests"]
"""

PAIRS_TOML = """[suite]
name = "gpukern-pairs"

[timing]
trials = 3

[[function]]
target = "gpukern.bench:bench_rowsum"
name = "rowsum-pipelined"
grid.cpu = { R = [128, 256], C = [4096] }
grid.gpu = { R = [4096, 8192, 16384], C = [32768] }
timing = { mode = "pipelined" }

[[function]]
target = "gpukern.bench:bench_rowsum_device"
name = "rowsum-device"
grid.cpu = { R = [128, 256], C = [4096] }
grid.gpu = { R = [4096, 8192, 16384], C = [32768] }
timing = { mode = "device" }
"""

KERNEL = '''"""Row sums of x[R, C] (float32), one CUDA launch; MLX ops off CUDA."""

import mlx.core as mx

TILE = 256
PERF_PLANT = {perf}
TAIL_BUG = {tail}

SOURCE = """
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int C = dims[0];
    const int P = dims[1];
    const int end = TAIL_BUG ? (C / 256) * 256 : C;
    const float* xr = x + (size_t)row * C;
    float acc = 0.0f;
    for (int c = tid; c < end; c += 256) acc += xr[c];
    if (PERF_PLANT) {{
        const float* pr = pad + (size_t)row * P;
        float extra = 0.0f;
        for (int c = tid; c < P; c += 256) extra += pr[c];
        acc += extra * scale[0];
    }}
    __shared__ float part[256];
    part[tid] = acc;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {{
        if (tid < s) part[tid] += part[tid + s];
        __syncthreads();
    }}
    if (tid == 0) out[row] = part[0];
"""

_kernel = None


def on_cuda() -> bool:
    return bool(getattr(mx, "cuda", None) and mx.cuda.is_available()) and mx.default_device() == mx.gpu


def rowsum(x, pad, scale):
    """sum(x, axis=1) (with the planted extra work and the tail bug of this commit)."""
    global _kernel
    r, c = x.shape
    if not on_cuda():
        end = (c // TILE) * TILE if TAIL_BUG else c
        out = mx.sum(x[:, :end], axis=1)
        return out + mx.sum(pad, axis=1) * scale[0] if PERF_PLANT else out
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(name="gpukern_rowsum", input_names=["x", "pad", "scale", "dims"],
                                      output_names=["out"], source=SOURCE.replace("TAIL_BUG", str(int(TAIL_BUG)))
                                      .replace("PERF_PLANT", str(int(PERF_PLANT))), ensure_row_contiguous=True)
    (out,) = _kernel(inputs=[x, pad, scale, mx.array([c, pad.shape[1]], dtype=mx.int32)],
                     grid=(r * TILE, 1, 1), threadgroup=(TILE, 1, 1), output_shapes=[(r,)],
                     output_dtypes=[mx.float32])
    return out
'''

BENCH = '''"""The benchmark function of the suite (harness.toml [[function]])."""

import mlx.core as mx

from harness.bench import benchmark
from gpukern.rowsum import rowsum

PAD_DIV = {pad_div}  # pad[R, C / PAD_DIV]: the planted commit reads it too ({pad_pct} % more bytes)


@benchmark(bytes=lambda R, C, **_: 4 * R * C)
def bench_rowsum(R, C):
    x = mx.random.normal((R, C))
    pad = mx.random.normal((R, C // PAD_DIV))
    scale = mx.array([0.0])
    mx.eval(x, pad, scale)
    return lambda: rowsum(x, pad, scale)


bench_rowsum_device = benchmark(bytes=lambda R, C, **_: 4 * R * C)(
    lambda R, C: bench_rowsum(R=R, C=C))  # the same series under another name: timed on the device clock
'''

TESTS = '''import mlx.core as mx
import numpy as np
import pytest

from gpukern.rowsum import rowsum


@pytest.mark.parametrize("C", [256, 4096])
def test_aligned(C):
    x = mx.random.normal((64, C), key=mx.random.key(1))
    pad = mx.random.normal((64, max(1, C // 32)), key=mx.random.key(2))
    got = rowsum(x, pad, mx.array([0.0]))
    np.testing.assert_allclose(np.array(got), np.array(x).sum(axis=1), rtol=1e-4, atol=1e-3)


def test_tail():
    x = mx.random.normal((64, 1000), key=mx.random.key(3))
    pad = mx.random.normal((64, 31), key=mx.random.key(4))
    got = rowsum(x, pad, mx.array([0.0]))
    np.testing.assert_allclose(np.array(got), np.array(x).sum(axis=1), rtol=1e-4, atol=1e-3)
'''


def git(dest: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(dest), "-c", "user.email=k@example.com", "-c", "user.name=k", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def write(dest: Path, perf: bool, tail: bool, pad_div: int = 32, toml: str = HARNESS_TOML) -> None:
    (dest / "gpukern").mkdir(parents=True, exist_ok=True)
    (dest / "tests").mkdir(exist_ok=True)
    (dest / "harness.toml").write_text(toml)
    (dest / "gpukern" / "__init__.py").write_text("")
    (dest / "gpukern" / "rowsum.py").write_text(KERNEL.format(perf=perf, tail=tail))
    (dest / "gpukern" / "bench.py").write_text(BENCH.format(pad_div=pad_div, pad_pct=round(100 / pad_div, 1)))
    (dest / "tests" / "test_rowsum.py").write_text(TESTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--perf", type=int, default=6, help="the commit that makes the kernel 3%% slower")
    parser.add_argument("--break", dest="broken", type=int, default=11, help="the commit that loses the tail")
    parser.add_argument("--commits", type=int, default=17)
    parser.add_argument("--pairs", action="store_true", help="base, null and planted (2 %%) commits instead")
    args = parser.parse_args()
    args.dest.mkdir(parents=True)
    git(args.dest, "init", "-q", "-b", "main")
    if args.pairs:
        make_pairs(args.dest)
        return
    shas = []
    for i in range(args.commits):
        write(args.dest, perf=i >= args.perf, tail=i >= args.broken)
        with (args.dest / "CHANGELOG").open("a") as log:
            log.write(f"c{i}\n")
        git(args.dest, "add", "-A")
        what = "reads pad too (3% more bytes)" if i == args.perf else "tile-only loop" if i == args.broken else "notes"
        git(args.dest, "commit", "-q", "-m", f"c{i}: {what}")
        shas.append(git(args.dest, "rev-parse", "HEAD"))
    print("\n".join(shas))


def make_pairs(dest: Path) -> None:
    write(dest, perf=False, tail=False, pad_div=50, toml=PAIRS_TOML)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "base")
    git(dest, "branch", "base")
    git(dest, "commit", "-q", "--allow-empty", "-m", "null: nothing changed")
    git(dest, "branch", "null")
    git(dest, "checkout", "-q", "-b", "planted", "base")
    write(dest, perf=True, tail=False, pad_div=50, toml=PAIRS_TOML)
    git(dest, "commit", "-q", "-am", "planted: reads pad too (2% more bytes)")
    for name in ("base", "null", "planted"):
        print(name, git(dest, "rev-parse", name))


if __name__ == "__main__":
    main()
