"""Integrations where people train: a transformers ``TrainerCallback`` and a Lightning
``Callback``, each attaching the same instrumentation as ``mpdoctor.watch`` (same hooks,
same cost, same ``every=`` sampling) and reporting its findings when training ends or
fails::

    from mpdoctor.integrations.transformers import MpdoctorCallback
    trainer = Trainer(..., callbacks=[MpdoctorCallback()])

    from mpdoctor.integrations.lightning import MpdoctorCallback
    trainer = lightning.Trainer(..., callbacks=[MpdoctorCallback()])

    trainer.train() / trainer.fit(...)
    callback.findings        # [mpdoctor.findings.Finding], root cause first
    callback.report()        # mpdoctor.findings.Report; mpdoctor.render_findings(callback, "markdown")

The frameworks are optional: this package imports none of them; each integration module
imports its framework through `require` (the one place that guards them) and says what
to install when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["require"]


def require(module: str, feature: str, install: str) -> Any:
    """Import an optional framework for `feature`, or raise ImportError saying what to
    install (`install`: the pip requirement)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{feature} needs {module.split('.')[0]}, which is not installed here "
                          f"({exc}); install it with: pip install '{install}'") from exc


def first_available(candidates: list[tuple[str, str]], feature: str, install: str) -> Any:
    """The first of `candidates` ((module, attribute)) that imports, e.g. Lightning's
    `lightning.pytorch` or the older `pytorch_lightning`."""
    errors = []
    for module, attr in candidates:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}: {exc}")
    raise ImportError(f"{feature} needs one of {', '.join(m for m, _ in candidates)} ({'; '.join(errors)}); "
                      f"install it with: pip install '{install}'")
