"""What both callbacks share: one watch() handle over the training, and its findings
reported once, when the training ends or fails."""

from __future__ import annotations

import sys
from typing import Any


class WatchSession:
    """A watch() handle with a beginning and an end.

    `every`: watch(every=N) sampling (None: every step; under `mpdoctor run` the run's
    watcher is used, sampled as MPDOCTOR_WATCH_EVERY says);
    `report`: print the findings at the end ("terminal", "markdown", "json", "oneline",
    or None for silence); `stderr`: print there (default) rather than on stdout."""

    def __init__(self, every: int | None = None, report: str | None = "terminal", stderr: bool = True) -> None:
        if report not in (None, "terminal", "markdown", "json", "oneline"):
            raise ValueError(f"report must be terminal, markdown, json, oneline or None, not {report!r}")
        if every is not None:
            from ..instrument.steps import sampling_period

            sampling_period(every)  # a wrong value is the user's error: say so now, not mid-training
        self.every = every
        self.report_format = report
        self.stderr = stderr
        self.handle: Any = None
        self.failure: BaseException | None = None
        self._report: Any = None
        self._owned = False  # False when `mpdoctor run`'s process-wide watcher is used

    # ---- life cycle -------------------------------------------------------------------
    def start(self, model: Any) -> None:
        """Watch `model` (an nn.Module); a second start (a new fit) watches anew."""
        if self.handle is not None and self._report is None:
            return
        from ..api import watch
        from ..instrument import patches

        self._report = None
        self.failure = None
        self._owned = patches.auto_watcher() is None
        kwargs = {"every": self.every} if self._owned and self.every is not None else {}
        self.handle = watch(model, **kwargs)

    def finish(self, failure: BaseException | None = None) -> Any:
        """End of training (or its failure): the findings, printed once; the hooks removed."""
        if self.handle is None or self._report is not None:
            return self._report
        h = self.handle
        if failure is not None:
            self.failure = failure
            h.on_exit_exception(failure)
        try:
            self._report = h.report()
        finally:
            if self._owned:
                h.close()
        if self.report_format and self._owned:  # under `mpdoctor run` the wrapper reports
            self._print(self._report)
        return self._report

    def _print(self, report: Any) -> None:
        from .. import print_findings

        try:
            if report.worth_showing(1 if self.failure is not None else 0):
                stream = sys.stderr if self.stderr else sys.stdout
                stream.write("mpdoctor: findings of this training\n")
                print_findings(report, self.report_format, stderr=self.stderr)
        except Exception as exc:  # the doctor must not die of the disease
            sys.stderr.write(f"mpdoctor: could not print the findings ({type(exc).__name__}: {exc})\n")

    # ---- results -----------------------------------------------------------------------
    def report(self) -> Any:
        """The findings as a Report (so far, while training; final after it)."""
        if self._report is not None:
            return self._report
        if self.handle is None:
            from ..findings import Report

            return Report(findings=[])
        return self.handle.report()

    @property
    def findings(self) -> list[Any]:
        return self.report().findings


class SessionResults:
    """What both callbacks offer once training ran: the findings, the report, the watch
    handle (a callback keeps its WatchSession in `self.session`)."""

    session: WatchSession

    def finish(self, failure: BaseException | None = None) -> Any:
        """Report now (idempotent): at the end of training, or after it raised."""
        return self.session.finish(failure)

    def report(self) -> Any:
        return self.session.report()

    @property
    def findings(self) -> list[Any]:
        return self.session.findings

    @property
    def handle(self) -> Any:
        """The watch() handle (an mpdoctor.Watcher): its .nonfinite, .scaler, .plan, ..."""
        return self.session.handle
