"""The tensor/version derivers: what a user sees in a finding's facts."""

from __future__ import annotations

from mpdoctor import rulebase
from mpdoctor.engine.derive import run_deriver
from mpdoctor.engine.derive.tensors import device_name, op_of
from mpdoctor.engine.derive.versions import demangle, library_info
from mpdoctor.logs import explain_text


def test_devices_and_ops():
    assert device_name("cuda:0!") == "cuda:0"
    assert device_name("CPU") == "cpu"
    assert device_name("GPU") == "cuda"  # torch 1.x "is on CPU, but expected it to be on GPU"
    assert device_name("1") == "cuda:1"  # torch 1.x "but device 1 does not equal 0"
    assert device_name("weight") is None
    assert op_of("wrapper_CUDA__index_select") == "index_select"
    assert op_of("_thnn_conv2d_forward") == "conv2d"


def test_tensors_deriver_compares_the_two_sides():
    out = run_deriver("tensors", {"_input": "torch.HalfTensor", "_weight": "torch.cuda.FloatTensor"}, [])
    assert out["dtype_differs"] == "float16 vs float32"
    assert out["device_differs"] == "cpu vs cuda"
    assert out["input_half"] == "float16" and out["weight_wide"] == "float32"
    both = run_deriver("tensors", {"_input": "c10::BFloat16", "_bias": "c10::Half"}, [])
    assert both["both_half"] == "float16 and bfloat16"
    assert "input_half" not in both  # neither side is 'the' half one


def test_tensors_deriver_never_raises_on_odd_input():
    assert run_deriver("tensors", {"_x": object(), "_y": None, "method": 3}, []) is not None


def test_versions_deriver_reads_requirements_and_numbers():
    out = run_deriver("versions", {"required": ">= 2.1", "found": "2.1.0a0+41361538"}, [])
    assert out["comparison"] == "older than" and "pre-release" in out["prerelease_note"]
    out = run_deriver("versions", {"required": "accelerate>=0.20.1", "found": "0.20.1",
                                   "built_cuda_number": "1201", "torch_version": "2.1.2+cu121",
                                   "cudnn_compiled": "90100", "cudnn_runtime": "(8, 9, 2)",
                                   "cuda_a": "12.1", "cuda_b": "11.8"}, [])
    assert "comparison" not in out and out["required_version"] == "0.20.1"
    assert out["built_cuda"] == "12.1" and out["torch_cuda"] == "12.1"
    assert out["cudnn_runtime_is"] == "older" and out["major_mismatch"] == "CUDA 12 vs CUDA 11"


def test_libraries_and_symbols():
    info = library_info("libcudart.so.12")
    assert (info["component"], info["cuda_major"], info["pip_package"]) == (
        "the CUDA runtime", "12", "nvidia-cuda-runtime-cu12")
    assert library_info("cudnn_cnn_infer64_8.dll")["cudnn_major"] == "8"
    assert "pip_package" not in library_info("libcudart.so.10.1")  # no CUDA 10 wheels
    assert demangle("_ZN3c104cuda9SetDeviceEi") == "c10::cuda::SetDevice"
    assert demangle("_ZN3c105ErrorC2ENS_14SourceLocationE") == "c10::Error::Error"
    assert demangle("__nvJitLinkAddData_12_1") is None
    out = run_deriver("cuda_library", {"symbol": "__nvJitLinkAddData_12_1", "lib": "libnvJitLink.so.12"}, [])
    assert out["needs_nvjitlink"] == "12.1" and out["symbol_owner"] == "a CUDA library"


def test_input_weight_message_is_read_as_dtype_or_device():
    """The same torch message is two different problems depending on what differs."""
    dtype = explain_text("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type "
                         "(torch.cuda.FloatTensor) should be the same\n", rulebase.load())
    device = explain_text("RuntimeError: Input type (torch.FloatTensor) and weight type "
                          "(torch.cuda.FloatTensor) should be the same\n", rulebase.load())
    assert [f.category for f in dtype.findings][:1] == ["dtype-mismatch"]
    assert [f.category for f in device.findings][:1] == ["device-mismatch"]
    assert device.findings[0].facts["input_device"] == "cpu"
