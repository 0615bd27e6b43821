"""Steps and roots: which module is the model, where a step begins, which steps are
watched (sampling), and the names modules have for the user.

The outermost module called with parameters is the *primary root* (the model). Steps are
the user's: optimizer steps (an optimizer's step(), or a loss scaler's step(), which
skips the optimizer's on overflow), as the loop counts them. The first training forward
(grad enabled, the model in train mode) after one begins the next step; the training
forwards within a step are its micro-batches (gradient accumulation: `micro` 0..N-1);
evaluation forwards begin no step (they belong to the step before them). Before any optimizer step has been seen, a training
forward after a backward begins a step (a loop without an optimizer counts its
forwards); at the first optimizer step those turn out to be the micro-batches of step 0
and are renumbered so. An integration may count the steps itself instead (`mark_step`,
from the trainer's step events).

With sampling (``every=N``) the per-module reductions run on steps 0, N, 2N, ... only;
a non-finite loss met on a step not watched makes every later step watched, so that the
module that makes it can be named.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

# Sampling: watch the modules of every Nth step only (see `sampling_period`).
ENV_EVERY = "MPDOCTOR_WATCH_EVERY"


def sampling_period(every: Any, from_env: bool = False) -> int:
    """The sampling period: `every` as given (a positive int, else ValueError); when not
    given, 1, or for `mpdoctor run`'s recorder (`from_env`) MPDOCTOR_WATCH_EVERY (a wrong
    value there means 1: the training must not fail on it)."""
    if every is None:
        raw = os.environ.get(ENV_EVERY, "").strip() if from_env else ""
        return int(raw) if raw.isdigit() and int(raw) > 0 else 1
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"mpdoctor.watch(every=...) takes a positive integer, not {every!r}")
    return every


def strip_wrapper(name: str, root: Any) -> str:
    """A module's name as the user knows it: DDP / DataParallel / torch.compile wrap the
    user's model under `module.` / `_orig_mod.`."""
    for prefix in ("module.", "_orig_mod."):
        if name.startswith(prefix) and hasattr(root, prefix[:-1]):
            return name[len(prefix):]
    return name


def _training(mod: Any) -> bool:
    """A training forward: grad enabled and the module in train mode (not evaluation)."""
    return bool(getattr(mod, "training", True)) and torch.is_grad_enabled()


class _RootInfo:
    __slots__ = ("primary",)

    def __init__(self, primary: bool) -> None:
        self.primary = primary


class StepCounter:
    """The recorder's roots, steps and module names (a mixin of ``recorder.Recorder``)."""

    def _init_steps(self, every: int) -> None:
        # Step sampling: the per-module reductions (forward outputs, gradients) and the
        # per-parameter gradient norms run on steps 0, N, 2N, ... only; the loss, the loss
        # scale and exceptions are recorded on every step (one value each, or nothing).
        self.every = every
        self._on = True  # is the current step sampled
        self._escalated_from: int | None = None  # every step watched from this one on
        self._step_driven = False  # steps counted by mark_step() (an integration), not by forwards
        self.step = -1
        self.micro = -1  # the training forward (micro-batch) within the step, 0-based
        self.optimizer_steps = 0  # steps completed (optimizer or loss scaler steps)
        self._closed = True  # an optimizer step ended the current step
        self._backward_since = False  # a backward ran since the step's last training forward
        self._provisional = False  # steps were begun at a backward, before any optimizer step
        self._early_forwards = 0  # training forwards before the first optimizer step
        self._roots: dict[int, _RootInfo] = {}
        self._primary: Any = None
        self._names: dict[int, str] = {}
        self._params_counted = False
        self._batch_shape: list[int] | None = None

    def _new_root(self, mod: Any, force_primary: bool = False) -> _RootInfo:
        has_params = next(iter(mod.parameters()), None) is not None
        contains_primary = self._primary is not None and any(m is self._primary for m in mod.modules())
        primary = force_primary or (has_params and (self._primary is None or contains_primary))
        info = _RootInfo(primary)
        if len(self._roots) > 1000:  # modules made on the fly each step: keep the map small
            self._roots = {k: v for k, v in self._roots.items() if v.primary}
        self._roots[id(mod)] = info
        for name, m in mod.named_modules():
            name = strip_wrapper(name, mod)
            if primary or id(m) not in self._names:
                self._names[id(m)] = name
        if primary:
            if self._primary is not None and self._primary is not mod:
                self._roots[id(self._primary)].primary = False
            self._primary = mod
            self._params_counted = False
        return info

    def _root_enter(self, mod: Any, args: Any) -> None:
        info = self._roots.get(id(mod))
        if info is None:
            info = self._new_root(mod)
        if not info.primary:
            # a model trained beside a primary used only without grad (a frozen teacher
            # called first): its training forward begins the next step too
            if self._closed and self.step >= 0 and not self._step_driven and _training(mod):
                self._forward_begins(mod)
            return
        if not self._step_driven:
            self._forward_begins(mod)
        elif _training(mod):
            self.micro += 1
        if not self._params_counted:
            self._params_counted = True
            self.plan_tracker.count_root(mod)
        t = args[0] if args and isinstance(args[0], Tensor) else None
        self._batch_shape = list(t.shape) if t is not None else None
        if self.sink is not None:
            self.sink.progress(self.step, "forward")

    def _forward_begins(self, mod: Any) -> None:
        """The model's forward begins: the next step if an optimizer step ended this one
        (or, before any, a backward did), else the next micro-batch of this one."""
        training = _training(mod)
        before_any = not self.optimizer_steps
        if self.step < 0 or (training and (self._closed or (self._backward_since and before_any))):
            if not self._closed and self.step >= 0:
                self._provisional = True
            self._next_step()
            self.micro = -1
            self._closed = False
        else:
            self.flush()  # a step's values are read at each forward (bounded memory, one read)
        if training:
            self.micro += 1
            self._backward_since = False
            if before_any:
                self._early_forwards += 1

    def _step_taken(self) -> None:
        """An optimizer's or a loss scaler's step: the current step is done (a second
        optimizer, or the optimizer under the scaler, in the same step counts once)."""
        if self._closed or self._step_driven:
            if self._step_driven:
                self.optimizer_steps += 1
            return
        self._closed = True
        self.optimizer_steps += 1
        if self._provisional:
            self._fold_into_step_0()

    def _fold_into_step_0(self) -> None:
        """The steps begun at a backward before the first optimizer step were the
        micro-batches of its accumulation cycle: they are step 0."""
        self._provisional = False
        self.flush()
        self.readout.renumber_steps(0)
        for err in [*self.errors, *self.recovered]:
            if err.step > 0:
                err.step = 0
        if self._escalated_from is not None:
            self._escalated_from = 0
        self.step = 0
        self.micro = self._early_forwards - 1

    def _next_step(self) -> None:
        self.flush()
        self.step += 1
        self._on = self.every == 1 or self.step % self.every == 0
        if not self._on and self.readout.held_loss is not None:
            # a non-finite loss on a step that was not watched: watch every step from now on
            self._on = True
            if self._escalated_from is None:
                self._escalated_from = self.step
        self._sample_hooks()

    def mark_step(self) -> None:
        """A training step begins, as the training loop counts them (the integrations
        call it from the Trainer's step events). From the first call on, steps are these,
        not the outermost module's forwards: a LightningModule whose training_step calls
        its submodules, or gradient accumulation, then counts as the trainer does."""
        if self.disabled:
            return
        try:
            self._step_driven = True
            self._stack().clear()
            self._next_step()
            self.micro = -1
        except Exception as exc:
            self._fail(exc)

    def _is_sampled(self, step: int) -> bool:
        return step % self.every == 0 or (self._escalated_from is not None and step >= self._escalated_from)

    def name_of(self, mod: Any) -> str:
        if mod is None:
            return "(loss)"
        name = self._names.get(id(mod))
        if name is None:
            return type(mod).__name__
        return name or type(mod).__name__
