"""What several environment checks share: the facts that describe a GPU, and the
reasons, worded once, why a check cannot judge this snapshot (no driver answered, no
usable torch)."""

from __future__ import annotations

from typing import Any

from ...engine.judge import Skip
from ...knowledge.units import gib
from ..view import EnvView, Gpu


def gpu_facts(g: Gpu) -> dict[str, Any]:
    return {"gpu": g.label, "gpu_name": g.name, "gpu_index": g.index, "sm": g.sm, "capability": g.cc_text,
            "arch": g.arch, "memory": gib(g.total_memory_bytes)}


def no_nvml(v: EnvView) -> Skip | None:
    """One reason, worded once, for every check that needs the NVIDIA driver."""
    if v.nvml_ok:
        return None
    err = (v.nvml.get("error") or {}).get("message") or v.nvml.get("status")
    return Skip(f"no NVIDIA driver answered ({err})")


def torch_missing(v: EnvView) -> str | None:
    """Why torch was not examined at all (a core install, an old snapshot), or None."""
    status = v.torch.get("status")
    if status == "not-installed":
        where = v.torch.get("python")
        return "torch is not installed" + (f" in {where}" if where else "") + \
            " (install it there, or point --python at the interpreter that trains)"
    if status in ("unknown", None):
        return "the snapshot has no torch section"
    return None


def need_torch(v: EnvView) -> Skip | None:
    status = v.torch.get("status")
    if status == "ok":
        return None
    missing = torch_missing(v)
    if missing:
        return Skip(missing)
    return Skip(f"torch could not be examined ({status})")
