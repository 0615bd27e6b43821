"""`explain --snapshot FILE` / `explain --here`: the machine's facts sharpen the
explanation of a log.

A log says what failed; the snapshot says on what. Each log finding gets the
environment findings of its own kind (judged with the precision the log points at),
framed by the [on_this_machine] words of rules/_frames.toml, and the sentences of the
refinement rules (rules/env/machine-*.toml: `refines = [categories]`) whose check the
machine's facts settle: a bf16 cuBLAS failure on a V100 says "your Tesla V100 (sm_70)
has no bf16: use fp16"; an OOM in fp32 on a 24 GiB GPU says which half precision that
GPU has. Every word is a rule's; the finding is re-rendered by the one assembler.
"""

from __future__ import annotations

import re
from typing import Any

from ..engine.assemble import assemble
from ..engine.derive.fit import fit, machine_facts
from ..engine.judge import judge_rules
from ..engine.rule import Rule
from ..findings import Finding, Report

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


# The log categories whose finding says, by itself, which precision the training asked for.
_ASKS = {"fp8-unsupported": "fp8", "bf16-unsupported": "bf16", "fp16-unsupported-device": "fp16"}


def asked_precision(findings: list[Finding]) -> str | None:
    """The precision a run's failure says it asked for, where the run's plan never learnt
    it (an Accelerator whose __init__ raised: `Accelerator(mixed_precision="fp8")`
    without a backend): the env rules then judge the same plan as `check`."""
    for f in findings:
        if f.category in _ASKS:
            return _ASKS[f.category]
    return None


def refinement_findings(f: Finding, view: Any, rules: list[Rule]) -> list[Finding]:
    """The refinement rules' findings for log finding `f` on the machine `view` (made
    for `f`'s precision): each says one thing the machine settles."""
    from ..env.judge import env_checks

    mine = [r for r in rules if r.kind == "env" and f.category in r.refines]
    if not mine:
        return []
    view.hint = mode_hint(f)
    return [x for o in judge_rules(view, mine, env_checks()) for x in o.findings]


def sharpen_finding(f: Finding, view_for: Any, rules: list[Rule], by_id: dict[str, Rule],
                    machine_fit: dict[str, Any] | None = None) -> None:
    """`machine_fit`: the machine's device and transformers (fit.machine_facts): a finding
    whose rule computed fit facts (the autocast's device, `dtype=` or `torch_dtype=`) is
    said again with this machine's."""
    hint = mode_hint(f)
    view, env_report = view_for(hint)
    related = RELATED.get(f.category, {f.category})
    refinements = list(f.refinements)
    evidence = list(f.evidence)
    machine = list(f.facts.get("machine_findings") or [])
    machine_error = False
    # a machine finding whose rule supersedes the log's (fp8 on a machine without fp8
    # hardware over "install an fp8 backend"): its fixes replace the log rule's own
    replaced = False
    seen_ev = [e.to_dict() for e in evidence]
    for e in env_report.findings:
        if e.category not in related or (e.severity == "info" and f.category != "driver-too-old"):
            continue
        machine_error = machine_error or e.severity == "error"
        env_rule = by_id.get(e.rule)
        replaced = replaced or bool(env_rule is not None and f.rule in (env_rule.supersedes or ()))
        # the machine's own cause comes first among the fixes
        refinements.append(("last", "first" if e.severity == "error" else "last", "on_this_machine",
                            {"title": e.title, "fix": e.fixes[0] if e.fixes else None}))
        for ev in e.evidence:
            if ev.to_dict() not in seen_ev:
                evidence.append(ev)
                seen_ev.append(ev.to_dict())
        if e.rule not in machine:
            machine.append(e.rule)
    added_facts: dict[str, Any] = {}
    for r in refinement_findings(f, view, rules):
        rule = by_id[r.rule]
        fixes_at = None if (rule.fix_when_alone and machine_error) else rule.fix_position
        refinements.append((rule.position, fixes_at, rule, dict(r.all_facts or r.facts)))
        for k, v in r.facts.items():
            if k.startswith("machine_"):
                added_facts.setdefault(k, v)
        for ev in r.evidence:
            if ev.to_dict() not in seen_ev:
                evidence.append(ev)
                seen_ev.append(ev.to_dict())
    facts = dict(f.all_facts if f.all_facts is not None else f.facts)
    refit: dict[str, Any] = {}
    if machine_fit and "_ac_dev_arg" in facts:  # the rule's fixes fit a device and a transformers
        # what the log itself shows comes first; the machine fills what it does not say
        gaps = {k: v for k, v in machine_fit.items()
                if not (k == "_run_device" and facts.get("_ac_device"))
                and not (k == "_run_transformers" and facts.get("_tf_known"))}
        refit = {k: v for k, v in fit({**facts, **gaps}).items() if facts.get(k) != v} if gaps else {}
    if len(refinements) == len(f.refinements) and not refit:
        return
    own = by_id.get(f.rule)
    if own is None:
        return
    facts.update(refit)
    for k, v in added_facts.items():
        facts.setdefault(k, v)
    if machine:
        facts["machine_findings"] = machine
    fresh = assemble(own, facts, evidence, count=f.count, ranks=f.ranks, likely=f.likely, refinements=refinements)
    if replaced:
        mine = set(assemble(own, facts, evidence, count=f.count, ranks=f.ranks, likely=f.likely).fixes)
        fresh.fixes = [x for x in fresh.fixes if x not in mine] or fresh.fixes
    f.title, f.explanation, f.fixes = fresh.title, fresh.explanation, fresh.fixes
    f.evidence, f.refinements = fresh.evidence, fresh.refinements
    f.facts = {**f.facts, **{k: v for k, v in fresh.facts.items() if k not in f.facts}}
    f.all_facts = fresh.all_facts


def sharpen_with(report: Report, snap: dict[str, Any], source: str, rules: list[Rule]) -> None:
    """Amend the findings of `report` with the facts of the snapshot `snap` (judged once
    per precision a finding hints at)."""
    from ..env.judge import judge, make_view

    by_id = {r.id: r for r in rules}
    cache: dict[str | None, tuple[Any, Report]] = {}

    def view_for(hint: str | None) -> tuple[Any, Report]:
        if hint not in cache:
            cache[hint] = (make_view(snap, hint), judge(snap, mixed_precision=hint, rules=rules, source=source))
        return cache[hint]

    fitted = machine_facts(snap)
    for f in report.findings:
        sharpen_finding(f, view_for, rules, by_id, fitted)
    report.input["snapshot"] = source
