"""The tensor/version derivers: what a user sees in a finding's facts."""

from __future__ import annotations

import pytest

from mpdoctor.engine.derive import run_deriver
from mpdoctor.engine.derive.tensors import device_name, dtype_name, op_of, tensor_type
from mpdoctor.engine.derive.versions import (
    compare,
    cuda_from_number,
    cudnn_version,
    demangle,
    library_info,
    parse_requirement,
)
from mpdoctor.explain import explain_text


@pytest.mark.parametrize("spelling, name", [
    ("Half", "float16"), ("c10::Half", "float16"), ("struct c10::Half", "float16"),
    ("at::Half", "float16"), ("torch.float16", "float16"), ("c10::BFloat16", "bfloat16"),
    ("c 10::BFloat16", "bfloat16"), ("float", "float32"), ("Float", "float32"),
    ("double", "float64"), ("Float8_e4m3fn", "float8_e4m3fn"), ("Long", "int64"),
])
def test_dtype_spellings_normalise(spelling, name):
    assert dtype_name(spelling) == name


def test_tensor_type_names_carry_dtype_and_device():
    assert tensor_type("torch.cuda.HalfTensor") == ("float16", "cuda")
    assert tensor_type("torch.FloatTensor") == ("float32", "cpu")
    assert tensor_type("CUDABFloat16Type") == ("bfloat16", "cuda")
    assert tensor_type("MPSFloatType") == ("float32", "mps")
    assert tensor_type("float") is None  # a dtype, not a tensor type


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


def test_versions_requirements_and_numbers():
    assert parse_requirement("accelerate>=0.20.1") == ("accelerate", ">=", "0.20.1")
    assert parse_requirement("tokenizers>=0.14,<0.19") == ("tokenizers", ">=", "0.14")
    assert compare("2.1.0a0+41361538", "2.1") == -1  # pre-release below its release
    assert compare("0.20.1", "0.20.1") == 0
    assert cuda_from_number("1201") == "12.1"  # xformers' MMmm
    assert cuda_from_number("11040") == "11.4"  # driver-style MMmmp
    assert cudnn_version("(8, 9, 2)") == "8.9.2"
    assert cudnn_version("7102") == "7.1.2"
    assert cudnn_version("90100") == "9.1.0"
    out = run_deriver("versions", {"required": ">= 2.1", "found": "2.1.0a0+41361538"}, [])
    assert out["comparison"] == "older than" and "pre-release" in out["prerelease_note"]


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
                         "(torch.cuda.FloatTensor) should be the same\n")
    device = explain_text("RuntimeError: Input type (torch.FloatTensor) and weight type "
                          "(torch.cuda.FloatTensor) should be the same\n")
    assert [f.category for f in dtype.findings][:1] == ["dtype-mismatch"]
    assert [f.category for f in device.findings][:1] == ["device-mismatch"]
    assert device.findings[0].facts["input_device"] == "cpu"
