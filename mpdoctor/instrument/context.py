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


def device_memory(owners: Any = None) -> dict[str, Any]:
    """The GPU allocator at the moment of an error, in the child: `torch.cuda.memory_stats`,
    `memory_summary`, `mem_get_info` and, where the snapshot API answers, the live blocks,
    each attributed to the module whose tensor it holds (`owners`: a callable returning
    (label, data_ptr, nbytes) of the tensors the watcher knows). {} without CUDA."""
    import torch

    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        raw = read_cuda_allocator(torch)
    except Exception as exc:  # the context is a bonus; a broken CUDA state must not hide the OOM
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    try:
        listed = owners() if callable(owners) else owners
    except Exception:
        listed = None
    return summarise_device_memory(raw, listed)


def read_cuda_allocator(torch: Any) -> dict[str, Any]:
    """The allocator's own figures, raw (what fixtures/events/cuda-oom-allocator.json holds)."""
    dev = torch.cuda.current_device()
    raw: dict[str, Any] = {"device": f"cuda:{dev}", "memory_stats": dict(torch.cuda.memory_stats(dev))}
    for key, get in (("mem_get_info", lambda: list(torch.cuda.mem_get_info(dev))),
                     ("memory_summary", lambda: torch.cuda.memory_summary(dev, abbreviated=True)[:4000]),
                     ("segments", lambda: _segments(torch, dev))):
        try:
            raw[key] = get()
        except Exception as exc:
            raw.setdefault("errors", []).append(f"{key}: {type(exc).__name__}: {exc}"[:200])
    return raw


def _segments(torch: Any, dev: int) -> list[dict[str, Any]]:
    """The allocator's segments on `dev`, each block reduced to address, size and state."""
    try:
        segs = torch.cuda.memory._snapshot(dev)["segments"]
    except Exception:
        segs = torch.cuda.memory_snapshot()
    out = []
    for seg in segs:
        if seg.get("device", dev) != dev:
            continue
        out.append({"address": seg.get("address"), "total_size": seg.get("total_size"),
                    "blocks": [{"address": b.get("address"), "size": b.get("size"), "state": b.get("state")}
                               for b in seg.get("blocks", [])]})
    return out


def summarise_device_memory(raw: dict[str, Any], owners: list[tuple[str, int, int]] | None = None,
                            top: int = 5) -> dict[str, Any]:
    """The allocator's figures in the words the run's findings use: allocated, reserved
    (and how much of it is cached but unused), peak, free of total, retries and OOMs,
    and the largest live allocations, by module where a watched tensor holds them."""
    stats = raw.get("memory_stats") or {}
    out: dict[str, Any] = {"device": raw.get("device")}
    for key, stat in (("allocated_bytes", "allocated_bytes.all.current"),
                      ("reserved_bytes", "reserved_bytes.all.current"),
                      ("peak_allocated_bytes", "allocated_bytes.all.peak"),
                      ("active_bytes", "active_bytes.all.current"),
                      ("inactive_split_bytes", "inactive_split_bytes.all.current")):
        if isinstance(stats.get(stat), int):
            out[key] = stats[stat]
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc"):
        if isinstance(stats.get(key), int):
            out[key] = stats[key]
    info = raw.get("mem_get_info")
    if isinstance(info, (list, tuple)) and len(info) == 2:
        out["free_bytes"], out["total_bytes"] = int(info[0]), int(info[1])
    if "reserved_bytes" in out and "allocated_bytes" in out:
        out["reserved_unused_bytes"] = max(0, out["reserved_bytes"] - out["allocated_bytes"])
    for key in [k for k in out if k.endswith("_bytes")]:
        out[key.replace("_bytes", "")] = gib(out[key])
    blocks = sorted(((b.get("address"), b.get("size")) for seg in raw.get("segments") or []
                     for b in seg.get("blocks", []) if b.get("state") == "active_allocated"
                     and isinstance(b.get("size"), int)), key=lambda b: -b[1])
    by_module = attribute_blocks(blocks, owners or [])
    if by_module:
        out["largest_by_module"] = by_module[:top]
    out["largest_allocations"] = [
        gib(size) + (f" ({label})" if label else "")
        for size, label in _largest(blocks, owners or [], top)]
    if raw.get("memory_summary"):
        out["summary"] = raw["memory_summary"]
    if raw.get("errors"):
        out["errors"] = raw["errors"]
    return out


def _owner_index(owners: list[tuple[str, int, int]]) -> tuple[list[int], list[tuple[str, int, int]]]:
    ordered = sorted((o for o in owners if o[2] > 0), key=lambda o: o[1])
    return [o[1] for o in ordered], ordered


def _owner_of(addr: Any, size: int, starts: list[int], ordered: list) -> str | None:
    """The first watched tensor whose storage starts inside the block [addr, addr+size)."""
    import bisect

    if not isinstance(addr, int):
        return None
    i = bisect.bisect_left(starts, addr)
    if i < len(starts) and starts[i] < addr + size:
        return ordered[i][0]
    return None


def _largest(blocks: list[tuple[Any, int]], owners: list[tuple[str, int, int]], top: int
             ) -> list[tuple[int, str | None]]:
    starts, ordered = _owner_index(owners)
    return [(size, _owner_of(addr, size, starts, ordered)) for addr, size in blocks[:top]]


def attribute_blocks(blocks: list[tuple[Any, int]], owners: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    """Live memory by owner ("output of blocks.3.mlp", "parameters of head", ...): the
    allocator's live blocks where the snapshot API gave them, else the watched tensors'
    own sizes. Largest first."""
    totals: dict[str, int] = {}
    if blocks:
        starts, ordered = _owner_index(owners)
        for addr, size in blocks:
            label = _owner_of(addr, size, starts, ordered)
            if label:
                totals[label] = totals.get(label, 0) + size
    else:
        seen: set[int] = set()
        for label, ptr, nbytes in owners:
            if ptr in seen or nbytes <= 0:
                continue
            seen.add(ptr)
            totals[label] = totals.get(label, 0) + nbytes
    return [{"owner": k, "bytes": v, "size": gib(v)} for k, v in sorted(totals.items(), key=lambda kv: -kv[1])]
