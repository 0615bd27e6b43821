"""Headroom per module (child side: imports torch): the largest |activation| each
module produced, against the largest finite value of the dtype it produced it in and
against fp16's, and the module where a non-finite value first appeared.

A forward hook on every module reduces its output to one 0-d tensor (abs().amax(), on
the device: no host sync in the hook); `step_end()` reads them all at once, one copy
per step. It is attached for the fixed-batch evaluation and the warm-up steps, and
removed before the timed steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..knowledge.dtypes import dtype_name
from .usermodel import first_float

FP16_MAX = 65504.0
FINITE_MAX = {"float16": FP16_MAX, "bfloat16": float(torch.finfo(torch.bfloat16).max),
              "float32": float(torch.finfo(torch.float32).max), "float64": float(torch.finfo(torch.float64).max)}
TOP = 5  # the modules closest to overflow, named in the report


class HeadroomMeter:
    def __init__(self, model: nn.Module) -> None:
        self.names: list[str] = []
        self.types: list[str] = []
        self.absmax: list[float] = []
        self.dtypes: list[str | None] = []
        self.first_nonfinite: dict[str, Any] | None = None
        self.steps = 0
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._hooks: list[Any] = []
        for i, (name, module) in enumerate((n, m) for n, m in model.named_modules() if n):
            self.names.append(name)
            self.types.append(type(module).__name__)
            self.absmax.append(0.0)
            self.dtypes.append(None)
            self._hooks.append(module.register_forward_hook(self._hook(i)))

    def _hook(self, i: int) -> Any:
        def on_output(_m: nn.Module, _inputs: Any, out: Any) -> None:
            try:
                t = first_float(out)
                if t is None or not t.numel() or t.is_meta:
                    return
                if self.dtypes[i] is None:
                    self.dtypes[i] = dtype_name(t.dtype)
                self._pending.append((i, t.detach().abs().amax()))
            except Exception:
                pass  # fail open: the training never sees the meter
        return on_output

    def step_end(self) -> None:
        """Read this step's values (one host copy) and keep the maxima."""
        if not self._pending:
            return
        idx = [i for i, _ in self._pending]
        vals = torch.stack([v.float().reshape(()) for _, v in self._pending]).cpu().tolist()
        self._pending.clear()
        for i, v in zip(idx, vals):
            if not math.isfinite(v):
                if self.first_nonfinite is None:
                    self.first_nonfinite = {"module": self.names[i], "type": self.types[i],
                                            "step": self.steps, "dtype": self.dtypes[i],
                                            "value": "nan" if math.isnan(v) else "inf"}
                self.absmax[i] = math.inf
            elif v > self.absmax[i]:
                self.absmax[i] = v
        self.steps += 1

    def detach(self) -> None:
        self.step_end()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def summary(self) -> dict[str, Any]:
        rows = []
        for name, typ, mx, dt in zip(self.names, self.types, self.absmax, self.dtypes):
            if dt is None:
                continue
            limit = FINITE_MAX.get(dt)
            rows.append({"module": name, "type": typ, "absmax": mx if math.isfinite(mx) else None,
                         "nonfinite": not math.isfinite(mx), "dtype": dt,
                         # how many times larger the output could grow before it overflows
                         "headroom": (limit / mx if mx > 0 else None) if limit and math.isfinite(mx) else 0.0,
                         "fp16_headroom": (FP16_MAX / mx if mx > 0 else None) if math.isfinite(mx) else 0.0})
        by_dtype = sorted(rows, key=lambda r: (r["headroom"] is None, r["headroom"] or 0.0))
        by_fp16 = sorted(rows, key=lambda r: (r["fp16_headroom"] is None, r["fp16_headroom"] or 0.0))
        finite = [r["absmax"] for r in rows if r["absmax"] is not None]
        return {"modules_watched": len(rows), "steps": self.steps,
                "peak_abs": (math.inf if any(r["nonfinite"] for r in rows) else max(finite, default=0.0)),
                "closest": by_dtype[:TOP], "closest_fp16": by_fp16[:TOP],
                "first_nonfinite": self.first_nonfinite}
