"""The watcher: module forward hooks, gradient tensor hooks, one read per step.

Hot path (every module call): the first floating tensor of the output is reduced on its
device with ``torch.aminmax`` (the cheapest reduction that shows NaN, Inf and magnitude
at once) and the two 0-d results are kept; gradients get the same through tensor hooks
on module inputs (cheaper than module backward hooks). Nothing is read back until the
step ends (the outermost module's next forward, ``flush()``, an error, exit): then all
of a step's values are stacked and copied to the host once.

Everything here fails open: a hook that raises records an ``info`` finding, turns the
watcher off, and returns normally.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any

import torch
from torch import Tensor

from ..knowledge.dtypes import dtype_name
from . import context
from .records import NonFinite, OverflowWarning, PrecisionPlan, RaisedError, ScalerTimeline

_FORCE_FAIL = os.environ.get("MPDOCTOR_INSTRUMENT_FAIL") == "1"
_LINEAR_TYPES: tuple[type, ...] = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.Conv1d, torch.nn.Conv2d,
                                   torch.nn.Conv3d)
_DTYPE_MAX = {torch.float16: 65504.0, torch.bfloat16: float(torch.finfo(torch.bfloat16).max),
              torch.float32: float(torch.finfo(torch.float32).max)}
_LOW = (torch.float16, torch.bfloat16)
# Warn before overflow: a module whose output reaches half the dtype's largest value.
OVERFLOW_FRACTION = 0.5
# Flush anyway when this many values are pending (a loop with no outermost module).
_MAX_PENDING = 20000
_INF = math.inf


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
_tracing_state = torch._C._get_tracing_state


def _skip() -> bool:
    """Inside torch.compile / jit tracing our hooks must vanish: their ops would be traced
    into the user's graph (or break it)."""
    return _is_compiling() or _tracing_state() is not None


def _first_float(x: Any) -> Tensor | None:
    if isinstance(x, Tensor):
        return x if x.is_floating_point() else None
    if isinstance(x, (tuple, list)):
        for y in x[:4]:
            if isinstance(y, Tensor) and y.is_floating_point():
                return y
        return None
    if isinstance(x, dict):  # transformers' ModelOutput: loss or logits first
        for i, y in enumerate(x.values()):
            if isinstance(y, Tensor) and y.is_floating_point():
                return y
            if i >= 3:
                break
    return None


def _strip_wrapper(name: str, root: Any) -> str:
    # DDP / DataParallel / torch.compile wrap the user's model; users know the inner names.
    for prefix in ("module.", "_orig_mod."):
        if name.startswith(prefix) and hasattr(root, prefix[:-1]):
            return name[len(prefix):]
    return name


class _RootInfo:
    __slots__ = ("primary", "names")

    def __init__(self, primary: bool) -> None:
        self.primary = primary


class Watcher:
    """See the package docstring for the handle's API."""

    def __init__(self, *, sink: Any = None, auto: bool = False) -> None:
        self.sink = sink
        self.auto = auto
        self.step = -1
        self.plan = PrecisionPlan()
        self.scaler = ScalerTimeline()
        self.nonfinite: list[NonFinite] = []
        self.overflow: list[OverflowWarning] = []
        self.errors: list[RaisedError] = []
        self.internal_errors: list[str] = []
        self.last_loss: float | None = None
        self.last_grad_norm: float | None = None
        self.loss_zero_grad_nan: tuple[int, float | None] | None = None
        self.disabled = False
        self._tls = threading.local()
        self._hooks: list[Any] = []
        self._roots: dict[int, _RootInfo] = {}
        self._primary: Any = None
        self._names: dict[int, str] = {}
        self._params_counted = False
        # pending on-device values, per device: 0-d tensors (stacked at flush) and vectors
        self._scalars: dict[Any, list[Tensor]] = {}
        self._vectors: dict[Any, list[Tensor]] = {}
        # (kind, module, device, offset-in-scalars or vector index, aux, step, dtype)
        self._meta: list[tuple] = []
        self._out_cache: dict[int, tuple[Any, int]] = {}
        self._gen = 0  # +1 at every flush: indices into _meta are only valid within one
        self._gin: dict[int, tuple[Any, list]] = {}
        self._warned_modules: set[str] = set()
        self._nf_phases: set[str] = set()
        self._nf_steps: set[int] = set()
        self._last_exc: Any = None
        self._optimizers: set[int] = set()
        self._scalers: list[Any] = []
        self._accelerators: list[Any] = []
        self._sample: list[tuple[Tensor, Tensor]] | None = None
        self._sampled = False
        self._batch_shape: list[int] | None = None
        self._grad_scaler_seen = False
        # what is trained: the modules accelerate prepared and the optimizers' parameters
        self._prepared: list[Any] = []          # weakrefs to prepared modules
        self._optimizers_seen: list[Any] = []   # weakrefs to optimizers
        # the first Linear/conv outputs seen: (weakref module, name, dtype, autocast on,
        # device type), so that the plan can name the first matmul of a *trained* module
        # (a frozen teacher's no_grad forward is not what the training ran in)
        self._matmuls: list[tuple[Any, str, str, bool, str]] = []

    # ---- attaching -------------------------------------------------------------------
    def attach_global(self) -> None:
        """Watch every module call in the process (the `mpdoctor run` mode)."""
        from torch.nn.modules import module as nn_module

        self._hooks.append(nn_module.register_module_forward_pre_hook(self._pre))
        self._hooks.append(nn_module.register_module_forward_hook(self._post, always_call=True))

    def attach_module(self, model: Any) -> None:
        for m in model.modules():
            self._hooks.append(m.register_forward_pre_hook(self._pre))
            self._hooks.append(m.register_forward_hook(self._post, always_call=True))
        self._new_root(model, force_primary=self._primary is None)

    def attach_accelerator(self, acc: Any) -> None:
        self.on_accelerator(acc)
        for m in list(getattr(acc, "_models", [])):
            self.attach_module(m)
        original = acc.prepare
        watcher = self

        def prepare(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                objs = result if isinstance(result, tuple) else (result,)
                for obj in objs:
                    if isinstance(obj, torch.nn.Module):
                        watcher.attach_module(obj)
                watcher.on_prepare(acc, objs)
            except Exception as exc:
                watcher._fail(exc)
            return result

        acc.prepare = prepare

    def close(self) -> None:
        self.flush()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        from . import patches

        patches.unregister(self)

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- handle API --------------------------------------------------------------
    @property
    def autocast_dtype(self) -> str | None:
        return self.plan.autocast_dtype

    @property
    def skipped_steps(self) -> list[int]:
        return self.scaler.skipped_steps

    @property
    def final_scale(self) -> float | None:
        return self.scaler.final_scale

    @property
    def optimizer_step_was_skipped(self) -> bool | None:
        """accelerate's own flag for the last step, when an Accelerator is watched."""
        flags = [getattr(a, "optimizer_step_was_skipped", None) for a in self._accelerators]
        flags = [f for f in flags if f is not None]
        return any(flags) if flags else None

    @property
    def first_nonfinite(self) -> NonFinite | None:
        return self.nonfinite[0] if self.nonfinite else None

    def findings(self, rules: list[Any] | None = None) -> list[Any]:
        """What the rule base says about this process so far, root cause first: the
        run rules and the env rules, judged exactly as `mpdoctor run` judges a run."""
        return self.report(rules).findings

    def report(self, rules: list[Any] | None = None) -> Any:
        from ..env.inprocess import collect_in_process
        from ..run.diagnose import judge_run

        self.flush()
        self._refresh_plan()
        evidence = {"schema": 1, "command": list(sys.argv[:8]), "exit_code": 0, "signal": None,
                    "output": {}, "processes": [{
                        "rank": None, "pid": os.getpid(), "world_size": os.environ.get("WORLD_SIZE"),
                        "env": collect_in_process(), "watch": self.snapshot(),
                        "exceptions": [], "exit": None, "progress": None,
                        "internal_errors": list(self.internal_errors)}]}
        report = judge_run(evidence, rules)
        report.extra.update({"precision_plan": self.plan.to_dict(), "loss_scaler": self.scaler.to_dict()})
        return report

    def snapshot(self) -> dict[str, Any]:
        """Everything found so far, as the JSON the events file carries."""
        return {
            "step": self.step,
            "plan": self.plan.to_dict(),
            "scaler": self.scaler.to_dict(),
            "nonfinite": [n.to_dict() for n in self.nonfinite],
            "overflow": [o.to_dict() for o in self.overflow],
            "errors": [e.to_dict() for e in self.errors],
            "internal_errors": list(self.internal_errors),
            "loss_zero_grad_nan": list(self.loss_zero_grad_nan) if self.loss_zero_grad_nan else None,
            "last_loss": self.last_loss,
            "last_grad_norm": self.last_grad_norm,
        }

    # ---- failing open ------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        """An error of ours: keep it, stop watching, never let it reach the training."""
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

    def _stack(self) -> list:
        st = getattr(self._tls, "stack", None)
        if st is None:
            st = self._tls.stack = []
        return st

    # ---- module hooks (the hot path) -----------------------------------------------
    def _pre(self, mod: Any, args: Any) -> None:
        if self.disabled or _skip():
            return None
        try:
            if _FORCE_FAIL:
                raise RuntimeError("forced by MPDOCTOR_INSTRUMENT_FAIL=1")
            st = self._stack()
            if st and mod is self._primary:
                st.clear()  # a KeyboardInterrupt skipped the post hooks: the stack is stale
            if not st:
                self._root_enter(mod, args)
            t = None
            if args:
                a0 = args[0]
                t = a0 if isinstance(a0, Tensor) and a0.is_floating_point() else _first_float(args)
            in_idx = -1
            if t is not None and t.numel() and not t.is_meta:
                tid = id(t)
                hit = self._out_cache.get(tid)
                if hit is not None and hit[0]() is t:
                    in_idx = hit[1]
                else:
                    in_idx = self._record("in", mod, t)
                    self._out_cache[tid] = (weakref.ref(t), in_idx)
                if t.requires_grad and torch.is_grad_enabled():
                    self._grad_hook_on(t, mod, "gin")
            st.append((mod, in_idx, self._gen))
        except Exception as exc:
            self._fail(exc)
        return None

    def _post(self, mod: Any, args: Any, out: Any) -> None:
        if self.disabled or _skip():
            return None
        try:
            st = self._stack()
            in_idx = -1
            if st and st[-1][0] is mod:
                _, in_idx, gen = st.pop()
                if gen != self._gen:  # read out by a flush in between: the index is gone
                    in_idx = -1
            if out is None:
                exc = sys.exc_info()[1]
                if exc is not None:
                    # the same exception passes every enclosing module's hook: keep its
                    # identity, not the exception (its traceback holds frames and tensors;
                    # an OOM retry with a smaller batch must get that memory back)
                    key = (id(exc), type(exc), str(exc)[:200])
                    if key != self._last_exc:
                        self._last_exc = key
                        self._on_forward_error(mod, args, exc)
                    if not st:
                        self._flush_safely()
                    return None
            t = out if isinstance(out, Tensor) else _first_float(out)
            if t is None or not t.is_floating_point() or not t.numel() or t.is_meta:
                return None
            idx = self._record("out", mod, t, in_idx)
            self._out_cache[id(t)] = (weakref.ref(t), idx)
            if len(self._matmuls) < 64 and isinstance(mod, _LINEAR_TYPES):
                self._note_matmul(mod, t)
            if not st and t.requires_grad and torch.is_grad_enabled():
                self._grad_hook_on(t, mod, "gout")
            if len(self._meta) > _MAX_PENDING:
                self.flush()
        except Exception as exc:
            self._fail(exc)
        return None

    def _record(self, kind: str, mod: Any, t: Tensor, aux: int = -1) -> int:
        mn, mx = torch.aminmax(t.detach())
        dev = t.device
        lst = self._scalars.get(dev)
        if lst is None:
            lst = self._scalars[dev] = []
        lst.append(mn)
        lst.append(mx)
        self._meta.append((kind, mod, dev, len(lst) - 2, aux, self.step, t.dtype))
        return len(self._meta) - 1

    def _grad_hook_on(self, t: Tensor, mod: Any, kind: str) -> None:
        tid = id(t)
        hit = self._gin.get(tid)
        if hit is not None and hit[0]() is t:
            hit[1][0] = mod  # the innermost module that takes this tensor gets the blame
            return
        holder = [mod]
        self._gin[tid] = (weakref.ref(t), holder)
        step = self.step

        def on_grad(g: Tensor) -> None:
            if self.disabled or g is None:
                return None
            try:
                if _FORCE_FAIL:
                    raise RuntimeError("forced by MPDOCTOR_INSTRUMENT_FAIL=1")
                if g.is_floating_point() and g.numel():
                    mn, mx = torch.aminmax(g.detach())
                    dev = g.device
                    lst = self._scalars.get(dev)
                    if lst is None:
                        lst = self._scalars[dev] = []
                    lst.append(mn)
                    lst.append(mx)
                    self._meta.append((kind, holder[0], dev, len(lst) - 2, -1, step, g.dtype))
            except Exception as exc:
                self._fail(exc)
            return None

        t.register_hook(on_grad)

    # ---- roots and steps -------------------------------------------------------------
    def _new_root(self, mod: Any, force_primary: bool = False) -> _RootInfo:
        has_params = next(iter(mod.parameters()), None) is not None
        contains_primary = self._primary is not None and any(m is self._primary for m in mod.modules())
        primary = force_primary or (has_params and (self._primary is None or contains_primary))
        info = _RootInfo(primary)
        if len(self._roots) > 1000:  # modules made on the fly each step: keep the map small
            self._roots = {k: v for k, v in self._roots.items() if v.primary}
        self._roots[id(mod)] = info
        for name, m in mod.named_modules():
            name = _strip_wrapper(name, mod)
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
            return
        self.flush()
        self.step += 1
        if not self._params_counted:
            self._count_params(mod)
        t = args[0] if args and isinstance(args[0], Tensor) else None
        self._batch_shape = list(t.shape) if t is not None else None
        if self.sink is not None:
            self.sink.progress(self.step, "forward")

    def name_of(self, mod: Any) -> str:
        if mod is None:
            return "(loss)"
        name = self._names.get(id(mod))
        if name is None:
            return type(mod).__name__
        return name or type(mod).__name__

    def _count_params(self, root: Any) -> None:
        # only a fallback: what is trained is known once an optimizer steps or accelerate
        # prepares a model (see _trained_params)
        self._params_counted = True
        if not self._prepared and not self._optimizers_seen:
            self._set_param_counts([p for p in root.parameters()])

    def _trained_params(self) -> list[Tensor] | None:
        """The parameters the training updates or prepared, or None before either is known."""
        params: dict[int, Tensor] = {}
        known = False
        for ref in self._optimizers_seen:
            opt = ref()
            if opt is not None:
                known = True
                for g in opt.param_groups:
                    for p in g["params"]:
                        params[id(p)] = p
        for ref in self._prepared:
            m = ref()
            if m is not None:
                known = True
                for p in m.parameters():
                    params.setdefault(id(p), p)
        return list(params.values()) if known else None

    def _set_param_counts(self, params: list[Tensor]) -> None:
        counts: dict[str, dict[str, int]] = {"trainable": {}, "frozen": {}}
        devices: dict[str, int] = {}
        for p in params:
            side = counts["trainable" if p.requires_grad else "frozen"]
            key = dtype_name(p.dtype)
            side[key] = side.get(key, 0) + p.numel()
            devices[p.device.type] = devices.get(p.device.type, 0) + p.numel()
        self.plan.params = counts
        if devices:
            self.plan.device = max(devices, key=devices.get)  # type: ignore[arg-type]

    def _note_matmul(self, mod: Any, t: Tensor) -> None:
        if any(ref() is mod for ref, *_ in self._matmuls):
            return
        state = context.autocast_state()
        self._matmuls.append((weakref.ref(mod), self.name_of(mod), dtype_name(t.dtype),
                              bool(state.get(t.device.type)), t.device.type))
        if self.plan.autocast_dtype is None:
            self._settle_matmul()

    def _settle_matmul(self) -> None:
        """The plan's first matmul: the first one seen of a trained module (any module
        until what is trained is known)."""
        trained = self._trained_params()
        ids = {id(p) for p in trained} if trained is not None else None
        for ref, name, dtype, enabled, _device in self._matmuls:
            m = ref()
            if ids is not None and (m is None or not any(id(p) in ids for p in m.parameters(recurse=False))):
                continue
            self.plan.autocast_dtype, self.plan.autocast_module, self.plan.autocast_enabled = dtype, name, enabled
            return

    # ---- the once-per-step read ---------------------------------------------------
    def flush(self) -> None:
        """Copy the pending values to the host (one sync per device) and look at them."""
        try:
            self._flush()
        except Exception as exc:
            self._fail(exc)

    _flush_safely = flush

    def _flush(self) -> None:
        if self.disabled or not self._meta:
            self._out_cache.clear()
            return
        meta, scalars, vectors = self._meta, self._scalars, self._vectors
        self._meta, self._scalars, self._vectors = [], {}, {}
        self._gen += 1
        self._out_cache.clear()
        self._gin.clear()
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
        self._analyse(meta, values, vec_base)

    def _analyse(self, meta: list[tuple], values: dict[Any, list[float]], vec_base: dict[Any, int]) -> None:
        first_fwd = first_bwd = first_loss = first_pgrad = None
        skipped: set[int] = set()
        hot: list[tuple] = []
        loss_by_step: dict[int, float] = {}
        norm_by_step: dict[int, float] = {}
        isfinite = math.isfinite
        for i, (kind, mod, dev, off, aux, step, dtype) in enumerate(meta):
            vals = values[dev]
            if kind in ("in", "out", "gin", "gout"):
                mn, mx = vals[off], vals[off + 1]
                finite = isfinite(mn) and isfinite(mx)
                if kind == "out":
                    if not finite:
                        if first_fwd is None:
                            first_fwd = i
                    elif dtype in _LOW:
                        absmax = max(-mn, mx)
                        limit = _DTYPE_MAX[dtype]
                        if absmax > OVERFLOW_FRACTION * limit:
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
            self._overflow_warning(hot)
        if loss_by_step:
            self.last_loss = list(loss_by_step.values())[-1]
        if norm_by_step:
            self.last_grad_norm = list(norm_by_step.values())[-1]
        for step, loss in loss_by_step.items():
            norm = norm_by_step.get(step)
            if loss == 0.0 and norm is not None and not isfinite(norm) and self.loss_zero_grad_nan is None:
                self.loss_zero_grad_nan = (step, norm)
                self._emit()

        if first_fwd is not None:
            self._nonfinite_forward(meta, values, first_fwd)
        elif first_loss is not None:
            kind, mod, dev, off, aux, step, dtype = meta[first_loss]
            self._add_nonfinite(NonFinite(module="(loss)", phase="forward", step=step, dtype=dtype_name(dtype),
                                          kind="nan" if math.isnan(values[dev][off]) else "inf", origin="loss"))
        # NaN in the backward of a step whose forward already had one is only its echo
        fwd_step = min((n.step for n in self.nonfinite if n.phase == "forward"), default=None)
        if first_bwd is not None:
            kind, mod, dev, off, aux, step, dtype = meta[first_bwd]
            if step not in skipped and not self._scaler_active() and (fwd_step is None or step < fwd_step):
                vals = values[dev]
                nan = math.isnan(vals[off]) or math.isnan(vals[off + 1])
                self._add_nonfinite(NonFinite(
                    module=self.name_of(mod) if kind == "gin" else "(loss)", module_type=type(mod).__name__,
                    phase="backward", step=step, dtype=dtype_name(dtype), kind="nan" if nan else "inf",
                    origin="module" if kind == "gin" else "loss"))
        elif first_pgrad is not None and not (skipped or self._scaler_active()) and \
                (fwd_step is None or meta[first_pgrad[0]][5] < fwd_step):
            i, pname, what = first_pgrad
            step = meta[i][5]
            module = pname.rsplit(".", 1)[0] if "." in pname else self.name_of(self._primary)
            self._add_nonfinite(NonFinite(module=module, phase="backward", step=step, dtype="", kind=what,
                                          origin="param-grad"))
        if skipped:
            self._emit()

    def _scaler_active(self) -> bool:
        return any(getattr(s, "_enabled", False) for s in self._scalers)

    def _nonfinite_forward(self, meta: list[tuple], values: dict, i: int) -> None:
        kind, mod, dev, off, aux, step, dtype = meta[i]
        vals = values[dev]
        nan = math.isnan(vals[off]) or math.isnan(vals[off + 1])
        rec = NonFinite(module=self.name_of(mod), module_type=type(mod).__name__, phase="forward", step=step,
                        dtype=dtype_name(dtype), kind="nan" if nan else "inf")
        if aux >= 0:
            ikind, imod, idev, ioff, _, _, idtype = meta[aux]
            rec.input_min, rec.input_max = values[idev][ioff], values[idev][ioff + 1]
            rec.input_dtype = dtype_name(idtype)
            if not (math.isfinite(rec.input_min) and math.isfinite(rec.input_max)):
                rec.origin = "input"
        self._add_nonfinite(rec)

    def _add_nonfinite(self, rec: NonFinite) -> None:
        self._nf_steps.add(rec.step)
        if rec.phase in self._nf_phases:
            for old in self.nonfinite:
                if old.phase == rec.phase:
                    old.steps_affected = len(self._nf_steps)
            return
        self._nf_phases.add(rec.phase)
        rec.steps_affected = len(self._nf_steps)
        self.nonfinite.append(rec)
        self._emit()

    def _overflow_warning(self, hot: list[tuple]) -> None:
        """One warning per step that ran hot, naming the first module (where it started);
        the modules the large values flowed on into are listed with it."""
        mod, step, dtype, absmax, limit = hot[0]
        name = self.name_of(mod)
        if name in self._warned_modules or len(self.overflow) >= 20:
            return
        names = list(dict.fromkeys(self.name_of(h[0]) for h in hot))
        self._warned_modules.update(names)
        self.overflow.append(OverflowWarning(module=name, module_type=type(mod).__name__, step=step,
                                             dtype=dtype_name(dtype), absmax=absmax,
                                             limit=limit, also=names[1:8]))
        self._emit()

    def _emit(self) -> None:
        if self.sink is not None:
            self._refresh_plan()
            self.sink.snapshot(self.snapshot())

    # ---- errors ------------------------------------------------------------------
    def _on_forward_error(self, mod: Any, args: Any, exc: BaseException) -> None:
        err = RaisedError(exception=_exception_text(exc), module=self.name_of(mod), module_type=type(mod).__name__,
                          step=self.step, time=time.time())
        err.context = self._context(mod, args)
        self.errors.append(err)
        if self.sink is not None:
            self.sink.event("exception", step=self.step, module=err.module, exception=err.exception[:500],
                            time=err.time)
        self._emit()

    def _context(self, mod: Any, args: Any) -> dict[str, Any]:
        """What surrounded the failure; each part on its own, a partial context is still one."""
        ctx: dict[str, Any] = {"batch_shape": self._batch_shape}
        for key, get in (("params", lambda: context.param_summary(mod)),
                         ("inputs", lambda: [context.describe_tensor(t) for t in context.tensors_in(args)]),
                         ("autocast", context.autocast_state),
                         ("memory", lambda: {"host": context.host_memory(), "device": context.device_memory()})):
            if mod is None and key in ("params", "inputs"):
                continue
            try:
                ctx[key] = get()
            except Exception as inner:
                ctx.setdefault("errors", []).append(f"{key}: {type(inner).__name__}: {inner}"[:200])
        return ctx

    def on_exit_exception(self, exc: BaseException) -> None:
        """An exception nobody caught, raised outside any module's forward (the backward,
        the optimizer, the loss, a collective): recorded with the memory at that moment."""
        text = _exception_text(exc)
        if any(e.exception == text for e in self.errors):
            return
        err = RaisedError(exception=text, step=self.step, time=time.time())
        err.context = self._context(None, ())
        self.errors.append(err)

    # ---- process-wide events (dispatched by patches.py) ----------------------------
    def on_backward(self, loss: Tensor) -> None:
        if self.disabled or not isinstance(loss, Tensor) or not loss.is_floating_point() or not loss.numel():
            return
        v = loss.detach()
        v = v.reshape(-1)[0] if v.numel() == 1 else torch.linalg.vector_norm(v.float())
        dev = v.device
        lst = self._scalars.setdefault(dev, [])
        lst.append(v)
        lst.append(v)
        self._meta.append(("loss", None, dev, len(lst) - 2, -1, self.step, v.dtype))
        if self.sink is not None:
            self.sink.progress(self.step, "backward")

    def on_scaler_created(self, scaler: Any) -> None:
        self._scalers.append(scaler)
        self.plan.grad_scaler = True
        self.plan.grad_scaler_enabled = bool(getattr(scaler, "_enabled", True))

    def on_scaler_seen(self, scaler: Any) -> None:
        if not any(s is scaler for s in self._scalers):
            self.on_scaler_created(scaler)

    def on_scale(self, scaler: Any, before: Tensor, after: Tensor) -> None:
        if self.disabled:
            return
        self.on_scaler_seen(scaler)
        dev = before.device
        lst = self._scalars.setdefault(dev, [])
        lst.append(before.reshape(()))
        lst.append(after.reshape(()))
        self._meta.append(("scale", None, dev, len(lst) - 2, -1, self.step, before.dtype))

    def on_optimizer_pre(self, opt: Any) -> None:
        if self.disabled:
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        if id(opt) not in self._optimizers:
            self._optimizers.add(id(opt))
            self._note_optimizer(params, opt)
            self._refresh_counts()
        with_grad = [p for p in params if p.grad is not None]
        if not with_grad:
            return
        grads = [p.grad for p in with_grad]
        norms = torch._foreach_norm(grads, _INF, dtype=torch.float32)
        by_dev: dict[Any, list[int]] = {}
        for j, n in enumerate(norms):
            by_dev.setdefault(n.device, []).append(j)
        for dev, idx in by_dev.items():
            vec = torch.stack([norms[j] for j in idx])
            self._vectors.setdefault(dev, []).append(vec)
            off = sum(v.numel() for v in self._vectors[dev][:-1])
            names = _LazyParamNames(self, [with_grad[j] for j in idx])
            self._meta.append(("pgrad", None, dev, off, (len(idx), names), self.step, torch.float32))
        if not self._sampled and any(p.dtype in _LOW for p in with_grad):
            self._sample_before(with_grad)
        if self.sink is not None:
            self.sink.progress(self.step, "optimizer")

    def on_optimizer_post(self, opt: Any) -> None:
        if self.disabled or self._sample is None:
            return
        sample, self._sample = self._sample, None
        unchanged = total = 0
        for p, before in sample:
            now = p.detach().reshape(-1)[: before.numel()]
            g = p.grad.detach().reshape(-1)[: before.numel()] if p.grad is not None else None
            moving = g != 0 if g is not None else torch.ones_like(now, dtype=torch.bool)
            unchanged += int(((now == before) & moving).sum())
            total += int(moving.sum())
        if total:
            self.plan.unchanged_fraction = unchanged / total
            self.plan.unchanged_sampled = total
            self._emit()

    def _sample_before(self, params: list[Tensor]) -> None:
        """Keep a few thousand low-precision weights to see whether one step moved them."""
        self._sampled = True
        self._sample = [(p, p.detach().reshape(-1)[:4096].clone()) for p in params[:64]
                        if p.dtype in _LOW and p.requires_grad]

    def on_grad_norm(self, norm: Any) -> None:
        if self.disabled or not isinstance(norm, Tensor):
            return
        v = norm.detach().reshape(1)
        dev = v.device
        self._vectors.setdefault(dev, []).append(v)
        off = sum(x.numel() for x in self._vectors[dev][:-1])
        self._meta.append(("gnorm", None, dev, off, (1, _LazyParamNames(self, [])), self.step, v.dtype))

    def _note_optimizer(self, params: list[Tensor], opt: Any = None) -> None:
        if opt is not None:
            self._optimizers_seen.append(weakref.ref(opt))
            name = type(opt).__name__
            inner = getattr(opt, "optimizer", None)  # accelerate's AcceleratedOptimizer wraps one
            if inner is not None and name.startswith("Accelerated"):
                name = type(inner).__name__
            self.plan.optimizers = list(dict.fromkeys([*self.plan.optimizers, name]))
            eps = [g.get("eps") for g in getattr(opt, "param_groups", []) if isinstance(g.get("eps"), (int, float))]
            if eps:
                low = min(eps)
                self.plan.optimizer_eps = low if self.plan.optimizer_eps is None else min(low, self.plan.optimizer_eps)
        dtypes: dict[str, int] = dict(self.plan.optimizer_param_dtypes)
        for p in params:
            key = dtype_name(p.dtype)
            dtypes[key] = dtypes.get(key, 0) + p.numel()
        self.plan.optimizer_param_dtypes = dtypes
        trainable_low = any(p.dtype in _LOW and p.requires_grad for p in params)
        self.plan.fp32_master_weights = not trainable_low

    def on_accelerator(self, acc: Any) -> None:
        if acc in self._accelerators:
            return
        self._accelerators.append(acc)
        self._refresh_plan()

    def on_prepare(self, acc: Any, objs: tuple) -> None:
        self.on_accelerator(acc)
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                self.plan.prepared["model"] = True
                self._prepared.append(weakref.ref(obj))
                self._refresh_counts()
            elif isinstance(obj, torch.optim.Optimizer) or hasattr(obj, "optimizer"):
                self.plan.prepared["optimizer"] = True

    def _refresh_counts(self) -> None:
        trained = self._trained_params()
        if trained is not None:
            self._set_param_counts(trained)
            if self._matmuls:
                self._settle_matmul()

    def _refresh_plan(self) -> None:
        for acc in self._accelerators:
            try:
                self.plan.requested = str(getattr(acc, "mixed_precision", None) or "no")
                self.plan.distributed_type = str(getattr(acc, "distributed_type", "")).replace("DistributedType.", "")
                self.plan.num_processes = int(getattr(acc, "num_processes", 1))
                scaler = getattr(acc, "scaler", None)
                if scaler is not None:
                    self.on_scaler_seen(scaler)
            except Exception as exc:
                self._fail(exc)
        if self.plan.requested is None and os.environ.get("ACCELERATE_MIXED_PRECISION"):
            self.plan.requested = os.environ["ACCELERATE_MIXED_PRECISION"]
        if self.plan.num_processes is None and os.environ.get("WORLD_SIZE"):
            self.plan.num_processes = int(os.environ["WORLD_SIZE"])
        if self.plan.distributed_type is None:
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    self.plan.distributed_type = f"torch.distributed ({dist.get_backend()})"
            except Exception:
                pass


class _LazyParamNames:
    """Parameter names, resolved only when one of them turns out to matter."""

    def __init__(self, watcher: Watcher, params: list[Tensor]) -> None:
        self.watcher = watcher
        self.params = [weakref.ref(p) for p in params]

    def __getitem__(self, j: int) -> str:
        p = self.params[j]()
        root = self.watcher._primary
        if p is not None and root is not None:
            for name, q in root.named_parameters():
                if q is p:
                    return _strip_wrapper(name, root)
        return f"parameter #{j}"


def watch(obj: Any = None, **kwargs: Any) -> Watcher:
    """A handle on a watched model or accelerator (one watcher per process under
    `mpdoctor run`: watching again there returns the running one)."""
    from . import patches

    running = patches.auto_watcher()
    if running is not None:
        w = running
        if obj is not None and _is_accelerator(obj):
            w.on_accelerator(obj)
        return w
    w = Watcher(**kwargs)
    patches.register(w)
    if obj is None:
        w.attach_global()
    elif isinstance(obj, torch.nn.Module):
        w.attach_module(obj)
    elif _is_accelerator(obj):
        w.attach_accelerator(obj)
    else:
        raise TypeError(f"mpdoctor.watch() takes a torch.nn.Module or an accelerate Accelerator, not {type(obj).__name__}")
    return w


def _is_accelerator(obj: Any) -> bool:
    return type(obj).__name__ == "Accelerator" and hasattr(obj, "prepare")




_MAX_EXCEPTION = 4000


def _exception_text(exc: BaseException) -> str:
    """'Type: message' as Python prints it, whole (an OOM message runs several lines),
    bounded."""
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except Exception:  # a __str__ that raises
        text = type(exc).__name__
    return text[:_MAX_EXCEPTION]
