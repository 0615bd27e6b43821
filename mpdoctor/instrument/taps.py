"""What the recorder hears from the process-wide taps (patches.py) and from a watched
accelerate Accelerator: the loss backward() is called on, the loss scaler's scale at each
update, the optimizer's step (the per-parameter gradient norms before it, the precision
plan's optimizer facts), clip_grad_norm_'s result, what accelerate prepares.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import Tensor

from .steps import strip_wrapper


class LazyParamNames:
    """Parameter names, resolved only when one of them turns out to matter."""

    def __init__(self, recorder: Any, params: list[Tensor]) -> None:
        self.recorder = recorder
        self.params = [weakref.ref(p) for p in params]

    def __getitem__(self, j: int) -> str:
        p = self.params[j]()
        root = self.recorder._primary
        if p is not None and root is not None:
            for name, q in root.named_parameters():
                if q is p:
                    return strip_wrapper(name, root)
        return f"parameter #{j}"


class TrainingTaps:
    """Loss, scaler, optimizer and Accelerator observation (a mixin of ``recorder.Recorder``)."""

    def on_backward(self, loss: Tensor) -> None:
        if self.disabled or not isinstance(loss, Tensor) or not loss.is_floating_point() or not loss.numel():
            return
        self._backward_since = True
        self.recipe.backward()
        v = loss.detach()
        v = v.reshape(-1)[0] if v.numel() == 1 else torch.linalg.vector_norm(v.float())
        self._pend_pair("loss", v, v)
        if self.sink is not None:
            self.sink.progress(self.step, "backward")

    def on_scaler_created(self, scaler: Any) -> None:
        self.plan_tracker.on_scaler_created(scaler)

    def on_scaler_seen(self, scaler: Any) -> None:
        self.plan_tracker.on_scaler_seen(scaler)

    def on_scaler_scale(self, scaler: Any) -> None:
        self.plan_tracker.on_scaler_seen(scaler)
        if not self.disabled:
            self.recipe.scale(scaler)

    def on_scaler_unscale(self, scaler: Any) -> None:
        self.plan_tracker.on_scaler_seen(scaler)
        if not self.disabled:
            self.recipe.unscale(scaler)

    def on_scaler_step(self, scaler: Any) -> None:
        """scaler.step(optimizer): a step, taken or skipped (on overflow the scaler does not
        call the optimizer's step)."""
        if self.disabled:
            return
        self.plan_tracker.on_scaler_seen(scaler)
        self.recipe.step(scaler)
        self._step_taken()

    def on_scale(self, scaler: Any, before: Tensor, after: Tensor) -> None:
        if self.disabled:
            return
        self.plan_tracker.on_scaler_seen(scaler)
        self.recipe.update(scaler, {"step": self.step, "micro": self.micro})
        self._pend_pair("scale", before.reshape(()), after.reshape(()))

    def on_optimizer_pre(self, opt: Any) -> None:
        if self.disabled:
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        self.plan_tracker.on_optimizer(opt, params)
        with_grad = [p for p in params if p.grad is not None]
        if not with_grad:
            return
        if not self._on:
            self.plan_tracker.before_step(with_grad)
            return
        grads = [p.grad for p in with_grad]
        norms = torch._foreach_norm(grads, math.inf, dtype=torch.float32)
        by_dev: dict[Any, list[int]] = {}
        for j, n in enumerate(norms):
            by_dev.setdefault(n.device, []).append(j)
        for idx in by_dev.values():
            self._pend_vector("pgrad", torch.stack([norms[j] for j in idx]),
                              LazyParamNames(self, [with_grad[j] for j in idx]))
        self.plan_tracker.before_step(with_grad)
        if self.sink is not None:
            self.sink.progress(self.step, "optimizer")

    def on_optimizer_post(self, opt: Any) -> None:
        if self.disabled:
            return
        self._step_taken()
        self._after_optimizer_step()
        if self.plan_tracker.after_step():
            self._emit()

    def on_grad_norm(self, norm: Any, max_norm: Any = None) -> None:
        if self.disabled or not isinstance(norm, Tensor):
            return
        self.recipe.clip(norm, max_norm, {"step": self.step, "micro": self.micro})
        self._pend_vector("gnorm", norm.detach().reshape(1), LazyParamNames(self, []))

    # ---- accelerate ----------------------------------------------------------------------
    def attach_accelerator(self, acc: Any) -> None:
        """Watch what `acc` prepared, and what it will prepare."""
        self.on_accelerator(acc)
        for m in list(getattr(acc, "_models", [])):
            self.attach_module(m)
        original = acc.prepare
        recorder = self

        def prepare(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                objs = result if isinstance(result, tuple) else (result,)
                for obj in objs:
                    if isinstance(obj, torch.nn.Module):
                        recorder.attach_module(obj)
                recorder.on_prepare(acc, objs)
            except Exception as exc:
                recorder._fail(exc)
            return result

        acc.prepare = prepare

    def on_accelerator(self, acc: Any) -> None:
        if self.plan_tracker.add_accelerator(acc):
            self._refresh_plan()

    def on_prepare(self, acc: Any, objs: tuple) -> None:
        self.on_accelerator(acc)
        self.plan_tracker.on_prepare(objs)
