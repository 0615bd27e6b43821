"""The mixed-precision recipe as the loop really follows it: which of the loss scaler's
calls happened in which order, around backward() and gradient clipping.

PyTorch's "Automatic Mixed Precision examples" ask of a loop with a GradScaler:
`scaler.unscale_(optimizer)` before clipping or inspecting gradients, one
`scaler.update()` per iteration (after every optimizer of the iteration has been
stepped through `scaler.step(opt)`, once per accumulation cycle), gradients taken with
`torch.autograd.grad` of a scaled loss divided by the scale, the scaler's state saved
with the checkpoint, `custom_fwd`/`custom_bwd` on a custom autograd Function used under
autocast; accelerate asks for `accelerator.accumulate(model)` when accumulation is
configured. This file keeps the few counters that show a deviation and, for the first of
each kind, the step and the values that make it evidence (the scale, the norm
clip_grad_norm_ saw, the optimizer, the keys of the checkpoint). It records; the run face
judges (rules/run/).

Cheap by construction: a few attribute writes per call; a tensor is read (`.item()`)
only for the first deviation of a kind.
"""

from __future__ import annotations

import os
import weakref
from typing import Any


def _where(w: Any) -> dict[str, Any]:
    return {"step": getattr(w, "step", None), "micro": getattr(w, "micro", None)}


def _stage_unscaled(scaler: Any, opt: Any) -> bool:
    """Whether `scaler.unscale_(opt)` ran for `opt` since the last update (GradScaler's own
    per-optimizer state; READY=0, UNSCALED=1, STEPPED=2)."""
    states = getattr(scaler, "_per_optimizer_states", None)
    st = states.get(id(opt)) if isinstance(states, dict) else None
    stage = st.get("stage") if isinstance(st, dict) else None
    return getattr(stage, "name", None) in ("UNSCALED", "STEPPED")


_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval")


def _kind_of(obj: Any) -> str | None:
    """What a saved object is: a GradScaler's state, an optimizer's, a module's."""
    if type(obj).__name__ == "GradScaler":
        return "scaler"
    if isinstance(obj, dict) and obj:
        if all(k in obj for k in _SCALER_KEYS):
            return "scaler"
        if "state" in obj and "param_groups" in obj:
            return "optimizer"
        first = next(iter(obj.values()))
        if isinstance(next(iter(obj)), str) and type(first).__name__ in ("Tensor", "Parameter"):
            return "model"
    if hasattr(obj, "state_dict") and hasattr(obj, "param_groups"):
        return "optimizer"
    return None


def _kinds(obj: Any) -> set[str]:
    """The kinds of state in a saved object and one level inside it (a checkpoint dict)."""
    k = _kind_of(obj)
    if k is not None:
        return {k}
    found: set[str] = set()
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for v in list(values)[:64]:
        k = _kind_of(v)
        if k is not None:
            found.add(k)
        elif isinstance(v, dict):  # {"state": {"model": ..., "optimizer": ...}}
            found.update(x for x in map(_kind_of, list(v.values())[:64]) if x)
    return found


def _user_code(path: str) -> bool:
    return bool(path) and "site-packages" not in path and "dist-packages" not in path \
        and not path.startswith("<")


def _amp_decorated(fn: Any, name: str) -> bool:
    f = getattr(fn, "__func__", fn)
    code = getattr(f, "__code__", None)
    return code is not None and code.co_name == name and os.sep + "amp" + os.sep in code.co_filename


def _enabled(scaler: Any) -> bool:
    return bool(getattr(scaler, "_enabled", False))


def _scale_of(scaler: Any) -> float | None:
    s = getattr(scaler, "_scale", None)
    if s is None:
        return None
    try:
        return float(s.reshape(-1)[0].item())
    except Exception:
        return None


class RecipeTracker:
    """Counters and first occurrences; `to_dict()` is the `recipe` of a run's watch."""

    def __init__(self) -> None:
        self.scaled = 0          # scaler.scale(loss) calls (enabled scalers)
        self.unscaled = 0        # scaler.unscale_(opt) calls
        self.scaler_steps = 0    # scaler.step(opt) calls
        self.updates = 0         # scaler.update() calls
        self.clips = 0           # clip_grad_norm_ calls
        self.clips_scaled = 0    # ... of gradients still multiplied by the scale
        self.updates_without_step = 0     # update() with no scaler.step() since the last update
        self.updates_without_backward = 0  # a second update() in one iteration (no backward between)
        self.first: dict[str, dict[str, Any]] = {}
        self._scaled_backward = False   # a backward of a scaled loss since the last step/update
        self._unscaled_since = False    # unscale_() since that backward
        self._step_since_update = False
        self._backward_since_update = False
        self._scale_pending = False
        self._scaler: Any = None
        # several optimizers with one scaler
        self.optimizers: dict[int, str] = {}   # id(optimizer) -> "#i ClassName", in the order first stepped
        self.optimizer_steps = 0          # optimizer.step() calls (through scaler.step or not)
        self.steps_bypassing = 0          # ... called directly on gradients still multiplied by the scale
        self._in_scaler_step = False
        self._stepped: list[str] = []      # optimizers stepped through the scaler since the last update
        self._stepped_before: list[str] = []
        # gradient penalty: torch.autograd.grad of a scaled loss
        self.penalty_grads = 0            # autograd.grad(scaler.scale(loss), ..., create_graph=True)
        self.penalty_unscaled = 0         # ... in an iteration that never read scaler.get_scale()
        self._scaled_out: list[Any] = []
        self._penalty: dict[str, Any] | None = None
        self._scale_read = False
        # checkpoints
        self.saves = 0
        self.saves_with_optimizer = 0
        self.saves_with_scaler = 0
        # custom autograd Functions used under autocast
        self.functions_autocast = 0       # Functions of the user's code applied under autocast
        self.functions_undecorated = 0    # ... without custom_fwd / custom_bwd
        self._functions_seen: set[Any] = set()
        # accelerate's gradient accumulation
        self.accumulation_steps = 0
        self.accumulate_calls = 0
        self.backwards = 0

    # ---- the calls -----------------------------------------------------------------------
    def scale(self, scaler: Any) -> None:
        if not _enabled(scaler):
            return
        self.scaled += 1
        self._scaler = scaler
        self._scale_pending = True

    def backward(self) -> None:
        self.backwards += 1
        self._backward_since_update = True
        if self._scale_pending:
            self._scaled_backward = True
            self._unscaled_since = False
            self._scale_pending = False

    def unscale(self, scaler: Any) -> None:
        if not _enabled(scaler):
            return
        self.unscaled += 1
        self._unscaled_since = True

    def step(self, scaler: Any) -> None:
        if not _enabled(scaler):
            return
        self.scaler_steps += 1
        self._step_since_update = True
        self._in_scaler_step = True

    def update(self, scaler: Any, where: dict[str, Any]) -> None:
        if not _enabled(scaler):
            return
        self.updates += 1
        if not self._step_since_update:
            self.updates_without_step += 1
            if "update_without_step" not in self.first:
                self.first["update_without_step"] = {**where, "scale": _scale_of(scaler),
                                                     "steps_before": self.scaler_steps, "updates_before": self.updates - 1}
        elif not self._backward_since_update and self.updates > 1:
            self.updates_without_backward += 1
            if "update_twice" not in self.first:
                self.first["update_twice"] = {**where, "scale": _scale_of(scaler), "scaler_steps": self.scaler_steps,
                                              "stepped_before": list(self._stepped_before),
                                              "stepped_after": list(self._stepped)}
        if self._penalty is not None and not self._scale_read:
            self.penalty_unscaled += 1
            self.first.setdefault("penalty_unscaled", self._penalty)
        self._penalty = None
        self._scale_read = False
        self._stepped_before, self._stepped = self._stepped, []
        self._in_scaler_step = False
        self._step_since_update = False
        self._backward_since_update = False
        self._scaled_backward = False
        self._unscaled_since = False

    def clip(self, norm: Any, max_norm: Any, where: dict[str, Any]) -> None:
        self.clips += 1
        scaler = self._scaler
        if scaler is None or not _enabled(scaler) or not self._scaled_backward or self._unscaled_since:
            return
        self.clips_scaled += 1
        if "clip_scaled" not in self.first:
            seen = None
            try:
                seen = float(norm.reshape(-1)[0].item())
            except Exception:
                pass
            try:
                max_norm = float(max_norm) if max_norm is not None else None
            except (TypeError, ValueError):
                max_norm = None
            self.first["clip_scaled"] = {**where, "scale": _scale_of(scaler), "norm_seen": seen, "max_norm": max_norm}

    # ---- the optimizers' steps (patches: a global optimizer step pre-hook) ---------------
    def optimizer_step(self, w: Any, opt: Any) -> None:
        name = self.optimizers.get(id(opt))
        if name is None:
            name = self.optimizers[id(opt)] = f"#{len(self.optimizers)} {type(opt).__name__}"
        self.optimizer_steps += 1
        if self._in_scaler_step:  # the scaler's own call of opt.step(), after unscale_ and the inf check
            self._in_scaler_step = False
            self._stepped.append(name)
            return
        scaler = self._scaler
        if scaler is None or not _enabled(scaler) or not self._scaled_backward or _stage_unscaled(scaler, opt):
            return
        if not any(p.grad is not None for g in opt.param_groups for p in g["params"]):
            return
        self.steps_bypassing += 1
        if "step_bypassing" not in self.first:
            self.first["step_bypassing"] = {
                **_where(w), "scale": _scale_of(scaler), "optimizer": name,
                "params": sum(p.numel() for g in opt.param_groups for p in g["params"] if p.grad is not None),
                "stepped_through_scaler": list(self._stepped)}

    # ---- gradient penalty (patches: scaler.scale's result, torch.autograd.grad, get_scale)
    def scaled_output(self, w: Any, scaler: Any, out: Any) -> None:
        if not _enabled(scaler):
            return
        outs = out if isinstance(out, (list, tuple)) else (out,)
        self._scaled_out = [weakref.ref(t) for t in outs[:8] if hasattr(t, "grad_fn")]

    def autograd_grad(self, w: Any, outputs: Any, create_graph: Any, result: Any) -> None:
        if not create_graph or not self._scaled_out:
            return
        outs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
        scaled = [r() for r in self._scaled_out]
        if not any(any(o is t for t in scaled if t is not None) for o in outs):
            return
        self.penalty_grads += 1
        self._scale_read = False  # the recipe reads the scale after autograd.grad, to divide by it
        if self._penalty is None:
            entry: dict[str, Any] = {**_where(w), "scale": _scale_of(self._scaler)}
            if "penalty_unscaled" not in self.first:
                try:  # the evidence, read once: the norm of what autograd.grad returned
                    import torch

                    gs = [g.detach().float().reshape(-1) for g in result if g is not None]
                    entry["grad_norm"] = float(torch.linalg.vector_norm(torch.cat(gs)).item()) if gs else None
                except Exception:
                    entry["grad_norm"] = None
            self._penalty = entry

    def get_scale(self, w: Any, scaler: Any) -> None:
        self._scale_read = True

    # ---- checkpoints (patches: torch.save) --------------------------------------------------
    def saved(self, w: Any, obj: Any, frame: Any) -> None:
        self.saves += 1
        kinds = _kinds(obj)
        if "scaler" in kinds:
            self.saves_with_scaler += 1
        if "optimizer" not in kinds:
            return
        self.saves_with_optimizer += 1
        if "checkpoint" not in self.first:
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None
            keys = [str(k) for k in list(obj.keys())[:8]] if isinstance(obj, dict) else None
            self.first["checkpoint"] = {**_where(w), "where": where, "keys": keys, "kinds": sorted(kinds),
                                        "scale": _scale_of(self._scaler) if self._scaler is not None else None}

    # ---- custom autograd Functions (patches: Function.apply looked up under autocast) ----------
    def function_apply(self, w: Any, cls: Any) -> None:
        if cls in self._functions_seen:
            return
        self._functions_seen.add(cls)
        fwd, bwd = getattr(cls, "forward", None), getattr(cls, "backward", None)
        inner = getattr(fwd, "__func__", fwd)
        for _ in range(4):  # custom_fwd's wrapper: the user's forward is inside it
            inner = getattr(inner, "__wrapped__", inner)
        code = getattr(inner, "__code__", None)
        path = code.co_filename if code is not None else ""
        if not _user_code(path) or (cls.__module__ or "").startswith("torch."):
            return
        self.functions_autocast += 1
        fwd_ok, bwd_ok = _amp_decorated(fwd, "decorate_fwd"), _amp_decorated(bwd, "decorate_bwd")
        if fwd_ok and bwd_ok:
            return
        self.functions_undecorated += 1
        if "function_undecorated" in self.first:
            return
        import torch

        device, dtype = None, None
        for dev in ("cuda", "cpu", "xpu", "mps"):
            try:
                if torch.is_autocast_enabled(dev):
                    device, dtype = dev, str(torch.get_autocast_dtype(dev)).replace("torch.", "")
                    break
            except Exception:
                continue
        self.first["function_undecorated"] = {
            **_where(w), "function": getattr(cls, "__qualname__", cls.__name__),
            "forward_at": f"{path}:{code.co_firstlineno}" if code is not None else None,
            "custom_fwd": fwd_ok, "custom_bwd": bwd_ok, "autocast_device": device, "autocast_dtype": dtype}

    # ---- accelerate's gradient accumulation (patches: Accelerator(), accumulate()) ----------
    def accelerator(self, w: Any, acc: Any) -> None:
        try:
            self.accumulation_steps = max(self.accumulation_steps, int(acc.gradient_accumulation_steps or 0))
        except Exception:
            pass

    def accumulate(self, w: Any, acc: Any) -> None:
        self.accumulate_calls += 1

    # ---- the record ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any] | None:
        if not (self.scaled or self.clips or self.first or self.functions_autocast or self.accumulation_steps > 1):
            return None
        d = {"scaled": self.scaled, "unscaled": self.unscaled, "scaler_steps": self.scaler_steps,
             "updates": self.updates, "clips": self.clips, "clips_scaled": self.clips_scaled,
             "updates_without_step": self.updates_without_step,
             "updates_without_backward": self.updates_without_backward,
             "optimizer_steps": self.optimizer_steps, "optimizers": list(self.optimizers.values()),
             "steps_bypassing": self.steps_bypassing, "penalty_grads": self.penalty_grads,
             "penalty_unscaled": self.penalty_unscaled, "saves": self.saves,
             "saves_with_optimizer": self.saves_with_optimizer, "saves_with_scaler": self.saves_with_scaler,
             "functions_autocast": self.functions_autocast, "functions_undecorated": self.functions_undecorated,
             "backwards": self.backwards,
             "first": dict(self.first)}
        if self.accumulation_steps > 1:
            d["accumulation_steps"] = self.accumulation_steps
            d["accumulate_calls"] = self.accumulate_calls
        return d
