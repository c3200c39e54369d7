"""CUDA source kernels through MLX's own compile, and the report compile for probes (kernels/cuda_compile.py), with a
stand-in for NVRTC and for MLX's launch.

The real compile and launch need a CUDA GPU: on the H200, bench/cuda_jit_cost.py measured that MLX 0.32.4 compiles
a custom kernel in every process and does not load one prefilled on disk. Here: the source the report compile builds,
MLX's module names, the names MLX sees, the files written, and what happens without NVRTC.
"""

from __future__ import annotations

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
        self.options: list[tuple[str, ...]] = []

    def compile(self, source: str, arch: str, include: str | None, options=()) -> tuple[bytes, str]:
        self.sources.append(source)
        self.archs.append(arch)
        self.options.append(tuple(options))
        return f"cubin for {arch}: {len(source)}".encode(), "ptxas info    : Used 32 registers"


@pytest.fixture
def fake_nvrtc(monkeypatch, tmp_path):
    compiler = FakeNvrtc()
    monkeypatch.setattr(cuda_compile, "nvrtc", lambda: compiler)
    monkeypatch.setattr(cuda_compile, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_compile, "REPORT_FAILURES", {})
    monkeypatch.setattr(cuda_compile, "REPORT_OPTIONS", ())
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    monkeypatch.setenv(cuda_compile.REPORT_DIR_ENV, str(tmp_path / "reports"))
    return compiler


@pytest.fixture
def reporting(monkeypatch, fake_nvrtc):
    """The report compile on, as a probe turns it on."""
    monkeypatch.setattr(cuda_compile, "REPORT_OPTIONS", ("--ptxas-options=-v",))
    return fake_nvrtc


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


def files_in(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {p.name: p.read_bytes().decode(errors="replace") for p in sorted(folder.glob("*")) if p.suffix != ".tmp"}


def call_once(kernel: CudaKernel, dtype=mx.float32, template=()) -> None:
    x = mx.ones((2,), dtype=dtype)
    kernel(inputs=[x], output_shapes=[(2,)], output_dtypes=[dtype], grid=(2, 1, 1), threadgroup=(2, 1, 1),
           template=list(template))


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


def test_the_folder_of_mlxs_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    assert cuda_compile.mlx_cache_dir() == tmp_path
    monkeypatch.delenv("MLX_PTX_CACHE_DIR")
    assert cuda_compile.mlx_cache_dir().parts[-3:] == ("mlx", mx.__version__, "ptx")


def test_prefill_writes_the_module_and_the_index_mlxs_disk_cache_reads_once(fake_nvrtc, tmp_path):
    """What bench/cuda_jit_cost.py's proof puts where MLX's disk cache looks."""
    source = kernel_source("", "    out[0] = 1;", [], [("out", "float32")], [])
    cuda_compile.prefill(tmp_path, "custom_kernel_k_0123_64", source)
    cuda_compile.prefill(tmp_path, "custom_kernel_k_0123_64", source)  # as another process: the file is there
    assert len(fake_nvrtc.sources) == 1
    files = files_in(tmp_path)
    assert set(files) == {"custom_kernel_k_0123_64.ptx", "custom_kernel_k_0123_64.txt"}
    kernel_name, symbol = files["custom_kernel_k_0123_64.txt"].rstrip("\n").split("\t")
    assert kernel_name == "mlx::core::cu::custom_kernel_k_0123_64"  # what MLX's launch asks its module for
    assert NAME_PLACEHOLDER not in fake_nvrtc.sources[0] and f"void {symbol}(" in fake_nvrtc.sources[0]
    assert files["custom_kernel_k_0123_64.ptx"].startswith("cubin for sm_90")


def test_a_call_launches_mlxs_kernel_under_a_digest_name_and_compiles_nothing_here(fake_nvrtc, launches, tmp_path):
    kernel = CudaKernel("k", ["x"], ["out"], "    out[0] = x[0];", shared_memory=65536)
    x = mx.ones((4,), dtype=mx.float16)
    args = dict(inputs=[x], output_shapes=[(4,)], output_dtypes=[mx.float16], grid=(256, 2, 1),
                threadgroup=(128, 1, 1), template=[("T", mx.float16), ("N", 4)])
    (out,) = kernel(**args)
    kernel(**args)
    assert out.shape == (4,) and len(launches) == 2 and not fake_nvrtc.sources
    call = launches[0]
    assert call["name"].startswith("k_") and call["shared_memory"] == 65536 and call["ensure_row_contiguous"]
    assert call["source"] == "    out[0] = x[0];" and call["input_names"] == ["x"] and call["output_names"] == ["out"]
    assert (call["grid"], call["threadgroup"], call["template"]) == ((256, 2, 1), (128, 1, 1), args["template"])
    assert not files_in(tmp_path / "ptx") and not files_in(tmp_path / "reports")


def test_an_edited_kernel_or_other_dtypes_get_another_name(fake_nvrtc, launches):
    """Two kernels that share a name never share MLX's module (MLX before PR #4273 ran the first one's code)."""
    for source, dtype in (("    out[0] = x[0];", mx.float16), ("    out[0] = 2 * x[0];", mx.float16),
                          ("    out[0] = x[0];", mx.float32), ("    out[0] = x[0];", mx.float16)):
        call_once(CudaKernel("k", ["x"], ["out"], source), dtype)
    names = [call["name"] for call in launches]
    assert len(set(names)) == 3 and names[0] == names[3]


def test_the_report_compile_keeps_ptxas_log_once_per_module_and_setting(reporting, launches, tmp_path):
    kernel = CudaKernel("k", ["x"], ["out"], "    out[0] = x[0];", min_blocks=2)
    for _ in range(2):
        call_once(kernel, mx.float16, [("T", mx.float16), ("N", 4)])
    call_once(kernel, mx.float16, [("T", mx.float16), ("N", 8)])
    assert len(launches) == 3 and len(reporting.sources) == 2  # one per template
    assert reporting.options == [("--ptxas-options=-v",)] * 2
    source = reporting.sources[0]
    assert "__launch_bounds__(2, 2)" in source and "using T = __half;" in source and "constexpr int N = 4;" in source
    logs = files_in(tmp_path / "reports")
    module = f"custom_kernel_{launches[0]['name']}_float16_t_4"
    assert len(logs) == 2 and any(name.startswith(module + ".") for name in logs)
    assert all("Used 32 registers" in text for text in logs.values())
    cuda_compile.REPORT_OPTIONS = ("--ptxas-options=-v", "--maxrregcount=128")  # another setting: its own report
    call_once(kernel, mx.float16, [("T", mx.float16), ("N", 4)])
    assert len(reporting.sources) == 3 and len(files_in(tmp_path / "reports")) == 3


def test_without_nvrtc_the_kernel_still_runs_and_the_report_failure_is_kept(monkeypatch, reporting, launches,
                                                                            tmp_path):
    def missing():
        raise CompileError("NVRTC not found (libnvrtc.so)")

    monkeypatch.setattr(cuda_compile, "nvrtc", missing)
    call_once(CudaKernel("flash_like", ["x"], ["out"], ""))
    assert len(launches) == 1 and cuda_compile.REPORT_FAILURES == {"flash_like": "NVRTC not found (libnvrtc.so)"}
    assert not files_in(tmp_path / "reports")


def test_the_flash_and_decode_kernels_go_through_it(reporting, launches):
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
    assert len(launches) == 4 == len(reporting.sources)  # wmma, mma, decode partial + combine
    assert launches[1]["shared_memory"] == 64 * 1024
    assert "constexpr int WM = 2;" in reporting.sources[1] and "const uint8_t* k_codes" in reporting.sources[2]


def test_the_report_of_a_kernel_for_the_architecture_specific_target_is_compiled_for_it(reporting, launches):
    for suffix in ("", "a"):
        call_once(CudaKernel("k", ["x"], ["out"], "", arch_suffix=suffix))
    assert reporting.archs == ["sm_90", "sm_90a"]


@pytest.mark.skipif(nvcc() is None, reason="no CUDA compiler here (nvcc)")
def test_every_registered_cuda_source_variant_assembles_for_sm_90(reporting, launches, tmp_path):
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
    units = sorted(set(zip(reporting.sources, reporting.archs, strict=True)))
    assert len(units) >= 30  # 15 flash tiles and the decode kernels, in two dtypes
    assert {arch for _, arch in units} == {"sm_90", "sm_90a"}  # the wgmma tiles need the architecture-specific target

    def assemble(i: int) -> tuple[int, str]:
        source, arch = units[i]
        path = tmp_path / f"unit{i}.cu"
        path.write_text(source.replace(NAME_PLACEHOLDER, f"unit{i}"))
        done = subprocess.run([nvcc(), "-cubin", f"-arch={arch}", "-o", str(tmp_path / f"unit{i}.cubin"), str(path)],
                              capture_output=True, text=True)
        return done.returncode, done.stderr[-3000:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [log for status, log in pool.map(assemble, range(len(units))) if status]
    assert not failed, failed[0]
