"""Process-wide taps that module hooks cannot see: the loss scaler, backward(), the
optimizer step, gradient clipping, torch.autograd.grad, torch.save, custom autograd
Functions under autocast, collectives and accelerate's Accelerator.

Installed once per process, they dispatch to every active watcher. Each wrapper calls
the original exactly as it was called and returns its result untouched; our part runs in
a try block whose errors go to the watcher (fail-open), never to the caller.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

_WATCHERS: list[Any] = []
_AUTO: list[Any] = []
_INSTALLED: set[str] = set()


def register(watcher: Any, auto: bool = False) -> None:
    if watcher not in _WATCHERS:
        _WATCHERS.append(watcher)
    if auto:
        _AUTO.append(watcher)
        _hide_our_frames_when_uncaught()
    install_torch()
    # accelerate may be half-way through its own __init__ (it imports torch): patch it
    # now only if it is complete; otherwise the import hook calls us when it is.
    acc = sys.modules.get("accelerate.accelerator")
    if acc is not None and hasattr(acc, "Accelerator"):
        install_accelerate()


def unregister(watcher: Any) -> None:
    if watcher in _WATCHERS:
        _WATCHERS.remove(watcher)
    if watcher in _AUTO:
        _AUTO.remove(watcher)


def auto_watcher() -> Any:
    return _AUTO[0] if _AUTO else None


def _dispatch(method: str, *args: Any) -> None:
    for w in _WATCHERS:
        if w.disabled:
            continue
        try:
            getattr(w, method)(*args)
        except Exception as exc:
            w._fail(exc)


def _recipe(method: str, *args: Any) -> None:
    """A step of the AMP recipe, to each watcher's RecipeTracker (instrument/recipe.py)."""
    for w in _WATCHERS:
        recipe = getattr(w, "recipe", None)
        if w.disabled or recipe is None:
            continue
        try:
            getattr(recipe, method)(w, *args)
        except Exception as exc:
            w._fail(exc)


def _wrap(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    original = getattr(owner, name)
    if getattr(original, "__mpdoctor_wrapped__", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped.__mpdoctor_wrapped__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapped)


class _Before:
    """A method tapped when it is looked up on an instance, before the call: the call is
    then the original's own, so an error it raises has no frame of ours in its traceback
    (a wrapper function would add one to every failing backward()). Looked up on the
    class it is the original."""

    __mpdoctor_wrapped__ = True

    def __init__(self, original: Callable, tap: Callable[[Any], None]) -> None:
        self.original, self.tap = original, tap
        functools.update_wrapper(self, original)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self.original
        if _WATCHERS:
            self.tap(obj)
        return self.original.__get__(obj, objtype)


def _before(owner: Any, name: str, tap: Callable[[Any], None]) -> None:
    if isinstance(owner.__dict__.get(name), _Before):
        return
    setattr(owner, name, _Before(getattr(owner, name), tap))


class _BeforeClassmethod(classmethod):
    """A classmethod tapped when it is looked up (`MyFunction.apply(...)`), before the
    call, with the class it is looked up on: no frame of ours in what the call raises.
    Still a classmethod, so code that inspects the attribute statically sees one."""

    __mpdoctor_wrapped__ = True

    def __init__(self, original: classmethod, tap: Callable[[Any], None]) -> None:
        super().__init__(original.__func__)
        self.tap = tap

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # type: ignore[override]
        if _WATCHERS:
            self.tap(objtype if objtype is not None else type(obj))
        return super().__get__(obj, objtype)


def _without_our_frames(exc: BaseException | None, seen: set[int] | None = None) -> None:
    """Take the frames of this module's wrappers out of `exc`'s traceback (and of the
    exceptions it chains), so that what the user reads is what a bare run prints."""
    seen = set() if seen is None else seen
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        if tb is not exc.__traceback__:
            exc.__traceback__ = tb
        while tb is not None and tb.tb_next is not None:
            if tb.tb_next.tb_frame.f_code.co_filename == __file__:
                tb.tb_next = tb.tb_next.tb_next
            else:
                tb = tb.tb_next
        if exc.__cause__ is not None:
            _without_our_frames(exc.__cause__, seen)
        exc = exc.__context__


def _hide_our_frames_when_uncaught() -> None:
    """Under `mpdoctor run`: an uncaught error that went through one of the wrappers
    that must act after the call (Accelerator(), prepare(), clip_grad_norm_, the
    scaler's update) is printed without their frames, as the bare run prints it."""
    if "excepthook" in _INSTALLED:
        return
    _INSTALLED.add("excepthook")
    previous = sys.excepthook

    def excepthook(tp: Any, value: Any, tb: Any) -> None:
        try:
            _without_our_frames(value)
            tb = value.__traceback__
        except Exception:
            pass
        previous(tp, value, tb)

    sys.excepthook = excepthook


def install_torch() -> None:
    if "torch" in _INSTALLED:
        return
    _INSTALLED.add("torch")
    import torch
    import torch.nn.utils.clip_grad as clip_grad
    from torch.amp import grad_scaler
    from torch.optim import optimizer as optim_mod

    def scaler_init(orig: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            _dispatch("on_scaler_created", self)
        return __init__

    def scaler_update(orig: Callable) -> Callable:
        def update(self: Any, *args: Any, **kwargs: Any) -> Any:
            before = None
            if _WATCHERS and getattr(self, "_enabled", False) and getattr(self, "_scale", None) is not None:
                try:
                    before = self._scale.detach().clone()
                except Exception:
                    before = None
            result = orig(self, *args, **kwargs)
            if before is not None:
                try:
                    after = self._scale.detach().clone()
                except Exception:
                    return result
                _dispatch("on_scale", self, before, after)
            return result
        return update

    def scaler_scale(orig: Callable) -> Callable:
        def scale(self: Any, *args: Any, **kwargs: Any) -> Any:
            _dispatch("on_scaler_scale", self)
            result = orig(self, *args, **kwargs)
            if _WATCHERS:  # the scaled loss, known again if torch.autograd.grad is taken of it
                _recipe("scaled_output", self, result)
            return result
        return scale

    _wrap(grad_scaler.GradScaler, "__init__", scaler_init)
    _wrap(grad_scaler.GradScaler, "update", scaler_update)
    # a scaler made before watch() was called is met here, once per step
    # (and each call is a step of the recipe: scale, unscale_ before clipping)
    _wrap(grad_scaler.GradScaler, "scale", scaler_scale)
    _before(grad_scaler.GradScaler, "get_scale", lambda scaler: _recipe("get_scale", scaler))
    _before(grad_scaler.GradScaler, "unscale_", lambda scaler: _dispatch("on_scaler_unscale", scaler))
    # a step of the loop, taken or skipped on overflow (then the optimizer's step is not called)
    _before(grad_scaler.GradScaler, "step", lambda scaler: _dispatch("on_scaler_step", scaler))
    _before(torch.Tensor, "backward", lambda loss: _dispatch("on_backward", loss))

    def clip(orig: Callable) -> Callable:
        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            result = orig(*args, **kwargs)
            if _WATCHERS:
                _dispatch("on_grad_norm", result, args[1] if len(args) > 1 else kwargs.get("max_norm"))
            return result
        return clip_grad_norm_

    _wrap(clip_grad, "clip_grad_norm_", clip)
    torch.nn.utils.clip_grad_norm_ = clip_grad.clip_grad_norm_

    optim_mod.register_optimizer_step_pre_hook(lambda opt, args, kwargs: _dispatch("on_optimizer_pre", opt))
    optim_mod.register_optimizer_step_post_hook(lambda opt, args, kwargs: _dispatch("on_optimizer_post", opt))
    # the recipe: was this step the scaler's (scaler.step(opt)) or a direct one on scaled gradients?
    optim_mod.register_optimizer_step_pre_hook(lambda opt, args, kwargs: _recipe("optimizer_step", opt))
    _install_recipe(torch)


def _install_recipe(torch: Any) -> None:
    """The calls of the AMP recipe that are not the scaler's own: torch.autograd.grad (a
    gradient penalty of a scaled loss), torch.save (a checkpoint without the scaler's
    state), a custom autograd Function's apply under autocast. Each costs a check of a
    list (or, for apply, of the autocast state) when nothing is watched."""

    def autograd_grad(orig: Callable) -> Callable:
        def grad(*args: Any, **kwargs: Any) -> Any:
            result = orig(*args, **kwargs)
            if _WATCHERS:
                outputs = args[0] if args else kwargs.get("outputs")
                create_graph = args[4] if len(args) > 4 else kwargs.get("create_graph", False)
                _recipe("autograd_grad", outputs, create_graph, result)
            return result
        return grad

    _wrap(torch.autograd, "grad", autograd_grad)

    def save(orig: Callable) -> Callable:
        def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if _WATCHERS:
                _recipe("saved", obj, sys._getframe(1))
            return orig(obj, *args, **kwargs)
        return save

    import torch.serialization as serialization

    _wrap(serialization, "save", save)
    torch.save = serialization.save

    from torch.autograd.function import Function

    is_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)
    apply = Function.__dict__.get("apply")
    if is_autocast is not None and isinstance(apply, classmethod) and not isinstance(apply, _BeforeClassmethod):
        def tap(cls: Any) -> None:
            if is_autocast():
                _recipe("function_apply", cls)

        Function.apply = _BeforeClassmethod(apply, tap)  # type: ignore[method-assign]


def install_accelerate() -> None:
    """Called when `accelerate` has been imported (or at registration if it already is)."""
    if "accelerate" in _INSTALLED:
        return
    acc_mod = sys.modules.get("accelerate.accelerator")
    cls = getattr(acc_mod, "Accelerator", None)
    if cls is None:
        try:
            from accelerate.accelerator import Accelerator as cls
        except Exception:
            return

    def init(orig: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            _dispatch("on_accelerator", self)
            _recipe("accelerator", self)
        return __init__

    def prepare(orig: Callable) -> Callable:
        def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(self, *args, **kwargs)
            objs = result if isinstance(result, tuple) else (result,)
            _dispatch("on_prepare", self, objs)
            return result
        return prepare

    _wrap(cls, "__init__", init)
    _wrap(cls, "prepare", prepare)
    # `with accelerator.accumulate(model):` (the recipe when gradient_accumulation_steps > 1)
    _before(cls, "accumulate", lambda acc: _recipe("accumulate", acc))
    _INSTALLED.add("accelerate")


_COLLECTIVES = ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_object", "gather",
                "gather_object", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                "broadcast_object_list", "scatter", "all_to_all_single", "monitored_barrier")


def install_collectives(progress: Callable[[str], None]) -> None:
    """Mark, in the rank's progress file, when it enters and leaves a collective: a rank
    killed while waiting for a dead peer is then seen waiting."""
    if "collectives" in _INSTALLED:
        return
    _INSTALLED.add("collectives")
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    for name in _COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "__mpdoctor_wrapped__", False):
            continue

        def make(orig: Callable, name: str = name) -> Callable:
            def collective(*args: Any, **kwargs: Any) -> Any:
                try:
                    progress(f"in {name}")
                except Exception:
                    pass
                result = orig(*args, **kwargs)
                try:
                    progress(f"after {name}")
                except Exception:
                    pass
                return result
            return collective

        wrapped = functools.wraps(original)(make(original))
        wrapped.__mpdoctor_wrapped__ = True  # type: ignore[attr-defined]
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
