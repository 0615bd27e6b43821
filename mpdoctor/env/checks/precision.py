"""The precision asked for against what the hardware computes: bf16, fp16 and fp8 on
the GPUs, the CPU or Apple's MPS, and the fp8 backends that make fp8 run at all."""

from __future__ import annotations

from typing import Any

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge import compat
from ..plan import advisable_mode, fp8_matrix
from ..view import EnvView
from ._common import gpu_facts, need_torch


def _not_judged(v: EnvView, *modes: str) -> Result | None:
    """What a check of the precisions `modes` returns before it looks: nothing when
    another precision is judged, a Skip without a usable torch; None: judge. With
    `use_cpu: true` the device is the CPU whatever torch is: judged from the config."""
    if v.use_cpu:
        return None if v.requested in modes else []
    if (no_torch := need_torch(v)):
        return no_torch  # where torch is not usable the device is unknown: nothing here is judged
    return [] if v.requested not in modes else None


def _requested_evidence(v: EnvView) -> list[tuple[str, Any]]:
    """The snapshot field that asked for the precision being judged."""
    if v.plan is None:
        return []
    for s in v.plan.sources:
        if s.value == v.requested and s.path != "argument":
            return [(s.path, s.value)]
    return [(v.plan.requested_from, v.requested)] if v.plan.requested_from else []


@check(facts=("arch", "bf16_reported", "capability", "fp16_ok", "gpu", "gpu_index", "gpu_name",
              "memory", "refused", "sm", "torch_version"))
def bf16_below_sm80(v: EnvView) -> Result:
    if (early := _not_judged(v, "bf16")) is not None:
        return early
    if v.rocm:
        return Skip("ROCm build: compute-capability thresholds do not apply (bf16 is native on MI100 and newer)")
    if v.device != "cuda":
        return Skip("no CUDA GPU in use")
    hits = []
    for g in v.cuda_gpus:
        if g.cc >= (8, 0):
            continue
        facts = gpu_facts(g)
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


@check(facts=("accelerate", "gpus_seen", "source", "torch_version", "why_cpu"))
def fp16_on_cpu(v: EnvView) -> Result:
    if (early := _not_judged(v, "fp16")) is not None:
        return early
    if v.device != "cpu":
        return []
    if v.observed.get("observed_dtype") not in (None, "float32"):
        # the run computed in float16 or bfloat16 itself (torch.autocast, Lightning's
        # precision=, which never reads ACCELERATE_MIXED_PRECISION): it did not train in fp32
        return []
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


@check(facts=("accelerate", "detail", "macos", "mode", "torch_version"))
def mps_precision_refused(v: EnvView) -> Result:
    if (early := _not_judged(v, "fp16", "bf16")) is not None:
        return early
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


@check(facts=("arch", "capability", "fp16_rate", "gpu", "gpu_index", "gpu_name", "memory", "sm"))
def fp16_slower_than_fp32(v: EnvView) -> Result:
    if (early := _not_judged(v, "fp16")) is not None:
        return early
    if v.device != "cuda" or v.rocm:
        return []
    hits = []
    for g in v.cuda_gpus:
        feat = compat.features(g.cc)
        if feat.get("fp16") in ("slow", "none"):
            facts = gpu_facts(g)
            facts["fp16_rate"] = feat.get("fp16_rate") or ("no fp16 arithmetic units" if feat.get("fp16") == "none" else None)
            hits.append(Hit(facts, [(g.cc_path, g.cc_text)]))
    return hits


@check(facts=("alternative", "arch", "capability", "device", "fallback", "gpu", "gpu_index", "gpu_name",
              "memory", "sm", "what", "_no_gpu"))
def fp8_unsupported_hardware(v: EnvView) -> Result:
    if (early := _not_judged(v, "fp8")) is not None:
        return early
    # the mode to use instead: the one the plan says runs here (never fp16 on a CPU)
    alternative = advisable_mode(v)
    if v.rocm:
        bad = [g for g in v.gpus if not (compat.rocm_target(g.gcn_arch) or {}).get("fp8")]
        return [Hit({"gpu": g.label, "what": f"{g.label} has no fp8 matrix cores (MI300/gfx942 and MI350/gfx950 do)",
                     "alternative": alternative},
                    [(g.cc_path.replace("capability", "gcn_arch"), g.gcn_arch)]) for g in bad]
    if v.device != "cuda":
        return [Hit({"what": "no GPU is in use (fp8 runs only on a GPU)", "device": v.device,
                     "alternative": alternative, "_no_gpu": "yes"},
                    [("accelerate_config.config.use_cpu", True) if v.use_cpu else
                     ("torch.cuda_available", v.torch.get("cuda_available"))])]
    hits = []
    for g in v.cuda_gpus:
        if g.cc < (8, 9):
            facts = gpu_facts(g)
            facts["what"] = f"{g.label} is compute capability {g.cc_text}, below 8.9"
            facts["fallback"] = "fp16"
            facts["alternative"] = alternative
            hits.append(Hit(facts, [(g.cc_path, g.cc_text)]))
    return hits


@check(facts=("accelerate", "cuda_build", "installed", "reasons"))
def fp8_no_backend(v: EnvView) -> Result:
    if (early := _not_judged(v, "fp8")) is not None:
        return early
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


@check(facts=("cpu", "isa", "onednn_bf16"))
def bf16_cpu_not_native(v: EnvView) -> Result:
    if (early := _not_judged(v, "bf16")) is not None:
        return early
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
