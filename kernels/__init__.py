"""Built-in kernels under test; importing this package registers them all."""

import importlib

from kernels.base import REGISTRY, CheckResult, Kernel, Variant, register

BUILTIN_MODULES = (
    "kernels.flash_prefill",
    "kernels.flash_cuda",
    "kernels.flash_cuda_mma",
    "kernels.flash_cuda_wgmma",
    "kernels.calibration",
    "kernels.quant_decode",
    "kernels.quant_decode_cuda",
    "kernels.q8_0",
    "kernels.compressed_kv",
    "kernels.swiglu",
)

for _module in BUILTIN_MODULES:
    importlib.import_module(_module)

__all__ = ["REGISTRY", "CheckResult", "Kernel", "Variant", "register"]
