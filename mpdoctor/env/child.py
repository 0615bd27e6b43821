"""Run a collector script in a child process that cannot take mpdoctor down or hold it up.

Whatever the script imports (torch, libnvidia-ml) may raise, segfault, hang in a
driver, or start helper processes of its own. So the child:

- runs in its own session (its own process group), so that a timeout kills every
  process it started, not only the direct child;
- writes stdout and stderr to anonymous temporary files, not pipes: a grandchild that
  inherited them cannot make mpdoctor wait for an end-of-file that never comes, and a
  chatty library cannot fill a pipe and block;
- is waited for with a deadline; on the deadline, or once it has exited, what is left
  of its process group is killed (the helpers it started are mpdoctor's to clean up).

The script is run by path with `python -c BOOT script args`, so it must be standalone
(standard library only): the interpreter may be another environment's (`--python`),
where mpdoctor is not installed.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ..knowledge.signals import signal_name

# '' (the current directory) is dropped from the child's path: run inside a PyTorch
# source checkout, `import torch` would otherwise find the source tree, not the install.
BOOT = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "p = sys.argv[1]; sys.argv = sys.argv[1:]; "
        "exec(compile(open(p, encoding='utf-8').read(), p, 'exec'), {'__name__': '__main__', '__file__': p})")
MAX_STDOUT = 16 * 1024 * 1024   # an answer larger than this is not an answer
STDERR_TAIL = 64 * 1024

_LIVE: set["Child"] = set()


@dataclass
class Outcome:
    """How a child ended: `returncode` (negative: killed by that signal), its stdout
    (capped), the tail of its stderr, whether it ran past its deadline, and how long."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    seconds: float
    spawn_error: dict[str, str] | None = None

    @property
    def signal(self) -> str | None:
        rc = self.returncode
        return signal_name(-rc) if rc is not None and rc < 0 and not self.timed_out else None

    def death(self, what: str) -> str:
        """One sentence: how the child died, for an error message."""
        if self.timed_out:
            return f"{what} did not answer within {self.seconds:g} s; killed"
        if self.signal:
            return f"{what} crashed: signal {self.signal}"
        return f"{what} exited with status {self.returncode} without an answer"


@dataclass(eq=False)
class Child:
    proc: subprocess.Popen | None
    started: float
    timeout: float
    files: tuple[Any, Any] | None = None
    spawn_error: dict[str, str] | None = None
    _outcome: Outcome | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def finish(self) -> Outcome:
        """Wait (at most what is left of the timeout), kill what remains of the group,
        read the files. Never raises; a second call returns the same outcome."""
        if self._outcome is not None:
            return self._outcome
        if self.proc is None:
            self._outcome = Outcome(None, b"", b"", False, 0.0, self.spawn_error)
            return self._outcome
        try:
            remaining = max(0.0, self.timeout - (time.monotonic() - self.started))
            exited = _wait_exit(self.proc, remaining)
        finally:
            # Kill the group while the direct child is at most a zombie: its pid, which
            # is the group id, cannot have been reused yet. Also on KeyboardInterrupt.
            _kill_group(self.proc)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot end
                pass
            _LIVE.discard(self)
        seconds = round(time.monotonic() - self.started, 3)
        out, err = self.files or (None, None)
        self._outcome = Outcome(self.proc.returncode, _read(out, MAX_STDOUT, head=True),
                                _read(err, STDERR_TAIL, head=False), not exited, seconds)
        for fh in (out, err):
            try:
                fh.close()
            except Exception:
                pass
        return self._outcome


def _read(fh: Any, limit: int, head: bool) -> bytes:
    if fh is None:
        return b""
    try:
        size = fh.seek(0, os.SEEK_END)
        if head:
            fh.seek(0)
        else:
            fh.seek(max(0, size - limit))
        return fh.read(limit)
    except (OSError, ValueError):
        return b""


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """True once the child has exited (without reaping it), False at the deadline."""
    deadline = time.monotonic() + timeout
    pidfd, poller = None, None
    if hasattr(os, "pidfd_open") and hasattr(select, "poll"):  # Linux: woken the moment it exits
        try:
            pidfd = os.pidfd_open(proc.pid)
            poller = select.poll()  # not select(): a descriptor above 1023 is fine here
            poller.register(pidfd, select.POLLIN)
        except OSError:
            pidfd, poller = None, None
    try:
        while True:
            if _exited(proc):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if poller is not None:
                poller.poll(max(1, int(left * 1000)))
            else:
                time.sleep(min(0.02, left))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _exited(proc: subprocess.Popen) -> bool:
    if proc.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # no WNOWAIT here (Windows): reap it, the group id may go with it
        return proc.poll() is not None
    try:
        return waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return proc.poll() is not None


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.returncode is not None:  # reaped: its group id may belong to someone else now
        return
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            proc.kill()
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass


def start(python: str, script: str, args: list[str], timeout: float,
          env: dict[str, str] | None = None) -> Child:
    """Start `python script args` (script by path, see BOOT). Never raises: a python
    that cannot be started comes back as `spawn_error`."""
    started = time.monotonic()
    try:
        out = tempfile.TemporaryFile()
        err = tempfile.TemporaryFile()
    except OSError as exc:
        return Child(None, started, timeout, spawn_error={"type": type(exc).__name__, "message": str(exc)})
    try:
        kwargs: dict[str, Any] = {}
        if os.name == "posix":
            kwargs["start_new_session"] = True
        proc = subprocess.Popen([python, "-c", BOOT, script, *args], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, env=env, **kwargs)
    except (OSError, ValueError) as exc:
        out.close()
        err.close()
        message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Child(None, started, timeout, spawn_error={"type": type(exc).__name__,
                                                          "message": f"cannot run {python}: {message}"})
    child = Child(proc, started, timeout, (out, err))
    _LIVE.add(child)
    _reap_on_signals()
    return child


def _reap_on_signals() -> None:
    """SIGTERM/SIGHUP to mpdoctor would end it without atexit, and the children run in
    sessions of their own: kill their groups first, then die of the signal as before.
    Only where nobody set a handler (the run wrapper forwards signals its own way)."""
    if os.name != "posix":
        return
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        _reap_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, handler)
        except (ValueError, OSError):
            pass


@atexit.register
def _reap_all() -> None:
    """mpdoctor leaves no collector child behind, whatever made it exit early."""
    for child in list(_LIVE):
        if child.proc is not None:
            _kill_group(child.proc)


def python_problem(path: str) -> str | None:
    """Why `--python PATH` cannot be used, or None."""
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        return f"--python {path}: no such file"
    if os.path.isdir(full):
        return f"--python {path}: is a folder; give the interpreter (e.g. {os.path.join(path, 'bin', 'python')})"
    if not os.access(full, os.X_OK):
        return f"--python {path}: not executable"
    return None


def resolve_python(path: str | None) -> str:
    return os.path.expanduser(path) if path else sys.executable


def missing_modules(python: str | None, names: tuple[str, ...] = ("torch", "accelerate"),
                    timeout: float = 30.0) -> list[str] | None:
    """Which of `names` the interpreter cannot import (found by `find_spec`, nothing
    imported); None when the interpreter did not answer."""
    if python is None or os.path.abspath(os.path.expanduser(python)) == os.path.abspath(sys.executable):
        import importlib.util

        out = []
        for name in names:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                out.append(name)
        return out
    code = ("import importlib.util as u, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
            "print(' '.join(n for n in sys.argv[1:] if u.find_spec(n) is None))")
    try:
        r = subprocess.run([os.path.expanduser(python), "-c", code, *names], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return r.stdout.split()


def torch_missing_message(python: str | None, missing: list[str], face: str = "the probe") -> str:
    """What to say when torch (or accelerate) is not where mpdoctor would use it."""
    where = os.path.expanduser(python) if python else sys.executable
    whose = "the environment of --python" if python else "mpdoctor's own environment"
    names = " and ".join(missing)
    return (f"{face} trains with torch and accelerate, and {names} {'is' if len(missing) == 1 else 'are'} "
            f"not installed in {whose} ({where}).\n"
            f"  Install {'it' if len(missing) == 1 else 'them'} there: {where} -m pip install {' '.join(missing)}\n"
            f"    (pick the CUDA or CPU build of torch at https://pytorch.org/get-started/locally/)\n"
            f"  or use the interpreter that trains: mpdoctor probe --python /path/to/venv/bin/python")
