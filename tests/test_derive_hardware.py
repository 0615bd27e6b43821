"""The hardware derivers (mpdoctor/engine/derive/hardware.py): what a user reads in a
finding about GPUs, builds, drivers and half-precision kernels."""

from __future__ import annotations

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.derive import run_deriver
from mpdoctor.engine.derive.hardware import (
    build_hint,
    cc_of_gpu_name,
    covers,
    device_flags,
    driver_max_cuda,
    normalise_cc,
)
from mpdoctor.logs import explain_text


@pytest.mark.parametrize("text, cc", [
    ("7.5", "7.5"), ("(8, 6)", "8.6"), ("sm_120", "12.0"), ("sm75", "7.5"),
    ("compute_90", "9.0"), ("12.0", "12.0"), ("86", "8.6"), (None, None), ("gpu", None),
])
def test_compute_capability_spellings(text, cc):
    assert normalise_cc(text) == cc


@pytest.mark.parametrize("name, cc", [
    ("Tesla T4", "7.5"), ("Tesla V100-SXM2-32GB", "7.0"), ("NVIDIA A10G", "8.6"),
    ("NVIDIA GeForce RTX 5090 Laptop GPU", "12.0"), ("Quadro RTX 5000", "7.5"),
    ("NVIDIA RTX 6000 Ada Generation", "8.9"), ("NVIDIA H100 80GB HBM3", "9.0"),
    ("Tesla P40", "6.1"), ("NVIDIA GeForce GTX TITAN X", "5.2"), ("A GPU nobody knows", None),
])
def test_gpu_names_give_capabilities(name, cc):
    assert cc_of_gpu_name(name) == cc


def test_driver_branch_gives_newest_cuda():
    assert driver_max_cuda("470.86") == "11.4"
    assert driver_max_cuda("535.104.05") == "12.2"
    assert driver_max_cuda("not a driver") is None


def test_driver_deriver_names_the_minimum_driver_and_an_older_build():
    out = run_deriver("driver", {"found_version": "11040", "torch_version": "2.1.0+cu121"}, [])
    assert out["driver_cuda"] == "11.4"
    assert out["needed_cuda"] == "12.1"
    assert out["min_driver_linux"] == "525.60.13"  # the CUDA 12.x minor-version floor
    assert out["toolkit_driver"] == "530.30.02"  # what PTX from CUDA 12.1 needs
    assert "cu118" in out["older_build"]


def test_driver_deriver_without_the_build_cuda_only_decodes():
    out = run_deriver("driver", {"found_version": "12020"}, [])
    assert out["driver_cuda"] == "12.2"
    assert "min_driver_linux" not in out


def test_arch_coverage_follows_binary_compatibility():
    assert covers([50, 60, 70, 75, 80, 86, 90], 89)  # sm_86 code runs on Ada
    assert not covers([50, 60, 70, 75, 80, 86, 90], 120)  # no Blackwell code
    assert not covers([80, 86], 87)  # Orin runs only its own sm_87 code


def test_build_hints_name_builds_with_kernels():
    assert "cu118" in build_hint(37) and "R470" in build_hint(37)
    assert "cu126" in build_hint(70)
    blackwell = build_hint(120)
    assert "cu13" in blackwell and "torch >= 2.7" in blackwell
    assert "every official CUDA pip wheel" in build_hint(86)


def test_no_kernel_image_deriver_reads_the_missing_arch():
    out = run_deriver("no_kernel_image", {
        "gpu": "NVIDIA GeForce RTX 5090", "sm_num": "120",
        "supported": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90", "torch_version": "2.5.1+cu124"}, [])
    assert out["cc"] == "12.0" and out["arch"] == "Blackwell"
    assert out["missing_arch"] == "sm_120"
    assert out["supported_list"] == "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"
    assert out["torch_cuda"] == "12.4"


def test_gpu_modes_add_only_their_own_conditions():
    bf16 = run_deriver("gpu_bf16", {"gpu": "Tesla T4"}, [])
    assert bf16["no_bf16_gpu"] == "Tesla T4 (Turing, sm_75)"
    assert bf16["_cc_source"] == "looked up from the GPU name"
    assert "no_fp8_gpu" not in bf16
    fp8 = run_deriver("gpu_fp8", {"cc_major": "8", "cc_minor": "0"}, [])
    assert "no_fp8_gpu" in fp8 and "no_bf16_gpu" not in fp8
    flash = run_deriver("gpu_flash", {"gpu": "NVIDIA GeForce RTX 5090"}, [])
    assert "blackwell_gpu" in flash and "no_fa2_gpu" not in flash


def test_fp16_advice_warns_about_slow_pascal_fp16():
    out = run_deriver("gpu_bf16", {"gpu": "NVIDIA GeForce GTX 1080 Ti"}, [])
    assert "1/64" in out["_fp16_advice"]


def test_half_op_device_comes_from_the_kernel_name():
    cpu = run_deriver("half_op", {"op": "addmm_impl_cpu_", "dtype_raw": "Half"}, [])
    assert (cpu["dtype"], cpu["device"], cpu["_on_cpu"]) == ("float16", "cpu", "CPU")
    layer_norm = run_deriver("half_op", {"op": "LayerNormKernelImpl", "dtype_raw": "Half"}, [])
    assert layer_norm["device"] == "cpu"
    cuda = run_deriver("half_op", {"op": "max_all_cuda", "dtype_raw": "BFloat16"}, [])
    assert (cuda["dtype"], cuda["device"]) == ("bfloat16", "cuda")
    unknown = run_deriver("half_op", {"op": "_", "dtype_raw": "Float8_e8m0fnu"}, [])
    assert unknown["dtype"] == "float8_e8m0fnu" and "device" not in unknown


def test_device_flags():
    assert device_flags("xla:tpu") == {"device": "xla", "_on_xla": "XLA"}
    assert device_flags("cuda:0")["indexed_device"] == "cuda:0"
    assert device_flags(None) == {}


def test_cuda_init_codes_explain_themselves():
    assert "Fabric Manager" in run_deriver("cuda_init", {"code": "802"}, [])["code_hint"]
    assert run_deriver("cuda_init", {"unknown": "CUDA unknown error"}, [])["code_meaning"] == "cudaErrorUnknown"
    assert run_deriver("cuda_init", {"code": "12345"}, []) == {}


def test_nvcc_arch_names_the_toolkit_that_knows_it():
    assert run_deriver("nvcc_arch", {"target": "compute_120"}, [])["needs_cuda"] == "12.8"
    assert run_deriver("nvcc_arch", {"target": "compute_50"}, [])["dropped_in"] == "13.0"


@pytest.mark.parametrize("bad", [{"cc": object()}, {"gpu": 12}, {"found_version": "x" * 10000}, {"target": None}])
def test_derivers_never_raise(bad):
    for name in ("gpu", "gpu_bf16", "gpu_fp8", "gpu_flash", "no_kernel_image", "driver",
                 "cuda_init", "half_op", "device", "nvcc_arch"):
        assert "derive_error" not in run_deriver(name, bad, [])


def test_explain_reads_the_driver_story_out_of_a_log():
    log = """PyTorch version: 2.1.0+cu121
| NVIDIA-SMI 470.86       Driver Version: 470.86       CUDA Version: 11.4     |
RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver."""
    top = explain_text(log, rulebase.load()).findings[0]
    assert top.category == "driver-too-old"
    assert "CUDA 11.4" in top.explanation and "525.60.13" in top.explanation
