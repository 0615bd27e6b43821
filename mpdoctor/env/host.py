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
        "mac_version": platform.mac_ver()[0] or None,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "in_container": os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
    }


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
