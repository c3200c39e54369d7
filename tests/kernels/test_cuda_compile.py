"""The cubin cache of CUDA source kernels (kernels/cuda_compile.py), with a stand-in for NVRTC and for MLX's launch.

The real compile and launch need a CUDA GPU: on the H200, scripts/cuda_jit_cost.py --identical checks every CUDA
source variant bit for bit through both paths (reports/examples/h200-jit-cache.json). Here: the source it builds,
the cache's keys and files, and the fallback to mx.fast.cuda_kernel.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from kernels import cuda_compile
from kernels.cuda_compile import NAME_PLACEHOLDER, CompileError, CudaKernel, kernel_source


class FakeNvrtc:
    version = "13.0"

    def __init__(self) -> None:
        self.sources: list[str] = []

    def compile(self, source: str, arch: str, include: str | None) -> tuple[bytes, str]:
        self.sources.append(source)
        return f"cubin for {arch}: {len(source)}".encode(), "ptxas info    : Used 32 registers"


@pytest.fixture
def fake_nvrtc(monkeypatch, tmp_path):
    compiler = FakeNvrtc()
    monkeypatch.setattr(cuda_compile, "nvrtc", lambda: compiler)
    monkeypatch.setattr(cuda_compile, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_compile, "FALLBACKS", {})
    monkeypatch.setenv(cuda_compile.CACHE_ENV, str(tmp_path / "cubins"))
    return compiler


@pytest.fixture
def launches(monkeypatch):
    """mx.fast.precompiled_cuda_kernel replaced by a recorder that returns zero outputs of the asked shapes."""
    calls: list[dict] = []

    def precompiled(**kwargs):
        calls.append(kwargs)
        return [mx.zeros(shape, dtype=dtype) for shape, dtype in zip(kwargs["output_shapes"], kwargs["output_dtypes"],
                                                                      strict=True)]

    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", precompiled)
    return calls


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


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cuda_compile.CACHE_ENV, "off")
    assert cuda_compile.cache_dir() is None
    monkeypatch.setenv(cuda_compile.CACHE_ENV, str(tmp_path))
    assert cuda_compile.cache_dir() == tmp_path
    monkeypatch.delenv(cuda_compile.CACHE_ENV)
    assert cuda_compile.cache_dir() == cuda_compile.DEFAULT_CACHE


def test_a_kernel_is_compiled_once_then_read_from_the_cache(fake_nvrtc, tmp_path):
    source = kernel_source("", "    out[0] = 1;", [], [("out", "float32")], [])
    name, cubin = cuda_compile.cached_cubin(source, tmp_path)
    again = cuda_compile.cached_cubin(source, tmp_path)
    assert again == (name, cubin)
    assert len(fake_nvrtc.sources) == 1  # the second call (as in another process) only read the file
    assert NAME_PLACEHOLDER not in fake_nvrtc.sources[0] and f"void {name}(" in fake_nvrtc.sources[0]
    assert (tmp_path / f"{name}.cubin").read_bytes() == cubin
    assert "Used 32 registers" in (tmp_path / f"{name}.log").read_text()
    assert not list(tmp_path.glob("*.tmp"))


def test_another_source_arch_or_option_is_another_kernel(fake_nvrtc, tmp_path, monkeypatch):
    first = kernel_source("", "    out[0] = 1;", [], [("out", "float32")], [])
    second = kernel_source("", "    out[0] = 2;", [], [("out", "float32")], [])
    names = {cuda_compile.cached_cubin(first, tmp_path)[0], cuda_compile.cached_cubin(second, tmp_path)[0]}
    monkeypatch.setattr(cuda_compile, "device_arch", lambda: "sm_80")
    names.add(cuda_compile.cached_cubin(first, tmp_path)[0])
    monkeypatch.setattr(cuda_compile, "EXTRA_OPTIONS", ("--maxrregcount=128",))
    names.add(cuda_compile.cached_cubin(first, tmp_path)[0])
    assert len(names) == 4 and len(fake_nvrtc.sources) == 4


def test_a_call_launches_the_cached_cubin_with_the_kernels_launch_settings(fake_nvrtc, launches):
    kernel = CudaKernel("k", ["x"], ["out"], "    out[0] = x[0];", shared_memory=65536, min_blocks=1)
    x = mx.ones((4,), dtype=mx.float16)
    (out,) = kernel(inputs=[x], output_shapes=[(4,)], output_dtypes=[mx.float16], grid=(256, 2, 1),
                    threadgroup=(128, 1, 1), template=[("T", mx.float16), ("N", 4)])
    assert out.shape == (4,)
    (call,) = launches
    assert call["name"].startswith("harness_kernel_") and call["compiled_source"].startswith(b"cubin for sm_90")
    assert (call["grid"], call["threadgroup"], call["shared_memory"]) == ((256, 2, 1), (128, 1, 1), 65536)
    assert call["ensure_row_contiguous"] is True and call["scalars"] == []
    (source,) = fake_nvrtc.sources
    assert "__launch_bounds__(128, 1)" in source and "using T = __half;" in source and "constexpr int N = 4;" in source
    kernel(inputs=[x], output_shapes=[(4,)], output_dtypes=[mx.float16], grid=(256, 2, 1), threadgroup=(128, 1, 1),
           template=[("T", mx.float16), ("N", 4)])
    assert len(fake_nvrtc.sources) == 1 and len(launches) == 2


def test_without_nvrtc_the_kernel_runs_through_mx_fast_cuda_kernel_and_says_why(monkeypatch, tmp_path):
    def missing():
        raise CompileError("NVRTC not found (libnvrtc.so)")

    monkeypatch.setattr(cuda_compile, "nvrtc", missing)
    monkeypatch.setattr(cuda_compile, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_compile, "FALLBACKS", {})
    monkeypatch.setenv(cuda_compile.CACHE_ENV, str(tmp_path))
    kernel = CudaKernel("flash_like", ["x"], ["out"], "    out[0] = x[0];")
    seen: list[dict] = []
    kernel.__dict__["_mlx_kernel"] = lambda **kwargs: seen.append(kwargs) or ["mlx"]
    x = mx.ones((2,), dtype=mx.float32)
    result = kernel(inputs=[x], output_shapes=[(2,)], output_dtypes=[mx.float32], grid=(2, 1, 1),
                    threadgroup=(2, 1, 1), template=[("T", mx.float32)])
    assert result == ["mlx"] and seen[0]["template"] == [("T", mx.float32)]
    assert cuda_compile.FALLBACKS == {"flash_like": "NVRTC not found (libnvrtc.so)"}
    assert not any(tmp_path.iterdir())


def test_with_the_cache_off_mlx_compiles_as_before(monkeypatch, fake_nvrtc, launches):
    monkeypatch.setenv(cuda_compile.CACHE_ENV, "off")
    kernel = CudaKernel("k", ["x"], ["out"], "")
    kernel.__dict__["_mlx_kernel"] = lambda **kwargs: ["mlx"]
    x = mx.ones((2,), dtype=mx.float32)
    assert kernel(inputs=[x], output_shapes=[(2,)], output_dtypes=[mx.float32], grid=(2, 1, 1),
                  threadgroup=(2, 1, 1)) == ["mlx"]
    assert not fake_nvrtc.sources and not launches


def test_the_flash_and_decode_kernels_go_through_the_cache(fake_nvrtc, launches):
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
    assert len(launches) == 4  # wmma, mma, decode partial + combine
    assert launches[1]["shared_memory"] == 64 * 1024
    assert all(f"void {call['name']}(" in source for call, source in zip(launches, fake_nvrtc.sources, strict=True))
    assert "constexpr int WM = 2;" in fake_nvrtc.sources[1] and "const uint8_t* k_codes" in fake_nvrtc.sources[2]
    assert Path(cuda_compile.cache_dir()).is_dir()
