"""From the children's measurements to rows, findings and a recommendation.

Pure Python over the children's JSON (no torch). The rules of honesty live here:
a mode whose first matmul did not run in the requested dtype gets no speed-up and
no memory saving (it did not happen), and a failed mode's error is explained by the
rule base, exactly as `mpdoctor explain` would explain that stderr.
"""

from __future__ import annotations

import math
import signal
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..findings import Evidence, Finding, rank_findings
from .runner import ChildOutcome, ProbeOptions

FP16_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38
# The dtype the first matmul must produce for a mode to count as having run.
EXPECTED_DTYPE = {"no": "float32", "fp16": "float16", "bf16": "bfloat16"}
# Below these a difference is within what two identical fp32 runs differ by here.
MIN_SPEEDUP = 1.10
MIN_MEMORY_SAVING = 0.10
MAX_LOSS_REL_DIFF = 0.02
MAX_SKIPPED_FRACTION = 0.2
# Other processes' share of the CPUs during a mode's timing above which its timings
# are called unreliable.
BUSY_SHARE = 0.15
# A mode whose step times' interquartile range exceeds this share of their median was
# timed in noise (the CPU's frequency, a neighbour's burst), not in its precision.
MAX_SPREAD = 0.5


@dataclass
class ModeRow:
    mode: str
    ok: bool
    baseline_only: bool = False
    steps: int | None = None
    ran_as_requested: bool | None = None
    step_time_s: float | None = None
    step_time_spread: float | None = None
    speedup: float | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    memory_saving: float | None = None
    final_loss: float | None = None
    loss_rel_diff: float | None = None
    logits_rel_diff: float | None = None
    autocast_dtype: str | None = None
    skipped_steps: int | None = None
    final_scale: float | None = None
    nonfinite_count: int = 0
    peak_activation: float | None = None
    cpu_used_by_others: float | None = None
    error: str | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    note: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {k: _json_number(v) for k, v in self.__dict__.items() if k != "findings"}
        out["findings"] = [f.to_dict() for f in self.findings]
        return out


def _json_number(v: Any) -> Any:
    # JSON has no inf/nan: a non-finite measurement is null (its count says why).
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _spread(times: list[float]) -> float | None:
    if len(times) < 4:
        return None
    q = statistics.quantiles(times, n=4)
    med = statistics.median(times)
    return (q[2] - q[0]) / med if med > 0 else None


def _max_rel_diff(a: list[float] | None, ref: list[float] | None) -> float | None:
    """Largest absolute difference over the largest reference magnitude: elementwise
    relative differences blow up at logits near zero and would say nothing."""
    if not a or not ref or len(a) != len(ref):
        return None
    scale = max(abs(x) for x in ref)
    if not math.isfinite(scale) or scale == 0:
        return None
    worst = 0.0
    for x, y in zip(a, ref):
        d = abs(x - y)
        if not math.isfinite(d):  # an overflowed logit: no finite difference to report
            return math.inf
        if d > worst:
            worst = d
    return worst / scale


def _death(out: ChildOutcome, opts: ProbeOptions) -> str:
    where = f"during {out.last_phase}" if out.last_phase else "before it started"
    if out.last_phase == "train":
        where += f" (after step {out.last_step} of {opts.steps})"
    if out.timed_out:
        return f"timed out after {opts.timeout_s:g} s {where}; the child was killed"
    rc = out.returncode
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
        extra = " (with no traceback: often the kernel's OOM killer)" if -rc == signal.SIGKILL else ""
        return f"killed by {name} {where}{extra}"
    last = _last_exception_line(out.stderr_tail)
    return last or f"exited with status {rc} {where}"


def _last_exception_line(text: str) -> str | None:
    import re

    # The last line that looks like `SomeError: message` at the start of a line.
    found = None
    for line in text.splitlines():
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*", line):
            found = line.strip()
    return found


def _explain(text: str, rules: list[str]) -> tuple[list[Finding], list[str]]:
    """The rule base over a child's stderr, as `mpdoctor explain` sees it."""
    if not text.strip():
        return [], []
    from ..engine.rules import load_rules
    from ..explain import explain_text

    report = explain_text(text, load_rules(rules))
    return report.findings, [u.exception for u in report.unrecognised]


def _tagged(f: Finding, mode: str) -> Finding:
    """Every probe finding says which mode's run it rests on (facts.mode)."""
    if f.facts.get("mode") != mode:
        f.facts = {"mode": mode, **{k: v for k, v in f.facts.items() if k != "mode"}}
    return f


def build_rows(outcomes: list[ChildOutcome], opts: ProbeOptions) -> list[ModeRow]:
    base = next((o for o in outcomes if o.mode == "no"), None)
    base_res = base.result if base else None
    rows = []
    for out in outcomes:
        row = ModeRow(mode=out.mode, ok=out.result is not None, baseline_only=out.baseline_only,
                      timed_out=out.timed_out, wall_s=round(out.wall_s, 2))
        if out.result is None:
            row.error = _death(out, opts)
            found, unknown = _explain(out.stderr_tail, opts.rules)
            row.findings = [_tagged(f, out.mode) for f in found]
            if not found and unknown:
                row.note = f"not recognised by the rule base: {unknown[-1]}"
        else:
            _fill_measured(row, out.result, base_res, opts)
            found, _ = _explain(out.stderr_tail, opts.rules)
            row.findings = [_tagged(f, out.mode) for f in found + _own_findings(row, out.result, base_res, opts)]
        row.findings = _dedupe(rank_findings(row.findings))
        rows.append(row)
    return rows


def _fill_measured(row: ModeRow, res: dict[str, Any], base: dict[str, Any] | None, opts: ProbeOptions) -> None:
    obs = res.get("observed", {})
    row.autocast_dtype = res.get("autocast_dtype")
    row.steps = res.get("steps")
    if row.mode == "fp8":
        row.ran_as_requested = res.get("fp8_modules", 0) > 0
    else:
        row.ran_as_requested = row.autocast_dtype == EXPECTED_DTYPE[row.mode]
    times = res.get("step_times_s", [])[res.get("warmup", 0):]
    row.step_time_s = res.get("step_time_s")
    row.step_time_spread = _spread(times)
    row.peak_memory_bytes = res.get("peak_memory_bytes")
    row.memory_kind = res.get("memory_kind")
    row.final_loss = res.get("final_loss")
    row.skipped_steps = obs.get("skipped_steps", 0)
    row.final_scale = obs.get("scaler", {}).get("final_scale")
    # Steps whose loss was non-finite, plus the fixed batch if its logits were; a module
    # watch() saw go non-finite while the loss stayed finite still counts once.
    row.nonfinite_count = int(obs.get("nonfinite_count", 0)) + int(res["eval"].get("nonfinite_logits", 0) > 0)
    if not row.nonfinite_count and obs.get("module_nonfinite"):
        row.nonfinite_count = 1
    row.peak_activation = res["eval"].get("peak_abs")
    row.cpu_used_by_others = res.get("cpu_used_by_others")
    if base is None:
        return
    real = row.ran_as_requested or row.mode == "no"
    if real and row.step_time_s and base.get("step_time_s"):
        row.speedup = base["step_time_s"] / row.step_time_s
    if (real and row.peak_memory_bytes and base.get("peak_memory_bytes")
            and res.get("memory_kind") == base.get("memory_kind")):
        row.memory_saving = 1.0 - row.peak_memory_bytes / base["peak_memory_bytes"]
    if not real:
        row.note = (f"{row.mode} did not run: the first matmul produced {row.autocast_dtype}, "
                    "so no speed-up or memory saving is claimed")
    if row.final_loss is not None and base.get("final_loss"):
        row.loss_rel_diff = abs(row.final_loss - base["final_loss"]) / abs(base["final_loss"])
    row.logits_rel_diff = _max_rel_diff(res["eval"].get("logits"), base["eval"].get("logits"))


def _evidence(text: str, mode: str, key: str) -> Evidence:
    return Evidence(text=text, line=None, source=f"probe.{mode}.{key}")


def _own_findings(row: ModeRow, res: dict[str, Any], base: dict[str, Any] | None, opts: ProbeOptions) -> list[Finding]:
    """What the measurements themselves show (the rule base explains errors; these are
    the silent things only a live run can see)."""
    out: list[Finding] = []
    m = row.mode
    device = res.get("device", {})
    on_cpu = device.get("type") == "cpu"
    if m in ("fp16", "bf16") and not row.ran_as_requested:
        native = res.get("torch_autocast_fp16")
        expl = [f"accelerate {res.get('accelerate', '')} accepted mixed_precision=\"{m}\" on the "
                f"{device.get('type', '?')} without an error, but autocast did not run: the first "
                f"matmul produced {row.autocast_dtype} and there is no loss scaler. The run was plain fp32."]
        ev = [_evidence(f"first matmul output dtype: {row.autocast_dtype} (requested {m})", m, "autocast_dtype"),
              _evidence(f"accelerator.native_amp = {res.get('native_amp')}, scaler = "
                        f"{'present' if res.get('observed', {}).get('scaler', {}).get('present') else 'none'}",
                        m, "accelerator")]
        facts: dict[str, Any] = {"requested": m, "autocast_dtype": row.autocast_dtype,
                                 "device": device.get("type")}
        if native:
            expl.append(f"torch's own torch.autocast(\"cpu\", dtype=torch.float16) does run this model's "
                        f"Linear layers in {native.get('autocast_dtype')} (same weights and batch: "
                        f"peak |activation| {native.get('peak_abs'):.4g}, "
                        f"{native.get('nonfinite_logits')} non-finite logits).")
            ev.append(_evidence(f"torch.autocast('cpu', float16): first matmul {native.get('autocast_dtype')}, "
                                f"{native.get('nonfinite_logits')} non-finite logits", m, "torch_autocast_fp16"))
            facts["torch_autocast_fp16_dtype"] = native.get("autocast_dtype")
        fixes = ["On the CPU use mixed_precision=\"bf16\" (accelerate runs CPU autocast for bf16), or keep \"no\"."
                 if on_cpu else "Use a device and build where autocast supports this dtype.",
                 "For real fp16 mixed precision, run on a CUDA GPU: accelerate then uses "
                 "torch.autocast(\"cuda\", float16) with a GradScaler."]
        category = "fp16-unsupported-device" if m == "fp16" else "bf16-unsupported"
        out.append(Finding(rule=f"probe-{m}-not-applied", category=category, severity="warning",
                           title=f"mixed_precision=\"{m}\" was accepted but ran float32 on the {device.get('type')}",
                           explanation=" ".join(expl), fixes=fixes, evidence=ev, facts=facts, priority=60))
        if opts.stress and native:
            over = native.get("nonfinite_logits", 0) > 0 or (native.get("peak_abs") or 0) >= FP16_MAX
            out.append(Finding(
                rule="probe-stress-fp16-not-run", category="fp16-value-overflow", severity="info",
                title="--stress: accelerate's fp16 ran fp32 here, so it shows no overflow",
                explanation=("The stressed activations peak near 1.5x fp16's limit (65504). accelerate's fp16 "
                             "mode ran float32 on this CPU, so nothing overflowed in it; that is not headroom. "
                             + ("Under torch.autocast(\"cpu\", float16) the same batch does overflow "
                                f"({native.get('nonfinite_logits')} non-finite logits)." if over else
                                "Under torch.autocast(\"cpu\", float16) the same batch stayed finite.")),
                fixes=["Judge fp16 headroom on the GPU you will train on: `mpdoctor probe --stress --device cuda`."],
                evidence=[_evidence(f"torch.autocast('cpu', float16): peak |activation| "
                                    f"{native.get('peak_abs')}, {native.get('nonfinite_logits')} non-finite logits",
                                    m, "torch_autocast_fp16")],
                facts={"fp16_max": FP16_MAX, "torch_autocast_fp16_overflow": over}))
    busy = any((r or 0) > BUSY_SHARE for r in (row.cpu_used_by_others, (base or {}).get("cpu_used_by_others")))
    if m == "bf16" and row.ran_as_requested and on_cpu and row.speedup is not None and row.speedup < 0.9 \
            and not device.get("native_bf16") and not busy:
        out.append(Finding(
            rule="probe-bf16-emulated-cpu", category="bf16-unsupported", severity="info",
            title=f"bf16 runs on this CPU, but without native bf16 instructions it is slower ({row.speedup:.2f}x fp32)",
            explanation=(f"The CPU ({device.get('name', '?')}) has no AVX512-BF16 or AMX-BF16, so oneDNN "
                         "converts bf16 in software: the step takes longer than in fp32. "
                         + (f"It still holds {row.memory_saving:.0%} less memory." if row.memory_saving and
                            row.memory_saving > 0 else "")),
            fixes=["Train in fp32 (mixed_precision=\"no\") on this CPU unless memory is the limit.",
                   "bf16 pays off on CPUs with avx512_bf16 / amx_bf16 (Cooper Lake, Sapphire Rapids and newer) "
                   "and on GPUs with compute capability 8.0+."],
            evidence=[_evidence(f"step time {row.step_time_s * 1000:.1f} ms vs fp32 "
                                f"{base['step_time_s'] * 1000:.1f} ms" if base else "", m, "step_time_s"),
                      _evidence(f"CPU flags: no avx512_bf16, no amx_bf16 (capability {device.get('capability')})",
                                m, "device.native_bf16")],
            facts={"speedup": round(row.speedup, 3), "cpu": device.get("name")}))
    obs = res.get("observed", {})
    nonfinite = obs.get("nonfinite", [])
    eval_bad = res["eval"].get("nonfinite_logits", 0)
    if nonfinite or eval_bad:
        first = nonfinite[0] if nonfinite else None
        peak = row.peak_activation
        overflow = m == "fp16" and row.ran_as_requested and (eval_bad or (peak is not None and not math.isfinite(peak)))
        ev = []
        if first:
            ev.append(_evidence(f"step {first['step']}: loss = {first['value']} "
                                f"({obs.get('nonfinite_count')} of {res.get('steps')} steps non-finite)", m, "losses"))
        if eval_bad:
            ev.append(_evidence(f"fixed batch: {eval_bad} of {res['eval'].get('logits_count')} logits non-finite",
                                m, "eval.logits"))
        out.append(Finding(
            rule="probe-fp16-overflow" if overflow else "probe-nonfinite",
            category="fp16-value-overflow" if overflow else "non-finite-values",
            severity="warning",
            title=(f"{m}: activations overflowed fp16's range (max 65504)" if overflow
                   else f"{m}: non-finite values during the probe"),
            explanation=("Values above 65504 become inf in float16; the loss turns inf/NaN and the loss "
                         "scaler skips those steps. bf16 keeps fp32's exponent range." if overflow else
                         "The loss or the fixed-batch logits were NaN/Inf in this mode."),
            fixes=["Use mixed_precision=\"bf16\" where the hardware has it (same range as fp32).",
                   "Keep activations in range: normalise before large projections, lower the init scale."]
            if overflow else ["Compare with the fp32 row: if fp32 is finite, the precision mode is the cause."],
            evidence=ev, facts={"nonfinite_steps": obs.get("nonfinite_count", 0), "nonfinite_logits": eval_bad}))
    skipped = row.skipped_steps or 0
    if skipped:
        frac = skipped / max(1, res.get("steps", 1))
        many = frac > MAX_SKIPPED_FRACTION
        out.append(Finding(
            rule="probe-scaler-skipped-steps", category="loss-scale-overflow",
            severity="warning" if many else "info",
            title=f"{m}: the loss scaler skipped {skipped} of {res.get('steps')} steps (final scale {row.final_scale})",
            explanation=("The scaler keeps finding inf/NaN gradients and lowering the scale: training is not "
                         "progressing on those steps." if many else
                         "A few skipped steps while the dynamic loss scale settles are normal in fp16."),
            fixes=["Use bf16 where available, or find the layer that overflows (`mpdoctor run -- ...`)."]
            if many else [],
            evidence=[_evidence(f"skipped steps {skipped}, final scale {row.final_scale}", m, "scaler")],
            facts={"skipped_steps": skipped, "final_scale": row.final_scale}))
    return _merge_watch(out, obs, row)


_PROBE_FALLBACKS = {"probe-nonfinite", "probe-fp16-overflow", "probe-scaler-skipped-steps"}


def _merge_watch(own: list[Finding], obs: dict[str, Any], row: ModeRow) -> list[Finding]:
    """watch()'s findings, when it ran, replace the probe's stand-in ones of the same
    category; and the probe's not-applied finding (which knows accelerate ran fp32 on
    purpose) replaces watch()'s reading of the same observation."""
    watched = []
    for data in obs.get("findings", []):
        try:
            watched.append(_tagged(Finding.from_dict(data), row.mode))
        except (KeyError, ValueError, TypeError):
            continue
    not_applied = any(f.rule.endswith("-not-applied") and f.rule.startswith("probe-") for f in own)
    watched = [f for f in watched
               if not (not_applied and f.facts.get("requested") == row.mode
                       and f.facts.get("autocast_dtype") == row.autocast_dtype)]
    covered = {f.category for f in watched}
    own = [f for f in own if not (f.rule in _PROBE_FALLBACKS and f.category in covered)]
    return own + watched


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """The probe's view and watch()'s may say the same thing: one finding per rule,
    and one per category at a given severity (the better-ranked one, kept first)."""
    seen: set[Any] = set()
    kept = []
    for f in findings:
        keys = {("rule", f.rule), ("category", f.category, f.severity)}
        if keys & seen:
            continue
        seen |= keys
        kept.append(f)
    return kept


# -- the recommendation -----------------------------------------------------------

PREFERENCE = {"bf16": 0, "fp16": 1, "fp8": 2}  # on a near tie: no scaler, fp32's range


def config_lines(mode: str) -> dict[str, str]:
    return {"accelerate_config": f"mixed_precision: {mode}",
            "code": f'Accelerator(mixed_precision="{mode}")',
            "launch": f"accelerate launch --mixed_precision {mode} train.py"}


def _usable(r: ModeRow) -> bool:
    return (r.ok and r.mode != "no" and bool(r.ran_as_requested) and r.nonfinite_count == 0
            and (r.skipped_steps or 0) <= MAX_SKIPPED_FRACTION * (r.steps or 1)
            and (r.loss_rel_diff is None or r.loss_rel_diff <= MAX_LOSS_REL_DIFF))


def _percent(v: float) -> str:
    """0.003 -> 0.3%, 1.4e-05 -> 0.0014%: small differences keep two figures."""
    return f"{v:.1%}" if v >= 0.001 else f"{v * 100:.2g}%"


def _gain_words(r: ModeRow) -> str:
    parts = []
    if r.speedup is not None:
        parts.append(f"{r.speedup:.2f}× faster than fp32" if r.speedup >= 1 else
                     f"{r.speedup:.2f}× the speed of fp32")
    if r.memory_saving is not None:
        parts.append(f"{r.memory_saving:.0%} less memory" if r.memory_saving >= 0 else
                     f"{-r.memory_saving:.0%} more memory")
    if r.loss_rel_diff is not None:
        parts.append(f"loss within {_percent(r.loss_rel_diff)}")
    return ", ".join(parts)


def _why_not(r: ModeRow) -> str:
    if not r.ok:
        return f"{r.mode} failed ({r.findings[0].title if r.findings else r.error})"
    if not r.ran_as_requested:
        return f"{r.mode} did not run (first matmul {r.autocast_dtype})"
    if r.nonfinite_count:
        return f"{r.mode} produced non-finite values"
    if r.loss_rel_diff is not None and r.loss_rel_diff > MAX_LOSS_REL_DIFF:
        return f"{r.mode} loss is {r.loss_rel_diff:.1%} off fp32"
    return f"{r.mode}: {_gain_words(r)}"


def timing_noise(r: ModeRow) -> str | None:
    """Why this row's step time cannot be trusted, if it cannot."""
    if (r.cpu_used_by_others or 0) > BUSY_SHARE:
        return f"other processes used {r.cpu_used_by_others:.0%} of the CPUs"
    if (r.step_time_spread or 0) > MAX_SPREAD:
        return f"its step times varied ±{r.step_time_spread / 2:.0%}"
    return None


def recommend(rows: list[ModeRow], device_type: str | None = None) -> dict[str, Any]:
    """The mode to set, why, and the line to write. On a CPU whose timings were
    disturbed (a neighbour's job, wildly varying steps) no speed verdict is given:
    the working modes and what did not depend on timing are said instead."""
    noisy = {r.mode: timing_noise(r) for r in rows if r.ok and timing_noise(r)}
    rec = _recommend(rows)
    rec["timings_reliable"] = not noisy
    if not noisy or not rec.get("mode"):
        return rec
    why = "; ".join(f"{m}: {n}" for m, n in noisy.items())
    if device_type == "cpu" and rec.get("basis") in ("speed", "memory", "none faster"):
        working = [r for r in rows if r.ok and (r.ran_as_requested or r.mode == "no")]
        words = ", ".join(r.mode + (f" ({_gain_words_untimed(r)})" if r.mode != "no" and _gain_words_untimed(r) else "")
                          for r in working)
        out = {"mode": "no", "basis": "timings unreliable", "timings_reliable": False,
               "reason": (f"no, for now: the timings are unreliable ({why}). Modes that train here: {words}. "
                          "Re-run `mpdoctor probe` on an idle machine for a speed verdict."),
               "config": config_lines("no")}
        lean = [r for r in rows if _usable(r) and (r.memory_saving or 0) >= MIN_MEMORY_SAVING]
        if lean:
            alt = max(lean, key=lambda r: r.memory_saving or 0)
            out["if_memory_bound"] = {"mode": alt.mode, "reason": f"{alt.mode}: {_gain_words_untimed(alt)}",
                                      "config": config_lines(alt.mode)}
        return out
    rec["reason"] += f" — but the timings are unreliable ({why}): re-run it idle"
    return rec


def _gain_words_untimed(r: ModeRow) -> str:
    parts = []
    if r.memory_saving is not None:
        parts.append(f"{r.memory_saving:.0%} less memory" if r.memory_saving >= 0 else
                     f"{-r.memory_saving:.0%} more memory")
    if r.loss_rel_diff is not None:
        parts.append(f"loss within {_percent(r.loss_rel_diff)}")
    return ", ".join(parts)


def _recommend(rows: list[ModeRow]) -> dict[str, Any]:
    base = next((r for r in rows if r.mode == "no"), None)
    if base is None or not base.ok:
        working = [r for r in rows if r.ok and r.ran_as_requested]
        if not working:
            return {"mode": None, "reason": "no mode trained on this machine: see the findings", "config": None}
        pick = working[0]
        return {"mode": pick.mode, "reason": f"{pick.mode}: the only mode that trained (fp32 failed)",
                "config": config_lines(pick.mode)}
    usable = [r for r in rows if _usable(r)]
    others = [r for r in rows if r.mode != "no" and not r.baseline_only]
    faster = [r for r in usable if r.speedup is not None and r.speedup >= MIN_SPEEDUP]
    if faster:
        best = max(r.speedup for r in faster)
        near = [r for r in faster if r.speedup >= best / 1.05]
        pick = min(near, key=lambda r: PREFERENCE.get(r.mode, 9))
        return {"mode": pick.mode, "reason": f"{pick.mode}: {_gain_words(pick)}", "config": config_lines(pick.mode),
                "basis": "speed"}
    leaner = [r for r in usable if r.memory_saving is not None and r.memory_saving >= MIN_MEMORY_SAVING
              and r.speedup is not None and r.speedup >= 1 / MIN_SPEEDUP]
    if leaner:
        pick = max(leaner, key=lambda r: r.memory_saving or 0)
        return {"mode": pick.mode, "reason": f"{pick.mode}: {_gain_words(pick)} (as fast as fp32, less memory)",
                "config": config_lines(pick.mode), "basis": "memory"}
    why = "; ".join(_why_not(r) for r in others) or "no other mode was probed"
    rec: dict[str, Any] = {"mode": "no", "reason": f"no: no mixed-precision mode beat fp32 on this machine ({why})",
                           "config": config_lines("no"), "basis": "none faster"}
    trade = [r for r in usable if r.memory_saving is not None and r.memory_saving >= MIN_MEMORY_SAVING]
    if trade:
        alt = max(trade, key=lambda r: r.memory_saving or 0)
        rec["if_memory_bound"] = {"mode": alt.mode, "reason": f"{alt.mode}: {_gain_words(alt)}",
                                  "config": config_lines(alt.mode)}
    return rec
