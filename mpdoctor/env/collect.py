"""Collect this machine's snapshot: every collector isolated, torch in a child.

The torch child is started first, then the NVML child (both in their own process
groups with a timeout: env/child.py), and the cheap collectors (psutil,
/proc/cpuinfo, installed distributions, the accelerate config) run while they work,
so a live `check` costs about one `import torch`.

`python`: the interpreter that trains (`--python`), when it is not mpdoctor's own:
torch is examined with it, and its platform and libraries come from the torch child.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

from .. import __version__
from . import SCHEMA_VERSION


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
                 torch_timeout: float | None = None, python: str | None = None) -> None:
        self.config_file, self.anonymize, self.torch_timeout = config_file, anonymize, torch_timeout
        self.python = python
        self.timings: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> "Collection":
        from .accel_config import collect_accelerate_config, collect_env_vars
        from .host import collect_cpu, collect_cuda_toolkit, collect_memory, collect_platform, collect_threads
        from .nvml import start_nvml_child
        from .packages import collect_packages
        from .torch_collector import same_python, start_torch_child, torch_installed

        self._t0 = time.perf_counter()
        timings = self.timings
        self.other_python = bool(self.python) and not same_python(self.python)
        # mpdoctor's own interpreter without torch: nothing to start (a core install)
        self.child = (start_torch_child(self.torch_timeout, self.python)
                      if self.other_python or torch_installed() else None)
        own = {self.child.pid} if self.child is not None and self.child.pid else set()
        self.nvml = _isolated("nvml_start", lambda: {"child": start_nvml_child(own)}, timings).get("child")
        snap: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "mpdoctor_version": __version__,
            "collected_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "anonymized": False,
        }
        if not self.other_python:  # else: the torch child reads them in that interpreter
            snap["platform"] = _isolated("platform", collect_platform, timings)
            snap["packages"] = _isolated("packages", collect_packages, timings)
        snap["cpu"] = _isolated("cpu", collect_cpu, timings)
        snap["memory"] = _isolated("memory", collect_memory, timings)
        snap["accelerate_config"] = _isolated("accelerate_config",
                                              lambda: collect_accelerate_config(self.config_file), timings)
        snap["env"] = _isolated("env", collect_env_vars, timings)
        snap["threads"] = _isolated("threads", collect_threads, timings)
        snap["cuda_toolkit"] = _isolated("cuda_toolkit", collect_cuda_toolkit, timings)
        self.snap = snap
        return self

    def finish(self) -> dict[str, Any]:
        from .packages import collect_packages
        from .redact import anonymize_snapshot, redact_snapshot

        snap, timings = self.snap, self.timings
        t_nvml = time.perf_counter()
        if self.nvml is None:
            snap["nvml"] = {"status": "error", "error": {"type": "Error", "message": "NVML could not be examined"}}
        else:
            snap["nvml"] = _isolated("nvml", self.nvml.result, timings)
        timings["nvml_wait"] = round(time.perf_counter() - t_nvml, 4)
        t_torch = time.perf_counter()
        if self.child is None:
            snap["torch"] = {"status": "not-installed", "python": sys.executable,
                             "error": {"type": "ModuleNotFoundError", "message": "No module named 'torch'"}}
        else:
            snap["torch"] = self.child.result()
        timings["torch_wait"] = round(time.perf_counter() - t_torch, 4)
        if self.other_python:
            env = (self.child.environment() if self.child is not None else None) or {}
            unread = {"error": {"type": "Unavailable", "message": f"{self.python} did not say "
                                f"({(snap['torch'].get('error') or {}).get('message', 'no answer')})"}}
            platform = env.get("platform")
            snap["platform"] = platform if isinstance(platform, dict) else unread
            raw = env.get("packages")
            if isinstance(raw, dict) and "error" not in raw:
                snap["packages"] = _isolated("packages", lambda: collect_packages(raw), timings)
            else:
                snap["packages"] = raw if isinstance(raw, dict) else unread
        timings["total"] = round(time.perf_counter() - self._t0, 4)
        snap["timings"] = timings
        snap = redact_snapshot(snap)
        if self.anonymize:
            snap = anonymize_snapshot(snap)
        return snap


def collect_snapshot(*, config_file: str | None = None, anonymize: bool = False,
                     torch_timeout: float | None = None, python: str | None = None) -> dict[str, Any]:
    return Collection(config_file=config_file, anonymize=anonymize, torch_timeout=torch_timeout,
                      python=python).start().finish()
