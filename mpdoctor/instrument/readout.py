"""The once-per-step read: the values the hooks left on the devices, copied to the host
in one go, and what they show: where a NaN/Inf first appeared in the forward and in the
backward (with the input range that led to it), modules running close to their dtype's
largest value, the loss scale's timeline, the last loss and gradient norm.

What the hooks leave, per device: a list of 0-d tensors (in pairs) and a list of
vectors; and one entry per recorded value in `meta`, in the order recorded:
``(kind, module, device, offset, aux, step, dtype)`` where kind is

- "in" / "out": a module's input / output, (min, max) at `offset` in the scalars;
  an "out" entry's aux is the index in meta of the same call's "in" entry, or -1;
- "gin" / "gout": the gradient reaching a module's input / the outermost output;
- "loss": the loss backward() was called on (the value twice);
- "scale": the loss scale before and after an update;
- "pgrad" / "gnorm": a vector at `offset` in the device's vectors: per-parameter
  gradient norms before an optimizer step / the norm clip_grad_norm_ returned; aux is
  (length, names of the parameters).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from ..knowledge.dtypes import dtype_name
from .records import NonFinite, OverflowWarning, ScalerTimeline

# The largest finite value of each low-precision dtype.
_LOW_MAX = {torch.float16: 65504.0, torch.bfloat16: float(torch.finfo(torch.bfloat16).max)}
# Warn before overflow: a module whose output reaches half the dtype's largest value.
OVERFLOW_FRACTION = 0.5


def _to_host(scalars: dict[Any, list[Tensor]], vectors: dict[Any, list[Tensor]]
             ) -> tuple[dict[Any, list[float]], dict[Any, int]]:
    """Every device's values as one list of floats (one copy, one sync per device): its
    scalars, then its vectors from the returned base offset on."""
    values: dict[Any, list[float]] = {}
    vec_base: dict[Any, int] = {}
    for dev in set(scalars) | set(vectors):
        parts = []
        s = scalars.get(dev, [])
        if s:
            parts.append(torch.stack(s).float())
        vec_base[dev] = len(s)
        parts.extend(v.float().reshape(-1) for v in vectors.get(dev, []))
        values[dev] = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()
    return values, vec_base


class Readout:
    """What the step reads found so far; `name_of` names a module as the user knows it."""

    def __init__(self, name_of: Callable[[Any], str]) -> None:
        self.scaler = ScalerTimeline()
        self.nonfinite: list[NonFinite] = []
        self.overflow: list[OverflowWarning] = []
        self.last_loss: float | None = None
        self.last_grad_norm: float | None = None
        self.loss_zero_grad_nan: tuple[int, float | None] | None = None
        self._name_of = name_of
        self._warned_modules: set[str] = set()
        self._nf_phases: set[str] = set()
        self._nf_steps: set[int] = set()
        # step sampling (watch(every=N)): whether a step's modules were watched, and a
        # non-finite loss met on a step whose modules were not (held back: the modules of
        # the next steps are watched, so that the one that makes it can be named)
        self.sampled: Callable[[int], bool] = lambda step: True
        self.held_loss: NonFinite | None = None
        # the largest finite |output| of any watched module so far: (value, module, dtype)
        self._seen_max: tuple[float, Any, Any] = (0.0, None, None)

    def read(self, meta: list[tuple], scalars: dict[Any, list[Tensor]], vectors: dict[Any, list[Tensor]],
             scaler_active: bool, root: Any) -> bool:
        """Read one batch of pending values (see the module docstring); `scaler_active`:
        a loss scaler is on (its skipped steps explain a non-finite backward); `root`:
        the outermost module. Returns whether anything new was found."""
        values, vec_base = _to_host(scalars, vectors)
        return self._analyse(meta, values, vec_base, scaler_active, root)

    def _analyse(self, meta: list[tuple], values: dict[Any, list[float]], vec_base: dict[Any, int],
                 scaler_active: bool, root: Any) -> bool:
        found = False
        first_fwd = first_bwd = first_loss = first_pgrad = None
        skipped: set[int] = set()
        hot: list[tuple] = []
        loss_by_step: dict[int, float] = {}
        norm_by_step: dict[int, float] = {}
        isfinite = math.isfinite
        seen_max = self._seen_max[0]
        for i, (kind, mod, dev, off, aux, step, dtype) in enumerate(meta):
            vals = values[dev]
            if kind in ("in", "out", "gin", "gout"):
                mn, mx = vals[off], vals[off + 1]
                finite = isfinite(mn) and isfinite(mx)
                if kind == "out":
                    if not finite:
                        if first_fwd is None:
                            first_fwd = i
                    else:
                        absmax = -mn if -mn > mx else mx
                        if absmax > seen_max:
                            seen_max, self._seen_max = absmax, (absmax, mod, dtype)
                        limit = _LOW_MAX.get(dtype)
                        if limit is not None and absmax > OVERFLOW_FRACTION * limit:
                            hot.append((mod, step, dtype, absmax, limit))
                elif kind != "in" and not finite and first_bwd is None:
                    first_bwd = i
            elif kind == "loss":
                v = vals[off]
                loss_by_step[step] = v
                if not isfinite(v) and first_loss is None:
                    first_loss = i
            elif kind in ("pgrad", "gnorm"):
                start = vec_base[dev] + off
                seg = vals[start:start + aux[0]]
                bad = [j for j, v in enumerate(seg) if not isfinite(v)]
                if kind == "gnorm":
                    norm_by_step[step] = seg[0] if seg else float("nan")
                elif seg:
                    norm_by_step.setdefault(step, math.nan if bad else max(seg))
                if bad and first_pgrad is None and kind == "pgrad":
                    first_pgrad = (i, aux[1][bad[0]], "nan" if math.isnan(seg[bad[0]]) else "inf")
            elif kind == "scale":
                before, after = vals[off], vals[off + 1]
                self.scaler.add(step, before, after)
                if after < before:
                    skipped.add(step)
        if hot:
            found |= self._overflow_warning(hot)
        if loss_by_step:
            self.last_loss = list(loss_by_step.values())[-1]
        if norm_by_step:
            self.last_grad_norm = list(norm_by_step.values())[-1]
        for step, loss in loss_by_step.items():
            norm = norm_by_step.get(step)
            if loss == 0.0 and norm is not None and not isfinite(norm) and self.loss_zero_grad_nan is None:
                self.loss_zero_grad_nan = (step, norm)
                found = True

        if first_fwd is not None:
            found |= self._nonfinite_forward(meta, values, first_fwd)
        elif first_loss is not None:
            kind, mod, dev, off, aux, step, dtype = meta[first_loss]
            rec = NonFinite(module="(loss)", phase="forward", step=step, dtype=dtype_name(dtype),
                            kind="nan" if math.isnan(values[dev][off]) else "inf", origin="loss")
            if self.sampled(step):
                found |= self._add_nonfinite(rec)
            elif self.held_loss is None and "forward" not in self._nf_phases:
                self.held_loss = rec  # the watcher now watches every step
                found = True
        # NaN in the backward of a step whose forward already had one is only its echo
        fwd_step = min((n.step for n in self.nonfinite if n.phase == "forward"), default=None)
        if first_bwd is not None:
            kind, mod, dev, off, aux, step, dtype = meta[first_bwd]
            if step not in skipped and not scaler_active and (fwd_step is None or step < fwd_step):
                vals = values[dev]
                nan = math.isnan(vals[off]) or math.isnan(vals[off + 1])
                found |= self._add_nonfinite(NonFinite(
                    module=self._name_of(mod) if kind == "gin" else "(loss)", module_type=type(mod).__name__,
                    phase="backward", step=step, dtype=dtype_name(dtype), kind="nan" if nan else "inf",
                    origin="module" if kind == "gin" else "loss"))
        elif first_pgrad is not None and not (skipped or scaler_active) and \
                (fwd_step is None or meta[first_pgrad[0]][5] < fwd_step):
            i, pname, what = first_pgrad
            step = meta[i][5]
            module = pname.rsplit(".", 1)[0] if "." in pname else self._name_of(root)
            found |= self._add_nonfinite(NonFinite(module=module, phase="backward", step=step, dtype="", kind=what,
                                                   origin="param-grad"))
        return found or bool(skipped)

    def _nonfinite_forward(self, meta: list[tuple], values: dict, i: int) -> bool:
        kind, mod, dev, off, aux, step, dtype = meta[i]
        vals = values[dev]
        nan = math.isnan(vals[off]) or math.isnan(vals[off + 1])
        rec = NonFinite(module=self._name_of(mod), module_type=type(mod).__name__, phase="forward", step=step,
                        dtype=dtype_name(dtype), kind="nan" if nan else "inf")
        if aux >= 0:
            ikind, imod, idev, ioff, _, _, idtype = meta[aux]
            rec.input_min, rec.input_max = values[idev][ioff], values[idev][ioff + 1]
            rec.input_dtype = dtype_name(idtype)
            if not (math.isfinite(rec.input_min) and math.isfinite(rec.input_max)):
                rec.origin = "input"
        if rec.origin == "module" and "forward" not in self._nf_phases:
            self._broken_param(rec, mod)
        return self._add_nonfinite(rec)

    def _broken_param(self, rec: NonFinite, mod: Any) -> None:
        """The first of the module's own parameters that holds NaN/Inf (read once, on the
        first non-finite forward only): then the weights were broken before this forward."""
        try:
            for pname, p in mod.named_parameters(recurse=False):
                if p.is_floating_point() and p.numel() and not bool(torch.isfinite(p.detach()).all()):
                    rec.param = f"{rec.module}.{pname}" if rec.module else pname
                    rec.param_dtype = dtype_name(p.dtype)
                    return
        except Exception:  # a parameter that cannot be read (meta, a subclass): no origin
            return

    def renumber_steps(self, step: int) -> None:
        """Every step recorded so far becomes `step` (the recorder found them to be
        micro-batches of one step)."""
        for rec in [*self.nonfinite, *self.overflow, *([self.held_loss] if self.held_loss else [])]:
            rec.step = step
        self._nf_steps = {step} if self._nf_steps else set()
        for rec in self.nonfinite:
            rec.steps_affected = len(self._nf_steps)
        if self.loss_zero_grad_nan is not None:
            self.loss_zero_grad_nan = (step, self.loss_zero_grad_nan[1])

    def release_held(self) -> bool:
        """At the end: a held-back non-finite loss that no watched step explained is
        reported as it was seen (at the loss)."""
        rec, self.held_loss = self.held_loss, None
        return rec is not None and "forward" not in self._nf_phases and self._add_nonfinite(rec)

    def _add_nonfinite(self, rec: NonFinite) -> bool:
        """Keep the first non-finite value of each phase; a later step of the same phase
        only counts in its steps_affected. Returns whether `rec` was kept."""
        self._nf_steps.add(rec.step)
        if rec.phase in self._nf_phases:
            for old in self.nonfinite:
                if old.phase == rec.phase:
                    old.steps_affected = len(self._nf_steps)
            return False
        self._nf_phases.add(rec.phase)
        rec.steps_affected = len(self._nf_steps)
        value, mod, dtype = self._seen_max
        if mod is not None:
            rec.seen_absmax, rec.seen_module, rec.seen_dtype = value, self._name_of(mod), dtype_name(dtype)
        self.nonfinite.append(rec)
        return True

    def _overflow_warning(self, hot: list[tuple]) -> bool:
        """One warning per step that ran hot, naming the first module (where it started);
        the modules the large values flowed on into are listed with it."""
        mod, step, dtype, absmax, limit = hot[0]
        name = self._name_of(mod)
        if name in self._warned_modules or len(self.overflow) >= 20:
            return False
        names = list(dict.fromkeys(self._name_of(h[0]) for h in hot))
        self._warned_modules.update(names)
        self.overflow.append(OverflowWarning(module=name, module_type=type(mod).__name__, step=step,
                                             dtype=dtype_name(dtype), absmax=absmax,
                                             limit=limit, also=names[1:8]))
        return True
