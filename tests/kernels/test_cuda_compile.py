"""Compiled CUDA kernels on disk for MLX to find (kernels/cuda_compile.py), with a stand-in for NVRTC and for MLX.

The real compile and launch need a CUDA GPU: on the H200, scripts/cuda_jit_cost.py checks that MLX loads the
prefilled module, that outputs are bit-identical either way and what a first call and a launch cost. Here: the
source it builds, MLX's module names, the files it writes, and what happens without NVRTC.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import pytest

from kernels import cuda_compile
from kernels.cuda_compile import NAME_PLACEHOLDER, CompileError, CudaKernel, kernel_source
from testkit.cuda import nvcc


class FakeNvrtc:
    version = "13.0"

    def __init__(self) -> None:
        self.sources: list[str] = []
        self.archs: list[str] = []

    def compile(self, source: str, arch: str, include: str | None) -> tuple[bytes, str]:
        self.sources.append(source)
        self.archs.append(arch)
        return f"cubin for {arch}: {len(source)}".encode(), "ptxas info    : Used 32 registers"


@pytest.fixture
def fake_nvrtc(monkeypatch, tmp_path):
    compiler = FakeNvrtc()
    monkeypatch.setattr(cuda_compile, "nvrtc", lambda: compiler)
    monkeypatch.setattr(cuda_compile, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_compile, "FALLBACKS", {})
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    monkeypatch.delenv(cuda_compile.CACHE_ENV, raising=False)
    return compiler


@pytest.fixture
def launches(monkeypatch):
    """mx.fast.cuda_kernel replaced by a recorder of the kernels made and their calls (zero outputs)."""
    calls: list[dict] = []

    def cuda_kernel(**made):
        def call(**kwargs):
            calls.append({**made, **kwargs})
            return [mx.zeros(shape, dtype=dtype)
                    for shape, dtype in zip(kwargs["output_shapes"], kwargs["output_dtypes"], strict=True)]
        return call

    monkeypatch.setattr(mx.fast, "cuda_kernel", cuda_kernel)
    return calls


def module_files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_bytes().decode(errors="replace") for p in sorted(folder.glob("*")) if p.suffix != ".tmp"}


def test_the_source_declares_inputs_const_outputs_writable_and_the_template_as_constants():
    source = kernel_source("// header", "    out[0] = x[0];", [("x", "float16"), ("dims", "int32")],
                           [("out", "bfloat16")], [("T", "float16"), ("BQ", 64), ("CAUSAL", True)])
    assert source.index("// header") < source.index('extern "C" __global__ void ' + NAME_PLACEHOLDER + "(")
    assert "    const __half* x,\n    const int32_t* dims,\n    __nv_bfloat16* out) {" in source
    assert "  using T = __half;\n  constexpr int BQ = 64;\n  constexpr bool CAUSAL = true;" in source
    assert source.rstrip().endswith("out[0] = x[0];\n}")
    assert "__launch_bounds__" not in source


def test_launch_bounds_go_in_the_signature_when_asked():
    source = kernel_source("", "", [("x", "float32")], [("out", "float32")], [], launch_bounds=(128, 2))
    assert f"__global__ void __launch_bounds__(128, 2) {NAME_PLACEHOLDER}(" in source


def test_a_dtype_without_a_cuda_type_is_a_compile_error():
    with pytest.raises(CompileError, match="complex64"):
        kernel_source("", "", [("x", "complex64")], [("out", "float32")], [])


def test_module_names_end_as_mlx_hashes_the_template():
    assert cuda_compile.template_suffix([("T", mx.float16), ("BQ", 64), ("C", True), ("U", mx.bfloat16),
                                         ("F", False), ("X", mx.float32)]) == "_float16_t_64_t_bfloat16_t_f_float"


def test_mlx_reads_its_own_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    assert cuda_compile.mlx_cache_dir() == tmp_path
    monkeypatch.delenv("MLX_PTX_CACHE_DIR")
    assert cuda_compile.mlx_cache_dir().parts[-3:] == ("mlx", mx.__version__, "ptx")
    assert os.environ["MLX_PTX_CACHE_DIR"] == str(cuda_compile.mlx_cache_dir())  # MLX will read the same folder


def test_a_module_is_compiled_once_with_the_index_mlx_reads(fake_nvrtc, tmp_path):
    source = kernel_source("", "    out[0] = 1;", [], [("out", "float32")], [])
    cuda_compile.prefill(tmp_path, "custom_kernel_k_0123_64", source)
    cuda_compile.prefill(tmp_path, "custom_kernel_k_0123_64", source)  # as another process: the file is there
    assert len(fake_nvrtc.sources) == 1
    files = module_files(tmp_path)
    assert set(files) == {"custom_kernel_k_0123_64.ptx", "custom_kernel_k_0123_64.txt", "custom_kernel_k_0123_64.log"}
    kernel_name, symbol = files["custom_kernel_k_0123_64.txt"].rstrip("\n").split("\t")
    assert kernel_name == "mlx::core::cu::custom_kernel_k_0123_64"  # what MLX's launch asks its module for
    assert NAME_PLACEHOLDER not in fake_nvrtc.sources[0] and f"void {symbol}(" in fake_nvrtc.sources[0]
    assert files["custom_kernel_k_0123_64.ptx"].startswith("cubin for sm_90")
    assert "Used 32 registers" in files["custom_kernel_k_0123_64.log"]


def test_a_call_prefills_the_module_mlx_will_look_for_and_launches_mlxs_kernel(fake_nvrtc, launches, tmp_path):
    kernel = CudaKernel("k", ["x"], ["out"], "    out[0] = x[0];", shared_memory=65536, min_blocks=1)
    x = mx.ones((4,), dtype=mx.float16)
    args = dict(inputs=[x], output_shapes=[(4,)], output_dtypes=[mx.float16], grid=(256, 2, 1),
                threadgroup=(128, 1, 1), template=[("T", mx.float16), ("N", 4)])
    (out,) = kernel(**args)
    kernel(**args)
    assert out.shape == (4,) and len(launches) == 2 and len(fake_nvrtc.sources) == 1
    call = launches[0]
    assert call["name"].startswith("k_") and call["shared_memory"] == 65536 and call["ensure_row_contiguous"]
    assert (call["grid"], call["threadgroup"], call["template"]) == ((256, 2, 1), (128, 1, 1), args["template"])
    module = f"custom_kernel_{call['name']}_float16_t_4"
    assert {f"{module}.ptx", f"{module}.txt"} <= set(module_files(tmp_path / "ptx"))
    (source,) = fake_nvrtc.sources
    assert "__launch_bounds__(128, 1)" in source and "using T = __half;" in source and "constexpr int N = 4;" in source


def test_an_edited_kernel_or_other_dtypes_are_another_module(fake_nvrtc, launches):
    x16, x32 = mx.ones((2,), dtype=mx.float16), mx.ones((2,), dtype=mx.float32)
    for source, x in (("    out[0] = x[0];", x16), ("    out[0] = 2 * x[0];", x16), ("    out[0] = x[0];", x32)):
        CudaKernel("k", ["x"], ["out"], source)(inputs=[x], output_shapes=[(2,)], output_dtypes=[x.dtype],
                                                grid=(2, 1, 1), threadgroup=(2, 1, 1))
    assert len({call["name"] for call in launches}) == 3 and len(fake_nvrtc.sources) == 3


def test_without_nvrtc_mlx_compiles_as_before_and_the_reason_is_kept(monkeypatch, launches, tmp_path):
    def missing():
        raise CompileError("NVRTC not found (libnvrtc.so)")

    monkeypatch.setattr(cuda_compile, "nvrtc", missing)
    monkeypatch.setattr(cuda_compile, "FALLBACKS", {})
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    x = mx.ones((2,), dtype=mx.float32)
    CudaKernel("flash_like", ["x"], ["out"], "")(inputs=[x], output_shapes=[(2,)], output_dtypes=[mx.float32],
                                                 grid=(2, 1, 1), threadgroup=(2, 1, 1))
    assert len(launches) == 1 and cuda_compile.FALLBACKS == {"flash_like": "NVRTC not found (libnvrtc.so)"}
    assert not any(tmp_path.iterdir())


def test_with_the_cache_off_nothing_is_compiled_here(monkeypatch, fake_nvrtc, launches, tmp_path):
    monkeypatch.setenv(cuda_compile.CACHE_ENV, "off")
    x = mx.ones((2,), dtype=mx.float32)
    CudaKernel("k", ["x"], ["out"], "")(inputs=[x], output_shapes=[(2,)], output_dtypes=[mx.float32],
                                        grid=(2, 1, 1), threadgroup=(2, 1, 1))
    assert len(launches) == 1 and not fake_nvrtc.sources and not (tmp_path / "ptx").exists()


def test_the_flash_and_decode_kernels_go_through_the_cache(fake_nvrtc, launches, tmp_path):
    from kernels import REGISTRY
    from kernels.flash_cuda import flash_attention_cuda
    from kernels.flash_cuda_mma import flash_attention_mma
    from kernels.quant_decode_cuda import decode_attend_cuda

    q = mx.zeros((1, 2, 64, 128), dtype=mx.float16)
    flash_attention_cuda(q, q, q, 0.1, 64, 64)
    flash_attention_mma(q, q, q, 0.1, 128, 64, 2)  # 64 KB: the dynamic shared memory build
    decode = REGISTRY["quant_decode"]
    inputs = decode.make_inputs(decode.normalize_shape({"B": 1, "H_q": 4, "H_kv": 2, "S_kv": 256, "D": 64}),
                                "bfloat16", 0)
    decode_attend_cuda(**{k: v for k, v in inputs.items() if k != "bits"}, bits=inputs["bits"], mode="splitk")
    assert len(launches) == 4 == len(fake_nvrtc.sources)  # wmma, mma, decode partial + combine
    assert launches[1]["shared_memory"] == 64 * 1024
    assert "constexpr int WM = 2;" in fake_nvrtc.sources[1] and "const uint8_t* k_codes" in fake_nvrtc.sources[2]
    assert len([name for name in module_files(tmp_path / "ptx") if name.endswith(".ptx")]) == 4


def test_a_kernel_for_the_architecture_specific_target_is_compiled_for_it(fake_nvrtc, launches):
    x = mx.ones((2,), dtype=mx.float32)
    for suffix in ("", "a"):
        CudaKernel("k", ["x"], ["out"], "", arch_suffix=suffix)(inputs=[x], output_shapes=[(2,)],
                                                                output_dtypes=[mx.float32], grid=(2, 1, 1),
                                                                threadgroup=(2, 1, 1))
    assert fake_nvrtc.archs == ["sm_90", "sm_90a"] and launches[0]["name"] != launches[1]["name"]


@pytest.mark.skipif(nvcc() is None, reason="no CUDA compiler here (nvcc)")
def test_every_registered_cuda_source_variant_assembles_for_sm_90(fake_nvrtc, launches, tmp_path):
    """Where the CUDA toolkit is installed (no GPU needed): the source every registered CUDA variant would compile,
    captured on its real call path, must pass nvcc and ptxas for sm_90, as NVRTC's compile must on the GPU."""
    from kernels import REGISTRY

    shapes = {"flash_prefill": {"B": 1, "H": 2, "S_q": 64, "S_kv": 64, "D": 128},
              "quant_decode": {"B": 1, "H_q": 4, "H_kv": 2, "S_kv": 256, "D": 128},
              "quant_decode_layers": {"NL": 2, "B": 1, "H_q": 4, "H_kv": 2, "S_kv": 256, "D": 128}}
    for kernel_name, shape in shapes.items():
        kernel = REGISTRY[kernel_name]
        for dtype in ("float16", "bfloat16"):
            inputs = kernel.make_inputs(kernel.normalize_shape(shape), dtype, 0)
            for variant in (v for v in kernel.variants.values() if v.backend == "cuda"):
                variant.fn(**inputs)
    sources = sorted(set(fake_nvrtc.sources))
    assert len(sources) >= 30  # 15 flash tiles and the decode kernels, in two dtypes

    def assemble(i: int) -> tuple[int, str]:
        path = tmp_path / f"unit{i}.cu"
        path.write_text(sources[i].replace(NAME_PLACEHOLDER, f"unit{i}"))
        done = subprocess.run([nvcc(), "-cubin", "-arch=sm_90", "-o", str(tmp_path / f"unit{i}.cubin"), str(path)],
                              capture_output=True, text=True)
        return done.returncode, done.stderr[-3000:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [log for status, log in pool.map(assemble, range(len(sources))) if status]
    assert not failed, failed[0]
