"""Module hooks, the hot path: what every module call records.

The first floating tensor of a module's output (and of its input) is reduced on its
device with ``torch.aminmax`` (the cheapest reduction that shows NaN, Inf and magnitude
at once) and the two 0-d results are kept, unread; gradients get the same through
tensor hooks on module inputs (cheaper than module backward hooks). Nothing is read back
here: ``pending.PendingValues.flush`` reads a step's values in one go.

A module that cannot carry hooks (a TorchScript submodule) is skipped and listed in
``unhooked``; the rest of the model is watched. Inside torch.compile or jit tracing the
hooks step aside rather than enter the user's graph. Every hook fails open: an error of
ours goes to ``_fail`` and the hook returns normally.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

import torch
from torch import Tensor

from .plan import MATMUL_TYPES

_FORCE_FAIL = os.environ.get("MPDOCTOR_INSTRUMENT_FAIL") == "1"
# Flush anyway when this many values are pending (a loop with no outermost module).
_MAX_PENDING = 20000
# Modules that could not be hooked, kept by name (a scripted model can have thousands).
_MAX_UNHOOKED = 50

_F64, _F32 = torch.float64, torch.float32
_MAX_MADE = 256

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
_tracing_state = torch._C._get_tracing_state


def _skip() -> bool:
    """Inside torch.compile / jit tracing our hooks must vanish: their ops would be traced
    into the user's graph (or break it)."""
    return _is_compiling() or _tracing_state() is not None


def first_float(x: Any) -> Tensor | None:
    """The first floating tensor of a module's input or output (tuples, lists, dicts such
    as transformers' ModelOutput: the first few entries only)."""
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


def innermost_module(exc: BaseException, names: dict[int, str], mod: Any, args: Any) -> tuple[Any, Any]:
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


def _is_scripted(m: Any) -> bool:
    return isinstance(m, torch.jit.ScriptModule)


class ModuleHooks:
    """The recorder's module hooks (a mixin of ``recorder.Recorder``: the step counter,
    the pending values, the error recorder and `_fail` are the recorder's)."""

    def _init_hooks(self) -> None:
        self._tls = threading.local()
        self._hooks: list[Any] = []  # process-wide hooks (attach_global)
        # per-module hooks (attach_module): id(module) -> (weakref, pre handle, post handle);
        # with sampling, the handles of all but the watched roots are None on the steps
        # that are not sampled (those steps then cost no hook call at all)
        self._module_hooks: dict[int, tuple[Any, Any, Any]] = {}
        self._attach_roots: set[int] = set()
        self._children_hooked = True
        # modules that refused hooks: [{"module": name, "module_type": ..., "reason": ...}]
        self.unhooked: list[dict[str, str]] = []
        self._unhooked_count = 0
        self._last_exc: Any = None
        # the hot path's view of the plan: bound once, and () once the plan has enough
        self._note_matmul = self.plan_tracker.note_matmul
        self._matmul_types = MATMUL_TYPES
        # outputs of a dtype the module changed from a 16-bit or float64 input, or float64
        # ones: id -> (weakref, module, input dtype), read by origin.py at a failure only
        self._made: dict[int, tuple[Any, Any, Any]] = {}

    # ---- attaching -------------------------------------------------------------------
    def attach_global(self) -> None:
        """Watch every module call in the process (the `mpdoctor run` mode)."""
        from torch.nn.modules import module as nn_module

        self._hooks.append(nn_module.register_module_forward_pre_hook(self._pre))
        self._hooks.append(nn_module.register_module_forward_hook(self._post, always_call=True))

    def attach_module(self, model: Any) -> None:
        """Hooks on `model` and every submodule that takes them; a TorchScript submodule
        (and what it holds) is skipped and listed in `unhooked`, never raised."""
        self._attach_roots.add(id(model))
        scripted: set[int] = set()
        for name, m in model.named_modules():
            old = self._module_hooks.get(id(m))
            if old is not None and old[0]() is m:
                continue  # already watched (a wrapper around a watched model)
            if id(m) in scripted:
                continue
            if _is_scripted(m):
                scripted.update(id(s) for s in m.modules())
                self._note_unhooked(name, m, "a TorchScript module takes no Python hooks")
                continue
            hooked = self._children_hooked or id(m) in self._attach_roots
            try:
                handles = self._hook(m) if hooked else (None, None)
            except Exception as exc:  # any other module that refuses hooks
                self._note_unhooked(name, m, f"{type(exc).__name__}: {exc}"[:200])
                continue
            self._module_hooks[id(m)] = (weakref.ref(m), *handles)
        if id(model) in self._module_hooks:
            self._new_root(model, force_primary=self._primary is None)

    def _note_unhooked(self, name: str, m: Any, reason: str) -> None:
        self._unhooked_count += 1
        if len(self.unhooked) < _MAX_UNHOOKED:
            self.unhooked.append({"module": name or type(m).__name__, "module_type": type(m).__name__,
                                  "reason": reason})

    def _hook(self, m: Any) -> tuple[Any, Any]:
        pre = m.register_forward_pre_hook(self._pre)
        try:
            return pre, m.register_forward_hook(self._post, always_call=True)
        except Exception:
            pre.remove()
            raise

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

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for _, pre, post in self._module_hooks.values():
            if pre is not None:
                pre.remove()
                post.remove()
        self._module_hooks.clear()

    def _stack(self) -> list:
        st = getattr(self._tls, "stack", None)
        if st is None:
            st = self._tls.stack = []
        return st

    # ---- the hooks -------------------------------------------------------------------
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
                t = a0 if isinstance(a0, Tensor) and a0.is_floating_point() else first_float(args)
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
                    if self._first_sight(exc):
                        if not self._children_hooked:  # a step not sampled: the submodules had no hooks
                            mod, args = innermost_module(exc, self._names, mod, args)
                        self._on_forward_error(mod, args, exc)
                    if not st:
                        self.flush()
                    return None
            t = out if isinstance(out, Tensor) else first_float(out)
            if t is None or not t.is_floating_point() or not t.numel() or t.is_meta:
                return None
            dt = t.dtype
            a0 = args[0] if args else None
            if dt is _F64 or (isinstance(a0, Tensor) and a0.dtype is not dt and a0.dtype is not _F32
                              and a0.is_floating_point()):
                self._note_made(t, mod, a0)
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

    def _note_made(self, t: Tensor, mod: Any, a0: Any) -> None:
        """A module output whose dtype the module chose (float64, or another dtype than its
        16-bit input: a float32 LayerNorm in a bf16 model): origin.py names it as the maker."""
        made = self._made
        if len(made) >= _MAX_MADE:
            made.clear()
        made[id(t)] = (weakref.ref(t), mod, a0.dtype if isinstance(a0, Tensor) else None)

    def _first_sight(self, exc: BaseException) -> bool:
        """Whether this is the first hook the exception passes (it passes every enclosing
        module's). The exception is marked, not kept: its traceback holds frames and
        tensors, and an OOM retry with a smaller batch must get that memory back; its id
        alone is not enough, as the next try's exception often gets the same one."""
        token = id(self)
        try:
            if getattr(exc, "_mpdoctor_seen", None) == token:
                return False
            exc._mpdoctor_seen = token  # type: ignore[attr-defined]
            return True
        except Exception:  # an exception type without attributes: its identity then
            key = (id(exc), type(exc), str(exc)[:200])
            if key == self._last_exc:
                return False
            self._last_exc = key
            return True

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
