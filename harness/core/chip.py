"""Chip identity: the one place that knows what this machine's accelerator is and how it is keyed.

A chip generation is what performance depends on, not a host name. The identity
combines the MLX backend (metal / cuda / cpu), ``mx.device_info()`` (device name,
architecture, memory), the GPU core count where macOS tells it, the OS and the
MLX version. ``key`` is the stable identity used in the database and as the Ray
node label: two machines with the same key pool their samples.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

BACKENDS = ("metal", "cuda", "cpu")
KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
VIRTUAL_PREFIX = "vm-"
"""The key prefix of a virtual GPU: its own keys, never pooled with real hardware, and unfit for timing verdicts."""
VIRTUAL_DEVICE = re.compile(r"paravirtual|virtual|vmware|virtio|qemu|parallels|llvmpipe|lavapipe|swiftshader|"
                            r"basic render", re.I)
"""Device names of virtual or emulated GPUs: GitHub's hosted macOS runners report "Apple Paravirtual device" (the
VM's Metal device, Apple's Virtualization framework), software rasterisers name themselves (llvmpipe, SwiftShader,
Microsoft Basic Render Driver). Their timings measure the host's scheduling of a VM, not a chip."""


@dataclass(frozen=True)
class ChipIdentity:
    """What performance depends on (the key fields) plus the full record for the reader."""

    key: str
    backend: str
    device_name: str
    architecture: str
    memory_bytes: int | None = None
    gpu_cores: int | None = None
    os: str = ""
    mlx_version: str = ""
    device_info: dict[str, Any] = field(default_factory=dict)

    @property
    def virtual(self) -> bool:
        """A virtual GPU (``is_virtual``): its runs count for correctness, never for timing verdicts."""
        return not timing_fit(self.key)

    @property
    def chip_class(self) -> str:
        """'gpu' or 'cpu': which benchmark grid size fits this chip."""
        return "cpu" if self.backend == "cpu" else "gpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def slug(text: str) -> str:
    """Lower-case, dash-separated: 'Apple M4 Pro' -> 'apple-m4-pro'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def is_virtual(backend: str, device_name: str) -> bool:
    """The accelerator is a virtual or emulated device (``VIRTUAL_DEVICE``), not a chip."""
    return backend != "cpu" and bool(VIRTUAL_DEVICE.search(device_name))


def timing_fit(chip_key_: str) -> bool:
    """Whether a chip's timings may carry a verdict (compare, variants, bisect): not on a virtual GPU's key."""
    return not chip_key_.startswith(VIRTUAL_PREFIX)


def chip_key(backend: str, device_name: str, architecture: str, gpu_cores: int | None = None) -> str:
    """The stable key: ``apple-m4-pro-20c``, ``nvidia-h200-sm90``, ``cpu-x86_64-amd-epyc``; a virtual GPU's starts
    with ``vm-`` (``vm-apple-paravirtual-device``): never the key of the real chip under it."""
    if is_virtual(backend, device_name):
        return f"{VIRTUAL_PREFIX}{backend}-{slug(device_name)}"[:63]
    if backend == "metal":
        key = slug(device_name) or slug(architecture)
        if not key.startswith("apple"):
            key = f"apple-{key}"
        return f"{key}-{gpu_cores}c" if gpu_cores else key
    if backend == "cuda":
        arch = slug(architecture).replace("-", "")
        return f"{slug(device_name)}-{arch}" if arch else slug(device_name)
    return f"cpu-{architecture.lower()}-{slug(device_name)}" if device_name else f"cpu-{architecture.lower()}"


def validate_key(key: str) -> str:
    """A chip key usable as a DB key and a Ray label value (no ':' or spaces)."""
    if not KEY_PATTERN.match(key):
        raise ValueError(f"chip key {key!r} must be lower-case letters, digits, '.', '_' or '-' (max 63 chars)")
    return key


def parse_system_profiler_gpu_cores(text: str) -> int | None:
    """GPU core count from ``system_profiler SPDisplaysDataType -json`` (Apple Silicon reports sppci_cores)."""
    try:
        rows = json.loads(text).get("SPDisplaysDataType") or []
    except (json.JSONDecodeError, AttributeError):
        return None
    for row in rows:
        match = re.search(r"\d+", str(row.get("sppci_cores", "")))
        if match:
            return int(match.group())
    return None


def parse_ioreg_gpu_cores(text: str) -> int | None:
    """GPU core count from ``ioreg -rc AGXAccelerator -d 1`` ("gpu-core-count" = 10), the fallback."""
    match = re.search(r'"gpu-core-count"\s*=\s*(\d+)', text)
    return int(match.group(1)) if match else None


def _run(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def macos_gpu_cores(run=_run) -> int | None:
    """Ask macOS for the GPU core count: system_profiler first, ioreg as a fallback."""
    text = run(["system_profiler", "SPDisplaysDataType", "-json"])
    cores = parse_system_profiler_gpu_cores(text) if text else None
    if cores is None:
        text = run(["ioreg", "-rc", "AGXAccelerator", "-d", "1"])
        cores = parse_ioreg_gpu_cores(text) if text else None
    return cores


def detect_backend(mx) -> str:
    if mx.metal.is_available():
        return "metal"
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    return "cpu"


def _device_info(mx) -> dict[str, Any]:
    if hasattr(mx, "device_info"):
        return dict(mx.device_info())
    return dict(mx.metal.device_info()) if mx.metal.is_available() else {}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def identity_from_facts(
    backend: str, info: dict[str, Any], *, gpu_cores: int | None, os_name: str, mlx_version: str, cpu_name: str = ""
) -> ChipIdentity:
    """Build the identity from collected facts (pure: the recorded-output tests go through here)."""
    device_name = str(info.get("device_name") or (cpu_name if backend == "cpu" else "") or "unknown")
    architecture = str(info.get("architecture") or platform.machine())
    memory = info.get("memory_size") or info.get("total_memory") or info.get("memory")
    return ChipIdentity(
        key=chip_key(backend, device_name, architecture, gpu_cores),
        backend=backend,
        device_name=device_name,
        architecture=architecture,
        memory_bytes=int(memory) if memory else None,
        gpu_cores=gpu_cores,
        os=os_name,
        mlx_version=mlx_version,
        device_info={k: (v if isinstance(v, int | float | str) else str(v)) for k, v in info.items()},
    )


def detect(override_key: str | None = None) -> ChipIdentity:
    """The local chip's identity; ``override_key`` replaces the key (operator labels, tests)."""
    import mlx.core as mx  # loads mlx: only when needed

    backend = detect_backend(mx)
    gpu_cores = macos_gpu_cores() if backend == "metal" else None
    ident = identity_from_facts(
        backend,
        _device_info(mx),
        gpu_cores=gpu_cores,
        os_name=f"{platform.system()} {platform.release()}",
        mlx_version=mx.__version__,
        cpu_name=_cpu_name(),
    )
    if override_key:
        if ident.virtual and timing_fit(override_key):
            raise ValueError(f"this GPU is virtual ({ident.device_name}): its key must start with "
                             f"{VIRTUAL_PREFIX!r}, not {override_key!r} (its timings would pool with real chips)")
        ident = ChipIdentity(**{**ident.to_dict(), "key": validate_key(override_key)})
    return ident


def machine_facts() -> dict[str, Any]:
    """Everything about the host that is not the chip: stored with every run, never part of the key."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
    }
