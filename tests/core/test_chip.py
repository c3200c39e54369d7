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
