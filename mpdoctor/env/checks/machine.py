"""The machine's facts that settle a log finding (`explain --here` / `--snapshot`).

These checks judge refinement rules (`refines = [categories]` in rules/env/machine-*.toml):
a log says what failed, the snapshot says on what. They never speak in `check` on their
own. The view carries the precision the log finding is about (`v.hint`: "bf16", "fp16",
"fp8" or None), set by diagnosis.sharpen.
"""

from __future__ import annotations

from typing import Any

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge.units import gib
from ..view import EnvView


def _lowest_gpu(v: EnvView) -> Any:
    gpus = [g for g in v.gpus if g.vendor == "nvidia" and g.cc]
    return min(gpus, key=lambda g: g.cc) if gpus else None


def _gpu_facts(g: Any) -> dict[str, Any]:
    return {"gpu_name": g.name, "sm": g.sm, "arch": g.arch, "machine_gpu": g.label}


def _cc(g: Any) -> list[tuple[str, Any]]:
    return [(g.cc_path, g.cc_text)]


@check(facts=("torch_version", "build_kind"))
def machine_has_no_gpu(v: EnvView) -> Result:
    if v.gpus:
        return []
    build = v.cuda_build or v.hip_build
    return [Hit({"torch_version": v.torch_version if v.torch_ok else None,
                 "build_kind": "cpu_only" if v.torch_ok and not build else None},
                [("torch.version", v.torch_version)])]


@check(facts=("gpu_name", "sm", "arch", "machine_gpu"))
def machine_gpu_without_bf16(v: EnvView) -> Result:
    if getattr(v, "hint", None) != "bf16":
        return Skip("the log finding is not about bf16")
    g = _lowest_gpu(v)
    if g is None:
        return Skip("no NVIDIA GPU with a known compute capability")
    if v.rocm or g.cc >= (8, 0):
        return []
    return [Hit(_gpu_facts(g), _cc(g))]


@check(facts=("gpu_name", "sm", "arch", "machine_gpu"))
def machine_gpu_with_bf16(v: EnvView) -> Result:
    if getattr(v, "hint", None) != "bf16":
        return Skip("the log finding is not about bf16")
    g = _lowest_gpu(v)
    if g is None:
        return Skip("no NVIDIA GPU with a known compute capability")
    if v.rocm or g.cc < (8, 0):
        return []
    return [Hit(_gpu_facts(g), _cc(g))]


@check(facts=("gpu_name", "sm", "arch", "machine_gpu"))
def machine_gpu_before_ampere(v: EnvView) -> Result:
    g = _lowest_gpu(v)
    if g is None:
        return Skip("no NVIDIA GPU with a known compute capability")
    return [Hit(_gpu_facts(g), _cc(g))] if g.cc < (8, 0) else []


def _fp32_oom(v: EnvView) -> Any:
    """The GPU of an OOM in a run that asked for no mixed precision (None: not that case)."""
    if getattr(v, "hint", None) is not None:
        return None
    requested = v.plan.requested if v.plan else None
    if requested not in (None, "no"):
        return None
    return _lowest_gpu(v)


def _memory(g: Any) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    mem = gib(g.total_memory_bytes)
    return ({**_gpu_facts(g), "machine_gpu_memory": mem},
            _cc(g) + [(g.cc_path.replace("capability", "total_memory_bytes"), mem)])


@check(facts=("gpu_name", "sm", "arch", "machine_gpu", "machine_gpu_memory"))
def machine_fp32_oom_on_bf16_gpu(v: EnvView) -> Result:
    g = _fp32_oom(v)
    if g is None:
        return Skip("the run asked for mixed precision, or no NVIDIA GPU is known")
    if g.cc < (8, 0):
        return []
    facts, ev = _memory(g)
    return [Hit(facts, ev)]


@check(facts=("gpu_name", "sm", "arch", "machine_gpu", "machine_gpu_memory"))
def machine_fp32_oom_on_fp16_gpu(v: EnvView) -> Result:
    g = _fp32_oom(v)
    if g is None:
        return Skip("the run asked for mixed precision, or no NVIDIA GPU is known")
    if not (7, 0) <= g.cc < (8, 0):
        return []
    facts, ev = _memory(g)
    return [Hit(facts, ev)]


@check(facts=("gpu_name", "sm", "arch", "machine_gpu", "torch_version", "arch_list"))
def machine_gpu_not_in_build(v: EnvView) -> Result:
    g = _lowest_gpu(v)
    if g is None:
        return Skip("no NVIDIA GPU with a known compute capability")
    archs = " ".join(v.torch.get("arch_list") or [])
    if not archs:
        return Skip("the snapshot has no torch arch list")
    return [Hit({**_gpu_facts(g), "torch_version": v.torch_version, "arch_list": archs},
                [("torch.arch_list", archs)] + _cc(g))]


@check(facts=("driver_version", "cuda_build"))
def machine_driver_and_build(v: EnvView) -> Result:
    if not v.nvml_ok:
        return Skip("no NVIDIA driver answered")
    drv = v.nvml.get("driver_version")
    if not drv:
        return []
    return [Hit({"driver_version": drv, "cuda_build": v.cuda_build or "?"}, [("nvml.driver_version", drv)])]
