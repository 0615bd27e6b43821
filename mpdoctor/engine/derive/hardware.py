"""What follows from the hardware a log names: GPU model -> compute capability -> what
it can run, a driver's CUDA number decoded, the builds that have kernels for a GPU, CUDA
initialisation error codes, and the kernel's device from its name.

The compatibility data (GPU names, drivers per toolkit, torch builds and their
architectures) is the one set of tables in mpdoctor/knowledge/tables, read through
mpdoctor.knowledge.compat (pure: no torch, no pynvml). This module only adds what those tables
do not hold: the first toolkit that knows an architecture, and CUDA's init error codes.
Derivers are pure and never raise.
"""

from __future__ import annotations

import re
from typing import Any

from ...knowledge.dtypes import dtype_name
from ...knowledge.versions import cuda_int_to_str, major
from . import deriver
from .fit import FIT_FACTS, fit


def _compat():
    # Imported on first use: explain only pays for the tables when a rule needs them.
    from ...knowledge import compat

    return compat


def _cc_tuple(cc: str | None) -> tuple[int, int] | None:
    n = cc_number(cc)
    return (n // 10, n % 10) if n is not None else None


def cc_of_gpu_name(name: str | None) -> str | None:
    """'Tesla V100-SXM2-32GB' -> '7.0'; None for a name the GPU table does not know."""
    if not name:
        return None
    row = _compat().gpu_by_name(str(name))
    return str(row["cc"]) if row else None


def normalise_cc(text: Any) -> str | None:
    """'7.5', '(7, 5)', '75', 'sm_75', 'sm75', 'compute_75', '12.0' -> 'X.Y'."""
    if text is None:
        return None
    s = str(text).strip().lower()
    m = re.search(r"(\d{1,2})\s*[.,]\s*(\d)", s)
    if m:
        return f"{int(m.group(1))}.{m.group(2)}"
    m = re.search(r"(?:sm|compute)?_?\s*(\d{2,3})\b", s)
    if m:
        n = int(m.group(1))
        return f"{n // 10}.{n % 10}"
    return None


def cc_number(cc: str | None) -> int | None:
    """'7.5' -> 75 (for comparisons)."""
    if not cc:
        return None
    try:
        major, minor = cc.split(".")
        return int(major) * 10 + int(minor)
    except ValueError:
        return None


def arch_of(cc: str | None, gpu: str | None = None) -> str | None:
    """Compute capability (and the name, for the traps) -> architecture name."""
    t = _cc_tuple(cc)
    return _compat().arch_name(t, gpu) if t else None


def _fp16_advice(n: int, arch: str | None) -> str:
    # compat-facts §2.1: FP16 rate per CC.
    what = f"This {arch} GPU" if arch else "This GPU"
    if n < 53:
        return f"{what} has no fast fp16 arithmetic either: train in fp32 (`mixed_precision=\"no\"`)."
    if n == 61:
        return (f"{what} (sm_61) runs fp16 arithmetic at 1/64 of its fp32 rate, so fp32 "
                "(`mixed_precision=\"no\"`) is usually faster than fp16 on it.")
    if n < 70:
        return f"{what} runs fp16 at twice its fp32 rate (no tensor cores): `mixed_precision=\"fp16\"` works and is faster."
    if n < 80:
        return f"{what} has fp16 tensor cores: `mixed_precision=\"fp16\"` is the fast choice on it."
    return f"{what} has both fp16 and bf16 tensor cores."


def gpu_facts(facts: dict[str, Any], mode: str = "plain") -> dict[str, Any]:
    """Normalise the GPU facts a rule read (`gpu`, `cc`, `cc_major`/`cc_minor`, `sm`)
    and add what follows from them. `mode` adds the facts one family of rules needs:
    "bf16", "fp8" or "flash" (kept apart so that a finding carries only its own)."""
    out: dict[str, Any] = {}
    cc = None
    if facts.get("cc_major") is not None and facts.get("cc_minor") is not None:
        cc = normalise_cc(f"{facts['cc_major']}.{facts['cc_minor']}")
    cc = cc or normalise_cc(facts.get("cc")) or normalise_cc(facts.get("sm_num")) or normalise_cc(facts.get("sm"))
    gpu = str(facts["gpu"]).strip() if facts.get("gpu") else None
    from_name = False
    if cc is None and gpu:
        cc = cc_of_gpu_name(gpu)
        from_name = cc is not None
    n = cc_number(cc)
    if cc is None or n is None:
        return out
    arch = arch_of(cc, gpu)
    out["cc"] = cc
    out["sm"] = f"sm_{n}"
    if arch:
        out["arch"] = arch
    if from_name:
        out["_cc_source"] = "looked up from the GPU name"
    label = f"{arch}, sm_{n}" if arch else f"sm_{n}"
    desc = f"{gpu} ({label})" if gpu else f"a {arch + ' ' if arch else ''}GPU of compute capability {cc}"
    out["gpu_desc"] = desc
    # Conditional descriptions: a template sentence naming one of these renders only
    # when the condition holds (sentences with unknown facts are left out).
    if mode == "bf16":
        out["_fp16_advice"] = _fp16_advice(n, arch)
        out["no_bf16_gpu" if n < 80 else "bf16_capable_gpu"] = desc
    elif mode == "fp8":
        out["_fp16_advice"] = _fp16_advice(n, arch)
        out["no_fp8_gpu" if n < 89 else "fp8_capable_gpu"] = desc
    elif mode == "flash":
        out["no_fa2_gpu" if n < 80 else "fa2_capable_gpu"] = desc
        if n >= 100:
            # flash-attn < 2.7.3 accepted only sm_8x and sm_90 (compat-facts §2.2)
            out["blackwell_gpu"] = desc
        if n < 75:
            out["pre_turing_gpu"] = desc
    return out


@deriver("gpu", facts=("gpu_desc",))
def gpu(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return gpu_facts(facts)


@deriver("gpu_bf16", facts=("_cc_source", "_fp16_advice", "arch", "bf16_capable_gpu", "cc", "gpu_desc", "no_bf16_gpu", "sm") + FIT_FACTS)
def gpu_bf16(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return {**gpu_facts(facts, "bf16"), **fit(facts)}


@deriver("gpu_fp8", facts=("_cc_source", "_fp16_advice", "arch", "cc", "fp8_capable_gpu", "gpu_desc", "no_fp8_gpu", "sm"))
def gpu_fp8(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return gpu_facts(facts, "fp8")


@deriver("gpu_flash", facts=("_cc_source", "arch", "bf16_on_old_gpu", "blackwell_gpu", "cc", "dtype", "fa2_capable_gpu", "full_precision", "gpu_desc", "no_fa2_gpu", "pre_turing_gpu", "sm") + FIT_FACTS)
def gpu_flash(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out = gpu_facts(facts, "flash")
    dtype = dtype_name(facts.get("dtype_raw"))
    if dtype:
        out["dtype"] = dtype
        if dtype in ("float32", "float64"):
            out["full_precision"] = dtype
        elif dtype == "bfloat16" and "no_fa2_gpu" in out:
            out["bf16_on_old_gpu"] = out["no_fa2_gpu"]
    out.update(fit(facts))
    return out


# -- which build has kernels for a GPU (compat-facts §4-5) ----------------------------

def _arch_list(text: Any) -> list[int]:
    """'sm_50 sm_60 sm_86 compute_90' or '5.0, 6.0, 8.6' or '- 7.5 which ...' -> [50, 60, 86, 90]."""
    if not text:
        return []
    s = str(text)
    found = [int(x) for x in re.findall(r"(?:sm|compute)_(\d{2,3})", s)]
    if not found:
        found = [int(a) * 10 + int(b) for a, b in re.findall(r"\b(\d{1,2})\.(\d)\b", s)]
    seen: list[int] = []
    for v in found:
        if v not in seen:
            seen.append(v)
    return seen


def build_hint(n: int) -> str | None:
    """Which x86_64 pip builds have machine code for compute capability n, as a sentence."""
    compat = _compat()
    cc = (n // 10, n % 10)
    if 75 <= n < 100:
        return ("every official CUDA pip wheel has kernels for this GPU, so the installed torch is a CPU-only, "
                "ROCm or custom build: reinstall it from https://pytorch.org/get-started/locally/")
    builds = compat.builds_covering(cc)
    if not builds:
        return None
    # Suggest a CUDA 12 build where one exists: it runs on older drivers (R525+/R570+)
    # than the cu13x builds (R580+), compat-facts §3.2.
    pick = next((b for b in builds if " cu12" in b), builds[0]).split()  # "torch 2.6-2.13 cu126"
    version, variant = pick[1].split("-")[-1], pick[2]
    text = (f"the builds with kernels for sm_{n} are {', '.join(builds)}: e.g. "
            f"`pip install \"torch=={version}.*\" --index-url https://download.pytorch.org/whl/{variant}`")
    support = compat.arch_support(cc)
    if support and support.get("last_driver_branch"):
        text += f"; this GPU's last driver branch is {support['last_driver_branch']}"
    if n >= 100:
        # compat-facts §5.2/§3.2: Blackwell kernels arrived with the cu128 builds of torch 2.7.
        text += " (Blackwell needs a CUDA 12.8+ build, torch >= 2.7, and an R570+ driver; cu13x builds need R580+)"
    return text


def covers(build: list[int], n: int) -> bool:
    """Whether a build's arch list (sm_XY numbers) has machine code for device CC n."""
    kind, _entry = _compat().arch_coverage((n // 10, n % 10), [f"sm_{b}" for b in build])
    return kind == "sass"


@deriver("no_kernel_image", facts=("_cuda", "_cuda_runtime", "_gfx_dropped", "_gfx_source", "_hip", "arch", "build_hint",
                                   "built_cuda", "cc", "cpu_build", "gfx_arch", "gfx_note", "gpu_desc", "hsa_override",
                                   "missing_arch", "needed_cuda", "sm", "supported_list", "tegra_gpu", "torch_cuda"))
def no_kernel_image(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    if facts.get("_hip") or any(h.get("_hip") for h in hits):
        # ROCm: `HIP error: invalid device function`, hipErrorNoBinaryForGpu, rocBLAS's
        # missing Tensile library: the facts are the gfx architecture's, not a CC's.
        from .platforms import hip_arch_facts

        out = hip_arch_facts(facts)
        out["_hip"] = "HIP"
        return out
    out = gpu_facts(facts)
    out["_cuda"] = "CUDA"
    if not facts.get("_cutlass_arch"):
        out["_cuda_runtime"] = "CUDA"
    build = _arch_list(facts.get("supported"))
    if build:
        out["supported_list"] = " ".join(f"sm_{b}" for b in build)
    n = cc_number(out.get("cc"))
    if n is not None and not (facts.get("extension") and 75 <= n < 100):
        # With an extension named and a GPU every wheel covers, torch is not the culprit.
        hint = build_hint(n)
        if hint:
            out["build_hint"] = hint
        if build and not covers(build, n):
            out["missing_arch"] = f"sm_{n}"
    if n in (53, 62, 72, 87):
        # Jetson: the official aarch64 wheels warn for Orin (sm_87) although sm_80 code runs.
        out["tegra_gpu"] = out.get("gpu_desc", f"sm_{n}")
    tv = str(facts.get("torch_version") or "")
    m = re.search(r"\+cu(\d{2,3})\b", tv)
    if m:
        out["torch_cuda"] = cuda_int_to_str(m.group(1))
    elif re.search(r"\+cpu\b", tv):
        out["cpu_build"] = tv
    for key in ("needed_cuda_int", "built_cuda_int"):
        v = cuda_int_to_str(facts.get(key))
        if v:
            out[key.replace("_int", "")] = v
    return out


# The toolkit that first knows a `compute_XY` target (compat-facts §4.1); the one that
# removed it is in knowledge/tables/torch_builds.toml.
_ARCH_FIRST_CUDA = {
    75: "10.0", 80: "11.0", 86: "11.1", 87: "11.4", 89: "11.8", 90: "11.8",
    100: "12.8", 101: "12.8", 120: "12.8", 103: "12.9", 121: "12.9", 110: "13.0",
}


@deriver("nvcc_arch", facts=("dropped_in", "needs_cuda", "target_cc"))
def nvcc_arch(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """nvcc's `Unsupported gpu architecture 'compute_120'`: which toolkit would know it."""
    out: dict[str, Any] = {}
    m = re.search(r"(\d{2,3})", str(facts.get("target") or ""))
    if not m:
        return out
    n = int(m.group(1))
    out["target_cc"] = f"{n // 10}.{n % 10}"
    if n in _ARCH_FIRST_CUDA:  # 'sm_90a' / 'compute_100f' share the number
        out["needs_cuda"] = _ARCH_FIRST_CUDA[n]
    dropped = _compat().removed_by_toolkit((n // 10, n % 10))
    if dropped:
        out["dropped_in"] = dropped
    return out


# -- driver versions (compat-facts §3) ------------------------------------------------

# A build whose runtime the driver can run, by the CUDA major the driver supports.
_BUILD_FOR_MAJOR = {
    10: "a CUDA 10.2 build (torch <= 1.12, `--index-url https://download.pytorch.org/whl/cu102`)",
    11: "a cu118 build (torch <= 2.7: `pip install \"torch==2.7.*\" --index-url https://download.pytorch.org/whl/cu118`)",
    12: "a cu126 build (`pip install torch --index-url https://download.pytorch.org/whl/cu126`)",
}


def driver_max_cuda(driver: Any) -> str | None:
    """'470.86' -> '11.4': the newest toolkit whose minimum driver this one meets."""
    if not re.match(r"\s*\d{3}\.\d", str(driver or "")):
        return None
    return _compat().driver_max_cuda(str(driver).strip())


def _runtime_cuda(facts: dict[str, Any]) -> str | None:
    """The CUDA the build needs: 'cu121' / '+cu121' / '12.1' in the facts."""
    for key in ("runtime_cuda", "torch_version", "torch_cuda"):
        v = facts.get(key)
        if not v:
            continue
        m = re.search(r"cu(\d{2,3})\b", str(v))
        if m:
            return cuda_int_to_str(m.group(1))
        m = re.search(r"\b(\d{1,2})\.(\d)\b", str(v))
        if m and key != "torch_version":
            return f"{int(m.group(1))}.{m.group(2)}"
    return None


@deriver("driver", facts=("driver_cuda", "min_driver_linux", "min_driver_windows", "needed_cuda", "older_build", "toolkit_driver"))
def driver(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    driver_cuda = cuda_int_to_str(facts.get("found_version"))
    if driver_cuda is None and facts.get("driver_cuda"):
        driver_cuda = str(facts["driver_cuda"])
    if driver_cuda is None and facts.get("driver"):
        driver_cuda = driver_max_cuda(facts["driver"])
    if driver_cuda:
        out["driver_cuda"] = driver_cuda
    need = _runtime_cuda(facts)
    if need:
        compat = _compat()
        out["needed_cuda"] = need
        # A pip wheel needs its CUDA major's minor-version-compatibility floor (§3.2);
        # 10.x has none, so the toolkit's own minimum applies.
        linux = compat.family_floor(need) or compat.toolkit_min_driver(need)
        windows = compat.family_floor(need, windows=True) or compat.toolkit_min_driver(need, windows=True)
        if linux:
            out["min_driver_linux"] = linux
        if windows:
            out["min_driver_windows"] = windows
        exact = compat.toolkit_min_driver(need)
        if exact:
            out["toolkit_driver"] = exact  # what PTX from that toolkit needs
    dmajor = major(driver_cuda)
    if dmajor in _BUILD_FOR_MAJOR and (need is None or (major(need) or 0) > dmajor):
        out["older_build"] = _BUILD_FOR_MAJOR[dmajor]
    return out


# -- CUDA initialisation error codes (compat-facts §3.3, CUDA runtime API) ---------------

_INIT_CODES: dict[str, tuple[str, str]] = {
    "100": ("cudaErrorNoDevice: no CUDA-capable device is visible",
            "check `nvidia-smi` and `CUDA_VISIBLE_DEVICES` (an empty or wrong value hides every GPU); in a container, start it with `--gpus all`"),
    "34": ("cudaErrorStubLibrary: the libcuda found is a stub, not the real driver",
           "remove the CUDA toolkit's `stubs/` folder from `LD_LIBRARY_PATH`; the real libcuda.so comes with the driver"),
    "802": ("cudaErrorSystemNotReady: the system is not yet initialised",
            "on NVSwitch systems (HGX/DGX A100, H100, H200, B200) the NVIDIA Fabric Manager must run: `sudo systemctl enable --now nvidia-fabricmanager` (its version must equal the driver's)"),
    "999": ("cudaErrorUnknown",
            "usually a driver left broken by suspend/resume or an upgrade: `sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm`, or reboot"),
    "46": ("cudaErrorDevicesUnavailable: every visible GPU is busy or unavailable",
           "the GPUs are in Exclusive Process compute mode and taken by another process (`nvidia-smi` lists it), or another job holds them; free them or ask for `sudo nvidia-smi -c DEFAULT`"),
    "304": ("cudaErrorOperatingSystem: an OS call failed",
            "the device nodes are not accessible: check the permissions on /dev/nvidia* and that the container was started with the GPU devices"),
}


@deriver("cuda_init", facts=("_hip", "code_hint", "code_meaning"))
def cuda_init(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    code = str(facts.get("code") or "").strip()
    if facts.get("_hip"):
        # ROCm's `HIP initialization: Unexpected error from hipGetDeviceCount()`: HIP's codes,
        # and the checks that apply to an AMD GPU
        return {"_hip": "HIP", "code_meaning": f"HIP's error {code}" + (f" ({facts['code_text']})" if facts.get("code_text") else ""),
                "code_hint": "Check the GPU outside Python: `rocminfo` must list a gfx agent and `dmesg | grep -i kfd` must show the "
                             "amdgpu/KFD driver loaded without errors (old GPUs on ROCm also need PCIe atomics); the user must be in the "
                             "`render` and `video` groups, and HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES must not hide it."}
    text = str(facts.get("code_text") or "").lower()
    if not code and facts.get("unknown"):
        code = "999"  # "CUDA unknown error" is cudaErrorUnknown
    elif not code and "busy or unavailable" in text:
        code = "46"
    elif not code and "stub library" in text:
        code = "34"
    if code in _INIT_CODES:
        meaning, hint = _INIT_CODES[code]
        return {"code_meaning": meaning, "code_hint": hint}
    return {}


# Kernels whose name does not say the device but that exist only in the CPU backend.
_CPU_KERNELS = re.compile(
    r"_cpu\b|_cpu_|cpu_|LayerNormKernelImpl|baddbmm_with_gemm|softmax_lastdim_kernel_impl|"
    r"_vml_|GroupNormKernelImpl|batch_norm_cpu|im2col|unfolded2d|host_softmax", re.I)
_CUDA_KERNELS = re.compile(r"_cuda\b|cuda_|_cuda_|cudnn|cublas", re.I)
_MPS_KERNELS = re.compile(r"_mps\b|mps_", re.I)


_DEVICE_LABEL = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xla": "XLA", "xpu": "XPU", "hpu": "HPU", "npu": "NPU"}


def device_flags(device: str | None) -> dict[str, Any]:
    """'cpu' -> {'device': 'cpu', '_on_cpu': 'CPU'}: the `_on_*` helper fact lets a template
    sentence render only for that device."""
    if not device:
        return {}
    raw = str(device).strip().strip("'\"")
    d = raw.lower()
    d = d.split(":")[0] if d.startswith(("xla", "cuda", "xpu")) else d
    out: dict[str, Any] = {"device": d}
    if ":" in raw and d in ("cuda", "xpu"):
        out["indexed_device"] = raw  # 'cuda:0' where a bare device type was wanted
    if d in _DEVICE_LABEL:
        out[f"_on_{d}"] = _DEVICE_LABEL[d]
    return out


@deriver("device", facts=("_on_cpu", "_on_cuda", "_on_mps", "_on_xla", "cpu_build", "device", "indexed_device", "k"))
def device_kind(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out = device_flags(facts.get("device_raw") or facts.get("device") or facts.get("ac_device"))
    tv = str(facts.get("torch_version") or "")
    if re.search(r"\+cpu\b", tv):
        out["cpu_build"] = tv
    return out


@deriver("half_op", facts=("_on_cpu", "_on_cuda", "_on_mps", "cpu_half", "device", "dtype", "ops") + FIT_FACTS)
def half_op(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dtype = dtype_name(facts.get("dtype_raw"))
    if dtype:
        out["dtype"] = dtype
    op = str(facts.get("op") or "")
    device = None
    if _CPU_KERNELS.search(op):
        device = "cpu"
    elif _CUDA_KERNELS.search(op):
        device = "cuda"
    elif _MPS_KERNELS.search(op):
        device = "mps"
    elif facts.get("device_hint"):
        hint = str(facts["device_hint"]).lower()
        device = "cpu" if "cpu" in hint else "cuda" if "cuda" in hint else "mps" if "mps" in hint else None
    out.update(device_flags(device))
    if device == "cpu" and dtype == "float16":
        out["cpu_half"] = "float16"
    if len(hits) > 1:
        ops = []
        for h in hits:
            o = h.get("op")
            if o and o not in ops:
                ops.append(o)
        if len(ops) > 1:
            out["ops"] = ", ".join(ops)
    out.update(fit(facts, device))
    return out
