"""Apply the environment rules to a snapshot: findings, the checklist, the plan.

The rules' text lives in rules/env/*.toml; their logic in env/checks/; engine.judge
joins the two. This module ranks the findings with the same model as `explain`, and
lays out the checklist (one line per area) that `mpdoctor check` prints.
"""

from __future__ import annotations

from typing import Any

from ..engine.assemble import conclude
from ..engine.judge import RuleOutcome, UnknownCheck, checks_in, judge_rules
from ..engine.rule import Rule
from ..findings import Finding, Report, rank_findings
from ..knowledge import compat
from ..knowledge.units import gib
from .checks import MODULES as CHECK_MODULES
from .checks import machine
from .plan import MODES, build_plan, fp8_matrix, what_runs
from .view import EnvView

# Checklist areas, in the order a person reads them; a rule lands in its area by
# category, or by its own `area` key where its category alone would mislead.
AREAS: list[tuple[str, str]] = [
    ("torch", "torch and CUDA runtime"),
    ("precision", "Hardware precision"),
    ("driver", "Driver and CUDA build"),
    ("arch", "GPU architecture and build"),
    ("libraries", "Library versions"),
    ("accelerate", "accelerate configuration"),
    ("memory", "Memory and GPU health"),
]
CATEGORY_AREA = {
    "cuda-unavailable": "torch", "cuda-library-missing": "libraries",
    "bf16-unsupported": "precision", "fp16-unsupported-device": "precision", "fp8-unsupported": "precision",
    "flash-attention-unsupported": "arch", "half-op-not-implemented": "precision",
    "driver-too-old": "driver", "no-kernel-image": "arch", "version-incompatible": "libraries",
    "accelerate-config": "accelerate", "out-of-memory": "memory", "host-out-of-memory": "memory",
    "cuda-kernel-fault": "memory",
}
PRECISION_CATEGORIES = {"bf16-unsupported", "fp16-unsupported-device", "fp8-unsupported"}


class EnvRuleError(ValueError):
    """An environment rule that names a check mpdoctor does not have."""


def area_of(rule: Rule) -> str:
    return rule.area or CATEGORY_AREA.get(rule.category, "accelerate")


_CHECKS: dict[str, Any] | None = None


def env_checks() -> dict[str, Any]:
    global _CHECKS
    if _CHECKS is None:
        _CHECKS = checks_in(*CHECK_MODULES, machine)
    return _CHECKS


def run_rules(view: EnvView, rules: list[Rule], observed: dict[str, Any] | None = None) -> list[RuleOutcome]:
    """Every env rule's check over the view; `observed`: facts another face saw (a
    run's first matmul dtype) for the rules' templates."""
    try:
        return judge_rules(view, rules, env_checks(), observed)
    except UnknownCheck as exc:
        raise EnvRuleError(str(exc)) from None


def env_rules(rules: list[Rule]) -> list[Rule]:
    return [r for r in rules if r.kind == "env" and not r.refines]  # refinements speak under a log finding


def make_view(snapshot: dict[str, Any], mixed_precision: str | None = None,
              requested_from: str = "--mixed-precision") -> EnvView:
    view = EnvView(snapshot)
    view.plan = build_plan(view, mixed_precision, requested_from)
    view.requested = view.plan.requested
    return view


def mode_verdicts(snapshot: dict[str, Any], rules: list[Rule], plan: Any) -> list[dict[str, Any]]:
    """Each precision mode as if it had been asked for: would it work here, and as what?"""
    precision_rules = [r for r in rules if r.category in PRECISION_CATEGORIES and r.kind == "env" and not r.refines]
    out = []
    for mode in MODES:
        view = EnvView(snapshot, requested=mode, plan=plan)
        found = [f for o in run_rules(view, precision_rules) for f in o.findings]
        runs_as, reason = what_runs(mode, view)
        worst = "error" if any(f.severity == "error" for f in found) else (
            "warning" if any(f.severity == "warning" for f in found) else "ok")
        if not view.torch_ok and not view.use_cpu:
            worst = "skipped"
            reason = ("torch is not installed" if view.torch.get("status") == "not-installed"
                      else "torch cannot be examined")
        out.append({"mode": mode, "status": worst, "runs_as": runs_as,
                    "reason": found[0].title if found else reason,
                    "rules": [f.rule for f in found]})
    return out


# --- checklist ------------------------------------------------------------------------------

def _environment_lines(view: EnvView) -> list[str]:
    s = view.snap
    p, cpu, mem = s["platform"], s["cpu"], s["memory"]
    lines = []
    host = f"Python {p.get('python', '?')} · {p.get('system', '?')} {p.get('machine', '')}".rstrip()
    if cpu.get("model"):
        host += f" · {cpu['model']}" + (f" ({cpu['logical_cores']} threads)" if cpu.get("logical_cores") else "")
    if mem.get("total_bytes"):
        host += f" · RAM {gib(mem['total_bytes'])} ({gib(mem.get('available_bytes'))} free)"
    lines.append(host)
    t = view.torch
    if view.torch_ok:
        build = (f"CUDA {t['cuda_build']}" if t.get("cuda_build") else
                 f"ROCm/HIP {t['hip_build']}" if t.get("hip_build") else "CPU-only build")
        extra = []
        if t.get("cudnn"):
            extra.append(f"cuDNN {t['cudnn']}")
        if t.get("nccl"):
            extra.append(f"NCCL {t['nccl']}")
        lines.append(f"torch {t.get('version')} ({build}{', ' + ', '.join(extra) if extra else ''})")
    elif t.get("status") == "not-installed":
        lines.append("torch: not installed" + (f" in {t['python']}" if t.get("python") else ""))
    else:
        msg = str((t.get("error") or {}).get("message") or "")
        lines.append(f"torch: {t.get('status')}" + (f" — {msg.splitlines()[0][:120]}" if msg.strip() else ""))
    libs = [f"{n} {view.pkg(n)}" for n in ("accelerate", "transformers", "deepspeed", "peft", "flash-attn",
                                         "transformer-engine", "torchao", "bitsandbytes") if view.pkg(n)]
    lines.append("libraries: " + (", ".join(libs) if libs else "accelerate not installed"))
    nv = view.nvml
    if view.nvml_ok:
        drv = nv.get("driver_version")
        cuda = compat.driver_max_cuda(drv or "0", view.windows) if drv else None
        reported = nv.get("cuda_driver_version")
        from ..knowledge.versions import cuda_int_to_str

        cuda_txt = cuda_int_to_str(reported) or cuda
        lines.append(f"NVIDIA driver {drv}" + (f" (supports CUDA ≤ {cuda_txt})" if cuda_txt else ""))
    for g in view.gpus:
        used = ((g.nvml or {}).get("memory") or {}).get("used_bytes") if g.nvml else None
        mem_txt = gib(g.total_memory_bytes) or "?"
        if used is not None:
            mem_txt += f", {gib(used)} in use"
        seen = "" if g.torch_sees else " — not usable by torch"
        lines.append(f"GPU {g.index}: {g.label} · {g.arch or '?'} · {mem_txt}{seen}")
    if not view.gpus:
        if view.mps_available:
            lines.append(f"GPU: Apple MPS (macOS {s['platform'].get('mac_version') or '?'})")
        else:
            why = (nv.get("error") or {}).get("message") if not view.nvml_ok else None
            lines.append("GPU: none visible" + (f" ({why})" if why else ""))
    return lines


def _plan_lines(view: EnvView) -> list[str]:
    plan = view.plan
    lines = []
    if plan.requested:
        eff = f" → runs as {plan.effective}" if plan.effective and plan.effective != plan.requested else ""
        why = f" ({plan.effective_reason})" if eff and plan.effective_reason else ""
        lines.append(f"requested: {plan.requested} (from {plan.requested_from}){eff}{why}")
    elif view.config_section.get("exists") and view.config is None:
        lines.append(f"requested: not known: the accelerate config {view.config_section.get('path')} cannot be read; "
                     "every mode judged")
    else:
        lines.append("requested: nothing (no --mixed-precision, no accelerate config, no ACCELERATE_MIXED_PRECISION): "
                     "every mode judged")
    if view.config_section.get("exists") or view.env.get("ACCELERATE_MIXED_PRECISION"):
        def said(mode: str | None, runs: str | None) -> str:
            if mode in (None, "no"):
                return "fp32 (mixed_precision no)"
            if runs in (None, mode):
                return mode
            return f"nothing ({mode} cannot run here)" if runs == "cannot run" else f"{runs} here (it asks for {mode})"

        lines.append(f"`accelerate launch` trains in {said(plan.under_launch, plan.launch_runs_as)}; "
                     f"`python train.py` with Accelerator() trains in {said(plan.under_python, plan.python_runs_as)}")
    for d in plan.disagreements:
        lines.append(f"disagreement: {d.first} = {d.first_value} vs {d.second} = {d.second_value}: {d.consequence}")
    return lines


def _area_summary(view: EnvView, area: str) -> str:
    gpus = view.cuda_gpus
    if area == "torch":
        if view.torch_ok:
            return f"torch imports; device for training: {view.device}"
        return ""
    if area == "precision":
        if view.device == "cuda" and gpus and not view.rocm:
            g = min(gpus, key=lambda x: x.cc)
            feats = compat.features(g.cc)
            parts = [f"{g.label}: bf16 {'native' if g.cc >= (8, 0) else 'not native'}",
                     f"TF32 {'available' if feats.get('tf32') else 'not available'}"
                     + (" (off for matmul, torch's default)" if feats.get("tf32") and
                        not (view.torch.get("tf32") or {}).get("matmul_allow_tf32") else ""),
                     f"fp8 {'yes' if g.cc >= (8, 9) else 'no'}"]
            return "; ".join(parts)
        if view.rocm:
            return "ROCm: " + ", ".join(sorted({g.label for g in view.gpus}))
        if view.device == "mps":
            return "Apple MPS"
        flags = view.snap["cpu"].get("flags") or {}
        native = any(flags.get(f) for f in ("avx512_bf16", "amx_bf16", "bf16"))
        return f"CPU only: bf16 {'native' if native else 'emulated (no avx512_bf16/AMX)'}; fp16 and fp8 need a GPU"
    if area == "driver":
        if view.nvml_ok and view.cuda_build:
            return f"driver {view.nvml.get('driver_version')} runs CUDA {view.cuda_build} builds"
        return ""
    if area == "arch":
        archs = view.torch.get("arch_list") or []
        if gpus and archs:
            return ", ".join(sorted({g.sm for g in gpus if g.sm})) + f" covered by the build ({archs[0]} … {archs[-1]})"
        return ""
    if area == "libraries":
        if view.accelerate and view.torch_version:
            return f"accelerate {view.accelerate} fits torch {view.torch_version}"
        return ""
    if area == "accelerate":
        cfg = view.config
        if cfg is not None:
            return (f"{view.config_section.get('path')}: {cfg.get('distributed_type', 'NO')}, "
                    f"{cfg.get('num_processes', 1)} process(es), mixed_precision {cfg.get('mixed_precision', 'no')}")
        return "no accelerate config file (" + str(view.config_section.get("path")) + ")"
    if area == "memory":
        mem = view.snap["memory"]
        parts = []
        for g in view.nvml_gpus:
            m = g.get("memory") or {}
            if m.get("free_bytes") is not None:
                parts.append(f"GPU {g.get('index')}: {gib(m['free_bytes'])} free of {gib(m.get('total_bytes'))}")
        if mem.get("available_bytes"):
            parts.append(f"host: {gib(mem['available_bytes'])} free")
        return "; ".join(parts)
    return ""


def _checklist(view: EnvView, outcomes: list[RuleOutcome], modes: list[dict[str, Any]],
               matrix: list[dict[str, Any]]) -> dict[str, Any]:
    areas = []
    for key, title in AREAS:
        mine = [o for o in outcomes if area_of(o.rule) == key]
        findings = rank_findings([f for o in mine for f in o.findings])
        judged = [o for o in mine if o.skipped is None]
        if any(f.severity == "error" for f in findings):
            status = "error"
        elif any(f.severity == "warning" for f in findings):
            status = "warning"
        elif judged:
            status = "ok"
        else:
            status = "skipped"
        items = [{"severity": f.severity, "title": f.title, "rule": f.rule, "count": f.count,
                  "fix": f.fixes[0] if f.fixes else None} for f in findings]
        skipped = [{"rule": o.rule.id, "reason": o.skipped} for o in mine if o.skipped]
        summary = _area_summary(view, key) if status in ("ok",) or not items else ""
        if status == "skipped" and skipped:
            summary = skipped[0]["reason"]
        areas.append({"id": key, "title": title, "status": status, "summary": summary,
                      "items": items, "skipped": skipped})
    return {
        "environment": _environment_lines(view),
        "plan": _plan_lines(view),
        "modes": modes,
        "areas": areas,
        "fp8": matrix if (view.requested == "fp8" or any(m["mode"] == "fp8" for m in modes)) else [],
        "skipped": [{"rule": o.rule.id, "reason": o.skipped} for o in outcomes if o.skipped],
    }


def judge(snapshot: dict[str, Any], *, rules: list[Rule], mixed_precision: str | None = None,
          source: str = "live", observed: dict[str, Any] | None = None,
          requested_from: str = "--mixed-precision") -> Report:
    """The environment report: ranked findings, and in `extra` the checklist, the
    precision plan, the per-mode verdicts and the fp8 matrix.

    `observed`: what another face saw this environment do (a run's first matmul
    dtype), for the rules' templates; `requested_from`: who asked for
    `mixed_precision` (check's option, or a run's Accelerator)."""
    rules_env = env_rules(rules)
    view = make_view(snapshot, mixed_precision, requested_from)
    view.observed = dict(observed or {})
    outcomes = run_rules(view, rules_env, observed)
    findings = conclude([f for o in outcomes for f in o.findings], {r.id: r for r in rules_env})
    modes = mode_verdicts(snapshot, rules_env, view.plan) if view.requested is None else []
    matrix = fp8_matrix(view)
    checklist = _checklist(view, outcomes, modes, matrix)
    report = Report(findings=findings, input={"snapshot": source, "schema": snapshot.get("schema"),
                                              "collected_at": snapshot.get("collected_at")})
    report.extra = {
        "checklist": checklist,
        "precision_plan": view.plan.to_dict(),
        "modes": modes,
        "fp8": matrix,
        "skipped": checklist["skipped"],
    }
    return report


# --- rule self-tests (mpdoctor rules test) --------------------------------------------------------

def snapshot_case(path: str, rules: list[Rule]) -> list[Finding]:
    """How `rules test` judges an env rule's snapshot example: as `check --snapshot`."""
    from .snapshot import read_snapshot_file

    return judge(read_snapshot_file(path), rules=rules, source=path).findings
