"""Details gathered only when something went wrong: the dtypes and devices around a
failing forward, the autocast state, host and device memory at that moment. Slow paths;
never on the hot path. Nothing here judges what went wrong: the raw exception and this
context go to the parent, where the rule base explains them."""

from __future__ import annotations

from typing import Any

from ..knowledge.dtypes import dtype_name
from ..knowledge.units import gib

def describe_tensor(t: Any) -> dict[str, Any]:
    return {"dtype": dtype_name(t.dtype), "device": str(t.device), "shape": list(t.shape)}


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
        key = f"{dtype_name(p.dtype)}@{p.device}"
        out[key] = out.get(key, 0) + 1
    return out


def autocast_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {}
    for dev in ("cpu", "cuda", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(dev):
                state[dev] = dtype_name(torch.get_autocast_dtype(dev))
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
        out[key.replace("_bytes", "")] = gib(out[key])
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
            out[key.replace("_bytes", "")] = gib(out[key])
        sizes = sorted((b["size"] for seg in torch.cuda.memory_snapshot() for b in seg.get("blocks", [])
                        if b.get("state") == "active_allocated"), reverse=True)[:5]
        out["largest_allocations"] = [gib(s) for s in sizes]
    except Exception as exc:  # the context is a bonus; a broken CUDA state must not hide the OOM
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out
