"""What precision was asked for, what ran, and whether the processes joined one run."""

from __future__ import annotations

from typing import Any

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge import intent
from ..evidence import RunView


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


_FP32 = {"no": "fp32"}


def _trained_in(value: str | None, device: str | None) -> str | None:
    """What a requested mode trains in on the run's device, as a mode name (fp32 for
    none); "none": it cannot run there."""
    ran = intent.runs_as(value, device)
    return _FP32.get(ran or "", ran)


def _overrides(v: RunView, losers: tuple[str, ...], winners: tuple[str, ...]) -> Result:
    """The first source of kind `losers` whose precision a source of kind `winners` (the
    one accelerate took) replaced, where that changes what trains on the run's device."""
    plan = v.plan
    sources = [s for s in (plan.get("sources") or []) if isinstance(s, dict) and s.get("value")]
    kinds = [s["source"] for s in sources]
    won = intent.winner(sources)
    if won not in winners:
        return []
    winner = next(s for s in sources if s["source"] == won)
    if not _took(plan, winner):
        return []
    device = plan.get("device")
    trained = _trained_in(winner["value"], device)
    for kind in losers:
        if kind not in kinds or kind == won:
            continue
        lost = next(s for s in sources if s["source"] == kind)
        asked = _trained_in(lost["value"], device)
        if intent.mode(lost["value"]) == intent.mode(winner["value"]) or asked == trained:
            continue
        return [Hit({"overridden": kind, "overridden_value": intent.mode(lost["value"]),
                     "overridden_where": lost.get("where"), "winner": won,
                     "winner_value": intent.mode(winner["value"]), "winner_where": winner.get("where"),
                     "trained": trained, "asked": asked, "ran": plan.get("autocast_dtype"), "device": device,
                     "_code_arg": "yes" if won == intent.ACCELERATOR_ARG else None,
                     "_trainer": "yes" if won == intent.TRAINER_ARGS else None},
                    [("plan.sources", "; ".join(f"{s['source']}={s['value']}" + (f" ({s['where']})" if s.get("where")
                                                                                   else "") for s in sources)),
                     ("plan.requested", plan.get("requested"))]
                    + ([("plan.autocast_dtype", f"{plan['autocast_dtype']} (first matmul: "
                                                f"{plan.get('autocast_module')})")] if plan.get("autocast_dtype") else []))]
    return []


def _took(plan: dict[str, Any], source: dict[str, Any]) -> bool:
    """Whether the Accelerator says the value `source` asked for (a source the recording
    could not see, such as the argument of an Accelerator watched after it was made,
    would show here as a difference: then no source is said to have won)."""
    requested = intent.mode(plan.get("requested"))
    return requested is None or requested == intent.mode(source.get("value"))


_INTENT_FACTS = ("overridden", "overridden_value", "overridden_where", "winner", "winner_value", "winner_where",
                 "trained", "asked", "ran", "device", "_code_arg", "_trainer")


@check(facts=_INTENT_FACTS)
def intent_code_overrides(v: RunView) -> Result:
    """The code's own precision (an Accelerator argument, TrainingArguments) replaced
    what the launcher, its config file or the environment asked for."""
    return _overrides(v, intent.OUTER, intent.CODE)


@check(facts=_INTENT_FACTS)
def intent_flag_overrides_config(v: RunView) -> Result:
    """`accelerate launch --mixed_precision X` replaced the config file's value."""
    return _overrides(v, (intent.CONFIG_FILE,), (intent.LAUNCH_FLAG,))


_SOURCE_FACTS = ("intent", "intent_value", "intent_where", "intent_won")
_PLAN_FACTS = ("requested", "autocast_dtype", "under_autocast", "trainable", "frozen", "scaler", "master",
               "distributed_type", "num_processes", "sources") + _SOURCE_FACTS


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
    sources = [s for s in (plan.get("sources") or []) if isinstance(s, dict) and s.get("value")]
    if sources:
        won = intent.winner(sources)
        if won is not None and not _took(plan, next(s for s in sources if s.get("source") == won)):
            won = None
        facts["sources"] = [{"intent": s.get("source"), "intent_value": intent.mode(s.get("value")),
                             "intent_where": s.get("where"), "intent_won": "yes" if s.get("source") == won else None}
                            for s in sources]
    return [Hit(facts, [("plan." + k, plan.get(k)) for k in ("requested", "autocast_dtype", "autocast_enabled",
                                                            "grad_scaler_enabled", "fp32_master_weights")
                        if plan.get(k) is not None])]
