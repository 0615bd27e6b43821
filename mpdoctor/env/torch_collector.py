"""Start the torch child (torch_child.py) and read its answer, whatever happens to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..knowledge.signals import signal_name

CHILD = Path(__file__).with_name("torch_child.py")
DEFAULT_TIMEOUT = 60.0
# '' (the current directory) is dropped from the child's path: run inside a PyTorch
# source checkout, `import torch` would otherwise find the source tree, not the install.
_BOOT = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
         "p = sys.argv[1]; sys.argv = [p]; "
         "exec(compile(open(p, encoding='utf-8').read(), p, 'exec'), {'__name__': '__main__', '__file__': p})")


def timeout_from_env(default: float = DEFAULT_TIMEOUT) -> float:
    try:
        return float(os.environ.get("MPDOCTOR_TORCH_TIMEOUT", default))
    except ValueError:
        return default


@dataclass
class TorchChild:
    """A running child; `result()` waits for it (at most the timeout) and never raises."""

    proc: subprocess.Popen | None
    started: float
    timeout: float
    python: str
    spawn_error: dict[str, str] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def result(self) -> dict[str, Any]:
        base = {"python": self.python}
        if self.proc is None:
            return {**base, "status": "collector-error", "error": self.spawn_error}
        remaining = max(0.1, self.timeout - (time.perf_counter() - self.started))
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            return {**base, "status": "timeout", "seconds": round(time.perf_counter() - self.started, 2),
                    "error": {"type": "Timeout", "message": f"torch did not answer within {self.timeout:g} s "
                              "(a hung driver or a very slow import); killed"},
                    "stderr_tail": _tail(err)}
        seconds = round(time.perf_counter() - self.started, 3)
        rc = self.proc.returncode
        try:
            data = json.loads(out.decode("utf-8", "replace")) if out.strip() else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            if rc is not None and rc < 0:
                error = {"type": "Crash",
                         "message": f"the Python process examining torch was killed by {signal_name(-rc)}"}
            else:
                error = {"type": "Crash", "message": f"the Python process examining torch exited with status {rc} "
                         "without an answer"}
            return {**base, "status": "crashed", "seconds": seconds, "exit_status": rc, "error": error,
                    "stderr_tail": _tail(err)}
        data.update(base)
        data["seconds"] = seconds
        tail = _tail(err)
        if tail:
            data["stderr_tail"] = tail
        return data


def _tail(raw: bytes | None, lines: int = 15) -> list[str]:
    if not raw:
        return []
    text = raw.decode("utf-8", "replace").splitlines()
    return [ln[:500] for ln in text[-lines:] if ln.strip()]


def start_torch_child(timeout: float | None = None, python: str | None = None) -> TorchChild:
    python = python or sys.executable
    timeout = timeout_from_env() if timeout is None else timeout
    started = time.perf_counter()
    try:
        proc = subprocess.Popen([python, "-c", _BOOT, str(CHILD)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return TorchChild(None, started, timeout, python, {"type": type(exc).__name__, "message": str(exc)})
    return TorchChild(proc, started, timeout, python)


def torch_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False
