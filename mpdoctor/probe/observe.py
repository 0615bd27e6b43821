"""What the probe child learns about a run as it happens (child side: imports torch).

This is the one place the probe touches run instrumentation. When
`mpdoctor.instrument.watch` exists (the instrumentation `mpdoctor run` injects) the
probe uses it; until then a deliberately minimal stand-in reads the three things the
probe reports: the dtype at the first matmul output (did autocast really run?), the
loss scaler (skipped steps, final scale) and non-finite losses. There is no second
instrumentation here: the stand-in is only what the probe needs to tell the truth.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..knowledge.dtypes import dtype_name

_MATMUL_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


class MinimalObserver:
    """The stand-in: hooks removed after the first matmul, one flag read per step."""

    source = "probe-minimal"

    def __init__(self, accelerator: Any, model: nn.Module, scaler: Any = None) -> None:
        self.accelerator = accelerator
        self.model = model
        self.own_scaler = scaler  # a GradScaler the child drives itself (torch-fp16)
        self.skipped_now: bool | None = None
        self.autocast_dtype: str | None = None
        self.skipped_steps = 0
        self.nonfinite: list[dict[str, Any]] = []
        self._step = 0
        self._hooks: list[Any] = []
        self._arm()

    def _arm(self) -> None:
        def first_output(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if self.autocast_dtype is None and isinstance(output, torch.Tensor):
                self.autocast_dtype = dtype_name(output.dtype)
                self._disarm()

        for module in self.model.modules():
            if isinstance(module, _MATMUL_MODULES):
                self._hooks.append(module.register_forward_hook(first_output))

    def _disarm(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def step_done(self, loss: float) -> None:
        if not math.isfinite(loss):
            self.nonfinite.append({"step": self._step, "where": "loss", "value": repr(loss)})
        skipped = self.skipped_now if self.own_scaler is not None else self.accelerator.optimizer_step_was_skipped
        if skipped:
            self.skipped_steps += 1
        self._step += 1

    def scaler(self) -> dict[str, Any]:
        scaler = self.own_scaler or getattr(self.accelerator, "scaler", None)
        if scaler is None:
            return {"present": False}
        try:
            scale = float(scaler.get_scale())
        except Exception:  # a scaler that never ran a step has no scale yet
            scale = None
        return {"present": True, "final_scale": scale, "skipped_steps": self.skipped_steps}

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "autocast_dtype": self.autocast_dtype,
                "skipped_steps": self.skipped_steps, "scaler": self.scaler(),
                "nonfinite": self.nonfinite[:20], "nonfinite_count": len(self.nonfinite),
                "watch": None}

    def stop_watching(self) -> None:
        """End the instrumentation's part; step_done() goes on counting."""
        self._disarm()

    def detach(self) -> None:
        self._disarm()


class WatchObserver(MinimalObserver):
    """The same interface over `mpdoctor.instrument.watch`'s handle: its hooks see the
    first matmul, the scaler and every module's non-finite values; the probe adds
    only the loss check it gets for free (the loss is read every step anyway)."""

    source = "mpdoctor.instrument.watch"

    def __init__(self, accelerator: Any, model: nn.Module, watch: Any, scaler: Any = None) -> None:
        self.accelerator = accelerator
        self.model = model
        self.own_scaler = scaler
        self.skipped_now = None
        self.autocast_dtype = None
        self.skipped_steps = 0
        self.nonfinite = []
        self._step = 0
        self._hooks = []
        # After prepare(): the handle finds the prepared model on the accelerator.
        self.handle: Any = watch(accelerator)
        self.watch_error: str | None = None
        self.seen: dict[str, Any] | None = None  # what the handle saw, kept at stop_watching()
        self.watched_steps = 0

    def step_done(self, loss: float) -> None:
        super().step_done(loss)
        if self.handle is not None:
            self.watched_steps += 1

    def _read_handle(self) -> dict[str, Any]:
        h = self.handle
        try:
            h.flush()
            h._refresh_plan()
            # raw: the parent judges it with the run rules, as `mpdoctor run` would
            return {"watch": h.snapshot(), "autocast_dtype": h.autocast_dtype,
                    "module_nonfinite": [n.to_dict() for n in h.nonfinite][:10], "plan": h.plan.to_dict(),
                    "skipped_steps": len(h.skipped_steps), "final_scale": h.final_scale}
        except Exception as exc:  # fail open: the probe still reports its own view
            self.watch_error = f"{type(exc).__name__}: {exc}"
            return {}

    def stop_watching(self) -> None:
        if self.handle is None:
            return
        self.seen = self._read_handle()
        self.detach()

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        seen = self.seen if self.handle is None else self._read_handle()
        seen = seen or {}
        out["autocast_dtype"] = seen.get("autocast_dtype")
        out["watch"] = seen.get("watch")
        out["module_nonfinite"] = seen.get("module_nonfinite", [])
        out["plan"] = seen.get("plan")
        out["watched_steps"] = self.watched_steps
        scaler = out["scaler"]
        if scaler.get("present"):
            # The probe counted every step; the watch only the ones it watched.
            scaler["skipped_steps"] = max(self.skipped_steps, seen.get("skipped_steps", 0))
            if scaler.get("final_scale") is None:
                scaler["final_scale"] = seen.get("final_scale")
        out["skipped_steps"] = scaler.get("skipped_steps", self.skipped_steps)
        if self.watch_error:
            out["watch_error"] = self.watch_error
        return out

    def detach(self) -> None:
        if self.handle is None:
            return
        try:
            self.handle.close()
        except Exception:
            pass
        self.handle = None


def attach(accelerator: Any, model: nn.Module, watch: bool = True, scaler: Any = None) -> MinimalObserver:
    """The probe's one entry point into run instrumentation; call it after prepare().
    `scaler`: a GradScaler the child drives itself, not accelerate's."""
    if not watch:
        return MinimalObserver(accelerator, model, scaler)
    try:
        from mpdoctor.instrument import watch as watch_fn  # type: ignore[attr-defined]
    except Exception:
        return MinimalObserver(accelerator, model, scaler)
    try:
        return WatchObserver(accelerator, model, watch_fn, scaler)
    except Exception:
        return MinimalObserver(accelerator, model, scaler)
