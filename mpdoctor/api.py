"""The Python API's facade: where what the instrumentation records meets what the run face
concludes. ``instrument/`` records only and imports no face; ``run/`` judges evidence and
knows nothing of hooks; this module joins them for the user's process:

* ``watch(model_or_accelerator)`` -> a ``Watcher``: the recorder's records (``h.plan``,
  ``h.nonfinite``, ``h.scaler``, ...; see ``mpdoctor.instrument``) and ``h.findings()`` /
  ``h.report()``, the run rules and env rules judged on them as ``mpdoctor run`` would;
* ``instrument_process(name)``: what ``mpdoctor run``'s boot calls when torch has been
  imported in a wrapped process (the recorder, with the env collector for its exit).

Nothing is imported here until used: ``import mpdoctor`` stays free of torch.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["Watcher", "instrument_process", "watch"]


def watch(obj: Any = None, **kwargs: Any) -> Watcher:
    """Watch a torch.nn.Module or an accelerate Accelerator (with no argument: every
    module in the process); `every=N` samples steps. Returns a Watcher. Only a wrong
    argument raises; the instrumentation itself fails open."""
    from .instrument import watch as record

    return Watcher(record(obj, **kwargs))


class Watcher:
    """The handle ``mpdoctor.watch()`` returns: every record of the instrumentation's
    ``Recorder`` (read through to it: ``h.plan``, ``h.first_nonfinite``, ``h.scaler``,
    ``h.errors``, ``h.step``, ``h.flush()``, ...), and the findings judged on them."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def __getattr__(self, name: str) -> Any:
        if name == "recorder":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.recorder, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {n for n in dir(self.recorder) if not n.startswith("_")})

    def findings(self, rules: list[Any] | None = None) -> list[Any]:
        """What the rule base says about this process so far, root cause first: the
        run rules and the env rules, judged exactly as `mpdoctor run` judges a run."""
        return self.report(rules).findings

    def report(self, rules: list[Any] | None = None) -> Any:
        from .diagnosis.run import judge_run
        from .env.inprocess import collect_in_process

        if rules is None:
            from .rulebase import load

            rules = load()

        r = self.recorder
        r.settle()
        evidence = {"schema": 1, "command": list(sys.argv[:8]), "exit_code": 0, "signal": None,
                    "output": {}, "processes": [{
                        "rank": None, "pid": os.getpid(), "world_size": os.environ.get("WORLD_SIZE"),
                        "env": collect_in_process(), "watch": r.snapshot(),
                        "exceptions": [], "exit": None, "progress": None,
                        "internal_errors": list(r.internal_errors)}]}
        report = judge_run(evidence, rules)
        report.extra.update({"precision_plan": r.plan.to_dict(), "loss_scaler": r.scaler.to_dict()})
        return report

    def close(self) -> None:
        """Remove every hook (under `mpdoctor run` the run's own recorder goes on)."""
        if not self.recorder.auto:
            self.recorder.close()
        else:
            self.recorder.settle()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def instrument_process(name: str) -> None:
    """`mpdoctor run`'s boot: `name` (torch, accelerate) has finished importing in a
    wrapped process. Never raises."""
    try:
        from .instrument import auto

        auto.on_import(name, describe_env=_describe_env)
    except Exception:
        pass


def _describe_env() -> dict[str, Any]:
    from .env.inprocess import collect_in_process

    return collect_in_process()
