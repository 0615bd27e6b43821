"""An exception raised in the training, as the instrumentation records it: the text
Python prints (whole, bounded) and the context a traceback does not show: the dtypes
and devices around the failing forward, autocast, the memory at that moment. Not
classified here: the parent explains it with the rule base."""

from __future__ import annotations

import time
from typing import Any

from . import context
from .records import RaisedError

_MAX_EXCEPTION = 4000


def exception_text(exc: BaseException) -> str:
    """'Type: message' as Python prints it, whole (an OOM message runs several lines),
    bounded."""
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except Exception:  # a __str__ that raises
        text = type(exc).__name__
    return text[:_MAX_EXCEPTION]


def raised_error(text: str, step: int, batch_shape: list[int] | None, mod: Any = None, name: str = "",
                 args: Any = (), owners: Any = None) -> RaisedError:
    """The record of an exception (`text`: exception_text's) raised at `step`: in the
    forward of `mod` (named `name`, called with `args`), or outside any module.
    `owners`: a callable listing the watched tensors, to attribute GPU memory to modules."""
    err = RaisedError(exception=text, module=name, module_type=type(mod).__name__ if mod is not None else "",
                      step=step, time=time.time())
    err.context = failure_context(mod, args, batch_shape, owners)
    return err


def failure_context(mod: Any, args: Any, batch_shape: list[int] | None, owners: Any = None) -> dict[str, Any]:
    """What surrounded the failure; each part on its own, a partial context is still one."""
    ctx: dict[str, Any] = {"batch_shape": batch_shape}
    for key, get in (("params", lambda: context.param_summary(mod)),
                     ("inputs", lambda: [context.describe_tensor(t) for t in context.tensors_in(args)]),
                     ("autocast", context.autocast_state),
                     ("memory", lambda: {"host": context.host_memory(), "device": context.device_memory(owners)})):
        if mod is None and key in ("params", "inputs"):
            continue
        try:
            ctx[key] = get()
        except Exception as inner:
            ctx.setdefault("errors", []).append(f"{key}: {type(inner).__name__}: {inner}"[:200])
    return ctx
