"""The checks of the run rules (rules/run/*.toml): small pure functions of a RunView.

Each returns Hits (facts for the rule's templates, and the fields of the run evidence
they rest on) or a Skip. The rule file holds the words; this file only says when, and
with which facts.
"""

from __future__ import annotations

import math
from typing import Any

from ..engine.judge import Hit, Result, Skip, check
from .evidence import Process, RunView

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
             "dtype_max", "headroom")


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


def _trainable(plan: dict[str, Any]) -> dict[str, int]:
    return dict((plan.get("params") or {}).get("trainable") or {})


@check(facts=("float16_params",))
def fp16_params_with_grad_scaler(v: RunView) -> Result:
    plan = v.plan
    low = {**_trainable(plan), **(plan.get("optimizer_param_dtypes") or {})}
    if not (plan.get("grad_scaler") and plan.get("grad_scaler_enabled") and low.get("float16")):
        return []
    return [Hit({"float16_params": f"{low['float16']:,}"},
                [("plan.params.trainable", _trainable(plan)), ("plan.grad_scaler_enabled", True)])]


@check(facts=("unchanged", "sampled", "optimizer_dtypes"))
def low_precision_updates_lost(v: RunView) -> Result:
    plan = v.plan
    frac = plan.get("unchanged_fraction")
    if frac is None or frac <= 0.5 or plan.get("fp32_master_weights") is not False:
        return []
    opt = plan.get("optimizer_param_dtypes") or {}
    return [Hit({"unchanged": f"{frac:.0%}", "sampled": plan.get("unchanged_sampled"),
                 "optimizer_dtypes": ", ".join(f"{k} {n:,}" for k, n in opt.items())},
                [("plan.unchanged_fraction", round(frac, 4)), ("plan.optimizer_param_dtypes", opt)])]


@check(facts=("step", "grad_norm"))
def loss_zero_grad_nonfinite(v: RunView) -> Result:
    p = v.main
    lz = (p.watch.get("loss_zero_grad_nan") if p is not None else None)
    if not lz:
        return []
    return [Hit({"step": lz[0], "grad_norm": _num(lz[1])},
                [(f"{p.path}.watch.loss_zero_grad_nan", f"step {lz[0]}: loss 0.0, grad norm {_num(lz[1])}")])]


_WANT = {"fp16": "float16", "bf16": "bfloat16"}


@check(facts=("requested", "ran", "module", "autocast_off", "device"))
def precision_not_applied(v: RunView) -> Result:
    plan = v.plan
    req, ran = plan.get("requested"), plan.get("autocast_dtype")
    want = _WANT.get(req or "")
    if not want or not ran or ran == want:
        return []
    return [Hit({"requested": req, "ran": ran, "module": plan.get("autocast_module"),
                 "autocast_off": "yes" if not plan.get("autocast_enabled") else None,
                 "device": plan.get("device")},
                [("plan.requested", req), ("plan.autocast_dtype", f"{ran} (first matmul: {plan.get('autocast_module')})")])]


@check(facts=("world_size", "processes", "distributed_type", "num_processes", "launcher", "device"))
def processes_did_not_join(v: RunView) -> Result:
    """A launcher started N processes (WORLD_SIZE=N) but each Accelerator says it is
    process 0 of 1: N independent trainings, no gradient sync."""
    alone = [p for p in v.watched if (p.world_size or 1) > 1 and p.plan.get("num_processes") == 1
             and str(p.plan.get("distributed_type") or "NO").upper() == "NO"]
    if not alone:
        return []
    p = alone[0]
    return [Hit({"world_size": p.world_size, "processes": len(v.watched),
                 "distributed_type": p.plan.get("distributed_type") or "NO", "num_processes": 1,
                 "launcher": (v.evidence.get("command") or ["?"])[0].rsplit("/", 1)[-1],
                 "device": p.plan.get("device")},
                [(f"{q.path}.world_size", f"{q.label}: WORLD_SIZE={q.world_size}, Accelerator: "
                                          f"{q.plan.get('distributed_type')} × {q.plan.get('num_processes')}")
                 for q in alone[:4]])]


@check(facts=("signal", "exit_code", "output_bytes"))
def killed_without_traceback(v: RunView) -> Result:
    if v.signal != "SIGKILL" or v.output.get("traceback"):
        return []
    return [Hit({"signal": "SIGKILL", "exit_code": v.exit_code, "output_bytes": v.output.get("bytes")},
                [("exit", f"exit status {v.exit_code} (killed by SIGKILL), {v.output.get('bytes')} bytes of "
                          "output, no traceback")])]


def rank_story(v: RunView) -> list[dict[str, Any]]:
    """Per rank, what it did at the end, as data: `status` (a code the rank-summary rule
    says in words: failed_first, failed, timed_out, lost_peer, waited_*, finished,
    killed, killed_during, no_record), `killed` ("yes" when the launcher killed it after),
    `when` (step, before_first) and `step`, `waited_in`, `during`, `exception`, `module`."""
    ranks = [p for p in v.watched if p.rank is not None]
    failures = sorted((p.first_exception.get("time", 0), p.rank) for p in ranks if p.first_exception)
    first_rank = failures[0][1] if failures else None
    out = []
    for p in sorted(ranks, key=lambda x: x.rank):  # type: ignore[arg-type, return-value]
        exc = p.first_exception
        prog = p.data.get("progress") or {}
        step = prog.get("step", p.watch.get("step"))
        where = prog.get("where")
        entry: dict[str, Any] = {"rank": p.rank, "pid": p.data.get("pid"), "step": step,
                                 "when": None if step is None else ("step" if step >= 0 else "before_first")}
        if exc is not None:
            text = exc.get("exception", "").split("\n")[0]
            if any(w in text for w in ("timed out", "Timeout", "timeout")):
                status = "timed_out"
            elif any(w in text for w in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                         "NCCL communicator was aborted")):
                status = "lost_peer"
            else:
                status = "failed_first" if p.rank == first_rank else "failed"
            if status in ("timed_out", "lost_peer") and where:
                status = "waited_" + status
                entry["waited_in"] = where.removeprefix("in ")
            entry["status"] = status
            if p.data.get("exit") is None:
                entry["killed"] = "yes"
            entry["exception"] = text[:120]
            if exc.get("module"):
                entry["module"] = exc["module"]
        elif p.data.get("exit") is not None:
            entry["status"] = "finished"
        elif where and where.startswith("in "):
            entry["status"] = "waited_killed"
            entry["waited_in"] = where[3:]
        elif where:
            entry["status"], entry["during"] = "killed_during", where
        else:
            entry["status"] = "killed"
        out.append(entry)
    # a rank of the group that left nothing (killed before its first step) is part of the story
    seen = {e["rank"] for e in out}
    for r in range(v.world_size):
        if r not in seen and len(out) < 64:
            out.append({"rank": r, "pid": None, "step": None, "status": "no_record"})
    return sorted(out, key=lambda e: e["rank"])


# what one rank's record may carry (the rank-summary rule's [each] templates say them)
RANK_RECORD_FACTS = ("rank", "status", "killed", "when", "step", "waited_in", "during", "exception", "module")


@check(facts=("story", "first_failed_rank", "ranks", "_first", "_others", "_details") + RANK_RECORD_FACTS)
def rank_summary(v: RunView) -> Result:
    if not v.multi_rank:
        return []
    story = rank_story(v)
    first = next((r for r in story if r["status"] == "failed_first"), None)
    others = [r for r in story if r is not first]
    return [Hit({"story": story, "first_failed_rank": first["rank"] if first else None, "ranks": len(story),
                 "_first": [first] if first else None, "_others": others or None, "_details": story},
                [("ranks", " ".join(f"{k}={r[k]}" for k in RANK_RECORD_FACTS if r.get(k) is not None))
                 for r in story])]


_PLAN_FACTS = ("requested", "autocast_dtype", "under_autocast", "trainable", "frozen", "scaler", "master",
               "distributed_type", "num_processes")


@check(facts=_PLAN_FACTS)
def precision_plan(v: RunView) -> Result:
    plan = v.plan
    if not plan:
        return Skip("no process recorded a precision plan")
    params = plan.get("params") or {}
    master = plan.get("fp32_master_weights")
    facts = {
        "requested": plan.get("requested") or "none",
        "autocast_dtype": plan.get("autocast_dtype") or "unknown",
        "under_autocast": "yes" if plan.get("autocast_enabled") else None,
        "trainable": ", ".join(f"{k} {n:,}" for k, n in (params.get("trainable") or {}).items()) or "none",
        "frozen": ", ".join(f"{k} {n:,}" for k, n in (params.get("frozen") or {}).items()) or "none",
        "scaler": "on" if plan.get("grad_scaler_enabled") else ("off" if plan.get("grad_scaler") else "none"),
        "master": "yes" if master else ("no" if master is False else "unknown"),
        "distributed_type": plan.get("distributed_type"),
        "num_processes": plan.get("num_processes"),
    }
    return [Hit(facts, [("plan." + k, plan.get(k)) for k in ("requested", "autocast_dtype", "autocast_enabled",
                                                            "grad_scaler_enabled", "fp32_master_weights")
                        if plan.get(k) is not None])]


@check(facts=("errors", "first_error"))
def instrumentation_stopped(v: RunView) -> Result:
    errors = [e for p in v.processes for e in (p.data.get("internal_errors") or []) + (p.watch.get("internal_errors") or [])]
    errors = list(dict.fromkeys(errors))
    if not errors:
        return []
    return [Hit({"errors": len(errors), "first_error": errors[0]}, [("internal_errors", e) for e in errors[:3]])]


# Accelerator out-of-memory messages (torch.OutOfMemoryError; CUDA, HIP, XPU, MPS wording)
_OOM_WORDS = (" out of memory", "OutOfMemoryError", "MPS backend out of memory")


@check(facts=("tries", "first_error", "module", "first_step", "resumed_step", "batch_shapes"))
def oom_recovered(v: RunView) -> Result:
    """Out-of-memory errors the program caught, after which an optimizer step completed
    (the instrumentation moves such an exception from `errors` to `recovered`): a retry
    with a smaller batch (accelerate's find_executable_batch_size) that then trained."""
    for p in v.watched:
        caught = [e for e in p.watch.get("recovered") or []
                  if any(w in str(e.get("exception") or "") for w in _OOM_WORDS)]
        if not caught:
            continue
        first = caught[0]
        shapes = list(dict.fromkeys(str(tuple(s)) for e in caught
                                    if (s := (e.get("context") or {}).get("batch_shape"))))
        return [Hit({"tries": len(caught), "first_error": str(first.get("exception") or "").split("\n")[0][:200],
                     "module": first.get("module") or None, "first_step": first.get("step"),
                     "resumed_step": caught[-1].get("recovered_at_step"),
                     "batch_shapes": ", ".join(shapes[:8]) or None},
                    [(f"{p.path}.watch.recovered[{i}]", f"step {e.get('step')}: "
                      f"{str(e.get('exception') or '').splitlines()[0][:160] if e.get('exception') else '?'}; "
                      f"trained on at step {e.get('recovered_at_step')}") for i, e in enumerate(caught[:3])])]
    return []


# ---- the AMP recipe (PyTorch's "Automatic Mixed Precision examples"), judged from the
# order of the calls the instrumentation recorded (instrument/recipe.py), even when
# nothing raised

def _g4(x: Any) -> str | None:
    if x is None:
        return None
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"


def _recipes(v: RunView) -> list[tuple[Process, dict[str, Any]]]:
    return [(p, p.watch["recipe"]) for p in v.watched if p.watch.get("recipe")]


def _with_rank(v: RunView, p: Process, facts: dict[str, Any]) -> dict[str, Any]:
    if v.multi_rank and p.rank is not None:
        facts["rank"] = p.rank
    return facts


@check(facts=("step", "micro", "scale", "norm_seen", "true_norm", "max_norm", "clips_scaled", "clips", "rank"))
def clip_before_unscale(v: RunView) -> Result:
    """clip_grad_norm_ called on gradients still multiplied by an enabled scaler's scale."""
    found = _recipes(v)
    if not found or not any(r.get("scaled") for _, r in found):
        return Skip("no loss scaler scaled a loss in this run")
    for p, r in found:
        first = (r.get("first") or {}).get("clip_scaled")
        if not r.get("clips_scaled") or not first:
            continue
        scale, seen = first.get("scale"), first.get("norm_seen")
        facts = {"step": first.get("step"), "micro": first.get("micro") or None, "scale": _g4(scale),
                 "norm_seen": _g4(seen), "max_norm": _g4(first.get("max_norm")),
                 "true_norm": _g4(seen / scale) if seen is not None and scale else None,
                 "clips_scaled": r["clips_scaled"], "clips": r.get("clips")}
        return [Hit(_with_rank(v, p, facts), [
            (f"{p.path}.watch.recipe.first.clip_scaled", first),
            (f"{p.path}.watch.recipe", f"clip_grad_norm_ {r.get('clips')} call(s), {r['clips_scaled']} on scaled "
                                       f"gradients; scaler.scale {r.get('scaled')}, unscale_ {r.get('unscaled')}, "
                                       f"step {r.get('scaler_steps')}, update {r.get('updates')}")])]
    return []
