"""Start the torch child (torch_child.py) and read its answer, whatever happens to it.

The child runs with the interpreter that trains (`--python`, default mpdoctor's own),
in its own process group, through env/child.py: a torch whose import hangs, crashes
or leaves helper processes holding the output costs at most the timeout.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import child as _child

CHILD = Path(__file__).with_name("torch_child.py")
DEFAULT_TIMEOUT = 60.0


def timeout_from_env(default: float = DEFAULT_TIMEOUT) -> float:
    """MPDOCTOR_TORCH_TIMEOUT in seconds; a value that is not a positive finite number
    is ignored (the default applies)."""
    try:
        value = float(os.environ.get("MPDOCTOR_TORCH_TIMEOUT", default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


@dataclass
class TorchChild:
    """A running child; `result()` waits for it (at most the timeout) and never raises."""

    handle: _child.Child
    timeout: float
    python: str
    _parsed: tuple[dict[str, Any] | None, dict[str, Any]] | None = None

    @property
    def pid(self) -> int | None:
        return self.handle.pid

    def _parse(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        if self._parsed is None:
            self._parsed = _answer(self.handle.finish(), self.timeout, self.python)
        return self._parsed

    def result(self) -> dict[str, Any]:
        """The snapshot's `torch` section."""
        return self._parse()[1]

    def environment(self) -> dict[str, Any] | None:
        """The interpreter's platform and raw packages, when asked for (`--python`)."""
        return self._parse()[0]


def _answer(o: _child.Outcome, timeout: float, python: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    base = {"python": python}
    if o.spawn_error:
        return None, {**base, "status": "collector-error", "error": o.spawn_error}
    env: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    for line in o.stdout.decode("utf-8", "replace").splitlines():
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(obj, dict):
            continue
        if "environment" in obj and env is None:
            env = obj["environment"] if isinstance(obj["environment"], dict) else None
        elif "status" in obj:
            data = obj
    if o.timed_out:
        return env, {**base, "status": "timeout", "seconds": o.seconds,
                     "error": {"type": "Timeout", "message": f"torch did not answer within {timeout:g} s "
                               "(a hung driver or a very slow import); killed"},
                     "stderr_tail": _tail(o.stderr)}
    if data is None:
        rc = o.returncode
        if o.signal:
            message = f"the Python process examining torch was killed by {o.signal}"
        else:
            message = f"the Python process examining torch exited with status {rc} without an answer"
        return env, {**base, "status": "crashed", "seconds": o.seconds, "exit_status": rc,
                     "error": {"type": "Crash", "message": message}, "stderr_tail": _tail(o.stderr)}
    data.update(base)
    data["seconds"] = o.seconds
    tail = _tail(o.stderr)
    if tail:
        data["stderr_tail"] = tail
    return env, data


def _tail(raw: bytes | None, lines: int = 15) -> list[str]:
    if not raw:
        return []
    text = raw.decode("utf-8", "replace").splitlines()
    return [ln[:500] for ln in text[-lines:] if ln.strip()]


def start_torch_child(timeout: float | None = None, python: str | None = None) -> TorchChild:
    """Examine torch in `python` (default: this interpreter). For another interpreter
    the child also reports that interpreter's platform and installed libraries."""
    python = python or sys.executable
    timeout = timeout_from_env() if timeout is None else timeout
    args = ["--environment"] if not same_python(python) else []
    return TorchChild(_child.start(python, str(CHILD), args, timeout), timeout, python)


def same_python(python: str) -> bool:
    """Whether `python` is the interpreter mpdoctor runs in (then its libraries are
    read here, while torch imports in the child)."""
    # Not samefile/realpath: two venvs' pythons are often links to one binary, and
    # which venv it is depends on the path it is started by.
    return os.path.abspath(os.path.expanduser(python)) == os.path.abspath(sys.executable)


def torch_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False
