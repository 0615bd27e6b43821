"""The watcher: module forward hooks, gradient tensor hooks, the handlers of the
process-wide taps (patches.py), and the handle `watch()` returns.

Hot path (every module call): the first floating tensor of the output is reduced on its
device with ``torch.aminmax`` (the cheapest reduction that shows NaN, Inf and magnitude
at once) and the two 0-d results are kept; gradients get the same through tensor hooks
on module inputs (cheaper than module backward hooks). Nothing is read back until the
step ends (the outermost module's next forward, ``flush()``, an error, exit): then all
of a step's values are stacked and copied to the host once, and ``readout.Readout``
looks at them. What is trained and in what precision is ``plan.PlanTracker``'s;
exceptions are recorded by ``errors``.

Everything here fails open: a hook that raises records an ``info`` finding, turns the
watcher off, and returns normally.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import traceback
import weakref
from typing import Any

import torch
from torch import Tensor

from .errors import exception_text, raised_error
from .plan import MATMUL_TYPES, PlanTracker
from .readout import Readout
from .records import NonFinite, PrecisionPlan, RaisedError, ScalerTimeline

_FORCE_FAIL = os.environ.get("MPDOCTOR_INSTRUMENT_FAIL") == "1"
# Sampling: watch the modules of every Nth step only (see `Watcher.every`).
ENV_EVERY = "MPDOCTOR_WATCH_EVERY"
# Flush anyway when this many values are pending (a loop with no outermost module).
_MAX_PENDING = 20000


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
    __slots__ = ("primary",)

    def __init__(self, primary: bool) -> None:
        self.primary = primary


class Watcher:
    """See the package docstring for the handle's API."""

    def __init__(self, *, sink: Any = None, auto: bool = False, every: int | None = None) -> None:
        self.sink = sink
        self.auto = auto
        # Step sampling: the per-module reductions (forward outputs, gradients) and the
        # per-parameter gradient norms run on steps 0, N, 2N, ... only; the loss, the loss
        # scale and exceptions are recorded on every step (one value each, or nothing).
        self.every = _every(every, from_env=auto)
        self._on = True  # is the current step sampled
        self._escalated_from: int | None = None  # every step watched from this one on
        self._step_driven = False  # steps counted by mark_step() (an integration), not by forwards
        self.step = -1
        self.errors: list[RaisedError] = []
        self.internal_errors: list[str] = []
        self.disabled = False
        self.readout = Readout(self.name_of)
        if self.every > 1:
            self.readout.sampled = self._is_sampled
        self.plan_tracker = PlanTracker(self.name_of)
        # the hot path's view of the plan: bound once, and () once the plan has enough
        self._note_matmul = self.plan_tracker.note_matmul
        self._matmul_types = MATMUL_TYPES
        self._tls = threading.local()
        self._hooks: list[Any] = []  # process-wide hooks (attach_global)
        # per-module hooks (attach_module): id(module) -> (weakref, pre handle, post handle);
        # with sampling, the handles of all but the watched roots are None on the steps
        # that are not sampled (those steps then cost no hook call at all)
        self._module_hooks: dict[int, tuple[Any, Any, Any]] = {}
        self._attach_roots: set[int] = set()
        self._children_hooked = True
        self._roots: dict[int, _RootInfo] = {}
        self._primary: Any = None
        self._names: dict[int, str] = {}
        self._params_counted = False
        # pending on-device values, per device: 0-d tensors (stacked at flush) and vectors;
        # `_meta` describes each (see readout.py)
        self._scalars: dict[Any, list[Tensor]] = {}
        self._vectors: dict[Any, list[Tensor]] = {}
        self._meta: list[tuple] = []
        self._out_cache: dict[int, tuple[Any, int]] = {}
        self._gen = 0  # +1 at every flush: indices into _meta are only valid within one
        self._gin: dict[int, tuple[Any, list]] = {}
        self._last_exc: Any = None
        self._batch_shape: list[int] | None = None

    # ---- attaching -------------------------------------------------------------------
    def attach_global(self) -> None:
        """Watch every module call in the process (the `mpdoctor run` mode)."""
        from torch.nn.modules import module as nn_module

        self._hooks.append(nn_module.register_module_forward_pre_hook(self._pre))
        self._hooks.append(nn_module.register_module_forward_hook(self._post, always_call=True))

    def attach_module(self, model: Any) -> None:
        self._attach_roots.add(id(model))
        for m in model.modules():
            old = self._module_hooks.get(id(m))
            if old is not None and old[0]() is m:
                continue  # already watched (a wrapper around a watched model)
            hooked = self._children_hooked or id(m) in self._attach_roots
            self._module_hooks[id(m)] = (weakref.ref(m), *(self._hook(m) if hooked else (None, None)))
        self._new_root(model, force_primary=self._primary is None)

    def _hook(self, m: Any) -> tuple[Any, Any]:
        return m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post, always_call=True)

    def _sample_hooks(self) -> None:
        """With sampling, the submodules' hooks are there on the sampled steps only."""
        want = self._on
        if self.every == 1 or want == self._children_hooked or not self._module_hooks:
            return
        self._children_hooked = want
        for key, (ref, pre, post) in list(self._module_hooks.items()):
            if key in self._attach_roots:
                continue
            m = ref()
            if m is None:
                del self._module_hooks[key]
            elif want and pre is None:
                self._module_hooks[key] = (ref, *self._hook(m))
            elif not want and pre is not None:
                pre.remove()
                post.remove()
                self._module_hooks[key] = (ref, None, None)

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
        self.readout.release_held()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for _, pre, post in self._module_hooks.values():
            if pre is not None:
                pre.remove()
                post.remove()
        self._module_hooks.clear()
        from . import patches

        patches.unregister(self)

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- handle API --------------------------------------------------------------
    @property
    def plan(self) -> PrecisionPlan:
        return self.plan_tracker.plan

    @property
    def autocast_dtype(self) -> str | None:
        return self.plan.autocast_dtype

    @property
    def scaler(self) -> ScalerTimeline:
        return self.readout.scaler

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
        return self.readout.nonfinite

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
        self.readout.release_held()
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
        r = self.readout
        return {
            "step": self.step,
            "plan": self.plan.to_dict(),
            "scaler": r.scaler.to_dict(),
            "nonfinite": [n.to_dict() for n in r.nonfinite],
            "overflow": [o.to_dict() for o in r.overflow],
            "errors": [e.to_dict() for e in self.errors],
            "internal_errors": list(self.internal_errors),
            "loss_zero_grad_nan": list(r.loss_zero_grad_nan) if r.loss_zero_grad_nan else None,
            "last_loss": r.last_loss,
            "last_grad_norm": r.last_grad_norm,
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
            if not self._on:  # a step that is not sampled: keep the call stack only
                st.append((mod, -1, self._gen))
                return None
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
                        if not self._children_hooked:  # a step not sampled: the submodules had no hooks
                            mod, args = _innermost_module(exc, self._names, mod, args)
                        self._on_forward_error(mod, args, exc)
                    if not st:
                        self.flush()
                    return None
            t = out if isinstance(out, Tensor) else _first_float(out)
            if t is None or not t.is_floating_point() or not t.numel() or t.is_meta:
                return None
            if not self._on:
                if isinstance(mod, self._matmul_types) and not self._note_matmul(mod, t):
                    self._matmul_types = ()
                return None
            idx = self._record("out", mod, t, in_idx)
            self._out_cache[id(t)] = (weakref.ref(t), idx)
            if isinstance(mod, self._matmul_types) and not self._note_matmul(mod, t):
                self._matmul_types = ()  # the plan has seen enough of them
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
        if not self._step_driven:
            self._next_step()
        if not self._params_counted:
            self._params_counted = True
            self.plan_tracker.count_root(mod)
        t = args[0] if args and isinstance(args[0], Tensor) else None
        self._batch_shape = list(t.shape) if t is not None else None
        if self.sink is not None:
            self.sink.progress(self.step, "forward")

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

    # ---- the once-per-step read ---------------------------------------------------
    def flush(self) -> None:
        """Copy the pending values to the host (one sync per device) and look at them."""
        try:
            if self.disabled or not self._meta:
                self._out_cache.clear()
                return
            meta, scalars, vectors = self._meta, self._scalars, self._vectors
            self._meta, self._scalars, self._vectors = [], {}, {}
            self._gen += 1
            self._out_cache.clear()
            self._gin.clear()
            found = self.readout.read(meta, scalars, vectors, self.plan_tracker.scaler_active(), self._primary)
            if self.readout.held_loss is not None and self._escalated_from is not None and \
                    self.step >= self._escalated_from:
                found |= self.readout.release_held()  # a watched step did not name a module
            if found:
                self._emit()
        except Exception as exc:
            self._fail(exc)

    def _emit(self) -> None:
        if self.sink is not None:
            self._refresh_plan()
            self.sink.snapshot(self.snapshot())

    def _refresh_plan(self) -> None:
        self.plan_tracker.refresh(self._fail)

    # ---- errors ------------------------------------------------------------------
    def _on_forward_error(self, mod: Any, args: Any, exc: BaseException) -> None:
        err = raised_error(exception_text(exc), self.step, self._batch_shape, mod, self.name_of(mod), args,
                           owners=self.memory_owners)
        self.errors.append(err)
        if self.sink is not None:
            self.sink.event("exception", step=self.step, module=err.module, exception=err.exception[:500],
                            time=err.time)
        self._emit()

    def on_exit_exception(self, exc: BaseException) -> None:
        """An exception nobody caught, raised outside any module's forward (the backward,
        the optimizer, the loss, a collective): recorded with the memory at that moment."""
        text = exception_text(exc)
        if any(e.exception == text for e in self.errors):
            return
        self.errors.append(raised_error(text, self.step, self._batch_shape, owners=self.memory_owners))

    def memory_owners(self) -> list[tuple[str, int, int]]:
        """(label, data_ptr, nbytes) of the tensors the watcher can name: the outputs of
        this step's module calls still alive, the outermost module's parameters and their
        gradients. Only read when an error asks for the memory context."""
        out: list[tuple[str, int, int]] = []

        def add(label: str, t: Any) -> None:
            try:
                st = t.untyped_storage()
                out.append((label, st.data_ptr(), st.nbytes()))
            except Exception:
                pass

        for ref, idx in list(self._out_cache.values()):
            t = ref()
            if t is not None and 0 <= idx < len(self._meta):
                kind, mod = self._meta[idx][0], self._meta[idx][1]
                add(f"{'input' if kind == 'in' else 'output'} of {self.name_of(mod)}", t)
        root = self._primary
        if root is not None:
            for name, m in root.named_modules():
                label = _strip_wrapper(name, root) or type(m).__name__
                for p in m.parameters(recurse=False):
                    add(f"parameters of {label}", p)
                    if p.grad is not None:
                        add(f"gradients of {label}", p.grad)
        return out

    # ---- process-wide events (dispatched by patches.py) ----------------------------
    def _pend_pair(self, kind: str, a: Tensor, b: Tensor) -> None:
        dev = a.device
        lst = self._scalars.setdefault(dev, [])
        lst.append(a)
        lst.append(b)
        self._meta.append((kind, None, dev, len(lst) - 2, -1, self.step, a.dtype))

    def _pend_vector(self, kind: str, vec: Tensor, names: "_LazyParamNames") -> None:
        dev = vec.device
        pending = self._vectors.setdefault(dev, [])
        pending.append(vec)
        off = sum(v.numel() for v in pending[:-1])
        self._meta.append((kind, None, dev, off, (vec.numel(), names), self.step, vec.dtype))

    def on_backward(self, loss: Tensor) -> None:
        if self.disabled or not isinstance(loss, Tensor) or not loss.is_floating_point() or not loss.numel():
            return
        v = loss.detach()
        v = v.reshape(-1)[0] if v.numel() == 1 else torch.linalg.vector_norm(v.float())
        self._pend_pair("loss", v, v)
        if self.sink is not None:
            self.sink.progress(self.step, "backward")

    def on_scaler_created(self, scaler: Any) -> None:
        self.plan_tracker.on_scaler_created(scaler)

    def on_scaler_seen(self, scaler: Any) -> None:
        self.plan_tracker.on_scaler_seen(scaler)

    def on_scale(self, scaler: Any, before: Tensor, after: Tensor) -> None:
        if self.disabled:
            return
        self.plan_tracker.on_scaler_seen(scaler)
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
                              _LazyParamNames(self, [with_grad[j] for j in idx]))
        self.plan_tracker.before_step(with_grad)
        if self.sink is not None:
            self.sink.progress(self.step, "optimizer")

    def on_optimizer_post(self, opt: Any) -> None:
        if not self.disabled and self.plan_tracker.after_step():
            self._emit()

    def on_grad_norm(self, norm: Any) -> None:
        if self.disabled or not isinstance(norm, Tensor):
            return
        self._pend_vector("gnorm", norm.detach().reshape(1), _LazyParamNames(self, []))

    def on_accelerator(self, acc: Any) -> None:
        if self.plan_tracker.add_accelerator(acc):
            self._refresh_plan()

    def on_prepare(self, acc: Any, objs: tuple) -> None:
        self.on_accelerator(acc)
        self.plan_tracker.on_prepare(objs)


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


def _innermost_module(exc: BaseException, names: dict[int, str], mod: Any, args: Any) -> tuple[Any, Any]:
    """The innermost watched module whose forward the exception went through (from its
    traceback), with the tensors that forward held; (mod, args) when none is found."""
    found = (mod, args)
    tb = exc.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        obj = local.get("self")
        if isinstance(obj, torch.nn.Module) and id(obj) in names and tb.tb_frame.f_code.co_name == "forward":
            found = (obj, tuple(v for k, v in local.items() if k != "self" and isinstance(v, Tensor))[:4])
        tb = tb.tb_next
    return found


def _every(every: Any, from_env: bool = False) -> int:
    """The sampling period: `every` as given (a positive int, else ValueError); when not
    given, 1, or for `mpdoctor run`'s watcher (`from_env`) MPDOCTOR_WATCH_EVERY (a wrong
    value there means 1: the training must not fail on it)."""
    if every is None:
        raw = os.environ.get(ENV_EVERY, "").strip() if from_env else ""
        return int(raw) if raw.isdigit() and int(raw) > 0 else 1
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"mpdoctor.watch(every=...) takes a positive integer, not {every!r}")
    return every


def _is_accelerator(obj: Any) -> bool:
    return type(obj).__name__ == "Accelerator" and hasattr(obj, "prepare")
