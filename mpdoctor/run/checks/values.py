"""Non-finite values, their magnitudes and headroom, activations near a limit, the loss scaler."""

from __future__ import annotations

import math
from typing import Any

from ...engine.judge import Hit, Result, check
from ..evidence import Process, RunView

# float16's largest finite value; an activation beyond it is Inf
FP16_MAX = 65504.0
ADAM_FAMILY = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "AdamWScheduleFree", "FusedAdam", "Adafactor")


def _num(x: Any) -> str:
    if x is None:
        return "?"
    if isinstance(x, float):
        if x != x or x in (math.inf, -math.inf):
            return str(x)
        return f"{x:.6g}"
    return str(x)


def _where(module: str, module_type: str = "") -> str:
    if module in ("(loss)", ""):
        return "the loss"
    return f"`{module}`" + (f" ({module_type})" if module_type and module_type != module else "")


def _word(kind: str) -> str:
    return "NaN" if kind == "nan" else "Inf"


def _first_nonfinite(v: RunView) -> tuple[Process, dict[str, Any]] | None:
    p = v.main
    if p is None:
        return None
    found = p.watch.get("nonfinite") or []
    return (p, found[0]) if found else None


def _steps_affected(p: Process) -> int | None:
    """On how many steps non-finite values were seen, in any phase (None for one)."""
    n = max([(x.get("steps_affected") or 1) for x in p.watch.get("nonfinite") or []] or [1])
    return n if n > 1 else None


def _nonfinite_facts(p: Process, nf: dict[str, Any], v: RunView) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "module": nf.get("module"), "module_type": nf.get("module_type") or None,
        "where": _where(nf.get("module", ""), nf.get("module_type", "")),
        "phase": nf.get("phase"), "step": nf.get("step"), "dtype": nf.get("dtype") or None,
        "what": _word(nf.get("kind", "nan")),
        "steps_affected": _steps_affected(p),
    }
    if nf.get("input_min") is not None:
        facts["input_range"] = f"[{_num(nf['input_min'])}, {_num(nf['input_max'])}]"
        facts["input_dtype"] = nf.get("input_dtype")
        absmax = max(abs(nf.get("input_min") or 0.0), abs(nf.get("input_max") or 0.0))
        if nf.get("dtype") == "float16" and (nf.get("kind") == "inf" or absmax > FP16_MAX):
            facts["_fp16_overflow"] = "yes"
            if absmax > FP16_MAX:
                facts["input_absmax"] = _num(absmax)
    facts.update(_magnitudes(nf))
    if nf.get("param"):  # the module's own weight was already non-finite: an update broke it
        facts["odd_tensor"], facts["odd_dtype"] = nf["param"], nf.get("param_dtype")
    if v.multi_rank and p.rank is not None:
        facts["rank"] = p.rank
    return facts


# the largest finite value of each floating dtype
DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308}


def _magnitudes(nf: dict[str, Any]) -> dict[str, Any]:
    """The largest finite |value| a watched module output before the non-finite one, and
    how far that was from its dtype's largest value (the headroom)."""
    seen, dtype = nf.get("seen_absmax"), nf.get("seen_dtype")
    if seen is None or not isinstance(seen, (int, float)) or not math.isfinite(seen):
        return {}
    out: dict[str, Any] = {"seen_absmax": f"{seen:.3g}", "seen_module": nf.get("seen_module"), "seen_dtype": dtype}
    limit = DTYPE_MAX.get(dtype or "")
    if limit:
        out["dtype_max"] = f"{limit:.3g}"
        if seen > 0:
            ratio = limit / seen
            out["headroom"] = f"{ratio:.3g}×" if ratio < 1e6 else f"{ratio:.1e}×"
    return out


def _nonfinite_evidence(p: Process, nf: dict[str, Any]) -> list[tuple[str, Any]]:
    dt = f", {nf['dtype']}" if nf.get("dtype") else ""
    rng = (f" from an input in [{_num(nf.get('input_min'))}, {_num(nf.get('input_max'))}]"
           if nf.get("input_min") is not None else "")
    ev = [(f"{p.path}.watch.nonfinite[0]", f"{nf.get('module')} · {nf.get('phase')} · step {nf.get('step')}{dt}: "
                                           f"{_word(nf.get('kind', 'nan'))}{rng}")]
    for i, later in enumerate((p.watch.get("nonfinite") or [])[1:3], 1):
        ev.append((f"{p.path}.watch.nonfinite[{i}]", f"then {later.get('module')} · {later.get('phase')} · step "
                                                     f"{later.get('step')}: {_word(later.get('kind', 'nan'))}"))
    return ev


def _nonfinite_check(v: RunView, phase: str, origins: tuple[str, ...]) -> Result:
    got = _first_nonfinite(v)
    if got is None:
        return []
    p, nf = got
    if nf.get("phase") != phase or nf.get("origin", "module") not in origins:
        return []
    return [Hit(_nonfinite_facts(p, nf, v), _nonfinite_evidence(p, nf))]


_NF_FACTS = ("module", "module_type", "where", "phase", "step", "dtype", "what", "steps_affected", "input_range",
             "input_dtype", "input_absmax", "_fp16_overflow", "rank", "seen_absmax", "seen_module", "seen_dtype",
             "dtype_max", "headroom", "odd_tensor", "odd_dtype")


@check(facts=_NF_FACTS)
def nonfinite_made_in_forward(v: RunView) -> Result:
    return _nonfinite_check(v, "forward", ("module",))


@check(facts=_NF_FACTS)
def nonfinite_entered_forward(v: RunView) -> Result:
    return _nonfinite_check(v, "forward", ("input",))


@check(facts=_NF_FACTS)
def nonfinite_in_loss(v: RunView) -> Result:
    return _nonfinite_check(v, "forward", ("loss",)) or _nonfinite_check(v, "backward", ("loss",))


@check(facts=_NF_FACTS)
def nonfinite_made_in_backward(v: RunView) -> Result:
    return _nonfinite_check(v, "backward", ("module",))


@check(facts=_NF_FACTS)
def nonfinite_parameter_gradient(v: RunView) -> Result:
    return _nonfinite_check(v, "backward", ("param-grad",))


@check(facts=_NF_FACTS + ("optimizer", "eps", "float16_params", "master_weights"))
def half_params_updated_directly(v: RunView) -> Result:
    """NaN after an optimizer step of float16 parameters with no fp32 master copy (an
    Adam-family eps of 1e-8 is 0 in float16: a zero second moment gives 0/0)."""
    got = _first_nonfinite(v)
    if got is None:
        return []
    p, nf = got
    plan = p.plan
    opt = plan.get("optimizer_param_dtypes") or {}
    half = opt.get("float16")
    if not half or plan.get("fp32_master_weights") is not False or (nf.get("step") or 0) < 1:
        return []
    if plan.get("grad_scaler_enabled"):
        return []  # fp16-gradient-unscale's business (GradScaler refuses fp16 gradients)
    facts = _nonfinite_facts(p, nf, v)
    names = plan.get("optimizers") or []
    facts["optimizer"] = names[0] if names else None
    eps = plan.get("optimizer_eps")
    if eps is not None:
        facts["eps"] = _num(eps)
    facts["float16_params"] = f"{half:,}"
    facts["master_weights"] = "none"
    if names and not any(n in ADAM_FAMILY for n in names):
        facts.pop("eps", None)
    ev = _nonfinite_evidence(p, nf) + [(f"{p.path}.watch.plan.optimizer_param_dtypes", opt),
                                       (f"{p.path}.watch.plan.fp32_master_weights", False)]
    return [Hit(facts, ev)]


@check(facts=("module", "where", "step", "dtype", "absmax", "limit", "percent", "also"))
def activation_near_limit(v: RunView) -> Result:
    p = v.main
    if p is None:
        return []
    hits = []
    for i, ow in enumerate((p.watch.get("overflow") or [])[:1]):
        also = ", ".join(f"`{a}`" for a in ow.get("also") or [])
        hits.append(Hit({"module": ow.get("module"), "where": _where(ow.get("module", ""), ow.get("module_type", "")),
                         "step": ow.get("step"), "dtype": ow.get("dtype"), "absmax": _num(ow.get("absmax")),
                         "limit": _num(ow.get("limit")),
                         "percent": f"{100.0 * ow['absmax'] / ow['limit']:.0f}%" if ow.get("limit") else None,
                         "also": also or None},
                        [(f"{p.path}.watch.overflow[{i}]", f"{ow.get('module')} · forward · step {ow.get('step')}: "
                                                           f"|max| {_num(ow.get('absmax'))} of {_num(ow.get('limit'))} "
                                                           f"({ow.get('dtype')})")]))
    return hits


def _scaler(v: RunView) -> tuple[Process, dict[str, Any], dict[str, Any]] | None:
    p = v.main
    if p is None:
        return None
    sc = p.watch.get("scaler") or {}
    skipped = sc.get("skipped_steps") or []
    updates = sc.get("updates") or 0
    if not skipped or not updates:
        return None
    final = sc.get("final_scale")
    run = best = 0
    prev = None
    for s in skipped:
        run = run + 1 if prev is not None and s == prev + 1 else 1
        best = max(best, run)
        prev = s
    shown = ", ".join(str(s) for s in skipped[:12]) + (" ..." if len(skipped) > 12 else "")
    facts = {"skipped": len(skipped), "updates": updates, "initial_scale": _num(sc.get("initial_scale")),
             "final_scale": _num(final), "longest_skip_run": best, "first_skipped_step": skipped[0],
             "skipped_list": shown, "_collapsed": "yes" if (final is not None and final < 1.0) or best >= 10 else None}
    series = [float(x[1]) for x in (sc.get("scales") or []) if isinstance(x, (list, tuple)) and len(x) == 2
              and isinstance(x[1], (int, float))]
    if len(series) >= 3:
        facts["_scale_series"] = series[:200]  # drawn as a sparkline by the renderers
    return p, sc, facts


_SCALE_FACTS = ("skipped", "updates", "initial_scale", "final_scale", "longest_skip_run", "first_skipped_step",
                "skipped_list", "_collapsed", "_scale_series")


@check(facts=_SCALE_FACTS)
def loss_scale_collapsed(v: RunView) -> Result:
    got = _scaler(v)
    if got is None or not got[2]["_collapsed"]:
        return []
    p, sc, facts = got
    return [Hit(facts, [(f"{p.path}.watch.scaler", f"skipped steps: {facts['skipped_list']}; scale "
                                                   f"{facts['initial_scale']} -> {facts['final_scale']}")])]


@check(facts=_SCALE_FACTS)
def loss_scale_skipping(v: RunView) -> Result:
    """Many skipped steps without a collapse (a few while the scale settles are normal)."""
    got = _scaler(v)
    if got is None or got[2]["_collapsed"]:
        return []
    p, sc, facts = got
    if not (facts["updates"] >= 20 and facts["skipped"] / facts["updates"] > 0.2):
        return []
    return [Hit(facts, [(f"{p.path}.watch.scaler", f"skipped steps: {facts['skipped_list']}; scale "
                                                   f"{facts['initial_scale']} -> {facts['final_scale']}")])]


@check(facts=("step", "grad_norm"))
def loss_zero_grad_nonfinite(v: RunView) -> Result:
    p = v.main
    lz = (p.watch.get("loss_zero_grad_nan") if p is not None else None)
    if not lz:
        return []
    return [Hit({"step": lz[0], "grad_norm": _num(lz[1])},
                [(f"{p.path}.watch.loss_zero_grad_nan", f"step {lz[0]}: loss 0.0, grad norm {_num(lz[1])}")])]
