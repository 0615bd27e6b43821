"""The mixed-precision recipe as the loop really follows it: which of the loss scaler's
calls happened in which order, around backward() and gradient clipping.

PyTorch's "Automatic Mixed Precision examples" ask of a loop with a GradScaler:
`scaler.unscale_(optimizer)` before clipping or inspecting gradients, one
`scaler.update()` per iteration (after every optimizer of the iteration has been
stepped, once per accumulation cycle). This file keeps the few counters that show a
deviation and, for the first of each kind, the step and the values that make it evidence
(the scale, the norm clip_grad_norm_ saw). It records; the run face judges (rules/run/).

Cheap by construction: a few attribute writes per call; a tensor is read (`.item()`)
only for the first deviation of a kind.
"""

from __future__ import annotations

from typing import Any


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

    # ---- the calls -----------------------------------------------------------------------
    def scale(self, scaler: Any) -> None:
        if not _enabled(scaler):
            return
        self.scaled += 1
        self._scaler = scaler
        self._scale_pending = True

    def backward(self) -> None:
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
                self.first["update_twice"] = {**where, "scale": _scale_of(scaler), "scaler_steps": self.scaler_steps}
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

    # ---- the record ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any] | None:
        if not (self.scaled or self.clips):
            return None
        return {"scaled": self.scaled, "unscaled": self.unscaled, "scaler_steps": self.scaler_steps,
                "updates": self.updates, "clips": self.clips, "clips_scaled": self.clips_scaled,
                "updates_without_step": self.updates_without_step,
                "updates_without_backward": self.updates_without_backward, "first": dict(self.first)}
