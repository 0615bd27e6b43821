"""An exception raised in the training, as the instrumentation records it: the text
Python prints (whole, bounded) and the context a traceback does not show: the dtypes
and devices around the failing forward, autocast, the memory at that moment (GPU memory
attributed to the watched tensors that hold it). Not classified here: the parent
explains it with the rule base.

An exception the program caught and trained on after (an OOM inside a
retry-with-a-smaller-batch loop such as accelerate's `find_executable_batch_size`,
followed by optimizer steps) is *recovered*: it moves from `errors` to `recovered`, and
the events file says so, so that the run does not report a failure that did not end it."""

from __future__ import annotations

import time
from typing import Any

from . import context
from .records import RaisedError
from .steps import strip_wrapper

_MAX_EXCEPTION = 4000
_MAX_RECOVERED = 50


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


class ErrorRecorder:
    """The recorder's exceptions (a mixin of ``recorder.Recorder``)."""

    def _init_errors(self) -> None:
        self.errors: list[RaisedError] = []
        self.recovered: list[RaisedError] = []  # caught, and the training went on

    def _on_forward_error(self, mod: Any, args: Any, exc: BaseException) -> None:
        err = raised_error(exception_text(exc), self.step, self._batch_shape, mod, self.name_of(mod), args,
                           owners=self.memory_owners)
        err.micro = self.micro
        self._add_origin(err, exc, mod, args)
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
        err = raised_error(text, self.step, self._batch_shape, owners=self.memory_owners)
        self._add_origin(err, exc)
        self.errors.append(err)

    def _add_origin(self, err: RaisedError, exc: BaseException, mod: Any = None, args: Any = ()) -> None:
        """The odd tensor of a dtype or device mismatch and what made it (origin.py); a
        failure to find it is noted in the context, never raised."""
        try:
            from . import origin

            found = origin.origin_in_forward(mod, args, exc, self) if mod is not None else \
                origin.origin_outside(exc, self)
        except Exception as inner:
            err.context.setdefault("errors", []).append(f"origin: {type(inner).__name__}: {inner}"[:200])
            return
        if found:
            err.context["origin"] = found

    def _after_optimizer_step(self) -> None:
        """An optimizer step completed: the exceptions recorded before it were caught and
        the training went on."""
        if not self.errors:
            return
        done, self.errors = self.errors, []
        for err in done:
            err.recovered_at_step = self.step
            if len(self.recovered) < _MAX_RECOVERED:
                self.recovered.append(err)
            if self.sink is not None:
                self.sink.event("recovered", exception=err.exception[:500], raised_time=err.time,
                                step=err.step, recovered_at_step=self.step)
        self._emit()

    def memory_owners(self) -> list[tuple[str, int, int]]:
        """(label, data_ptr, nbytes) of the tensors the recorder can name: the outputs of
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
                label = strip_wrapper(name, root) or type(m).__name__
                for p in m.parameters(recurse=False):
                    add(f"parameters of {label}", p)
                    if p.grad is not None:
                        add(f"gradients of {label}", p.grad)
        return out
