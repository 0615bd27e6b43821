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
