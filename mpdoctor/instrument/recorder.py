"""The recorder: what the instrumentation keeps about one training process, and the
handle `instrument.watch()` returns. It records; it never judges (the run face does, from
the snapshot; `mpdoctor.watch()` adds findings() on top of this handle).

One idea a module, joined here:

- ``hooks.ModuleHooks``: module forward hooks and gradient tensor hooks (the hot path);
- ``steps.StepCounter``: which module is the model, where a step begins, sampling, names;
- ``pending.PendingValues``: the values left on the devices and the once-per-step read,
  handed to ``readout.Readout`` (non-finite values, overflow, the loss scale);
- ``taps.TrainingTaps``: the loss, the loss scaler, the optimizer step, accelerate;
- ``errors.ErrorRecorder``: exceptions, with their memory context, and which were caught
  and trained on after;
- ``plan.PlanTracker``: the precision plan; ``events.EventSink``: where the records go
  under `mpdoctor run`.

Everything here fails open: a hook that raises records an internal error, turns the
recorder off, and returns normally.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from .errors import ErrorRecorder
from .hooks import ModuleHooks
from .pending import PendingValues
from .plan import PlanTracker
from .recipe import RecipeTracker
from .records import NonFinite, PrecisionPlan, ScalerTimeline
from .steps import StepCounter, sampling_period
from .taps import TrainingTaps


class Recorder(ModuleHooks, StepCounter, PendingValues, TrainingTaps, ErrorRecorder):
    """See the package docstring for the handle's API."""

    def __init__(self, *, sink: Any = None, auto: bool = False, every: int | None = None) -> None:
        self.sink = sink
        self.auto = auto
        self.internal_errors: list[str] = []
        self.disabled = False
        self._init_steps(sampling_period(every, from_env=auto))
        self._init_pending()
        self.plan_tracker = PlanTracker(self.name_of)
        self.recipe = RecipeTracker()
        self._init_hooks()
        self._init_errors()

    def close(self) -> None:
        """Read what is pending and remove every hook."""
        self.settle()
        self.remove_hooks()
        from . import patches

        patches.unregister(self)

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the records, current (what is pending is read first) --------------------------
    @property
    def plan(self) -> PrecisionPlan:
        return self.plan_tracker.plan

    @property
    def autocast_dtype(self) -> str | None:
        return self.plan.autocast_dtype

    @property
    def scaler(self) -> ScalerTimeline:
        return self._current().scaler

    @property
    def skipped_steps(self) -> list[int]:
        return self.scaler.skipped_steps

    @property
    def final_scale(self) -> float | None:
        return self.scaler.final_scale

    @property
    def optimizer_step_was_skipped(self) -> bool | None:
        """accelerate's own flag for the last step, when an Accelerator is watched."""
        return self.plan_tracker.optimizer_step_was_skipped

    @property
    def nonfinite(self) -> list[NonFinite]:
        return self._current().nonfinite

    @property
    def first_nonfinite(self) -> NonFinite | None:
        """The first non-finite value found; a non-finite loss of a step whose modules were
        not watched (sampling) until a watched step names the module."""
        r = self._current()
        return r.nonfinite[0] if r.nonfinite else r.held_loss

    def settle(self) -> None:
        """Everything up to now: the pending values read, a held-back non-finite loss
        reported at the loss, the plan refreshed (the end of a training, or a report)."""
        if self.disabled:
            return
        self.flush()
        self.readout.release_held()
        self._refresh_plan()

    def snapshot(self) -> dict[str, Any]:
        """Everything found so far, as the JSON the events file carries."""
        r = self.readout
        return {
            "step": self.step,
            "micro": self.micro,
            "optimizer_steps": self.optimizer_steps,
            "plan": self.plan.to_dict(),
            "scaler": r.scaler.to_dict(),
            "nonfinite": [n.to_dict() for n in r.nonfinite],
            "overflow": [o.to_dict() for o in r.overflow],
            "errors": [e.to_dict() for e in self.errors],
            "recovered": [e.to_dict() for e in self.recovered],
            "internal_errors": list(self.internal_errors),
            "unhooked": list(self.unhooked),
            "loss_zero_grad_nan": list(r.loss_zero_grad_nan) if r.loss_zero_grad_nan else None,
            "last_loss": r.last_loss,
            "last_grad_norm": r.last_grad_norm,
            "recipe": self.recipe.to_dict(),
        }

    # ---- where the records go ----------------------------------------------------------
    def _emit(self) -> None:
        if self.sink is not None:
            self._refresh_plan()
            self.sink.snapshot(self.snapshot())

    def _refresh_plan(self) -> None:
        self.plan_tracker.refresh(self._fail)

    def _fail(self, exc: BaseException) -> None:
        """An error of ours: keep it, stop recording, never let it reach the training."""
        try:
            where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            text = f"{type(exc).__name__}: {exc}"[:300]
            if where is not None:
                text += f" (at {os.path.basename(where.filename)}:{where.lineno} in {where.name})"
            self.internal_errors.append(text)
            self.disabled = True
            if self.sink is not None:
                self.sink.event("internal-error", text=text)
                self.sink.snapshot(self.snapshot())
        except Exception:
            self.disabled = True


def watch(obj: Any = None, **kwargs: Any) -> Recorder:
    """A recorder on a model or accelerator (one per process under `mpdoctor run`:
    watching again there returns the running one). Only a wrong argument raises
    (TypeError, or ValueError for `every`); anything else fails open."""
    from . import patches

    running = patches.auto_watcher()
    if running is not None:
        if obj is not None and _is_accelerator(obj):
            running.on_accelerator(obj)
        return running
    is_module = obj is not None and _is_module(obj)
    if obj is not None and not is_module and not _is_accelerator(obj):
        raise TypeError(f"mpdoctor.watch() takes a torch.nn.Module or an accelerate Accelerator, not {type(obj).__name__}")
    w = Recorder(**kwargs)
    try:
        patches.register(w)
        if obj is None:
            w.attach_global()
        elif is_module:
            w.attach_module(obj)
        else:
            w.attach_accelerator(obj)
    except Exception as exc:  # fail open: the training runs, the recorder says it stopped
        w._fail(exc)
    return w


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _is_accelerator(obj: Any) -> bool:
    return type(obj).__name__ == "Accelerator" and hasattr(obj, "prepare")
