"""The logic of the environment rules: small pure functions of the snapshot.

Each predicate gets an EnvView (the snapshot, the precision being judged and the
plan derived from both) and returns a list of Hits, one per thing that is wrong
(per GPU, per library, per setting), or a Skip saying why it cannot be judged here.
A Hit's facts fill the rule's templates (rules/env/*.toml); its evidence names the
snapshot fields it rests on.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..engine.judge import Hit, Result, Skip, check

from ..knowledge import compat
from .plan import MODES, fp8_matrix, uses_deepspeed
from ..knowledge.units import GIB, gib
from ..knowledge.versions import (compare, cuda_int_to_str, cudnn_version, parse_requires_dist, release,
                                   satisfies)
from .view import EnvView, Gpu, parse_visible_devices



Predicate = Callable[[EnvView], Result]
# check name -> the facts it produces (what its rule's templates may use)
FACTS: dict[str, tuple[str, ...]] = {
    "accelerate_config_unreadable": ("path", "problem"),
    "accelerate_torch_mismatch": ("accelerate", "spec", "torch_version", "where"),
    "alloc_conf_malformed": ("problems", "value", "variable"),
    "alloc_conf_unknown_key": ("keys", "value", "variable"),
    "bf16_below_sm80": ("arch", "bf16_reported", "capability", "fp16_ok", "gpu", "gpu_index", "gpu_name", "memory", "refused", "sm", "torch_version"),
    "bf16_cpu_not_native": ("cpu", "isa", "onednn_bf16"),
    "config_needs_launch": ("path", "value"),
    "cpu_torch_with_gpu": ("builds", "count", "driver", "driver_cuda", "gpus_seen", "torch_version"),
    "cuda_visible_devices_invalid": ("count", "invalid", "shown", "value"),
    "cudnn_mismatch": ("detail", "pin", "wheel", "wheel_name"),
    "deepspeed_config_missing": ("path", "problem"),
    "deepspeed_overrides": ("consequence", "first_value", "second_value"),
    "deepspeed_precision_conflict": ("consequence", "ds_path", "first", "first_value", "second_value"),
    "driver_minor_compat": ("cuda_build", "driver", "driver_cuda", "toolkit_min"),
    "driver_too_old": ("cuda_build", "driver", "driver_cuda", "floor", "gpu", "gpu_last_branch", "toolkit_min", "torch_version"),
    "flash_attn_old_gpu": ("arch", "capability", "flash_attn", "gpu", "gpu_index", "gpu_name", "memory", "sm"),
    "fp16_on_cpu": ("accelerate", "gpus_seen", "source", "torch_version", "why_cpu"),
    "fp16_slower_than_fp32": ("arch", "capability", "fp16_rate", "gpu", "gpu_index", "gpu_name", "memory", "sm"),
    "fp8_no_backend": ("accelerate", "cuda_build", "installed", "reasons"),
    "fp8_unsupported_hardware": ("arch", "capability", "device", "fallback", "gpu", "gpu_index", "gpu_name", "memory", "sm", "what"),
    "gpu_ecc_errors": ("errors", "gpu"),
    "gpu_memory_held": ("basis", "free", "gpu", "held", "share", "total", "who"),
    "host_memory_low": ("available", "share", "total"),
    "library_requirement_unmet": ("dependency", "installed", "package", "package_version", "spec"),
    "mixed_precision_unknown": ("outcome", "source", "under", "value", "meant"),
    "mps_precision_refused": ("accelerate", "detail", "macos", "mode", "torch_version"),
    "multi_gpu_one_gpu": ("num_processes", "visible"),
    "no_kernel_image": ("arch", "arch_list", "builds", "capability", "gpu", "gpu_index", "gpu_name", "memory", "removed_in", "sm", "torch_version"),
    "num_processes_exceeds_gpus": ("cvd", "distributed_type", "machines", "num_processes", "visible"),
    "nvidia_wheel_pin_mismatch": ("installed", "pin", "torch_version", "wheel_name"),
    "precision_sources_disagree": ("consequence", "first", "first_value", "second", "second_value"),
    "ptx_only": ("arch", "arch_list", "builds", "capability", "gpu", "gpu_index", "gpu_name", "memory", "ptx", "sm"),
    "torch_import_missing_library": ("exception", "library", "message", "pin", "torch_version", "wheel_name", "wheel_state"),
    "torch_unusable": ("exception", "message", "status", "stderr", "torch_version"),
}


def predicate(fn: Predicate) -> Predicate:
    """An environment check (engine.judge.check); its facts are declared in FACTS below."""
    return check(facts=FACTS.get(fn.__name__, ()))(fn)




def _gpu_facts(g: Gpu) -> dict[str, Any]:
    return {"gpu": g.label, "gpu_name": g.name, "gpu_index": g.index, "sm": g.sm, "capability": g.cc_text,
            "arch": g.arch, "memory": gib(g.total_memory_bytes)}


def _no_nvml(v: EnvView) -> Skip | None:
    """One reason, worded once, for every check that needs the NVIDIA driver."""
    if v.nvml_ok:
        return None
    err = (v.nvml.get("error") or {}).get("message") or v.nvml.get("status")
    return Skip(f"no NVIDIA driver answered ({err})")


def _need_torch(v: EnvView) -> Skip | None:
    status = v.torch.get("status")
    if status == "ok":
        return None
    if status == "not-installed":
        return Skip("torch is not installed")
    return Skip(f"torch could not be examined ({status})")


def _requested(v: EnvView, *modes: str) -> bool:
    return v.requested in modes


def _requested_evidence(v: EnvView) -> list[tuple[str, Any]]:
    """The snapshot field that asked for the precision being judged."""
    if v.plan is None:
        return []
    for s in v.plan.sources:
        if s.value == v.requested and s.path != "argument":
            return [(s.path, s.value)]
    return [(v.plan.requested_from, v.requested)] if v.plan.requested_from else []


# --- precision vs hardware -------------------------------------------------------------

@predicate
def bf16_below_sm80(v: EnvView) -> Result:
    if not _requested(v, "bf16"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.rocm:
        return Skip("ROCm build: compute-capability thresholds do not apply (bf16 is native on MI100 and newer)")
    if v.device != "cuda":
        return Skip("no CUDA GPU in use")
    hits = []
    for g in v.cuda_gpus:
        if g.cc >= (8, 0):
            continue
        facts = _gpu_facts(g)
        facts["torch_version"] = v.torch_version
        ev = [(g.cc_path, g.cc_text)]
        if g.bf16_supported:
            facts["bf16_reported"] = "True"
            ev.append((g.cc_path.replace("capability", "bf16_supported"), True))
        if g.bf16_native is False:
            ev.append((g.cc_path.replace("capability", "bf16_native"), False))
        if g.bf16_supported is False or not v.torch_at_least("2.3"):
            facts["refused"] = "yes"
        facts["fp16_ok"] = "yes" if compat.features(g.cc).get("fp16") == "fast" else None
        hits.append(Hit(facts, ev))
    return hits


@predicate
def fp16_on_cpu(v: EnvView) -> Result:
    if not _requested(v, "fp16"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.device != "cpu":
        return []
    if v.observed.get("observed_dtype") == "float16":
        return []  # the run autocast in float16 itself (torch.autocast): accelerate was not in the way
    facts: dict[str, Any] = {"accelerate": v.accelerate, "torch_version": v.torch_version}
    ev = _requested_evidence(v)
    if v.use_cpu:
        facts["why_cpu"] = "the accelerate config says use_cpu: true"
        ev.append(("accelerate_config.config.use_cpu", True))
    elif not v.cuda_build and not v.hip_build:
        facts["why_cpu"] = f"torch {v.torch_version} is a CPU-only build"
        ev.append(("torch.cuda_build", None))
    else:
        facts["why_cpu"] = "torch.cuda.is_available() is False"
        ev.append(("torch.cuda_available", False))
    if v.nvml_ok and v.nvml_gpus:
        facts["gpus_seen"] = ", ".join(str(g.get("name")) for g in v.nvml_gpus)
    facts["source"] = v.plan.requested_from if v.plan else None
    return [Hit(facts, ev)]


@predicate
def mps_precision_refused(v: EnvView) -> Result:
    if not _requested(v, "fp16", "bf16"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.device != "mps":
        return []
    row = compat.accelerate_device_outcome(v.requested, "mps", v.accelerate, v.torch_version)
    mps = v.torch.get("mps") or {}
    facts = {"mode": v.requested, "accelerate": v.accelerate, "torch_version": v.torch_version,
             "macos": v.snap["platform"].get("mac_version")}
    ev = [("torch.mps.available", True), ("packages.versions.accelerate", v.accelerate)]
    if row and row["outcome"] == "refused":
        facts["detail"] = row["detail"]
        return [Hit(facts, ev)]
    if v.requested == "bf16" and mps.get("macos_14_or_newer") is False:
        facts["detail"] = "MPS BFloat16 is only supported on MacOS 14 or newer"
        ev.append(("torch.mps.macos_14_or_newer", False))
        return [Hit(facts, ev)]
    return []


@predicate
def fp16_slower_than_fp32(v: EnvView) -> Result:
    if not _requested(v, "fp16"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.device != "cuda" or v.rocm:
        return []
    hits = []
    for g in v.cuda_gpus:
        feat = compat.features(g.cc)
        if feat.get("fp16") in ("slow", "none"):
            facts = _gpu_facts(g)
            facts["fp16_rate"] = feat.get("fp16_rate") or ("no fp16 arithmetic units" if feat.get("fp16") == "none" else None)
            hits.append(Hit(facts, [(g.cc_path, g.cc_text)]))
    return hits


@predicate
def fp8_unsupported_hardware(v: EnvView) -> Result:
    if not _requested(v, "fp8"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.rocm:
        bad = [g for g in v.gpus if not (compat.rocm_target(g.gcn_arch) or {}).get("fp8")]
        return [Hit({"gpu": g.label, "what": f"{g.label} has no fp8 matrix cores (MI300/gfx942 and MI350/gfx950 do)"},
                    [(g.cc_path.replace("capability", "gcn_arch"), g.gcn_arch)]) for g in bad]
    if v.device != "cuda":
        return [Hit({"what": "no GPU is in use (fp8 runs only on a GPU)", "device": v.device},
                    [("torch.cuda_available", v.torch.get("cuda_available"))])]
    hits = []
    for g in v.cuda_gpus:
        if g.cc < (8, 9):
            facts = _gpu_facts(g)
            facts["what"] = f"{g.label} is compute capability {g.cc_text}, below 8.9"
            facts["fallback"] = "fp16"
            hits.append(Hit(facts, [(g.cc_path, g.cc_text)]))
    return hits


@predicate
def fp8_no_backend(v: EnvView) -> Result:
    if not _requested(v, "fp8"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.device != "cuda":
        return Skip("no GPU in use: fp8 backends cannot be judged")
    if not v.rocm and any(g.cc < (8, 9) for g in v.cuda_gpus):
        return Skip("the GPU has no fp8 (see fp8-below-sm89)")
    matrix = fp8_matrix(v)
    if any(r["usable"] for r in matrix):
        return []
    installed = [f"{r['backend']} {r['installed']}" for r in matrix if r["installed"]]
    reasons = "; ".join(f"{r['backend']}: {r['verdict']}" for r in matrix)
    facts = {"installed": ", ".join(installed) if installed else None, "reasons": reasons,
             "accelerate": v.accelerate, "cuda_build": v.cuda_build}
    ev = [(f"packages.versions.{p}", v.pkg(p)) for p in ("transformer-engine", "torchao", "msamp") if v.pkg(p)]
    ev = ev or [("packages.versions", "no transformer-engine, torchao or msamp")]
    return [Hit(facts, ev)]


@predicate
def bf16_cpu_not_native(v: EnvView) -> Result:
    if not _requested(v, "bf16"):
        return []
    if (s := _need_torch(v)):
        return s
    if v.device != "cpu":
        return []
    flags = (v.snap["cpu"].get("flags") or {})
    tcpu = v.torch.get("cpu") or {}
    if not flags and not tcpu:
        return Skip("the CPU's flags are not in the snapshot")
    native = any(flags.get(f) for f in ("avx512_bf16", "amx_bf16", "bf16")) or tcpu.get("avx512_bf16") or tcpu.get("amx_tile")
    if native:
        return []
    facts = {"cpu": v.snap["cpu"].get("model"), "isa": tcpu.get("capability"),
             "onednn_bf16": "yes" if tcpu.get("mkldnn_bf16") else None}
    return [Hit(facts, [("cpu.flags.avx512_bf16", flags.get("avx512_bf16", False)),
                        ("cpu.flags.amx_bf16", flags.get("amx_bf16", False))])]


@predicate
def flash_attn_old_gpu(v: EnvView) -> Result:
    if (s := _need_torch(v)):
        return s
    if v.rocm or v.device != "cuda":
        return Skip("no NVIDIA GPU in use")
    fa = v.pkg("flash-attn")
    if not fa:
        return []
    hits = []
    for g in v.cuda_gpus:
        if g.cc < (8, 0):
            facts = _gpu_facts(g)
            facts["flash_attn"] = fa
            hits.append(Hit(facts, [(g.cc_path, g.cc_text), ("packages.versions.flash-attn", fa)]))
    return hits


# --- driver vs build ------------------------------------------------------------------------

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
    if (s := _no_nvml(v)):
        return s
    if not v.nvml.get("driver_version"):
        return Skip("the driver version is not in the snapshot")
    return None


@predicate
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


@predicate
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


# --- GPU architecture vs the build's arch list ----------------------------------------------

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


@predicate
def no_kernel_image(v: EnvView) -> Result:
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
        kind, _entry = compat.arch_coverage(g.cc, archs)
        if kind is not None:
            continue
        facts = _gpu_facts(g)
        facts.update({"arch_list": " ".join(archs), "torch_version": v.torch_version,
                      "builds": ", ".join(compat.builds_covering(g.cc)) or None,
                      "removed_in": compat.removed_by_toolkit(g.cc)})
        newest = max((compat.entry_cc(a.split("_")[1].rstrip("af")) for a in archs if a.startswith("sm_")), default=None)
        if newest and g.cc > newest:
            facts["newer_than_build"] = "yes"
        hits.append(Hit(facts, [(g.cc_path, g.cc_text), (path, " ".join(archs))]))
    return hits


@predicate
def ptx_only(v: EnvView) -> Result:
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
        kind, entry = compat.arch_coverage(g.cc, archs)
        if kind == "ptx":
            facts = _gpu_facts(g)
            facts.update({"ptx": entry, "arch_list": " ".join(archs),
                          "builds": ", ".join(compat.builds_covering(g.cc)) or None})
            hits.append(Hit(facts, [(g.cc_path, g.cc_text), (path, " ".join(archs))]))
    return hits


# --- libraries --------------------------------------------------------------------------------

@predicate
def accelerate_torch_mismatch(v: EnvView) -> Result:
    acc = v.accelerate
    if not acc:
        return Skip("accelerate is not installed")
    torch_v = v.torch_version
    if not torch_v:
        return Skip("torch is not installed")
    spec, where = None, ""
    for line in v.requires("accelerate"):
        parsed = parse_requires_dist(line)
        if parsed and parsed[0] == "torch" and not parsed[2]:
            spec, where = parsed[1], "packages.requires.accelerate"
    if spec is None:
        spec, where = compat.accelerate_torch_min(acc), "accelerate's setup.py (mpdoctor table)"
    if not spec or satisfies(torch_v, spec) is not False:
        return []
    return [Hit({"accelerate": acc, "torch_version": torch_v, "spec": spec, "where": where},
                [("packages.versions.accelerate", acc), ("packages.versions.torch", torch_v)])]


_CHECKED_DEPS = ("torch", "accelerate", "transformers", "peft", "deepspeed")


@predicate
def library_requirement_unmet(v: EnvView) -> Result:
    hits = []
    for pkg, lines in sorted(v.snap["packages"]["requires"].items()):
        if pkg in ("accelerate", "torch"):
            continue  # accelerate->torch has its own rule; torch's pins are the nvidia-* rule's
        for line in lines:
            parsed = parse_requires_dist(line)
            if not parsed:
                continue
            dep, spec, marker = parsed
            if dep not in _CHECKED_DEPS or not spec:
                continue
            if marker and "extra" in marker and dep != "torch":
                continue  # an optional extra the user may not use (torch extras are real: the library imports it)
            have = v.torch_version if dep == "torch" else v.pkg(dep)
            if not have:
                continue
            if satisfies(have, spec) is False:
                hits.append(Hit({"package": pkg, "package_version": v.pkg(pkg), "dependency": dep,
                                 "spec": spec, "installed": have},
                                [(f"packages.requires.{pkg}", line), (f"packages.versions.{dep}", have)]))
    return hits


def _torch_pins(v: EnvView) -> dict[str, str]:
    pins = {}
    for line in v.requires("torch"):
        parsed = parse_requires_dist(line)
        if parsed and parsed[0].startswith("nvidia-") and parsed[1].startswith("=="):
            pins[parsed[0]] = parsed[1][2:]
    return pins


@predicate
def cudnn_mismatch(v: EnvView) -> Result:
    if v.hip_build:
        return Skip("ROCm build: no cuDNN")
    hits = []
    err = ((v.torch.get("errors") or {}).get("cudnn") or {}).get("message") if v.torch_ok else None
    wheel_name = next((n for n in v.snap["packages"]["nvidia_wheels"] if n.startswith("nvidia-cudnn")), None)
    wheel = v.snap["packages"]["nvidia_wheels"].get(wheel_name) if wheel_name else None
    runtime = v.torch.get("cudnn") if v.torch_ok else None
    pin = _torch_pins(v).get(wheel_name or "") if wheel_name else None
    if err:
        hits.append(Hit({"detail": err, "wheel": wheel, "wheel_name": wheel_name},
                        [("torch.errors.cudnn", err)]))
    elif runtime and wheel:
        rt = (release(cudnn_version(runtime)) or (0, 0))[:2]
        wr = (release(wheel) or (0, 0))[:2]
        if tuple(wr) != rt:
            hits.append(Hit({"detail": f"torch loaded cuDNN {rt[0]}.{rt[1]} but {wheel_name} {wheel} is installed",
                             "wheel": wheel, "wheel_name": wheel_name, "runtime": f"{rt[0]}.{rt[1]}"},
                            [("torch.cudnn", runtime), (f"packages.nvidia_wheels.{wheel_name}", wheel)]))
    if not hits and pin and wheel and (release(pin) or (0,))[0] != (release(wheel) or (0,))[0]:
        hits.append(Hit({"detail": f"torch {v.torch_version} pins {wheel_name}=={pin}, installed is {wheel}",
                         "wheel": wheel, "wheel_name": wheel_name, "pin": pin},
                        [("packages.requires.torch", f"{wheel_name}=={pin}"),
                         (f"packages.nvidia_wheels.{wheel_name}", wheel)]))
    return hits


@predicate
def nvidia_wheel_pin_mismatch(v: EnvView) -> Result:
    pins = _torch_pins(v)
    if not pins:
        return Skip("torch declares no nvidia-* pins (not a pip CUDA wheel)")
    hits = []
    wheels = v.snap["packages"]["nvidia_wheels"]
    for name, pin in sorted(pins.items()):
        have = wheels.get(name)
        if have is None:
            continue  # a missing library is the import rule's business
        if name.startswith("nvidia-cudnn") and (release(pin) or (0,))[0] != (release(have) or (0,))[0]:
            continue  # a cuDNN major mismatch is cudnn-version-mismatch
        if compare(have, pin) != 0:
            hits.append(Hit({"wheel_name": name, "pin": pin, "installed": have, "torch_version": v.torch_version},
                            [("packages.requires.torch", f"{name}=={pin}"), (f"packages.nvidia_wheels.{name}", have)]))
    return hits


@predicate
def cpu_torch_with_gpu(v: EnvView) -> Result:
    if (s := _need_torch(v)):
        return s
    if v.torch.get("cuda_build") or v.torch.get("hip_build"):
        return []
    if (s := _no_nvml(v)):
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


_LIB_MISSING = re.compile(r"(lib[\w.+-]*\.so[\w.]*|[\w-]+\.dll)|undefined symbol|cannot open shared object|DLL load failed",
                          re.IGNORECASE)


def _torch_failure(v: EnvView) -> tuple[str, dict[str, Any]] | None:
    status = v.torch.get("status")
    if status in ("ok", "not-installed", "unknown", None):
        return None
    err = v.torch.get("error") or {}
    return status, err


@predicate
def torch_import_missing_library(v: EnvView) -> Result:
    failed = _torch_failure(v)
    if not failed:
        return []
    status, err = failed
    message = str(err.get("message", ""))
    m = _LIB_MISSING.search(message)
    if status != "import-error" or not m:
        return []
    lib = m.group(1)
    facts = {"message": message.splitlines()[0][:300], "library": lib, "exception": err.get("type"),
             "torch_version": v.pkg("torch")}
    wheels = v.snap["packages"]["nvidia_wheels"]
    pins = _torch_pins(v)
    if lib:
        stem = re.sub(r"^lib|\.so.*$|\.dll$", "", lib).lower()
        family = {"cudart": "cuda-runtime", "cublas": "cublas", "cublaslt": "cublas", "cudnn": "cudnn",
                  "nccl": "nccl", "nvjitlink": "nvjitlink", "cusparse": "cusparse", "cufft": "cufft",
                  "curand": "curand", "cusolver": "cusolver", "nvrtc": "cuda-nvrtc", "cupti": "cuda-cupti",
                  "cusparselt": "cusparselt", "nvtoolsext": "nvtx", "cufile": "cufile"}.get(re.sub(r"\d+$", "", stem))
        if family:
            want = [n for n in pins if n.startswith(f"nvidia-{family}-")]
            if want:
                facts["wheel_name"] = want[0]
                facts["pin"] = pins[want[0]]
                facts["wheel_state"] = f"installed {wheels[want[0]]}" if want[0] in wheels else "not installed"
    return [Hit(facts, [("torch.error.message", message.splitlines()[0][:300])])]


@predicate
def torch_unusable(v: EnvView) -> Result:
    failed = _torch_failure(v)
    if not failed:
        return []
    status, err = failed
    facts = {"status": status, "exception": err.get("type"), "message": str(err.get("message", "")).splitlines()[0][:300]
             if err.get("message") else None, "torch_version": v.pkg("torch"),
             "stderr": (v.torch.get("stderr_tail") or [None])[-1]}
    return [Hit(facts, [("torch.status", status)] + ([("torch.error.message", facts["message"])] if facts["message"] else []))]


# --- accelerate config and environment ----------------------------------------------------------

@predicate
def mixed_precision_unknown(v: EnvView) -> Result:
    hits = []
    cfg = v.config or {}
    value = cfg.get("mixed_precision")
    if value is not None and value is not False and str(value).lower() not in MODES:
        hits.append(Hit({"value": str(value), "source": "the accelerate config file", "under": "accelerate launch",
                         "outcome": "refuses to start (Unknown mixed_precision mode)"},
                        [("accelerate_config.config.mixed_precision", value)]))
    env = v.env.get("ACCELERATE_MIXED_PRECISION")
    if env is not None and env.strip() not in MODES:
        facts = {"value": env, "source": "ACCELERATE_MIXED_PRECISION",
                 "under": "python train.py with Accelerator()",
                 "outcome": "accepts it without an error and trains in fp32 (measured with accelerate 1.16)"}
        if env.strip().lower() in MODES:  # 'BF16': right word, wrong case
            facts["meant"] = env.strip().lower()
        hits.append(Hit(facts, [("env.ACCELERATE_MIXED_PRECISION", env)]))
    return hits


@predicate
def config_needs_launch(v: EnvView) -> Result:
    cfg = v.config
    if cfg is None:
        return Skip("no accelerate config file") if not v.config_section.get("exists") else []
    mp = cfg.get("mixed_precision")
    if not isinstance(mp, str) or mp.lower() not in ("fp16", "bf16", "fp8"):
        return []
    if v.env.get("ACCELERATE_MIXED_PRECISION"):
        return []
    return [Hit({"value": mp.lower(), "path": v.config_section.get("path")},
                [("accelerate_config.config.mixed_precision", mp), ("env.ACCELERATE_MIXED_PRECISION", None)])]


@predicate
def deepspeed_precision_conflict(v: EnvView) -> Result:
    if not v.plan or not uses_deepspeed(v):
        return []
    hits = []
    for d in v.plan.disagreements:
        if "DeepSpeed" in d.second and d.winner == "none":
            hits.append(Hit({"first": d.first, "first_value": d.first_value, "second_value": d.second_value,
                             "consequence": d.consequence, "ds_path": (v.config_section.get("deepspeed") or {}).get("path")},
                            [("accelerate_config.config.mixed_precision", (v.config or {}).get("mixed_precision")),
                             ("accelerate_config.deepspeed.config", f"fp16={((v.config_section.get('deepspeed') or {}).get('config') or {}).get('fp16')}, "
                              f"bf16={((v.config_section.get('deepspeed') or {}).get('config') or {}).get('bf16')}")]))
    return hits


@predicate
def deepspeed_overrides(v: EnvView) -> Result:
    if not v.plan or not uses_deepspeed(v):
        return []
    return [Hit({"first_value": d.first_value, "second_value": d.second_value, "consequence": d.consequence},
                [("accelerate_config.config.mixed_precision", (v.config or {}).get("mixed_precision", "no")),
                 ("accelerate_config.deepspeed.config", d.second_value)])
            for d in v.plan.disagreements if "DeepSpeed" in d.second and d.winner == "DeepSpeed config"]


@predicate
def deepspeed_config_missing(v: EnvView) -> Result:
    ds = v.config_section.get("deepspeed")
    if not ds:
        return []
    if not ds.get("exists"):
        return [Hit({"path": ds.get("path"), "problem": "does not exist"}, [("accelerate_config.deepspeed.path", ds.get("path"))])]
    if ds.get("error"):
        return [Hit({"path": ds.get("path"), "problem": f"cannot be read: {ds['error'].get('message')}"},
                    [("accelerate_config.deepspeed.error", ds["error"].get("message"))])]
    return []


@predicate
def precision_sources_disagree(v: EnvView) -> Result:
    if not v.plan:
        return []
    return [Hit({"first": d.first, "first_value": d.first_value, "second": d.second, "second_value": d.second_value,
                 "consequence": d.consequence},
                [(s.path, s.value) for s in v.plan.sources if s.source.startswith((d.first, d.second))])
            for d in v.plan.disagreements
            if "DeepSpeed" not in d.second and d.first != "--mixed-precision"]


def _distributed(cfg: dict[str, Any]) -> str:
    return str(cfg.get("distributed_type", "NO")).upper()


@predicate
def num_processes_exceeds_gpus(v: EnvView) -> Result:
    cfg = v.config
    if cfg is None:
        return Skip("no accelerate config file")
    dist = _distributed(cfg)
    if dist not in ("MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM") or v.use_cpu:
        return []
    n = cfg.get("num_processes")
    machines = int(cfg.get("num_machines") or 1)
    visible = v.visible_gpu_count
    if visible is None:
        return Skip("the number of visible GPUs is not known (no torch and no NVML)")
    try:
        per_machine = int(n) // max(machines, 1)
    except (TypeError, ValueError):
        return []
    if per_machine <= visible:
        return []
    return [Hit({"num_processes": n, "machines": machines, "visible": visible, "distributed_type": dist,
                 "cvd": v.env.get("CUDA_VISIBLE_DEVICES")},
                [("accelerate_config.config.num_processes", n),
                 ("torch.device_count" if v.cuda_available else "nvml.gpus", visible)])]


@predicate
def multi_gpu_one_gpu(v: EnvView) -> Result:
    cfg = v.config
    if cfg is None:
        return Skip("no accelerate config file")
    if _distributed(cfg) != "MULTI_GPU" or int(cfg.get("num_machines") or 1) > 1:
        return []
    visible = v.visible_gpu_count
    if visible is None:
        return Skip("the number of visible GPUs is not known")
    if visible != 1:
        return []
    return [Hit({"visible": visible, "num_processes": cfg.get("num_processes")},
                [("accelerate_config.config.distributed_type", "MULTI_GPU"),
                 ("torch.device_count" if v.cuda_available else "nvml.gpus", visible)])]


@predicate
def cuda_visible_devices_invalid(v: EnvView) -> Result:
    value = v.env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return []
    if (s := _no_nvml(v)):
        return s
    shown, invalid = parse_visible_devices(value, v.nvml_gpus)
    if invalid:
        return [Hit({"value": value, "invalid": ", ".join(invalid), "count": len(v.nvml_gpus),
                     "shown": ", ".join(map(str, shown or [])) or "none"},
                    [("env.CUDA_VISIBLE_DEVICES", value), ("nvml.gpus", f"{len(v.nvml_gpus)} GPU(s)")])]
    if shown == [] and v.nvml_gpus:
        return [Hit({"value": value, "invalid": None, "count": len(v.nvml_gpus), "shown": "none"},
                    [("env.CUDA_VISIBLE_DEVICES", value), ("nvml.gpus", f"{len(v.nvml_gpus)} GPU(s)")])]
    return []


def _alloc_problems(value: str, torch_version: str | None) -> tuple[list[str], list[str]]:
    conf = compat.alloc_conf()
    malformed, unknown = [], []
    for part in [p for p in value.split(",") if p.strip()]:
        if ":" not in part:
            malformed.append(f"'{part.strip()}' is not key:value")
            continue
        key, _, val = (x.strip() for x in part.partition(":"))
        if key not in conf["keys"]:
            import difflib

            close = difflib.get_close_matches(key, conf["keys"], n=1)
            unknown.append(f"'{key}'" + (f" (did you mean {close[0]}?)" if close else ""))
            continue
        if key in conf["booleans"] and val not in ("True", "False"):
            malformed.append(f"{key}:{val} must be True or False (capitalised)")
        elif key == "backend" and val not in conf["backends"]:
            malformed.append(f"backend:{val} is not one of {', '.join(conf['backends'])}")
        elif key == "garbage_collection_threshold":
            try:
                ok = 0.0 < float(val) < 1.0
            except ValueError:
                ok = False
            if not ok:
                malformed.append(f"garbage_collection_threshold:{val} must be between 0 and 1")
        elif key in ("max_split_size_mb", "roundup_power2_divisions", "pinned_num_register_threads") and not val.isdigit():
            malformed.append(f"{key}:{val} must be a whole number")
        since = conf.get("since", {}).get(key)
        if since and torch_version and satisfies(torch_version, f">={since}") is False:
            malformed.append(f"{key} needs torch >= {since} (this is {torch_version})")
    return malformed, unknown


def _alloc_conf_hits(v: EnvView, which: int, key: str) -> Result:
    """One hit per allocator variable whose value has problems of kind `which`
    (0: malformed, 1: unknown keys, as _alloc_problems returns them)."""
    hits = []
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = v.env.get(name)
        if value:
            problems = _alloc_problems(value, v.torch_version)[which]
            if problems:
                joiner = "; " if which == 0 else ", "
                hits.append(Hit({"variable": name, "value": value, key: joiner.join(problems)},
                                [(f"env.{name}", value)]))
    return hits


@predicate
def alloc_conf_malformed(v: EnvView) -> Result:
    return _alloc_conf_hits(v, 0, "problems")


@predicate
def alloc_conf_unknown_key(v: EnvView) -> Result:
    return _alloc_conf_hits(v, 1, "keys")


@predicate
def accelerate_config_unreadable(v: EnvView) -> Result:
    sec = v.config_section
    if not sec.get("exists"):
        return []
    err = sec.get("error")
    if not err:
        return []
    return [Hit({"path": sec.get("path"), "problem": err.get("message")}, [("accelerate_config.error", err.get("message"))])]


# --- memory -----------------------------------------------------------------------------------

@predicate
def gpu_memory_held(v: EnvView) -> Result:
    if (s := _no_nvml(v)):
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
        if not others and mem.get("used_bytes", 0) > 0.5 * total:
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


@predicate
def host_memory_low(v: EnvView) -> Result:
    mem = v.snap["memory"]
    total, avail = mem.get("total_bytes"), mem.get("available_bytes")
    if not total or avail is None:
        return Skip("host memory is not in the snapshot")
    if avail >= 0.10 * total and avail >= 2 * GIB:
        return []
    return [Hit({"available": gib(avail), "total": gib(total), "share": f"{avail / total:.0%}"},
                [("memory.available_bytes", gib(avail))])]


@predicate
def gpu_ecc_errors(v: EnvView) -> Result:
    if (s := _no_nvml(v)):
        return s
    return [Hit({"gpu": f"GPU {g.get('index', i)} {g.get('name')}", "errors": g["ecc_uncorrected_volatile"]},
                [(f"nvml.gpus[{i}].ecc_uncorrected_volatile", g["ecc_uncorrected_volatile"])])
            for i, g in enumerate(v.nvml_gpus) if (g.get("ecc_uncorrected_volatile") or 0) > 0]
