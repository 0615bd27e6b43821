"""Out-of-memory arithmetic from the figures in PyTorch's OOM message."""

from __future__ import annotations

from typing import Any

from ...knowledge.units import GIB, gib, parse_size
from . import deriver
from .fit import FIT_FACTS, OOM_SITE_FACTS, fit, oom_site


@deriver("oom", facts=("_alloc_conf_var", "_smi", "allocated_bytes", "fragmented", "free_bytes", "occurrences", "other_processes", "other_processes_bytes", "other_share", "process_in_use_bytes", "requested_bytes", "requested_share", "reserved", "reserved_bytes", "reserved_unallocated", "reserved_unallocated_bytes", "total_bytes") + FIT_FACTS + OOM_SITE_FACTS)
def oom(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sizes = {}
    for key in ("requested", "total", "free", "allocated", "reserved", "reserved_unallocated", "process_in_use"):
        n = parse_size(facts.get(key))
        if n is not None:
            sizes[key] = n
            out[f"{key}_bytes"] = n
    # Older messages give "X reserved in total by PyTorch"; newer ones give
    # "Y is reserved by PyTorch but unallocated". Each can be derived from the other.
    if "reserved" in sizes and "allocated" in sizes and "reserved_unallocated" not in sizes:
        sizes["reserved_unallocated"] = max(0, sizes["reserved"] - sizes["allocated"])
        out["reserved_unallocated"] = gib(sizes["reserved_unallocated"])
    if "reserved_unallocated" in sizes and "allocated" in sizes and "reserved" not in sizes:
        sizes["reserved"] = sizes["allocated"] + sizes["reserved_unallocated"]
        out["reserved"] = gib(sizes["reserved"])
    if {"total", "free"} <= sizes.keys() and ("process_in_use" in sizes or "reserved" in sizes):
        # "this process has X memory in use" includes the CUDA context; prefer it.
        held_here = sizes.get("process_in_use", sizes.get("reserved", 0))
        other = sizes["total"] - sizes["free"] - held_here
        # The CUDA context (0.3-1 GiB) is in the difference when only PyTorch's own
        # figure is known; "this process has X in use" already includes it.
        floor = GIB // 2 if "process_in_use" in sizes else 3 * GIB // 2
        if other > floor:
            out["other_processes"] = gib(other)
            out["other_processes_bytes"] = other
            out["other_share"] = f"{100 * other / sizes['total']:.0f}%"
    if {"reserved_unallocated", "reserved"} <= sizes.keys() and sizes["reserved"] > 0:
        frag = sizes["reserved_unallocated"]
        if frag >= max(GIB // 2, sizes.get("requested", 0) // 2) and frag / sizes["reserved"] > 0.1:
            out["fragmented"] = gib(frag)
    if "requested" in sizes and "total" in sizes and sizes["total"] > 0:
        out["requested_share"] = f"{100 * sizes['requested'] / sizes['total']:.0f}%"
    if len(hits) > 1:
        out["occurrences"] = len(hits)
    # ROCm says HIP where CUDA says CUDA: the allocator variable and the tool differ
    hip = bool(facts.get("_hip") or any(h.get("_hip") for h in hits))
    out["_alloc_conf_var"] = "PYTORCH_HIP_ALLOC_CONF" if hip else "PYTORCH_CUDA_ALLOC_CONF"
    out["_smi"] = "rocm-smi" if hip else "nvidia-smi"
    out.update(oom_site(facts))
    out.update(fit(facts))
    return out
