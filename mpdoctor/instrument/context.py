"""Details gathered only when something went wrong: memory at the moment of an OOM,
the dtypes/devices around a failing forward. Slow paths; never on the hot path."""

from __future__ import annotations

import re
from typing import Any

_OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)
_HOST_OOM = re.compile(r"can't allocate memory|Cannot allocate memory|std::bad_alloc|MemoryError")
_DTYPE = re.compile(r"dtype|scalar type|HalfTensor|BFloat16Tensor|FloatTensor and weight type \(torch\.\w*HalfTensor"
                    r"|Half|BFloat16", re.I)
_DEVICE = re.compile(r"same device|device type|cuda:\d and cpu|on the same device|Input type \(torch\.FloatTensor\) "
                     r"and weight type \(torch\.cuda", re.I)


def classify_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or _HOST_OOM.search(text):
        return "host-oom"
    if _OOM.search(text):
        return "oom"
    if _DEVICE.search(text):
        return "device"
    if "not implemented for" in text and _DTYPE.search(text):
        return "half-op"
    if _DTYPE.search(text):
        return "dtype"
    return "other"


def describe_tensor(t: Any) -> dict[str, Any]:
    return {"dtype": str(t.dtype).replace("torch.", ""), "device": str(t.device), "shape": list(t.shape)}


def tensors_in(obj: Any, limit: int = 8) -> list[Any]:
    import torch

    out: list[Any] = []

    def visit(x: Any, depth: int) -> None:
        if len(out) >= limit or depth > 3:
            return
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y, depth + 1)
        elif isinstance(x, dict):
            for y in x.values():
                visit(y, depth + 1)

    visit(obj, 0)
    return out


def param_summary(module: Any) -> dict[str, int]:
    """'dtype@device' -> number of parameter tensors: the module's own, else its subtree's."""
    params = list(module.parameters(recurse=False)) or list(module.parameters())
    out: dict[str, int] = {}
    for p in params:
        key = f"{str(p.dtype).replace('torch.', '')}@{p.device}"
        out[key] = out.get(key, 0) + 1
    return out


def autocast_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {}
    for dev in ("cpu", "cuda", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(dev):
                state[dev] = str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:  # a device type this build does not know
            continue
    return state


def host_memory() -> dict[str, Any]:
    """The process's and the machine's memory, from /proc (psutil may be absent)."""
    out: dict[str, Any] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, val = line.partition(":")
                if key in ("VmRSS", "VmHWM", "VmSize", "VmPeak"):
                    out[key.lower() + "_bytes"] = int(val.split()[0]) * 1024
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, val = line.partition(":")
                if key in ("MemTotal", "MemAvailable", "CommitLimit", "Committed_AS"):
                    out[key.lower() + "_bytes"] = int(val.split()[0]) * 1024
    except OSError:
        import resource

        out["maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for key in list(out):
        out[key.replace("_bytes", "")] = _human(out[key])
    return out


def device_memory() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return out
        dev = torch.cuda.current_device()
        out["device"] = f"cuda:{dev}"
        out["allocated_bytes"] = torch.cuda.memory_allocated(dev)
        out["reserved_bytes"] = torch.cuda.memory_reserved(dev)
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        free, total = torch.cuda.mem_get_info(dev)
        out["free_bytes"], out["total_bytes"] = free, total
        for key in [k for k in out if k.endswith("_bytes")]:
            out[key.replace("_bytes", "")] = _human(out[key])
        sizes = sorted((b["size"] for seg in torch.cuda.memory_snapshot() for b in seg.get("blocks", [])
                        if b.get("state") == "active_allocated"), reverse=True)[:5]
        out["largest_allocations"] = [_human(s) for s in sizes]
    except Exception as exc:  # the context is a bonus; a broken CUDA state must not hide the OOM
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def requested_bytes(text: str) -> int | None:
    m = re.search(r"you tried to allocate (\d+) bytes", text)
    if m:
        return int(m.group(1))
    m = re.search(r"Tried to allocate ([\d.]+) ([KMGT]i?B)", text)
    if m:
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)[0]]
        return int(float(m.group(1)) * scale)
    return None


def _human(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
