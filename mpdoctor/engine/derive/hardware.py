"""What follows from the hardware a log names: GPU model -> compute capability -> what
it can run, a driver's CUDA number decoded, the build that has kernels for a GPU, and
the dtype spellings of C++/Windows/legacy messages reduced to one name.

Every table cites shared/reference/compat-facts.md (section numbers in the comments);
the functions are pure and never raise, as a deriver must not.
"""

from __future__ import annotations

import re
from typing import Any

from . import deriver

# -- GPU model -> compute capability (compat-facts §1) ---------------------------------
# Ordered: the first pattern that matches the lower-cased name wins, so the specific
# names ("rtx 6000 ada", "titan xp") come before the ones they contain.
_GPU_CC: list[tuple[str, str]] = [
    (r"\bk80\b", "3.7"), (r"\bk40\b", "3.5"), (r"\bk20", "3.5"),
    (r"\bm40\b|\bm60\b|gtx titan x\b|gtx 9[5-8]0", "5.2"),
    (r"jetson nano", "5.3"), (r"\btx2\b", "6.2"),
    (r"\bp100\b|gp100", "6.0"),
    (r"titan xp|titan x \(pascal\)|nvidia titan x\b|\bp40\b|\bp4\b|gtx 10[5-8]0|\bp6000\b", "6.1"),
    (r"titan v\b|\bv100|gv100", "7.0"),
    (r"xavier", "7.2"),
    (r"rtx 6000 ada|rtx [2-5]0{3} ada|\bl40s?\b|\bl4\b|rtx 40[5-9]0", "8.9"),
    (r"rtx pro \d{4}|rtx 50[5-9]0", "12.0"),
    (r"\bt4\b|rtx 20[5-8]0|gtx 16[5-6]0|quadro rtx [3-8]000|\btitan rtx\b|\brtx [4-8]000\b", "7.5"),
    (r"\ba100\b|\ba800\b|\ba30\b", "8.0"),
    (r"\borin\b", "8.7"),
    (r"\ba10g?\b|\ba40\b|\ba16\b|\ba2\b|rtx a[2-6]000|rtx 30[5-9]0", "8.6"),
    (r"\bgh200\b|\bh100\b|\bh200\b|\bh800\b|\bh20\b", "9.0"),
    (r"\bgb300\b|\bb300\b", "10.3"),
    (r"\bgb200\b|\bb200\b|\bb100\b", "10.0"),
    (r"\bthor\b", "11.0"),
    (r"\bgb10\b", "12.1"),
]
_GPU_CC_RX = [(re.compile(p), cc) for p, cc in _GPU_CC]


def cc_of_gpu_name(name: str | None) -> str | None:
    """'Tesla V100-SXM2-32GB' -> '7.0'; None for a name not in the table."""
    if not name:
        return None
    low = re.sub(r"[-_]", " ", str(name).lower())
    for rx, cc in _GPU_CC_RX:
        if rx.search(low):
            return cc
    return None


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


def arch_of(cc: str | None) -> str | None:
    """Compute capability -> architecture name (compat-facts §1)."""
    n = cc_number(cc)
    if n is None:
        return None
    if n < 50:
        return "Kepler"
    if n < 60:
        return "Maxwell"
    if n < 70:
        return "Pascal"
    if n in (70, 72):
        return "Volta"
    if n < 80:
        return "Turing"
    if n < 89:
        return "Ampere"
    if n == 89:
        return "Ada Lovelace"
    if n < 100:
        return "Hopper"
    return "Blackwell"


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
    arch = arch_of(cc)
    out["cc"] = cc
    out["sm"] = f"sm_{n}"
    if arch:
        out["arch"] = arch
    if from_name:
        out["cc_source"] = "looked up from the GPU name"
    label = f"{arch}, sm_{n}" if arch else f"sm_{n}"
    desc = f"{gpu} ({label})" if gpu else f"a {arch + ' ' if arch else ''}GPU of compute capability {cc}"
    out["gpu_desc"] = desc
    # Conditional descriptions: a template sentence naming one of these renders only
    # when the condition holds (sentences with unknown facts are left out).
    if mode == "bf16":
        out["fp16_advice"] = _fp16_advice(n, arch)
        out["no_bf16_gpu" if n < 80 else "bf16_capable_gpu"] = desc
    elif mode == "fp8":
        out["fp16_advice"] = _fp16_advice(n, arch)
        out["no_fp8_gpu" if n < 89 else "fp8_capable_gpu"] = desc
    elif mode == "flash":
        out["no_fa2_gpu" if n < 80 else "fa2_capable_gpu"] = desc
        if n >= 100:
            # flash-attn < 2.7.3 accepted only sm_8x and sm_90 (compat-facts §2.2)
            out["blackwell_gpu"] = desc
        if n < 75:
            out["pre_turing_gpu"] = desc
    return out


@deriver("gpu")
def gpu(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return gpu_facts(facts)


@deriver("gpu_bf16")
def gpu_bf16(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return gpu_facts(facts, "bf16")


@deriver("gpu_fp8")
def gpu_fp8(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return gpu_facts(facts, "fp8")


@deriver("gpu_flash")
def gpu_flash(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out = gpu_facts(facts, "flash")
    dtype = dtype_name(facts.get("dtype_raw"))
    if dtype:
        out["dtype"] = dtype
        if dtype in ("float32", "float64"):
            out["full_precision"] = dtype
        elif dtype == "bfloat16" and "no_fa2_gpu" in out:
            out["bf16_on_old_gpu"] = out["no_fa2_gpu"]
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


def build_hint(n: int) -> str:
    """Where the kernels for compute capability n are (x86_64 pip wheels, compat-facts §5.2)."""
    if n < 50:
        return ("the last pip builds with Kepler kernels (sm_37) are torch 2.0-2.7 `cu118` wheels "
                "(`pip install torch==2.7.1 --index-url https://download.pytorch.org/whl/cu118`), "
                "with a driver no newer than R470; CUDA 12 dropped Kepler")
    if n < 70:
        return ("only the `cu126` builds still carry sm_50/sm_60 kernels "
                "(`pip install torch --index-url https://download.pytorch.org/whl/cu126`); "
                "cu128, cu129, cu130 and cu132 wheels have none for Maxwell/Pascal")
    if n in (70, 72):
        return ("Volta (sm_70) kernels are in every `cu126` build "
                "(`pip install torch --index-url https://download.pytorch.org/whl/cu126`) and in cu128 for torch 2.8-2.10; "
                "cu130 and newer builds and torch 2.11's cu128 dropped Volta")
    if n < 90:
        return ("every official CUDA pip wheel has kernels for this GPU, so the installed torch is a CPU-only, "
                "ROCm or custom build: reinstall from https://pytorch.org/get-started/locally/")
    if n < 100:
        return ("Hopper (sm_90) needs a cu118 or newer build (torch >= 2.0; the cu117 wheels of torch 2.0 lack sm_90): "
                "`pip install torch --index-url https://download.pytorch.org/whl/cu126`")
    if n in (110,):
        return "Jetson Thor (sm_110) is covered by the aarch64 `cu130` builds"
    return ("Blackwell needs a CUDA 12.8+ build, torch >= 2.7: "
            "`pip install torch --index-url https://download.pytorch.org/whl/cu128` "
            "(or cu130 for current releases); cu126 and older wheels have no sm_100/sm_120 kernels")


def covers(build: list[int], n: int) -> bool:
    """Whether a build's arch list runs on device CC n (same major, minor <=; Tegra exceptions)."""
    tegra_only = {53, 62, 72, 87}
    for b in build:
        if b == n:
            return True
        if n in tegra_only:
            continue
        if b // 10 == n // 10 and b % 10 <= n % 10 and b not in tegra_only:
            return True
    return False


@deriver("no_kernel_image")
def no_kernel_image(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out = gpu_facts(facts)
    build = _arch_list(facts.get("supported"))
    if build:
        out["supported_list"] = " ".join(f"sm_{b}" for b in build)
    n = cc_number(out.get("cc"))
    if n is not None and not (facts.get("extension") and 75 <= n < 100):
        # With an extension named and a GPU every wheel covers, torch is not the culprit.
        out["build_hint"] = build_hint(n)
        if build and not covers(build, n):
            out["missing_arch"] = f"sm_{n}"
    if n in (53, 62, 72, 87):
        # Jetson: the official aarch64 wheels warn for Orin (sm_87) although sm_80 code runs.
        out["tegra_gpu"] = out.get("gpu_desc", f"sm_{n}")
    tv = str(facts.get("torch_version") or "")
    m = re.search(r"\+cu(\d{3})", tv)
    if m:
        out["torch_cuda"] = f"{int(m.group(1)) // 10}.{int(m.group(1)) % 10}"
    elif re.search(r"\+cpu\b", tv):
        out["cpu_build"] = tv
    for key in ("needed_cuda_int", "built_cuda_int"):
        v = decode_cuda_version(facts.get(key))
        if v:
            out[key.replace("_int", "")] = v
    return out


# The toolkit that first knows a `compute_XY` target, and the one that dropped it (§4.1).
_ARCH_FIRST_CUDA = {
    75: "10.0", 80: "11.0", 86: "11.1", 87: "11.4", 89: "11.8", 90: "11.8",
    100: "12.8", 101: "12.8", 120: "12.8", 103: "12.9", 121: "12.9", 110: "13.0",
}
_ARCH_DROPPED_IN = {30: "11.0", 32: "11.0", 35: "12.0", 37: "12.0",
                    50: "13.0", 52: "13.0", 53: "13.0", 60: "13.0", 61: "13.0", 62: "13.0", 70: "13.0", 72: "13.0"}


@deriver("nvcc_arch")
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
    if n in _ARCH_DROPPED_IN:
        out["dropped_in"] = _ARCH_DROPPED_IN[n]
    return out


# -- driver versions (compat-facts §3) ------------------------------------------------

def decode_cuda_version(value: Any) -> str | None:
    """cudaDriverGetVersion's integer: 11040 -> '11.4', 12020 -> '12.2', 9000 -> '9.0'."""
    try:
        v = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    if v <= 0:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


# Minimum driver per CUDA toolkit, GA release (§3.1 Table 3): (linux, windows).
_TOOLKIT_DRIVER: dict[str, tuple[str, str]] = {
    "13.2": ("595.45.04", "N/A"), "13.1": ("590.44.01", "N/A"), "13.0": ("580.65.06", "N/A"),
    "12.9": ("575.51.03", "576.02"), "12.8": ("570.26", "570.65"), "12.6": ("560.28.03", "560.76"),
    "12.5": ("555.42.02", "555.85"), "12.4": ("550.54.14", "551.61"), "12.3": ("545.23.06", "545.84"),
    "12.2": ("535.54.03", "536.25"), "12.1": ("530.30.02", "531.14"), "12.0": ("525.60.13", "527.41"),
    "11.8": ("520.61.05", "520.06"), "11.7": ("515.43.04", "516.01"), "11.6": ("510.39.01", "511.23"),
    "11.5": ("495.29.05", "496.04"), "11.4": ("470.42.01", "471.11"), "11.3": ("465.19.01", "465.89"),
    "11.2": ("460.27.03", "460.82"), "11.1": ("455.23", "456.38"), "11.0": ("450.51.05", "451.48"),
    "10.2": ("440.33", "441.22"), "10.1": ("418.39", "418.96"), "10.0": ("410.48", "411.31"),
}
# Minor-version compatibility floors (§3.2): what a pip wheel of that CUDA major needs.
_MAJOR_FLOOR: dict[int, tuple[str, str]] = {
    11: ("450.80.02", "452.39"), 12: ("525.60.13", "528.33"), 13: ("580.65.06", "N/A"),
}
# Driver branch -> highest CUDA it supports (§3.3).
_BRANCH_CUDA: list[tuple[int, str]] = [
    (595, "13.2"), (590, "13.1"), (580, "13.0"), (575, "12.9"), (570, "12.8"), (560, "12.6"),
    (555, "12.5"), (550, "12.4"), (545, "12.3"), (535, "12.2"), (530, "12.1"), (525, "12.0"),
    (520, "11.8"), (515, "11.7"), (510, "11.6"), (495, "11.5"), (470, "11.4"), (465, "11.3"),
    (460, "11.2"), (455, "11.1"), (450, "11.0"), (440, "10.2"), (418, "10.1"), (410, "10.0"),
]
# A build whose runtime the driver can run, by the CUDA major the driver supports.
_BUILD_FOR_MAJOR = {
    10: "a CUDA 10.2 build (torch <= 1.12, `--index-url https://download.pytorch.org/whl/cu102`)",
    11: "a cu118 build (torch <= 2.7: `pip install torch==2.7.1 --index-url https://download.pytorch.org/whl/cu118`)",
    12: "a cu126 build (`pip install torch --index-url https://download.pytorch.org/whl/cu126`)",
}


def driver_max_cuda(driver: Any) -> str | None:
    """'470.86' -> '11.4' (the highest CUDA that driver branch supports)."""
    m = re.match(r"\s*(\d{3})\.", str(driver or ""))
    if not m:
        return None
    branch = int(m.group(1))
    for b, cuda in _BRANCH_CUDA:
        if branch >= b:
            return cuda
    return None


def _major(cuda: str | None) -> int | None:
    try:
        return int(str(cuda).split(".")[0])
    except (TypeError, ValueError):
        return None


def _runtime_cuda(facts: dict[str, Any]) -> str | None:
    """The CUDA the build needs: 'cu121' / '+cu121' / '12.1' in the facts."""
    for key in ("runtime_cuda", "torch_version", "torch_cuda"):
        v = facts.get(key)
        if not v:
            continue
        m = re.search(r"cu(\d{2})(\d)\b", str(v))
        if m:
            return f"{int(m.group(1))}.{m.group(2)}"
        m = re.search(r"\b(\d{1,2})\.(\d)\b", str(v))
        if m and key != "torch_version":
            return f"{int(m.group(1))}.{m.group(2)}"
    return None


@deriver("driver")
def driver(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    driver_cuda = decode_cuda_version(facts.get("found_version"))
    if driver_cuda is None and facts.get("driver_cuda"):
        driver_cuda = str(facts["driver_cuda"])
    if driver_cuda is None and facts.get("driver"):
        driver_cuda = driver_max_cuda(facts["driver"])
    if driver_cuda:
        out["driver_cuda"] = driver_cuda
    need = _runtime_cuda(facts)
    if need:
        out["needed_cuda"] = need
        major = _major(need)
        floor = _MAJOR_FLOOR.get(major or -1)
        exact = _TOOLKIT_DRIVER.get(need)
        if floor:
            out["min_driver_linux"], out["min_driver_windows"] = floor
        elif exact:
            out["min_driver_linux"], out["min_driver_windows"] = exact
        if exact:
            out["toolkit_driver"] = exact[0]
    dmajor = _major(driver_cuda)
    if dmajor in _BUILD_FOR_MAJOR and (need is None or (_major(need) or 0) > dmajor):
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


@deriver("cuda_init")
def cuda_init(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    code = str(facts.get("code") or "").strip()
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


# -- dtype spellings -------------------------------------------------------------------

_DTYPES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"complexhalf|complex32", re.I), "complex32"),
    (re.compile(r"float8_?e4m3fnuz", re.I), "float8_e4m3fnuz"),
    (re.compile(r"float8_?e4m3fn|fp8e4nv|e4m3", re.I), "float8_e4m3fn"),
    (re.compile(r"float8_?e5m2fnuz", re.I), "float8_e5m2fnuz"),
    (re.compile(r"float8_?e5m2|fp8e5\b|e5m2", re.I), "float8_e5m2"),
    (re.compile(r"bfloat16|\bbf16\b|BFloat16Tensor", re.I), "bfloat16"),
    (re.compile(r"\bhalf\b|halftensor|float16|\bfp16\b|c10::half", re.I), "float16"),
    (re.compile(r"\bdouble\b|doubletensor|float64", re.I), "float64"),
    (re.compile(r"\bfloat\b|floattensor|float32|\bfp32\b", re.I), "float32"),
]


def dtype_name(text: Any) -> str | None:
    """One name for a dtype however a message spells it: 'Half', 'c10::Half',
    'struct c10::Half' (Windows), 'torch.cuda.HalfTensor', 'torch.float16' -> 'float16'."""
    if text is None:
        return None
    s = str(text)
    for rx, name in _DTYPES:
        if rx.search(s):
            return name
    return None


# Kernels whose name does not say the device but that exist only in the CPU backend.
_CPU_KERNELS = re.compile(
    r"_cpu\b|_cpu_|cpu_|LayerNormKernelImpl|baddbmm_with_gemm|softmax_lastdim_kernel_impl|"
    r"_vml_|GroupNormKernelImpl|batch_norm_cpu|im2col|unfolded2d|host_softmax", re.I)
_CUDA_KERNELS = re.compile(r"_cuda\b|cuda_|_cuda_|cudnn|cublas", re.I)
_MPS_KERNELS = re.compile(r"_mps\b|mps_", re.I)


_DEVICE_LABEL = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xla": "XLA", "xpu": "XPU", "hpu": "HPU", "npu": "NPU"}


def device_flags(device: str | None) -> dict[str, Any]:
    """'cpu' -> {'device': 'cpu', 'on_cpu': 'CPU'}: the `on_*` fact lets a template
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
        out[f"on_{d}"] = _DEVICE_LABEL[d]
    return out


@deriver("device")
def device_kind(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out = device_flags(facts.get("device_raw") or facts.get("device") or facts.get("ac_device"))
    tv = str(facts.get("torch_version") or "")
    if re.search(r"\+cpu\b", tv):
        out["cpu_build"] = tv
    return out


@deriver("half_op")
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
    return out
