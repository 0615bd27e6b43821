"""The checks of the probe rules (rules/probe/*.toml): pure functions of one mode's
ProbeView. What only a live, measured run of a precision mode shows; everything the
env and run rules know is judged by them, on the same mode's environment and watch."""

from __future__ import annotations

import math
from typing import Any

from ..engine.judge import Hit, Result, check
from .evidence import FP16_MAX, ProbeView

# A mode whose loss scaler skipped more than this share of the steps is not training.
MAX_SKIPPED_FRACTION = 0.2


def _ev(v: ProbeView, key: str, text: str) -> tuple[str, Any]:
    return (f"probe.{v.mode}.{key}", text)


@check(facts=("peak_abs", "nonfinite_logits", "_overflowed"))
def stress_fp16_not_exercised(v: ProbeView) -> Result:
    native = v.result.get("torch_autocast_fp16")
    if v.mode != "fp16" or v.ran_as_requested or not v.options.get("stress") or not native:
        return []
    over = (native.get("nonfinite_logits") or 0) > 0 or (native.get("peak_abs") or 0) >= FP16_MAX
    return [Hit({"peak_abs": f"{native.get('peak_abs'):.4g}" if native.get("peak_abs") is not None else None,
                 "nonfinite_logits": native.get("nonfinite_logits"), "_overflowed": "yes" if over else None},
                [_ev(v, "torch_autocast_fp16", f"torch.autocast('cpu', float16): peak |activation| "
                                               f"{native.get('peak_abs')}, {native.get('nonfinite_logits')} "
                                               "non-finite logits")])]


def _nonfinite(v: ProbeView) -> tuple[int, int, dict[str, Any] | None]:
    obs = v.observed
    nonfinite = obs.get("nonfinite") or []
    bad_logits = (v.result.get("eval") or {}).get("nonfinite_logits", 0)
    return len(nonfinite), bad_logits, (nonfinite[0] if nonfinite else None)


def _nonfinite_evidence(v: ProbeView, first: dict[str, Any] | None, bad_logits: int) -> list[tuple[str, Any]]:
    ev = []
    if first:
        ev.append(_ev(v, "losses", f"step {first['step']}: loss = {first['value']} "
                                   f"({v.observed.get('nonfinite_count')} of {v.result.get('steps')} steps non-finite)"))
    if bad_logits:
        ev.append(_ev(v, "eval.logits", f"fixed batch: {bad_logits} of {(v.result.get('eval') or {}).get('logits_count')} "
                                        "logits non-finite"))
    return ev


def _overflowed(v: ProbeView, bad_logits: int) -> bool:
    peak = (v.result.get("eval") or {}).get("peak_abs")
    return v.mode == "fp16" and v.ran_as_requested and bool(bad_logits or (peak is not None and not math.isfinite(peak)))


def _first_module(v: ProbeView) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The module whose output was non-finite first (the probe's headroom meter, over
    the fixed-batch evaluation and the warm-up steps), as facts and evidence."""
    first = ((v.result.get("headroom") or {}).get("first_nonfinite")) or None
    if not first:
        return {}, []
    when = "the fixed-batch evaluation" if not first.get("step") else f"warm-up step {first['step']}"
    facts = {"module": first.get("module"), "module_type": first.get("type"), "dtype": first.get("dtype"),
             "when": when}
    return facts, [_ev(v, "headroom.first_nonfinite",
                       f"{first.get('module')} ({first.get('type')}, {first.get('dtype')}): output "
                       f"{first.get('value')} in {when}")]


_MODE_FACTS = ("nonfinite_steps", "nonfinite_logits", "steps", "module", "module_type", "dtype", "when")


@check(facts=_MODE_FACTS)
def mode_overflowed_fp16(v: ProbeView) -> Result:
    n, bad, first = _nonfinite(v)
    if not (n or bad) or not _overflowed(v, bad):
        return []
    where, ev = _first_module(v)
    return [Hit({"nonfinite_steps": n, "nonfinite_logits": bad, "steps": v.result.get("steps"), **where},
                _nonfinite_evidence(v, first, bad) + ev)]


@check(facts=_MODE_FACTS)
def mode_nonfinite(v: ProbeView) -> Result:
    n, bad, first = _nonfinite(v)
    if not (n or bad) or _overflowed(v, bad):
        return []
    where, ev = _first_module(v)
    return [Hit({"nonfinite_steps": n, "nonfinite_logits": bad, "steps": v.result.get("steps"), **where},
                _nonfinite_evidence(v, first, bad) + ev)]


# A module whose largest |output| comes within this factor of fp16's largest value is
# named: a little growth during training (a larger batch, a larger learning rate) and
# it is Inf. The run rule activation-near-fp16-limit uses the same factor on fp16 values.
NEAR_FP16 = 2.0


def _g(x: float) -> str:
    return f"{x:.3g}"


@check(facts=("module", "module_type", "absmax", "headroom", "others", "native_first", "native_nonfinite_logits",
              "_over", "_near", "_ran_fp32"))
def module_near_fp16_overflow(v: ProbeView) -> Result:
    if v.mode != "fp16":
        return []
    n, bad, _ = _nonfinite(v)
    if n or bad or v.observed.get("module_nonfinite"):
        return []  # it did overflow: the overflow rules name the module
    if ((v.observed.get("watch") or {}).get("overflow")):
        return []  # the watch saw it in float16 itself: activation-near-fp16-limit says it
    closest = [h for h in ((v.result.get("headroom") or {}).get("closest_fp16") or [])
               if h.get("absmax") is not None and h.get("fp16_headroom") is not None
               and h["fp16_headroom"] < NEAR_FP16]
    if not closest:
        return []
    top = closest[0]
    over = top["absmax"] >= FP16_MAX
    native = v.result.get("torch_autocast_fp16") or {}
    native_first = (native.get("first_nonfinite") or {}).get("module")
    others = ", ".join(f"{h['module']} ({_g(h['absmax'])})" for h in closest[1:4]) or None
    ev = [_ev(v, "headroom.closest_fp16", f"{h['module']} ({h.get('type')}, {h.get('dtype')}): largest |output| "
                                           f"{h['absmax']:.6g}, {h['fp16_headroom']:.3g}x fp16's 65504")
          for h in closest[:4]]
    if native_first:
        ev.append(_ev(v, "torch_autocast_fp16.first_nonfinite",
                      f"torch.autocast('cpu', float16): first non-finite output in {native_first}"))
    return [Hit({"module": top["module"], "module_type": top.get("type"), "absmax": _g(top["absmax"]),
                 "headroom": f"{top['fp16_headroom']:.2f}×", "others": others,
                 "native_first": native_first, "native_nonfinite_logits": native.get("nonfinite_logits") or None,
                 "_over": "yes" if over else None, "_near": None if over else "yes",
                 "_ran_fp32": None if v.ran_as_requested else "yes"}, ev)]


@check(facts=("skipped", "steps", "final_scale", "severity", "_many", "_few"))
def mode_scaler_skipped(v: ProbeView) -> Result:
    sc = v.observed.get("scaler") or {}
    skipped = v.observed.get("skipped_steps") or sc.get("skipped_steps") or 0
    if not skipped:
        return []
    steps = max(1, v.result.get("steps") or 1)
    many = skipped / steps > MAX_SKIPPED_FRACTION
    return [Hit({"skipped": skipped, "steps": v.result.get("steps"), "final_scale": sc.get("final_scale"),
                 "severity": "warning" if many else "info", "_many": "yes" if many else None,
                 "_few": None if many else "yes"},
                [_ev(v, "scaler", f"skipped steps {skipped}, final scale {sc.get('final_scale')}")])]
