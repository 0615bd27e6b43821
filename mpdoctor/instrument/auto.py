"""The `mpdoctor run` side of the instrumentation: started (through `mpdoctor.api`) by
boot/sitecustomize.py right after `import torch` has completed in a wrapped process.

At exit the recorder's last snapshot is written, with the process's environment when
the caller gave a `describe_env` (the env collector lives in env/, a face this package
does not import)."""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, Callable

_STARTED: list[Any] = []


def on_import(name: str, describe_env: Callable[[], dict[str, Any]] | None = None) -> None:
    """Called by the import hook when `torch` or `accelerate` finished importing.
    `describe_env`: what writes the process's environment into the events at exit."""
    try:
        if name == "torch":
            start(describe_env)
        elif name == "accelerate" and _STARTED:
            from . import patches

            patches.install_accelerate()
    except Exception as exc:  # fail open: the run goes on, the wrapper hears of it
        _report_boot_failure(exc)


def start(describe_env: Callable[[], dict[str, Any]] | None = None) -> Any:
    if _STARTED:
        return _STARTED[0]
    from . import patches
    from .events import ENV_DIR, EventSink
    from .recorder import Recorder

    directory = os.environ.get(ENV_DIR)
    sink = EventSink(directory) if directory else None
    w = Recorder(sink=sink, auto=True)
    _STARTED.append(w)
    patches.register(w, auto=True)
    w.attach_global()
    if sink is not None:
        patches.install_collectives(lambda where: sink.progress(w.step, where))
    atexit.register(_at_exit, w, describe_env)
    if os.environ.get("MPDOCTOR_JOB_DIR"):  # a job's shared folder: stacks and Flight Recorder on a hang
        from . import hang

        hang.install()
    return w


def _active(w: Any) -> bool:
    return bool(w.step >= 0 or w.errors or w.plan_tracker.accelerators or w.internal_errors)


def _at_exit(w: Any, describe_env: Callable[[], dict[str, Any]] | None = None) -> None:
    sink = w.sink
    try:
        w.settle()
        exc = getattr(sys, "last_value", None)
        if exc is not None and not w.disabled:
            w.on_exit_exception(exc)
        if sink is None or not _active(w):
            return
        if exc is not None:
            sink.event("exit-exception", exception=f"{type(exc).__name__}: {exc}".split("\n")[0][:500],
                       step=w.step, time=time.time())
        if describe_env is not None:
            sink.event("env", env=describe_env())
        sink.snapshot(w.snapshot())
        sink.event("exit", step=w.step, uncaught=exc is not None)
        sink.close()
    except Exception as exc:
        try:
            if sink is not None:
                sink.event("internal-error", text=f"at exit: {type(exc).__name__}: {exc}"[:300])
        except Exception:
            pass


def _report_boot_failure(exc: BaseException) -> None:
    try:
        from .events import ENV_DIR, EventSink

        directory = os.environ.get(ENV_DIR)
        if directory:
            EventSink(directory).event("internal-error", text=f"start: {type(exc).__name__}: {exc}"[:300])
    except Exception:
        pass
