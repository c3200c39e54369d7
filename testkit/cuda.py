"""The CUDA toolkit's compiler, where one is installed (no GPU needed): tests assemble kernel sources with it."""

from __future__ import annotations

import shutil
from pathlib import Path


def nvcc() -> str | None:
    """``nvcc`` on the PATH, else in the toolkit MLX would use; None where there is none (the CI machine)."""
    from kernels import cuda_compile

    home = cuda_compile.cuda_home()
    path = shutil.which("nvcc") or (f"{home}/bin/nvcc" if home else None)
    return path if path and Path(path).is_file() else None
