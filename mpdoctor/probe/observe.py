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

_MATMUL_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


class MinimalObserver:
    """The stand-in: hooks removed after the first matmul, one flag read per step."""

    source = "probe-minimal"

    def __init__(self, accelerator: Any, model: nn.Module) -> None:
        self.accelerator = accelerator
        self.model = model
        self.autocast_dtype: str | None = None
        self.skipped_steps = 0
        self.nonfinite: list[dict[str, Any]] = []
        self._step = 0
        self._hooks: list[Any] = []
        self._arm()

    def _arm(self) -> None:
        def first_output(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if self.autocast_dtype is None and isinstance(output, torch.Tensor):
                self.autocast_dtype = str(output.dtype).replace("torch.", "")
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
        if self.accelerator.optimizer_step_was_skipped:
            self.skipped_steps += 1
        self._step += 1

    def scaler(self) -> dict[str, Any]:
        scaler = getattr(self.accelerator, "scaler", None)
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
                "findings": []}

    def detach(self) -> None:
        self._disarm()


class WatchObserver(MinimalObserver):
    """The same interface over `mpdoctor.instrument.watch`'s handle: its hooks see the
    first matmul, the scaler and every module's non-finite values; the probe adds
    only the loss check it gets for free (the loss is read every step anyway)."""

    source = "mpdoctor.instrument.watch"

    def __init__(self, accelerator: Any, model: nn.Module, watch: Any) -> None:
        self.accelerator = accelerator
        self.model = model
        self.autocast_dtype = None
        self.skipped_steps = 0
        self.nonfinite = []
        self._step = 0
        self._hooks = []
        # After prepare(): the handle finds the prepared model on the accelerator.
        self.handle = watch(accelerator)
        self.watch_error: str | None = None

    def scaler(self) -> dict[str, Any]:
        h = self.handle
        mine = super().scaler()
        try:
            skipped = len(h.skipped_steps)
            scale = h.final_scale
        except Exception as exc:  # fail open: the probe's own reading stands
            self.watch_error = f"{type(exc).__name__}: {exc}"
            return mine
        if mine.get("present"):
            mine["final_scale"] = scale if scale is not None else mine.get("final_scale")
            mine["skipped_steps"] = max(skipped, mine.get("skipped_steps", 0))
        return mine

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        h = self.handle
        try:
            findings = [f.to_dict() for f in h.findings()]
            out["autocast_dtype"] = h.autocast_dtype
            out["module_nonfinite"] = [n.to_dict() for n in h.nonfinite][:10]
            out["plan"] = h.plan.to_dict()
        except Exception as exc:  # fail open: the probe still reports its own view
            findings = []
            self.watch_error = f"{type(exc).__name__}: {exc}"
        out["skipped_steps"] = out["scaler"].get("skipped_steps", self.skipped_steps)
        out["findings"] = findings
        if self.watch_error:
            out["watch_error"] = self.watch_error
        return out

    def detach(self) -> None:
        try:
            self.handle.close()
        except Exception:
            pass


def attach(accelerator: Any, model: nn.Module) -> MinimalObserver:
    """The probe's one entry point into run instrumentation; call it after prepare()."""
    try:
        from mpdoctor.instrument import watch  # type: ignore[attr-defined]
    except Exception:
        return MinimalObserver(accelerator, model)
    try:
        return WatchObserver(accelerator, model, watch)
    except Exception:
        return MinimalObserver(accelerator, model)
