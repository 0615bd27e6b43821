"""The host: platform, Python, CPU model and precision flags, host memory."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

# CPU flags that decide CPU precision: native bf16 dot products (avx512_bf16, AMX),
# native fp16 arithmetic (avx512_fp16, AMX-FP16), conversion only (f16c). On ARM the
# /proc/cpuinfo "Features" line names bf16 / fphp / asimdhp.
X86_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_fp16", "f16c", "fma")
ARM_FLAGS = ("bf16", "fphp", "asimdhp", "sve", "sve2", "i8mm")


def collect_platform() -> dict[str, Any]:
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "libc": " ".join(platform.libc_ver()).strip() or None,
        "os": _os_name(),
        "mac_version": platform.mac_ver()[0] or None,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "in_container": os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
    }


def _os_name() -> str | None:
    """The distribution as /etc/os-release names it ("Ubuntu 22.04.4 LTS"), what
    `torch.utils.collect_env` reports as OS; the macOS or Windows version elsewhere."""
    try:
        with open("/etc/os-release", encoding="utf-8", errors="replace") as fh:
            fields = dict(line.rstrip("\n").split("=", 1) for line in fh if "=" in line)
        name = fields.get("PRETTY_NAME") or fields.get("NAME")
        if name:
            return name.strip().strip('"')[:200]
    except OSError:
        pass
    if platform.system() == "Darwin" and platform.mac_ver()[0]:
        return f"macOS {platform.mac_ver()[0]}"
    return f"{platform.system()} {platform.release()}".strip() or None


# What the thread count of a CPU training depends on (collect_env and `accelerate env`
# print these): the OpenMP/MKL variables as they are set where mpdoctor runs.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def collect_threads() -> dict[str, Any]:
    out: dict[str, Any] = {"env": {k: os.environ[k] for k in THREAD_VARS if k in os.environ}}
    try:
        out["affinity_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    return out


def collect_cuda_toolkit() -> dict[str, Any]:
    """The system CUDA toolkit, if there is one (what `collect_env` reports as "CUDA
    used to build"/nvcc): CUDA_HOME or CUDA_PATH, else /usr/local/cuda, and `nvcc
    --version` from there or from PATH (a child with a short timeout). Unrelated to
    the CUDA that torch's wheel carries; extensions built from source use this one."""
    import shutil
    import subprocess

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    source = "CUDA_HOME" if os.environ.get("CUDA_HOME") else ("CUDA_PATH" if home else None)
    if not home and os.path.isdir("/usr/local/cuda"):
        home, source = "/usr/local/cuda", "default location"
    out: dict[str, Any] = {"cuda_home": home, "cuda_home_from": source}
    nvcc = None
    if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        nvcc = os.path.join(home, "bin", "nvcc")
    nvcc = nvcc or shutil.which("nvcc")
    out["nvcc"] = nvcc
    if nvcc:
        try:
            text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=10,
                                  start_new_session=True).stdout
            release = [line.strip() for line in text.splitlines() if "release" in line]
            out["nvcc_version"] = release[-1][:200] if release else None
        except (OSError, subprocess.SubprocessError) as exc:
            out["error"] = {"type": type(exc).__name__, "message": str(exc)[:400]}
    return out


def _cpuinfo() -> tuple[str | None, set[str]]:
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and model is None:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


def collect_cpu() -> dict[str, Any]:
    model, flags = _cpuinfo()
    if model is None and platform.system() == "Darwin":
        import subprocess

        try:
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                   text=True, timeout=2).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            model = None
    model = model or platform.processor() or None
    wanted = ARM_FLAGS if platform.machine().lower() in ("aarch64", "arm64") else X86_FLAGS
    out: dict[str, Any] = {"model": model, "logical_cores": os.cpu_count()}
    if flags:
        out["flags"] = {f: f in flags for f in wanted}
    return out


def collect_memory() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    out = {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}
    try:
        sw = psutil.swap_memory()
        out["swap_total_bytes"] = int(sw.total)
    except Exception:
        pass
    return out


def environment_light() -> dict[str, str]:
    """The environment block of a markdown report, without importing torch (for `run`: the training has ended):
    distribution versions from their metadata, GPU and driver from nvidia-smi in a child
    with a short timeout (never NVML in this process)."""
    import platform
    import shutil
    import subprocess
    from importlib import metadata

    from .. import __version__
    from ..render import gpu_summary

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except Exception:
            return "not installed"

    env = {"mpdoctor": __version__, "Python": f"{platform.python_version()} ({platform.system()} {platform.machine()})",
           "torch": version("torch"), "accelerate": version("accelerate"), "GPU": "none found", "driver": "none found"}
    host = collect_platform()
    system = " · ".join(str(x) for x in (host.get("os"), host.get("libc")) if x)
    if system:
        env["OS"] = system
    env["numpy"] = version("numpy")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=5, start_new_session=True).stdout
            rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
            if rows:
                env["GPU"] = gpu_summary([r[0] for r in rows])
                env["driver"] = rows[0][-1]
        except (OSError, subprocess.SubprocessError):
            pass
    return env
