"""The instrumentation's records -> Findings. Pure Python over the snapshot dict (the
same dict the events files carry), so the wrapper builds the same findings from a
child's file as `watch().findings()` does in process."""

from __future__ import annotations

from typing import Any

from ..findings import Evidence, Finding

SOURCE = "instrument"


def _num(x: Any) -> str:
    if x is None:
        return "?"
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            return str(x)
        return f"{x:.6g}"
    return str(x)


def _where(module: str, module_type: str) -> str:
    if module in ("(loss)", ""):
        return "the loss"
    return f"`{module}`" + (f" ({module_type})" if module_type and module_type != module else "")


def _what(kind: str) -> str:
    return "NaN" if kind == "nan" else "Inf"


def nonfinite_finding(nf: dict[str, Any]) -> Finding:
    module, phase, step, dtype, kind = nf["module"], nf["phase"], nf["step"], nf["dtype"], nf["kind"]
    where = _where(module, nf.get("module_type", ""))
    origin = nf.get("origin", "module")
    facts = {k: nf.get(k) for k in ("module", "phase", "step", "dtype", "kind", "module_type", "origin",
                                    "input_min", "input_max", "input_dtype", "steps_affected")
             if nf.get(k) not in (None, "")}
    in_range = ""
    if nf.get("input_min") is not None:
        in_range = f" from an input in [{_num(nf['input_min'])}, {_num(nf['input_max'])}]" + (
            f" ({nf['input_dtype']})" if nf.get("input_dtype") else "")
    dt = f", {dtype}" if dtype else ""
    title = f"{_what(kind)} first appeared in {where} ({phase}, step {step}{dt})"
    explanation: list[str] = []
    fixes: list[str] = []
    if phase == "forward" and origin == "module":
        explanation.append(f"The first non-finite value of the run came out of {where} in the forward pass of "
                           f"step {step}{in_range}: the input was finite, so this module made it.")
        if kind == "inf" and dtype == "float16":
            in_abs = max(abs(nf.get("input_min") or 0.0), abs(nf.get("input_max") or 0.0))
            if in_abs > 65504:
                explanation.append(f"Its input already reached {_num(in_abs)} in {nf.get('input_dtype')}: casting it "
                                   "into this module's float16 computation overflowed.")
            explanation.append("float16 cannot hold a value above 65504; a larger activation becomes Inf, and "
                               "Inf turns into NaN in the next subtraction or normalisation.")
            fixes += ["Train in bf16 instead of fp16 where the hardware has it (`mixed_precision=\"bf16\"`): "
                      "same range as fp32.",
                      f"Keep {where} in float32: wrap it in `torch.autocast(device_type, enabled=False)` and "
                      "feed it `.float()` inputs.",
                      "Bring the activations down: check the input scale, lower the learning rate, clip gradients."]
        else:
            fixes += [f"Look inside {where} for log/sqrt/division/exp of values that can be zero, negative "
                      "or large; add an epsilon or clamp.",
                      "Lower the learning rate or clip gradients if the weights grew until they overflowed."]
    elif phase == "forward" and origin == "input":
        explanation.append(f"The input that reached {where} at step {step} already contained {_what(kind)}: it came "
                           "from the data or from functional code between modules, not from a module's weights.")
        fixes += ["Check the batch for NaN/Inf (`torch.isfinite(batch).all()`), and any tensor arithmetic done "
                  "outside modules before this one."]
    elif origin == "loss":
        explanation.append(f"Every module's output was finite; the loss computed outside the modules was "
                           f"{_what(kind)} at step {step}{' (in the backward pass)' if phase == 'backward' else ''}.")
        fixes += ["Look at the loss computation: log of zero, division by a zero count, a mask that selects "
                  "nothing; compute the loss in float32."]
    elif origin == "param-grad":
        explanation.append(f"A gradient of a parameter of {where} was non-finite at step {step} while the "
                           "activations were finite.")
        fixes += ["Clip gradients (`clip_grad_norm_`) and look for operations whose derivative is infinite at "
                  "the values seen (sqrt at 0, log at 0, pow with a fractional exponent)."]
    else:
        explanation.append(f"The forward pass of step {step} was finite; the gradient that the backward pass of "
                           f"{where} produced for its input was {_what(kind)}{dt}.")
        fixes += [f"Look at the derivative of what {where} computes: sqrt/log/pow/norm at 0, division by a small "
                  "value, a custom autograd Function.",
                  "Clip gradients, or compute this module in float32."]
    if nf.get("steps_affected", 1) > 1:
        explanation.append(f"Non-finite values were seen on {nf['steps_affected']} steps in all.")
    ev = Evidence(text=f"{module} · {phase} · step {step}{dt}: {_what(kind)}{in_range}", source=SOURCE)
    rule = f"instrument-nonfinite-{phase}"
    return Finding(rule=rule, category="non-finite-values", severity="error", title=title,
                   explanation=" ".join(explanation), fixes=fixes, evidence=[ev], facts=facts, priority=70)


def overflow_finding(ow: dict[str, Any]) -> Finding:
    where = _where(ow["module"], ow.get("module_type", ""))
    pct = 100.0 * ow["absmax"] / ow["limit"]
    return Finding(
        rule="instrument-near-overflow", category="fp16-value-overflow", severity="warning",
        title=f"{where} reached {_num(ow['absmax'])} in {ow['dtype']}, {pct:.0f}% of its largest value",
        explanation=f"At step {ow['step']} the output of {where} reached {_num(ow['absmax'])}; {ow['dtype']} "
                    f"stops at {_num(ow['limit'])}. A little more growth turns it into Inf."
                    + (" The large values went on into " + ", ".join(f"`{a}`" for a in ow["also"]) + "."
                       if ow.get("also") else ""),
        fixes=["Run this module in float32 or train in bf16.",
               "Check what makes it grow: input scale, learning rate, missing normalisation."],
        evidence=[Evidence(text=f"{ow['module']} · forward · step {ow['step']}: |max| {_num(ow['absmax'])} "
                                f"of {_num(ow['limit'])} ({ow['dtype']})", source=SOURCE)],
        facts={"module": ow["module"], "phase": "forward", "step": ow["step"], "dtype": ow["dtype"],
               "absmax": ow["absmax"], "limit": ow["limit"]},
        priority=40)


def scaler_findings(sc: dict[str, Any]) -> list[Finding]:
    skipped = sc.get("skipped_steps") or []
    updates = sc.get("updates") or 0
    if not skipped or not updates:
        return []
    final = sc.get("final_scale")
    run = best = 0
    prev = None
    for s in skipped:
        run = run + 1 if prev is not None and s == prev + 1 else 1
        best = max(best, run)
        prev = s
    collapsed = (final is not None and final < 1.0) or best >= 10
    frac = len(skipped) / updates
    if not collapsed and not (updates >= 20 and frac > 0.2):
        return []  # a few skips while the scale settles are how the scaler works
    facts = {"skipped": len(skipped), "updates": updates, "initial_scale": sc.get("initial_scale"),
             "final_scale": final, "longest_skip_run": best, "first_skipped_step": skipped[0]}
    title = (f"The loss scale collapsed to {_num(final)}: {len(skipped)} of {updates} steps skipped" if collapsed
             else f"The loss scaler skipped {len(skipped)} of {updates} steps")
    shown = ", ".join(str(s) for s in skipped[:12]) + (" ..." if len(skipped) > 12 else "")
    return [Finding(
        rule="instrument-loss-scale", category="loss-scale-overflow", severity="error" if collapsed else "warning",
        title=title,
        explanation="The dynamic loss scaler found Inf/NaN gradients and skipped the optimizer step, halving the "
                    f"scale each time (from {_num(sc.get('initial_scale'))} to {_num(final)}). When the gradients "
                    "overflow at any scale, the model stops learning while the loss still prints.",
        fixes=["Find where the values overflow (the non-finite finding above names the module) and keep it in "
               "float32, or train in bf16, which needs no loss scaling.",
               "Lower the learning rate or clip gradients after `scaler.unscale_(optimizer)`."],
        evidence=[Evidence(text=f"skipped steps: {shown}; scale {_num(sc.get('initial_scale'))} -> {_num(final)}",
                           source=SOURCE)],
        facts=facts, priority=60)]


_ERROR_KIND = {
    "dtype": ("dtype-mismatch", "a dtype mismatch"),
    "device": ("device-mismatch", "a device mismatch"),
    "half-op": ("half-op-not-implemented", "a missing half-precision kernel"),
    "oom": ("out-of-memory", "out of memory"),
    "host-oom": ("host-out-of-memory", "a host memory allocation failure"),
}


def error_finding(err: dict[str, Any]) -> Finding | None:
    kind = err.get("kind")
    if kind not in _ERROR_KIND:
        return None
    category, what = _ERROR_KIND[kind]
    module = err.get("module") or ""
    where = _where(module, err.get("module_type", "")) if module else "the training code (outside any module)"
    params = ", ".join(f"{n}× {k}" for k, n in (err.get("params") or {}).items()) or "none"
    inputs = "; ".join(f"{i['dtype']} {i['device']} {tuple(i['shape'])}" for i in err.get("inputs") or []) or "none"
    ac = err.get("autocast") or {}
    autocast = ", ".join(f"{d}: {dt}" for d, dt in ac.items()) if ac else "off"
    facts: dict[str, Any] = {"module": module or None, "module_type": err.get("module_type") or None,
                             "step": err.get("step"), "phase": "forward" if module else None}
    explanation: list[str] = []
    evidence = [Evidence(text=err.get("exception", ""), source=SOURCE)]
    if kind in ("dtype", "device", "half-op"):
        facts.update({"param_dtypes": err.get("params"), "inputs": err.get("inputs"), "autocast": ac or "off"})
        explanation.append(f"The forward of {where} raised at step {err.get('step')}. Its parameters: {params}; "
                           f"its inputs: {inputs}; autocast: {autocast}.")
        evidence.append(Evidence(text=f"{module} params [{params}] · inputs [{inputs}] · autocast {autocast}",
                                 source=SOURCE))
        fixes = []
        if kind == "dtype":
            fixes = [f"Make {where}'s parameters and its input the same dtype: don't `.half()`/`.to(dtype)` one "
                     "submodule alone, or cast its input with `.to(param.dtype)`.",
                     "Or run the forward under autocast (accelerate's `mixed_precision`), which casts per op."]
        elif kind == "device":
            fixes = [f"Move {where} and its inputs to one device (`accelerator.prepare(model)` or `.to(device)` "
                     "for the model and every batch)."]
        else:
            fixes = [f"Run {where} in float32 on this device, or use a device with half kernels."]
    else:
        mem = err.get("memory") or {}
        host, dev = mem.get("host") or {}, mem.get("device") or {}
        facts["batch_shape"] = err.get("batch_shape")
        if mem.get("requested_bytes") is not None:
            facts["requested_bytes"] = mem["requested_bytes"]
        parts = []
        if dev and "allocated" in dev:
            parts.append(f"device {dev.get('device')}: allocated {dev['allocated']}, reserved {dev['reserved']}, "
                         f"peak {dev['peak_allocated']}, free {dev.get('free')} of {dev.get('total')}")
            if dev.get("largest_allocations"):
                parts.append("largest allocations " + ", ".join(dev["largest_allocations"]))
            facts.update({k: v for k, v in dev.items() if k.endswith("_bytes")})
        if host:
            parts.append(f"process RSS {host.get('vmrss', '?')} (peak {host.get('vmhwm', '?')}), machine "
                         f"{host.get('memavailable', '?')} available of {host.get('memtotal', '?')}")
            facts.update({f"host_{k}": v for k, v in host.items() if k.endswith("_bytes")})
        explanation.append(f"The allocation failed in {where} at step {err.get('step')}"
                           + (f" with a batch of shape {tuple(err['batch_shape'])}" if err.get("batch_shape") else "")
                           + ". " + "; ".join(parts) + ".")
        evidence.append(Evidence(text="; ".join(parts) or "no memory statistics", source=SOURCE))
        fixes = ["Lower the batch size (or use gradient accumulation) and retry.",
                 "Look at the requested size: a tensor far larger than the batch suggests a shape bug "
                 "(a broadcast or a view over the wrong dimension)."]
    facts = {k: v for k, v in facts.items() if v is not None}
    return Finding(rule=f"instrument-forward-{kind}", category=category, severity="error",
                   title=f"{where[0].upper() + where[1:]} failed with {what}", explanation=" ".join(explanation),
                   fixes=fixes, evidence=evidence, facts=facts, priority=65)


def plan_findings(plan: dict[str, Any], snap: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    trainable = (plan.get("params") or {}).get("trainable") or {}
    opt = plan.get("optimizer_param_dtypes") or {}
    low_trainable = {k: v for k, v in {**trainable, **opt}.items() if k in ("float16", "bfloat16")}
    if plan.get("grad_scaler") and plan.get("grad_scaler_enabled") and low_trainable.get("float16"):
        out.append(Finding(
            rule="instrument-fp16-params-with-scaler", category="fp16-gradient-unscale", severity="warning",
            title=f"{low_trainable['float16']:,} trainable parameters are float16 and a GradScaler is in use",
            explanation="GradScaler keeps fp32 master weights' gradients; with the parameters themselves in "
                        "float16 its unscale_ raises \"Attempting to unscale FP16 gradients\" (or, without it, "
                        "small updates vanish).",
            fixes=["Keep the model in float32 and let autocast / `mixed_precision=\"fp16\"` do the casting "
                   "(remove `.half()` / `torch_dtype=torch.float16` for trained weights)."],
            evidence=[Evidence(text=f"trainable parameter dtypes {trainable}; GradScaler enabled", source=SOURCE)],
            facts={"trainable_float16": low_trainable["float16"], "grad_scaler": True}, priority=60))
    frac = plan.get("unchanged_fraction")
    if frac is not None and frac > 0.5 and plan.get("fp32_master_weights") is False:
        out.append(Finding(
            rule="instrument-low-precision-updates-lost", category="accelerate-config", severity="warning",
            title=f"{frac:.0%} of the sampled weights did not change in an optimizer step",
            explanation="The optimizer updates low-precision (bf16/fp16) parameters directly, with no fp32 master "
                        "copy; an update smaller than the weight's rounding step (about 1/256 of it in bf16) is "
                        "lost, so most of the model stops learning while the loss looks plausible.",
            fixes=["Keep the trained parameters in float32 and use `mixed_precision=\"bf16\"` (autocast) instead "
                   "of casting the model to bf16.",
                   "Or use an optimizer with fp32 master weights / stochastic rounding."],
            evidence=[Evidence(text=f"{plan.get('unchanged_sampled')} sampled weights with a non-zero gradient; "
                                    f"{frac:.1%} unchanged after the step; optimizer dtypes {opt}", source=SOURCE)],
            facts={"unchanged_fraction": round(frac, 4), "sampled": plan.get("unchanged_sampled"),
                   "optimizer_param_dtypes": opt}, priority=55))
    lz = snap.get("loss_zero_grad_nan")
    if lz:
        out.append(Finding(
            rule="instrument-loss-zero-grad-nan", category="non-finite-values", severity="warning",
            title=f"The loss was 0.0 at step {lz[0]} while the gradient norm was {_num(lz[1])}",
            explanation="A loss that prints as 0.0 looks like convergence, but its gradients were non-finite: the "
                        "loss underflowed (or was masked to zero) while the backward pass overflowed.",
            fixes=["Compute the loss in float32 and check the gradient norm each step "
                   "(`clip_grad_norm_` returns it)."],
            evidence=[Evidence(text=f"step {lz[0]}: loss 0.0, grad norm {_num(lz[1])}", source=SOURCE)],
            facts={"step": lz[0], "grad_norm": lz[1]}, priority=55))
    req, ran = plan.get("requested"), plan.get("autocast_dtype")
    want = {"fp16": "float16", "bf16": "bfloat16"}.get(req or "")
    if want and ran and ran != want:
        out.append(Finding(
            rule="instrument-precision-not-applied", category="accelerate-config", severity="warning",
            title=f"mixed_precision={req} was requested but the first matmul ran in {ran}",
            explanation=f"accelerate was configured for {req}, yet the first Linear/conv "
                        f"(`{plan.get('autocast_module')}`) produced {ran}"
                        + (" with autocast off" if not plan.get("autocast_enabled") else "")
                        + ": the forward ran outside `accelerator.autocast()` / the prepared model.",
            fixes=["Call the model returned by `accelerator.prepare(...)`, not the original object.",
                   "Wrap custom forward code in `with accelerator.autocast():`."],
            evidence=[Evidence(text=f"requested {req}; first matmul ({plan.get('autocast_module')}) output {ran}",
                               source=SOURCE)],
            facts={"requested": req, "autocast_dtype": ran, "module": plan.get("autocast_module")}, priority=45))
    return out


def internal_findings(errors: list[str]) -> list[Finding]:
    if not errors:
        return []
    return [Finding(
        rule="instrument-internal-error", category="version-incompatible", severity="info",
        title="mpdoctor's instrumentation stopped itself (the training was not affected)",
        explanation="An error inside mpdoctor's hooks was caught; the hooks turned themselves off and the run "
                    "went on untouched. The diagnosis rests on the output only.",
        fixes=["Report it with `mpdoctor collect` output if it repeats."],
        evidence=[Evidence(text=e, source=SOURCE) for e in errors[:3]],
        facts={"errors": len(errors)}, priority=10)]


def plan_summary_finding(plan: dict[str, Any]) -> Finding:
    params = plan.get("params") or {}
    trainable = ", ".join(f"{k} {v:,}" for k, v in (params.get("trainable") or {}).items()) or "none"
    frozen = ", ".join(f"{k} {v:,}" for k, v in (params.get("frozen") or {}).items()) or "none"
    bits = [f"requested {plan.get('requested') or 'nothing (no accelerate)'}",
            f"first matmul ran in {plan.get('autocast_dtype') or '?'}"
            + (" under autocast" if plan.get("autocast_enabled") else ""),
            f"trainable params {trainable}; frozen {frozen}",
            f"GradScaler {'on' if plan.get('grad_scaler_enabled') else ('off' if plan.get('grad_scaler') else 'none')}",
            f"fp32 master weights {plan.get('fp32_master_weights')}"]
    if plan.get("distributed_type"):
        bits.append(f"{plan['distributed_type']} × {plan.get('num_processes')}")
    if plan.get("prepared"):
        bits.append("prepared: " + ", ".join(k for k, v in plan["prepared"].items() if v))
    return Finding(rule="instrument-precision-plan", category="accelerate-config", severity="info",
                   title="The precision the run really used", explanation="; ".join(bits) + ".",
                   evidence=[Evidence(text="; ".join(bits), source=SOURCE)],
                   facts={k: plan.get(k) for k in ("requested", "autocast_dtype", "grad_scaler_enabled",
                                                   "fp32_master_weights", "distributed_type", "num_processes")
                          if plan.get(k) is not None}, priority=5)


def findings_for(snap: dict[str, Any], *, with_plan: bool = False) -> list[Finding]:
    out: list[Finding] = []
    nonfinite = snap.get("nonfinite") or []
    for i, nf in enumerate(nonfinite):
        f = nonfinite_finding(nf)
        if i:  # later than the first: what the first one left behind (NaN'd weights, ...)
            first = nonfinite[0]
            f.consequence = True
            f.explanation = (f"This follows the {_what(first['kind'])} found earlier (step {first['step']}, "
                             f"{first['phase']}, `{first['module']}`). " + f.explanation)
        out.append(f)
    for err in snap.get("errors") or []:
        f = error_finding(err)
        if f is not None:
            out.append(f)
    for ow in snap.get("overflow") or []:
        out.append(overflow_finding(ow))
    out += scaler_findings(snap.get("scaler") or {})
    out += plan_findings(snap.get("plan") or {}, snap)
    out += internal_findings(snap.get("internal_errors") or [])
    if with_plan and snap.get("plan"):
        out.append(plan_summary_finding(snap["plan"]))
    return out
