"""`explain --snapshot FILE` / `explain --here`: the machine's facts sharpen the
explanation of a log.

A log says what failed; the snapshot says on what. Each log finding gets the
environment findings of its own kind (judged with the precision the log points at),
plus a few direct sentences where a fact settles the question: a bf16 cuBLAS failure
on a V100 says "your Tesla V100 (sm_70) has no bf16: use fp16"; an OOM in fp32 on a
24 GiB GPU says which half precision that GPU has.
"""

from __future__ import annotations

import re
from typing import Any

from ..findings import Evidence, Finding, Report
from ..knowledge.units import gib

# Which environment categories can explain a log finding of a category.
RELATED: dict[str, set[str]] = {
    "bf16-unsupported": {"bf16-unsupported"},
    "cublas-cudnn-failure": {"bf16-unsupported", "cuda-library-missing", "driver-too-old"},
    "half-op-not-implemented": {"fp16-unsupported-device", "cuda-unavailable"},
    "fp16-unsupported-device": {"fp16-unsupported-device", "cuda-unavailable"},
    "fp8-unsupported": {"fp8-unsupported"},
    "flash-attention-unsupported": {"flash-attention-unsupported"},
    "no-kernel-image": {"no-kernel-image"},
    "driver-too-old": {"driver-too-old"},
    "cuda-unavailable": {"cuda-unavailable", "driver-too-old", "cuda-library-missing"},
    "cuda-library-missing": {"cuda-library-missing"},
    "version-incompatible": {"version-incompatible"},
    "out-of-memory": {"out-of-memory"},
    "host-out-of-memory": {"host-out-of-memory"},
    "accelerate-config": {"accelerate-config"},
    "distributed-communication": {"accelerate-config"},
    "cuda-kernel-fault": {"cuda-kernel-fault"},
    "device-mismatch": {"cuda-unavailable"},
}
_BF16 = re.compile(r"bf16|bfloat16|BFloat16|CUDA_R_16BF", re.IGNORECASE)
_FP8 = re.compile(r"fp8|float8|e4m3|e5m2", re.IGNORECASE)
_FP16 = re.compile(r"fp16|float16|\bHalf\b|GradScaler|loss scale", re.IGNORECASE)


def _text(f: Finding) -> str:
    parts = [f.title, f.explanation] + [str(v) for v in f.facts.values()] + [e.text for e in f.evidence]
    return " ".join(parts)


def mode_hint(f: Finding) -> str | None:
    """The precision a log finding is about, if it says."""
    text = _text(f)
    if _BF16.search(text) or f.category == "bf16-unsupported":
        return "bf16"
    if _FP8.search(text) or f.category == "fp8-unsupported":
        return "fp8"
    if _FP16.search(text) or f.category in ("fp16-unsupported-device", "fp16-gradient-unscale", "fp16-value-overflow",
                                             "loss-scale-overflow"):
        return "fp16"
    return None


def _prepend_fix(f: Finding, fix: str) -> None:
    if fix not in f.fixes:
        f.fixes.insert(0, fix)


def _add_sentence(f: Finding, sentence: str, first: bool = False) -> None:
    if sentence in f.explanation:
        return
    f.explanation = (sentence + " " + f.explanation).strip() if first else (f.explanation + " " + sentence).strip()


def _lowest_gpu(view: Any) -> Any:
    gpus = [g for g in view.gpus if g.vendor == "nvidia" and g.cc]
    return min(gpus, key=lambda g: g.cc) if gpus else None


def _direct(f: Finding, hint: str | None, view: Any) -> str | None:
    """The sentences a single machine fact settles; returns a fix to add when no
    environment finding brings one of its own."""
    g = _lowest_gpu(view)
    if g is None:
        if f.category in ("cuda-unavailable", "half-op-not-implemented", "device-mismatch") and not view.gpus:
            build = view.cuda_build or view.hip_build
            _add_sentence(f, "This machine has no GPU torch can use" +
                          (f" (torch {view.torch_version} is a CPU-only build)." if view.torch_ok and not build else "."))
        return None
    ev = Evidence(text=g.cc_text or "", line=None, source=g.cc_path)
    if hint == "bf16" and f.category in ("bf16-unsupported", "cublas-cudnn-failure", "half-op-not-implemented",
                                         "flash-attention-unsupported", "dtype-mismatch"):
        if g.cc < (8, 0) and not view.rocm:
            _add_sentence(f, f"Your {g.name} ({g.sm}) has no bf16: use fp16.", first=True)
            f.facts.setdefault("machine_gpu", g.label)
            return ("Train in fp16 on this GPU: `mixed_precision=\"fp16\"` in `Accelerator(...)` or the "
                    "accelerate config (`accelerate launch --mixed_precision fp16`).")
            f.evidence.append(ev)
        else:
            _add_sentence(f, f"Your {g.name} ({g.sm}) does support bf16 natively, so the GPU is not the cause.")
            f.evidence.append(ev)
    elif f.category == "flash-attention-unsupported" and g.cc < (8, 0):
        _add_sentence(f, f"Your {g.name} ({g.sm}, {g.arch}) is older than Ampere: FlashAttention 2 cannot run on it.",
                      first=True)
        _prepend_fix(f, "Load the model with `attn_implementation=\"sdpa\"`.")
        f.evidence.append(ev)
    elif f.category == "out-of-memory":
        mem = gib(g.total_memory_bytes)
        requested = view.plan.requested if view.plan else None
        if hint is None and requested in (None, "no"):
            if g.cc >= (8, 0):
                _add_sentence(f, f"Your {g.name} has {mem} and native bf16; the run looks like fp32, where bf16 "
                                 "mixed precision roughly halves activation memory.")
                _prepend_fix(f, f"Train in bf16 on this {g.name}: `Accelerator(mixed_precision=\"bf16\")` "
                                "(or `accelerate launch --mixed_precision bf16`).")
            elif g.cc >= (7, 0):
                _add_sentence(f, f"Your {g.name} has {mem} and no bf16, but fast fp16: fp16 mixed precision roughly "
                                 "halves activation memory.")
                _prepend_fix(f, "Train in fp16 on this GPU: `Accelerator(mixed_precision=\"fp16\")`.")
            f.evidence.append(Evidence(text=mem or "", line=None, source=g.cc_path.replace("capability", "total_memory_bytes")))
        f.facts.setdefault("machine_gpu_memory", mem)
    elif f.category == "no-kernel-image":
        archs = " ".join(view.torch.get("arch_list") or [])
        if archs:
            _add_sentence(f, f"Your {g.name} is {g.sm}; this torch ({view.torch_version}) was built for {archs}.", first=True)
            f.evidence.append(Evidence(text=archs, line=None, source="torch.arch_list"))
        f.evidence.append(ev)
    elif f.category == "driver-too-old" and view.nvml_ok:
        drv = view.nvml.get("driver_version")
        _add_sentence(f, f"This machine's driver is {drv}; torch is built with CUDA {view.cuda_build or '?'}.")
        f.evidence.append(Evidence(text=str(drv), line=None, source="nvml.driver_version"))
    return None


def sharpen_finding(f: Finding, view_for: Any) -> None:
    hint = mode_hint(f)
    view, env_report = view_for(hint)
    fallback_fix = _direct(f, hint, view)
    related = RELATED.get(f.category, {f.category})
    added = False
    for e in env_report.findings:
        if e.category not in related or (e.severity == "info" and f.category != "driver-too-old"):
            continue
        _add_sentence(f, f"On this machine: {e.title}.")
        added = added or e.severity == "error"
        if e.fixes and e.fixes[0] not in f.fixes:
            if e.severity == "error":  # the machine's own cause comes first
                f.fixes.insert(0, e.fixes[0])
            else:
                f.fixes.append(e.fixes[0])
        for ev in e.evidence:
            if ev.to_dict() not in [x.to_dict() for x in f.evidence]:
                f.evidence.append(ev)
        f.facts.setdefault("machine_findings", [])
        if e.rule not in f.facts["machine_findings"]:
            f.facts["machine_findings"].append(e.rule)
    if fallback_fix and not added:
        _prepend_fix(f, fallback_fix)


def sharpen_with(report: Report, snap: dict[str, Any], source: str) -> None:
    """Amend the findings of `report` with the facts of the snapshot `snap` (judged once
    per precision a finding hints at)."""
    from .judge import judge, make_view

    cache: dict[str | None, tuple[Any, Report]] = {}

    def view_for(hint: str | None) -> tuple[Any, Report]:
        if hint not in cache:
            cache[hint] = (make_view(snap, hint), judge(snap, mixed_precision=hint, source=source))
        return cache[hint]

    for f in report.findings:
        sharpen_finding(f, view_for)
    report.input["snapshot"] = source
