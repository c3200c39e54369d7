"""Chip identity: stable keys per backend, the macOS parsing on recorded outputs, the local detection."""

from __future__ import annotations

import json

import pytest

from harness.core import chip
from testkit.paths import TESTS

MACOS = TESTS / "data" / "macos"


def test_keys_are_stable_and_put_the_gpu_in_the_key():
    assert chip.chip_key("metal", "Apple M4", "applegpu_g16g", 10) == "apple-m4-10c"
    assert chip.chip_key("metal", "Apple M4 Pro", "applegpu_g16s", 20) == "apple-m4-pro-20c"
    assert chip.chip_key("cuda", "NVIDIA H200", "sm_90") == "nvidia-h200-sm90"
    assert chip.chip_key("cpu", "AMD EPYC", "x86_64") == "cpu-x86_64-amd-epyc"


def test_an_m4_and_an_m4_pro_never_share_a_key():
    assert chip.chip_key("metal", "Apple M4", "a", 10) != chip.chip_key("metal", "Apple M4 Pro", "a", 16)


@pytest.mark.parametrize("name, cores", [("system_profiler_m1.json", 7), ("system_profiler_m4pro.json", 20)])
def test_gpu_cores_from_recorded_system_profiler_output(name, cores):
    assert chip.parse_system_profiler_gpu_cores((MACOS / name).read_text()) == cores


def test_gpu_cores_from_recorded_ioreg_output():
    assert chip.parse_ioreg_gpu_cores((MACOS / "ioreg_m2max.txt").read_text()) == 30


def test_unparseable_outputs_give_no_core_count():
    assert chip.parse_system_profiler_gpu_cores("not json") is None
    assert chip.parse_system_profiler_gpu_cores('{"SPDisplaysDataType": [{"_name": "Intel UHD"}]}') is None
    assert chip.parse_ioreg_gpu_cores("") is None


def test_macos_falls_back_to_ioreg_when_system_profiler_fails():
    calls = []

    def fake_run(command):
        calls.append(command[0])
        return (MACOS / "ioreg_m2max.txt").read_text() if command[0] == "ioreg" else None

    assert chip.macos_gpu_cores(fake_run) == 30
    assert calls == ["system_profiler", "ioreg"]


def test_metal_identity_from_recorded_device_info():
    info = json.loads((MACOS / "device_info_m4pro.json").read_text())
    cores = chip.parse_system_profiler_gpu_cores((MACOS / "system_profiler_m4pro.json").read_text())
    ident = chip.identity_from_facts("metal", info, gpu_cores=cores, os_name="Darwin 24.6.0", mlx_version="0.32.4")
    assert ident.key == "apple-m4-pro-20c"
    assert ident.memory_bytes == 68719476736 and ident.architecture == "applegpu_g16s"
    assert ident.chip_class == "gpu"


def test_local_detection_on_this_machine():
    ident = chip.detect()
    assert ident.backend in chip.BACKENDS
    assert chip.validate_key(ident.key) == ident.key
    assert ident.mlx_version


def test_override_key_is_validated():
    assert chip.detect("lab-m3-max").key == "lab-m3-max"
    with pytest.raises(ValueError, match="must be lower-case"):
        chip.detect("bad:key")


def test_a_paravirtual_gpu_gets_a_key_of_its_own_never_apple_silicons():
    info = json.loads((MACOS / "device_info_paravirtual.json").read_text())
    cores = chip.parse_system_profiler_gpu_cores((MACOS / "system_profiler_paravirtual.json").read_text())
    ident = chip.identity_from_facts("metal", info, gpu_cores=cores, os_name="Darwin 23.6.0", mlx_version="0.32.4")
    assert cores is None
    assert ident.key == "vm-metal-apple-paravirtual-device" and chip.validate_key(ident.key) == ident.key
    assert ident.virtual and not chip.timing_fit(ident.key)
    real = chip.identity_from_facts("metal", json.loads((MACOS / "device_info_m4pro.json").read_text()),
                                    gpu_cores=20, os_name="Darwin 24.6.0", mlx_version="0.32.4")
    assert not real.virtual and chip.timing_fit(real.key) and not real.key.startswith(chip.VIRTUAL_PREFIX)


@pytest.mark.parametrize("name", ["Apple Paravirtual device", "llvmpipe (LLVM 15.0.7, 256 bits)",
                                  "Microsoft Basic Render Driver", "VMware SVGA 3D"])
def test_virtual_and_emulated_devices_are_recognised(name):
    assert chip.is_virtual("metal", name) and chip.chip_key("metal", name, "x").startswith("vm-")


@pytest.mark.parametrize("name", ["Apple M1", "Apple M4 Pro", "NVIDIA H200"])
def test_real_chips_are_not_virtual(name):
    assert not chip.is_virtual("metal", name)


def test_a_virtual_gpu_cannot_take_a_real_chips_key(monkeypatch):
    info = json.loads((MACOS / "device_info_paravirtual.json").read_text())
    virtual = chip.identity_from_facts("metal", info, gpu_cores=None, os_name="Darwin", mlx_version="0.32.4")
    monkeypatch.setattr(chip, "identity_from_facts", lambda *a, **k: virtual)
    with pytest.raises(ValueError, match="virtual"):
        chip.detect("apple-m1-8c")
    assert chip.detect("vm-macos-14").key == "vm-macos-14"
