"""The torch build against the machine it runs on: the driver's floor for the CUDA
build, the GPU architectures compiled into it (kernel images, PTX only), a CPU-only
build on a machine with GPUs, and FlashAttention's architecture floor."""

from __future__ import annotations

import re
from typing import Any, Callable

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge import compat
from ...knowledge.versions import compare, cuda_int_to_str, satisfies
from ..view import EnvView, Gpu
from ._common import gpu_facts, need_torch, no_nvml, torch_missing


def _build_cuda(v: EnvView) -> tuple[str | None, str]:
    """The CUDA version torch is built with: from torch, else from the wheel's +cuXYZ tag."""
    if v.torch_ok and v.torch.get("cuda_build"):
        return v.torch["cuda_build"], "torch.cuda_build"
    tag = re.search(r"\+cu(\d{2,3})$", str(v.pkg("torch") or ""))
    if tag:
        return cuda_int_to_str(tag.group(1)), "packages.versions.torch"
    return None, ""


def _driver_skip(v: EnvView) -> Skip | None:
    if v.hip_build or "+rocm" in str(v.pkg("torch") or ""):
        return Skip(f"ROCm build (HIP {v.hip_build or '?'}): NVIDIA driver checks do not apply")
    if (s := no_nvml(v)):
        return s
    if not v.nvml.get("driver_version"):
        return Skip("the driver version is not in the snapshot")
    return None


@check(facts=("cuda_build", "driver", "driver_cuda", "floor", "gpu", "gpu_last_branch",
              "toolkit_min", "torch_version"))
def driver_too_old(v: EnvView) -> Result:
    if (s := _driver_skip(v)):
        return s
    cuda, path = _build_cuda(v)
    if not cuda:
        return Skip("torch has no CUDA build to compare with the driver")
    driver = v.nvml["driver_version"]
    floor = compat.family_floor(cuda, v.windows)
    need = compat.toolkit_min_driver(cuda, v.windows)
    limit = floor or need
    if limit is None or compare(driver, limit) >= 0:
        return []
    facts = {"driver": driver, "cuda_build": cuda, "floor": limit, "toolkit_min": need,
             "driver_cuda": compat.driver_max_cuda(driver, v.windows), "torch_version": v.torch_version,
             "gpu": v.gpus[0].label if v.gpus else None}
    old = [g for g in v.gpus if g.cc and compat.arch_support(g.cc)]
    if old:
        row = compat.arch_support(old[0].cc)
        facts["gpu_last_branch"] = f"{row['arch']} GPUs are supported up to driver branch {row['last_driver_branch']} and CUDA {row['last_cuda']}"
    warn = next((w for w in v.torch.get("warnings", []) if "driver" in w.lower() and "too old" in w.lower()), None)
    ev = [("nvml.driver_version", driver), (path, cuda)]
    if warn:
        ev.append(("torch.warnings", warn))
    return [Hit(facts, ev)]


def _driver_between(v: EnvView) -> tuple[str, str, str, str] | None:
    cuda, path = _build_cuda(v)
    if not cuda:
        return None
    driver = v.nvml["driver_version"]
    floor = compat.family_floor(cuda, v.windows)
    need = compat.toolkit_min_driver(cuda, v.windows)
    if not floor or not need or compare(driver, floor) < 0 or compare(driver, need) >= 0:
        return None
    return driver, cuda, need, path


def _arch_list(v: EnvView) -> list[str]:
    return list(v.torch.get("arch_list") or []) if v.torch_ok else []


@check(facts=("cuda_build", "driver", "driver_cuda", "toolkit_min"))
def driver_minor_compat(v: EnvView) -> Result:
    if (s := _driver_skip(v)):
        return s
    between = _driver_between(v)
    if not between:
        return []
    driver, cuda, need, path = between
    return [Hit({"driver": driver, "cuda_build": cuda, "toolkit_min": need,
                 "driver_cuda": compat.driver_max_cuda(driver, v.windows)},
                [("nvml.driver_version", driver), (path, cuda)])]


def _build_archs(v: EnvView) -> tuple[list[str], str]:
    archs = _arch_list(v)
    if archs:
        return archs, "torch.arch_list"
    version = v.torch_version or ""
    tag = re.search(r"\+(cu\d+)", version)
    if not tag:
        return [], ""
    for row in compat.table("torch_builds")["build"]:
        if row["variant"] == tag.group(1) and satisfies(version, row["torch"]):
            out = [f"sm_{a.replace('.', '')}" for a in row["archs"]]
            if row.get("ptx"):
                out.append(f"compute_{row['archs'][-1].replace('.', '')}")
            return out, "packages.versions.torch (published arch list of this build)"
    return [], ""


def _coverage_hits(v: EnvView, kind: str | None,
                   extra: Callable[[Gpu, str | None, list[str]], dict[str, Any]]) -> Result:
    """One hit per NVIDIA GPU that the build's architecture list covers as `kind`
    (compat.arch_coverage's: "sass", "ptx", or None for not at all), with the GPU's
    facts and those `extra(gpu, arch list entry, arch list)` adds."""
    if (missing := torch_missing(v)) and not v.pkg("torch"):
        return Skip(missing)
    if v.hip_build:
        return Skip("ROCm build: gfx targets are not compared here")
    if v.torch_ok and not v.torch.get("cuda_build"):
        return Skip("CPU-only torch: no GPU kernels at all (see cpu-only-torch-with-gpu)")
    archs, path = _build_archs(v)
    if not archs:
        return Skip("the build's architecture list is not known")
    hits = []
    for g in v.gpus:
        if g.vendor != "nvidia" or not g.cc:
            continue
        covered, entry = compat.arch_coverage(g.cc, archs)
        if covered == kind:
            facts = gpu_facts(g)
            facts.update(extra(g, entry, archs))
            hits.append(Hit(facts, [(g.cc_path, g.cc_text), (path, " ".join(archs))]))
    return hits


@check(facts=("arch", "arch_list", "builds", "capability", "gpu", "gpu_index", "gpu_name",
              "memory", "removed_in", "sm", "torch_version"))
def no_kernel_image(v: EnvView) -> Result:
    def facts(g: Gpu, _entry: str | None, archs: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"arch_list": " ".join(archs), "torch_version": v.torch_version,
                               "builds": ", ".join(compat.builds_covering(g.cc)) or None,
                               "removed_in": compat.removed_by_toolkit(g.cc)}
        newest = max((compat.entry_cc(a.split("_")[1].rstrip("af")) for a in archs if a.startswith("sm_")), default=None)
        if newest and g.cc > newest:
            out["newer_than_build"] = "yes"
        return out

    return _coverage_hits(v, None, facts)


@check(facts=("arch", "arch_list", "builds", "capability", "gpu", "gpu_index", "gpu_name",
              "memory", "ptx", "sm"))
def ptx_only(v: EnvView) -> Result:
    return _coverage_hits(v, "ptx", lambda g, entry, archs: {
        "ptx": entry, "arch_list": " ".join(archs), "builds": ", ".join(compat.builds_covering(g.cc)) or None})


@check(facts=("builds", "count", "driver", "driver_cuda", "gpus_seen", "torch_version"))
def cpu_torch_with_gpu(v: EnvView) -> Result:
    if (s := need_torch(v)):
        return s
    if v.torch.get("cuda_build") or v.torch.get("hip_build"):
        return []
    if (s := no_nvml(v)):
        return s
    if not v.nvml_gpus:
        return []
    names = ", ".join(str(g.get("name")) for g in v.nvml_gpus)
    cc = compat.parse_cc(v.nvml_gpus[0].get("capability"))
    facts = {"torch_version": v.torch_version, "gpus_seen": names, "count": len(v.nvml_gpus),
             "driver": v.nvml.get("driver_version"),
             "driver_cuda": compat.driver_max_cuda(v.nvml.get("driver_version") or "0", v.windows)}
    if cc:
        facts["builds"] = ", ".join(compat.builds_covering(cc, 2))
    return [Hit(facts, [("torch.cuda_build", None), ("nvml.gpus[0].name", v.nvml_gpus[0].get("name"))])]


@check(facts=("arch", "capability", "flash_attn", "gpu", "gpu_index", "gpu_name", "memory", "sm"))
def flash_attn_old_gpu(v: EnvView) -> Result:
    if (s := need_torch(v)):
        return s
    if v.rocm or v.device != "cuda":
        return Skip("no NVIDIA GPU in use")
    fa = v.pkg("flash-attn")
    if not fa:
        return []
    hits = []
    for g in v.cuda_gpus:
        if g.cc < (8, 0):
            facts = gpu_facts(g)
            facts["flash_attn"] = fa
            hits.append(Hit(facts, [(g.cc_path, g.cc_text), ("packages.versions.flash-attn", fa)]))
    return hits
