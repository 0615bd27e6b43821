"""scripts/mine_catalogue.py, the miner of catalogue/*.toml: what it reads from C/C++ check
macros, error-string tables and the CUDA runtime's library, and how its classifier labels a
message by its meaning (memory, driver, kernel, device, dtype, communication words)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mine_catalogue", ROOT / "scripts" / "mine_catalogue.py")
mine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mine)


def test_the_libraries_own_check_macros_are_mined():
    src = '''
    NVTE_CHECK(t.dtype() == DType::kFloat8E4M3, "FP8 GEMM requires compute capability 8.9 or newer, got ", cc);
    NVTE_ERROR("Unsupported dtype ", to_string(dtype));
    TORCH_CHECK(q.is_cuda(), "seqused_k must be on CUDA device");
    '''
    got = [(m["template"], m["kind"]) for m in mine.mine_cpp(src, "te/gemm.cu", "transformer-engine")]
    assert ("FP8 GEMM requires compute capability 8.9 or newer, got {}", "RuntimeError") in got
    assert ("seqused_k must be on CUDA device", "RuntimeError") in got
    assert all(t != "Unsupported dtype {}" or k == "RuntimeError" for t, k in got)


def test_nccls_warn_is_a_log_line_with_its_printf_placeholders_and_only_nccls():
    src = 'WARN("NET/IB : Got completion from peer %s with error %d, opcode %d", addr, err, op);'
    [m] = mine.mine_cpp(src, "src/transport/net_ib.cc", "nccl")
    assert m["template"] == "{host}:{pid}:{tid} [{dev}] NCCL WARN NET/IB : Got completion from peer {} with error {}, opcode {}"
    assert m["kind"] == "log-error" and m["source"] == "src/transport/net_ib.cc:1"
    assert mine.mine_cpp(src, "csrc/x.cu", "xformers") == []  # another library's WARN macro is not NCCL's


def test_an_error_string_table_is_mined_as_torch_prints_it():
    src = '''const char* ncclGetErrorString(ncclResult_t code) {
      switch (code) {
        case ncclSuccess                : return "no error";
        case ncclUnhandledCudaError     : return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError          : return "internal error - please report this issue to the NCCL developers";
      }
    }'''
    got = [m["template"] for m in mine.mine_table(src, "src/init.cc", "nccl")]
    assert "NCCL error in: {file}:{line}, unhandled cuda error (run with NCCL_DEBUG=INFO for details), " \
           "NCCL version {version}" in got
    assert len(got) == 2  # "no error" is no message
    # only the runtime's own function: a plugin's table of its own codes is not what torch prints
    plugin = 'const char* inspectorErrorString(int r) {\n  switch (r) {\n  case 1: return "Inspector is disabled";\n  }\n}'
    assert mine.mine_table(plugin, "ext/inspector.cc", "nccl") == []
    hip = ('const char *ihipGetErrorName(hipError_t e) {\n  case hipErrorOutOfMemory:\n    return "hipErrorOutOfMemory";\n}\n'
           'const char *ihipGetErrorString(hipError_t e) {\n  case hipErrorOutOfMemory:\n    return "out of memory";\n}\n')
    assert [m["template"] for m in mine.mine_table(hip, "hip_error.cpp", "rocm-hip")] == ["HIP error: out of memory"]


def test_the_cuda_runtimes_table_is_read_from_its_library(tmp_path):
    lib = tmp_path / "libcudart.so.12"
    lib.write_bytes(b"\x7fELF\0\0cudaMalloc\0no error\0cudaErrorMemoryAllocation\0out of memory\0"
                    b"cudaErrorAssert\0device-side assert triggered\0startup failure in cuda runtime\0tail text\0")
    got = [m["template"] for m in mine.mine_cudart(str(lib))]
    assert got == ["CUDA error: out of memory", "CUDA error: device-side assert triggered",
                   "CUDA error: startup failure in cuda runtime"]
    empty = tmp_path / "other.so"
    empty.write_bytes(b"nothing here")
    with pytest.raises(SystemExit, match="no cudaGetErrorString table"):
        mine.mine_cudart(str(empty))


@pytest.mark.parametrize("template, library, category", [
    ("CUDA error: out of memory", "cuda-runtime", "out-of-memory"),
    ("Couldn't allocate memory on device!", "rocm-hip", "out-of-memory"),
    ("Not enough memory, use lower resolution (max approx. {}x{}). Need: {}GB free, Have:{}GB free", "comfyui",
     "out-of-memory"),
    ("CUDA error: API call is not supported in the installed CUDA driver", "cuda-runtime", "driver-too-old"),
    ("CUDA error: no CUDA-capable device is detected", "cuda-runtime", "cuda-unavailable"),
    ("HIP error: invalid device function", "rocm-hip", "no-kernel-image"),
    ("CUDA error: hardware stack error", "cuda-runtime", "cuda-kernel-fault"),
    ("HeaddimV > 256 requires fp16 and bf16 data type", "flash-attn", "flash-attention-unsupported"),
    ("Attention combine function only supports Ampere GPUs or newer.", "flash-attn", "flash-attention-unsupported"),
    ("The index tensor and the source tensor must be of type CUDA!", "xformers", "device-mismatch"),
    ("query and out must have the same dtype", "flash-attn", "dtype-mismatch"),
    ("MXFP8 Dequantization is NOT supported by architectures < 10.0", "transformer-engine", "fp8-unsupported"),
    ("{host}:{pid}:{tid} [{dev}] NCCL WARN Could not find real path of {} ({})", "nccl", "distributed-communication"),
    ("nvte_grouped_gemm requires cuBLAS 13.3+, but compile-time cuBLAS version is {}", "transformer-engine",
     "version-incompatible"),
    # not ours: an index argument's dtype, an fp8 kernel's internal argument check, a missing optional package
    ("cu_seqlens_k must have dtype torch.int32", "flash-attn", "not ours"),
    ("Row-scaled NVFP4 reference quantization requires rowwise usage.", "transformer-engine", "not ours"),
    ("xentropy_cuda is not installed", "flash-attn", "not ours"),
    ("__all__ must be kept sorted", "torch", "not ours"),
])
def test_the_classifier_reads_the_messages_meaning(template, library, category):
    assert mine.classify(template, library) == category


def test_every_mined_library_records_where_it_came_from():
    for p in sorted((ROOT / "catalogue").glob("*.toml")):
        if p.name == "review.toml":
            continue
        data = tomllib.loads(p.read_text(encoding="utf-8"))
        assert data["version"] and data["origin"], p.name
        for m in data["message"][:50]:
            assert m["source"] and m["kind"], (p.name, m)


def test_relabel_is_stable_on_the_committed_catalogue(tmp_path):
    # the committed files are what the script's current classifier and review.toml say
    out = tmp_path / "catalogue"
    out.mkdir()
    for p in (ROOT / "catalogue").glob("*.toml"):
        (out / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "mine_catalogue.py"), "--out", str(out), "--relabel"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    changed = [p.name for p in out.glob("*.toml")
               if p.read_text(encoding="utf-8") != (ROOT / "catalogue" / p.name).read_text(encoding="utf-8")]
    assert changed == []


def test_a_deprecation_or_an_internal_assert_is_not_ours_but_amps_deprecations_are():
    assert mine.classify("`nccl.reduce` with an output tensor list is deprecated. Please specify a single output "
                         "tensor with argument 'output' instead.", "torch", "FutureWarning") == "not ours"
    assert mine.classify("Expected all_reduce_event to be set for non-CPU device", "torch",
                         "AssertionError") == "not ours"
    assert mine.classify("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                         "`torch.amp.autocast('cuda', args...)` instead.", "torch", "FutureWarning") == "amp-deprecated-api"
    # the same words from a library's own raise stay relevant
    assert mine.classify("NCCL communicator has {} ranks, but the process group reports {}", "transformer-engine",
                         "RuntimeError") == "distributed-communication"
