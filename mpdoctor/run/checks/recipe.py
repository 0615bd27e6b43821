"""The AMP recipe (PyTorch's "Automatic Mixed Precision examples"), judged from the
order of the calls the instrumentation recorded (instrument/recipe.py), even when
nothing raised."""

from __future__ import annotations

from typing import Any

from ...engine.judge import Hit, Result, Skip, check
from ..evidence import Process, RunView


def _g4(x: Any) -> str | None:
    if x is None:
        return None
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"


def _recipes(v: RunView) -> list[tuple[Process, dict[str, Any]]]:
    return [(p, p.watch["recipe"]) for p in v.watched if p.watch.get("recipe")]


def _scaled_recipes(v: RunView) -> "list[tuple[Process, dict[str, Any]]] | Skip":
    """The processes' recipe records, or a Skip where no loss scaler scaled a loss (every
    scaler rule's question needs one)."""
    found = _recipes(v)
    if not found or not any(r.get("scaled") for _, r in found):
        return Skip("no loss scaler scaled a loss in this run")
    return found


def _with_rank(v: RunView, p: Process, facts: dict[str, Any]) -> dict[str, Any]:
    if v.multi_rank and p.rank is not None:
        facts["rank"] = p.rank
    return facts


@check(facts=("step", "micro", "scale", "norm_seen", "true_norm", "max_norm", "clips_scaled", "clips", "rank"))
def clip_before_unscale(v: RunView) -> Result:
    """clip_grad_norm_ called on gradients still multiplied by an enabled scaler's scale."""
    found = _scaled_recipes(v)
    if isinstance(found, Skip):
        return found
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


def _first(r: dict[str, Any], key: str) -> dict[str, Any] | None:
    return (r.get("first") or {}).get(key)


def _counts(r: dict[str, Any]) -> str:
    return (f"scaler.scale {r.get('scaled')}, unscale_ {r.get('unscaled')}, scaler.step {r.get('scaler_steps')}, "
            f"update {r.get('updates')}, optimizer.step {r.get('optimizer_steps')}, backward {r.get('backwards')}")


@check(facts=("step", "micro", "scale", "optimizer", "params", "through_scaler", "steps_bypassing",
              "optimizer_steps", "rank"))
def optimizer_bypasses_scaler(v: RunView) -> Result:
    """optimizer.step() called directly (not through scaler.step) on gradients of a scaled
    loss that were never unscaled."""
    found = _scaled_recipes(v)
    if isinstance(found, Skip):
        return found
    for p, r in found:
        first = _first(r, "step_bypassing")
        if not r.get("steps_bypassing") or not first:
            continue
        through = ", ".join(first.get("stepped_through_scaler") or []) or None
        facts = {"step": first.get("step"), "micro": first.get("micro") or None, "scale": _g4(first.get("scale")),
                 "optimizer": first.get("optimizer"), "params": f"{first.get('params'):,}" if first.get("params")
                 else None, "through_scaler": through, "steps_bypassing": r["steps_bypassing"],
                 "optimizer_steps": r.get("optimizer_steps")}
        return [Hit(_with_rank(v, p, facts), [(f"{p.path}.watch.recipe.first.step_bypassing", first),
                                              (f"{p.path}.watch.recipe", _counts(r))])]
    return []


@check(facts=("step", "micro", "scale", "before", "after", "updates", "updates_in_iteration", "rank"))
def update_between_steps(v: RunView) -> Result:
    """scaler.update() called again with no backward() since the last update: between two
    optimizers' scaler.step() of one iteration."""
    found = _scaled_recipes(v)
    if isinstance(found, Skip):
        return found
    for p, r in found:
        first = _first(r, "update_twice")
        if not r.get("updates_without_backward") or not first:
            continue
        facts = {"step": first.get("step"), "micro": first.get("micro") or None, "scale": _g4(first.get("scale")),
                 "before": ", ".join(first.get("stepped_before") or []) or None,
                 "after": ", ".join(first.get("stepped_after") or []) or None,
                 "updates": r.get("updates"), "updates_in_iteration": r["updates_without_backward"]}
        return [Hit(_with_rank(v, p, facts), [(f"{p.path}.watch.recipe.first.update_twice", first),
                                              (f"{p.path}.watch.recipe", _counts(r))])]
    return []


@check(facts=("step", "micro", "scale", "grad_norm", "true_norm", "penalty_factor", "penalty_unscaled",
              "penalty_grads", "rank"))
def penalty_not_unscaled(v: RunView) -> Result:
    """torch.autograd.grad(scaler.scale(loss), ..., create_graph=True) in an iteration that
    never read scaler.get_scale() to divide the gradients by it."""
    found = _scaled_recipes(v)
    if isinstance(found, Skip):
        return found
    for p, r in found:
        first = _first(r, "penalty_unscaled")
        if not r.get("penalty_unscaled") or not first:
            continue
        scale, norm = first.get("scale"), first.get("grad_norm")
        facts = {"step": first.get("step"), "micro": first.get("micro") or None, "scale": _g4(scale),
                 "grad_norm": _g4(norm), "true_norm": _g4(norm / scale) if norm is not None and scale else None,
                 "penalty_factor": _g4(scale * scale) if scale else None,
                 "penalty_unscaled": r["penalty_unscaled"], "penalty_grads": r.get("penalty_grads")}
        return [Hit(_with_rank(v, p, facts), [(f"{p.path}.watch.recipe.first.penalty_unscaled", first),
                                              (f"{p.path}.watch.recipe", _counts(r))])]
    return []


@check(facts=("step", "where", "keys", "scale", "saves_with_optimizer", "rank"))
def checkpoint_without_scaler(v: RunView) -> Result:
    """torch.save of an optimizer's state (a resumable checkpoint) in a run whose enabled
    scaler's state was never saved."""
    found = _scaled_recipes(v)
    if isinstance(found, Skip):
        return found
    for p, r in found:
        first = _first(r, "checkpoint")
        if not r.get("saves_with_optimizer") or r.get("saves_with_scaler") or not first:
            continue
        keys = first.get("keys")
        facts = {"step": first.get("step"), "where": first.get("where"),
                 "keys": ", ".join(repr(k) for k in keys) if keys else None, "scale": _g4(first.get("scale")),
                 "saves_with_optimizer": r["saves_with_optimizer"]}
        return [Hit(_with_rank(v, p, facts), [(f"{p.path}.watch.recipe.first.checkpoint", first),
                                              (f"{p.path}.watch.recipe", f"torch.save {r.get('saves')} call(s), "
                                               f"{r['saves_with_optimizer']} with an optimizer's state, "
                                               f"{r.get('saves_with_scaler', 0)} with the scaler's")])]
    return []


@check(facts=("step", "function", "forward_at", "missing", "autocast_device", "autocast_dtype", "functions", "rank"))
def function_without_custom_fwd(v: RunView) -> Result:
    """A custom torch.autograd.Function of the user's code applied under autocast without
    torch.amp.custom_fwd on its forward or custom_bwd on its backward."""
    found = [(p, r) for p, r in _recipes(v) if r.get("functions_autocast") or r.get("functions_undecorated")]
    if not found:
        return Skip("no custom autograd Function of this run's code was applied under autocast")
    for p, r in found:
        first = _first(r, "function_undecorated")
        if not r.get("functions_undecorated") or not first:
            continue
        missing = " and ".join(x for x, ok in (("custom_fwd", first.get("custom_fwd")),
                                               ("custom_bwd", first.get("custom_bwd"))) if not ok)
        facts = {"step": first.get("step"), "function": first.get("function"), "forward_at": first.get("forward_at"),
                 "missing": missing, "autocast_device": first.get("autocast_device"),
                 "autocast_dtype": first.get("autocast_dtype"), "functions": r["functions_undecorated"]}
        return [Hit(_with_rank(v, p, facts), [(f"{p.path}.watch.recipe.first.function_undecorated", first)])]
    return []


@check(facts=("accumulation_steps", "backwards", "optimizer_steps", "rank"))
def accumulation_not_used(v: RunView) -> Result:
    """Accelerator(gradient_accumulation_steps=N>1), accelerator.accumulate() never entered,
    and the optimizer stepped at (nearly) every backward()."""
    found = [(p, r) for p, r in _recipes(v) if (r.get("accumulation_steps") or 0) > 1]
    if not found:
        return Skip("no Accelerator with gradient accumulation in this run")
    for p, r in found:
        n, backs, steps = r["accumulation_steps"], r.get("backwards") or 0, r.get("optimizer_steps") or 0
        if r.get("accumulate_calls") or backs < n or steps * n <= backs:
            continue
        facts = {"accumulation_steps": n, "backwards": backs, "optimizer_steps": steps}
        return [Hit(_with_rank(v, p, facts), [(f"{p.path}.watch.recipe",
                                               f"gradient_accumulation_steps {n}, accelerator.accumulate() entered "
                                               f"0 times; backward {backs}, optimizer.step {steps}")])]
    return []
