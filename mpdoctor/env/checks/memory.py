"""Memory and GPU health: host memory, GPU memory other processes hold, uncorrected
ECC errors."""

from __future__ import annotations

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge.units import GIB, gib
from ..view import EnvView
from ._common import no_nvml


@check(facts=("basis", "free", "gpu", "held", "share", "total", "who"))
def gpu_memory_held(v: EnvView) -> Result:
    if (s := no_nvml(v)):
        return s
    hits = []
    for i, g in enumerate(v.nvml_gpus):
        mem = g.get("memory") or {}
        total = mem.get("total_bytes")
        if not total:
            continue
        others = [p for p in g.get("processes", []) if not p.get("mpdoctor") and p.get("used_memory_bytes")]
        held = sum(p["used_memory_bytes"] for p in others)
        basis = "processes"
        if not others and (mem.get("used_bytes") or 0) > 0.5 * total:
            held, basis = mem["used_bytes"], "used"  # a container cannot see the other processes
        if held < 0.25 * total:
            continue
        top = sorted(others, key=lambda p: -p["used_memory_bytes"])[:3]
        who = ", ".join(f"pid {p['pid']}" + (f" ({p['name']})" if p.get("name") else "") + f" {gib(p['used_memory_bytes'])}"
                        for p in top) or None
        hits.append(Hit({"gpu": f"GPU {g.get('index', i)} {g.get('name')}", "held": gib(held), "total": gib(total),
                         "free": gib(mem.get("free_bytes")), "share": f"{held / total:.0%}", "who": who,
                         "basis": basis},
                        [(f"nvml.gpus[{i}].memory.used_bytes", gib(mem.get("used_bytes"))),
                         (f"nvml.gpus[{i}].processes", who or "not visible from here")]))
    return hits


@check(facts=("available", "share", "total"))
def host_memory_low(v: EnvView) -> Result:
    mem = v.snap["memory"]
    total, avail = mem.get("total_bytes"), mem.get("available_bytes")
    if not total or avail is None:
        return Skip("host memory is not in the snapshot")
    if avail >= 0.10 * total and avail >= 2 * GIB:
        return []
    return [Hit({"available": gib(avail), "total": gib(total), "share": f"{avail / total:.0%}"},
                [("memory.available_bytes", gib(avail))])]


@check(facts=("errors", "gpu"))
def gpu_ecc_errors(v: EnvView) -> Result:
    if (s := no_nvml(v)):
        return s
    return [Hit({"gpu": f"GPU {g.get('index', i)} {g.get('name')}", "errors": g["ecc_uncorrected_volatile"]},
                [(f"nvml.gpus[{i}].ecc_uncorrected_volatile", g["ecc_uncorrected_volatile"])])
            for i, g in enumerate(v.nvml_gpus) if (g.get("ecc_uncorrected_volatile") or 0) > 0]
