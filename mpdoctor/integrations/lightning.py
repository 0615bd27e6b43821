"""A Lightning ``Callback`` that watches the LightningModule the way ``mpdoctor.watch``
does, and reports what it found when the fit ends or raises::

    from mpdoctor.integrations.lightning import MpdoctorCallback

    cb = MpdoctorCallback()                  # every=N to sample steps; report=None for silence
    trainer = lightning.Trainer(..., callbacks=[cb])
    trainer.fit(model, data)
    cb.findings                              # root cause first

Works with `lightning` (lightning.pytorch) and with the older `pytorch_lightning`,
whichever is installed (the first found).
"""

from __future__ import annotations

from typing import Any

from . import first_available
from ._session import SessionResults, WatchSession

Callback = first_available([("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback")],
                           "mpdoctor.integrations.lightning", "lightning>=2.2")

__all__ = ["MpdoctorCallback"]


class MpdoctorCallback(SessionResults, Callback):  # type: ignore[misc, valid-type]
    """Watches the LightningModule from `on_fit_start`; reports at `on_fit_end` or in
    `on_exception`.

    every: sample the per-module checks on every Nth step (see mpdoctor.watch);
    report: "terminal" (default), "markdown", "json", "oneline", or None: how the
    findings are printed at the end (on stderr; nothing is printed under `mpdoctor run`,
    which reports them itself)."""

    def __init__(self, every: int | None = None, report: str | None = "terminal", stderr: bool = True) -> None:
        super().__init__()
        self.session = WatchSession(every=every, report=report, stderr=stderr)
        self._global_step: int | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start(pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # steps as Lightning counts them (training_step may call submodules, not the module):
        # its optimizer steps (global_step); the batches of one accumulation cycle are one step
        h = self.session.handle
        if h is None or self.session._report is not None:
            return
        step = getattr(trainer, "global_step", None)
        if step is None or step != self._global_step:
            self._global_step = step
            h.mark_step()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # the step's values are read here (one host read, as watch() does at the next forward)
        h = self.session.handle
        if h is not None and self.session._report is None:
            h.flush()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(exception)
