"""A transformers ``TrainerCallback`` that watches the model the way ``mpdoctor.watch``
does, and reports what it found when the training ends::

    from mpdoctor.integrations.transformers import MpdoctorCallback

    cb = MpdoctorCallback()                  # every=N to sample steps; report=None for silence
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb])
    try:
        trainer.train()
    finally:
        cb.finish()                          # a failed train() has no "end" event: report now
    cb.findings                              # root cause first

The Trainer has no event for a training that raises, so `finish()` is also called by an
exception hook while training runs (an uncaught exception prints the findings before
the traceback ends the process) and can be called by the user (as above).
"""

from __future__ import annotations

import sys
from typing import Any

from ..knowledge import intent
from . import require
from ._session import SessionResults, WatchSession

_transformers = require("transformers", "mpdoctor.integrations.transformers", "transformers>=4.40")
TrainerCallback = _transformers.TrainerCallback

__all__ = ["MpdoctorCallback"]


class MpdoctorCallback(SessionResults, TrainerCallback):  # type: ignore[misc, valid-type]
    """Watches the Trainer's model from `on_train_begin`; reports at `on_train_end`.

    every: sample the per-module checks on every Nth step (see mpdoctor.watch);
    report: "terminal" (default), "markdown", "json", "oneline", or None: how the
    findings are printed at the end (on stderr; nothing is printed under `mpdoctor run`,
    which reports them itself)."""

    def __init__(self, every: int | None = None, report: str | None = "terminal", stderr: bool = True) -> None:
        self.session = WatchSession(every=every, report=report, stderr=stderr)
        self._excepthook: Any = None

    # ---- Trainer events -------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        self.session.start(model)
        self._see_trainer_precision(kwargs.get("optimizer"), args)
        self._hook_uncaught()

    def _see_trainer_precision(self, optimizer: Any, args: Any = None) -> None:
        """The Trainer made its Accelerator before training began, so the watch never saw
        it: hand the precision it asked for (accelerate's shared state, the prepared
        optimizer's scaler) to the plan, as `mpdoctor run` sees it (Trainer(fp16=True,
        use_cpu=True) then reads as fp16 asked for, trained in fp32)."""
        h = self.session.handle
        recorder = getattr(h, "recorder", None)
        if recorder is None or recorder.plan_tracker.accelerators or "accelerate" not in sys.modules:
            return
        try:
            from accelerate.state import AcceleratorState

            if not AcceleratorState._shared_state:
                return
            recorder.on_accelerator(_TrainerAccelerator(AcceleratorState(), optimizer))
            # where the precision came from, as `mpdoctor run` records it: the Trainer
            # hands TrainingArguments' fp16/bf16 to its Accelerator over the environment
            asked = "fp16" if getattr(args, "fp16", False) else ("bf16" if getattr(args, "bf16", False) else None)
            sources = recorder.plan_tracker.plan.sources
            if asked and not any(s.get("source") == intent.TRAINER_ARGS for s in sources):
                sources.append({"source": intent.TRAINER_ARGS, "value": asked, "where": None})
        except Exception as exc:  # fail open, as the watcher does
            recorder._fail(exc)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # steps as the Trainer counts them (optimizer steps, gradient accumulation included)
        h = self.session.handle
        if h is not None and self.session._report is None:
            h.mark_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the step's values are read here (one host read, as watch() does at the next forward)
        h = self.session.handle
        if h is not None and self.session._report is None:
            h.flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.finish()

    # ---- results ----------------------------------------------------------------------------
    def finish(self, failure: BaseException | None = None) -> Any:
        """Report now (idempotent): at the end of training, or after train() raised."""
        self._unhook_uncaught()
        if failure is None:
            failure = sys.exc_info()[1]
        return self.session.finish(failure)

    # ---- a training that raises -----------------------------------------------------------
    def _hook_uncaught(self) -> None:
        if self._excepthook is not None:
            return
        previous = sys.excepthook
        callback = self

        def excepthook(tp: Any, value: Any, tb: Any) -> None:
            try:
                callback.finish(value)
            except Exception:
                pass
            previous(tp, value, tb)

        self._excepthook = (previous, excepthook)
        sys.excepthook = excepthook

    def _unhook_uncaught(self) -> None:
        if self._excepthook is not None:
            previous, ours = self._excepthook
            if sys.excepthook is ours:
                sys.excepthook = previous
            self._excepthook = None


class _TrainerAccelerator:
    """What the precision plan reads of an Accelerator, from accelerate's shared state
    and the Trainer's prepared optimizer."""

    def __init__(self, state: Any, optimizer: Any) -> None:
        self._state, self._optimizer = state, optimizer

    @property
    def mixed_precision(self) -> Any:
        return self._state.mixed_precision

    @property
    def distributed_type(self) -> Any:
        return self._state.distributed_type

    @property
    def num_processes(self) -> int:
        return self._state.num_processes

    @property
    def scaler(self) -> Any:
        return getattr(self._optimizer, "scaler", None)

    @property
    def optimizer_step_was_skipped(self) -> Any:
        return getattr(self._optimizer, "step_was_skipped", None)
