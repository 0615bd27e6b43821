"""Collect this machine's snapshot: every collector isolated, torch in a child.

The torch child is started first and the cheap collectors (NVML in a thread with its
own timeout, psutil, /proc/cpuinfo, dist-info names, the accelerate config) run
while it imports torch, so a live `check` costs about one `import torch`.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from .. import __version__
from . import SCHEMA_VERSION

NVML_TIMEOUT = 20.0


def _isolated(name: str, fn: Callable[[], dict[str, Any]], timings: dict[str, float]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # a collector bug or an odd machine: record it, go on
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    finally:
        timings[name] = round(time.perf_counter() - t0, 4)


class Collection:
    """A collection in progress: `start()` launches the torch child and NVML and reads
    the cheap sections; `finish()` waits for the rest. Between the two the caller can
    do its own start-up work (loading rules) while torch imports in the child."""

    def __init__(self, *, config_file: str | None = None, anonymize: bool = False,
                 torch_timeout: float | None = None) -> None:
        self.config_file, self.anonymize, self.torch_timeout = config_file, anonymize, torch_timeout
        self.timings: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> "Collection":
        from .accel_config import collect_accelerate_config, collect_env_vars
        from .host import collect_cpu, collect_memory, collect_platform
        from .nvml import collect_nvml
        from .packages import collect_packages
        from .torch_collector import start_torch_child, torch_installed

        self._t0 = time.perf_counter()
        timings = self.timings
        self.child = start_torch_child(self.torch_timeout) if torch_installed() else None
        self._nvml_box: dict[str, Any] = {}
        own = {self.child.pid} if self.child is not None and self.child.pid else set()

        def run_nvml() -> None:
            self._nvml_box["result"] = _isolated("nvml", lambda: collect_nvml(own), timings)

        self._nvml_thread = threading.Thread(target=run_nvml, name="mpdoctor-nvml", daemon=True)
        self._nvml_thread.start()
        snap: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "mpdoctor_version": __version__,
            "collected_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "anonymized": False,
        }
        snap["platform"] = _isolated("platform", collect_platform, timings)
        snap["cpu"] = _isolated("cpu", collect_cpu, timings)
        snap["memory"] = _isolated("memory", collect_memory, timings)
        snap["packages"] = _isolated("packages", collect_packages, timings)
        snap["accelerate_config"] = _isolated("accelerate_config",
                                              lambda: collect_accelerate_config(self.config_file), timings)
        snap["env"] = _isolated("env", collect_env_vars, timings)
        self.snap = snap
        return self

    def finish(self) -> dict[str, Any]:
        from .redact import anonymize_snapshot, redact_snapshot

        snap, timings = self.snap, self.timings
        self._nvml_thread.join(NVML_TIMEOUT)
        if self._nvml_thread.is_alive():  # a hung driver: leave the daemon thread behind
            snap["nvml"] = {"status": "timeout", "error": {"type": "Timeout",
                            "message": f"NVML did not answer within {NVML_TIMEOUT:g} s"}}
        else:
            snap["nvml"] = self._nvml_box.get("result", {"status": "error"})
        t_torch = time.perf_counter()
        snap["torch"] = {"status": "not-installed"} if self.child is None else self.child.result()
        timings["torch_wait"] = round(time.perf_counter() - t_torch, 4)
        timings["total"] = round(time.perf_counter() - self._t0, 4)
        snap["timings"] = timings
        snap = redact_snapshot(snap)
        if self.anonymize:
            snap = anonymize_snapshot(snap)
        return snap


def collect_snapshot(*, config_file: str | None = None, anonymize: bool = False,
                     torch_timeout: float | None = None) -> dict[str, Any]:
    return Collection(config_file=config_file, anonymize=anonymize, torch_timeout=torch_timeout).start().finish()
