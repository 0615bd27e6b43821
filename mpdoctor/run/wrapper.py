"""The wrapper of `mpdoctor run -- CMD`: run a training command untouched.

The child's output passes through byte for byte as it arrives (a pseudo-terminal when
our stdout is a terminal, so progress bars and colours behave as in a bare run; plain
pipes otherwise, stdout to stdout and stderr to stderr); stdin reaches it; SIGINT,
SIGTERM and SIGHUP go to its process group; our exit status is its own. We keep a
bounded head and tail of the output, and the instrumentation (instrument/, injected
through a sitecustomize on PYTHONPATH) leaves per-rank event files. When the run fails,
or the instrumentation saw trouble, the explain rules read the captured output and their
findings are merged with the instrumentation's, root cause first, on stderr after the
child's own output. This module never imports torch.
"""

from __future__ import annotations

import errno
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..knowledge.signals import signal_name

HEAD_BYTES = 256 * 1024
TAIL_BYTES = 4 * 1024 * 1024
_CHUNK = 1 << 16
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class OutputTail:
    """The first `head` and the last `tail` bytes of everything the child wrote.

    The chunks os.read returned are kept as they are (no copying on the hot path); the
    oldest are dropped once the tail holds more than it needs."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        from collections import deque

        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.chunks: Any = deque()
        self.kept = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if len(self.head) < self.head_limit:
            take = self.head_limit - len(self.head)
            self.head += data[:take]
            data = data[take:]
            if not data:
                return
        self.chunks.append(data)
        self.kept += len(data)
        while self.kept - len(self.chunks[0]) >= self.tail_limit:
            self.kept -= len(self.chunks.popleft())

    @property
    def tail(self) -> bytes:
        return b"".join(self.chunks)[-self.tail_limit:]

    def text(self) -> str:
        tail = self.tail
        if self.total > len(self.head) + len(tail):
            skipped = self.total - len(self.head) - len(tail)
            nl = tail.find(b"\n")
            body = bytes(self.head) + f"\n[... {skipped} bytes not kept ...]\n".encode() + tail[nl + 1:]
        else:
            body = bytes(self.head) + tail
        return body.decode("utf-8", "replace")


@dataclass
class ChildResult:
    returncode: int
    tail: OutputTail
    signal_name: str | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 128 - self.returncode if self.returncode < 0 else self.returncode


# ---- starting the child ----------------------------------------------------------------
def _boot_dir(workdir: Path) -> Path:
    """A copy of instrument/boot with its bytecode compiled, so the child's interpreter
    loads it without compiling (PYTHONDONTWRITEBYTECODE is common in containers)."""
    src = Path(__file__).parent.parent / "instrument" / "boot" / "sitecustomize.py"
    boot = workdir / "boot"
    boot.mkdir()
    dst = boot / "sitecustomize.py"
    shutil.copyfile(src, dst)
    try:
        import importlib.util
        import py_compile

        py_compile.compile(str(dst), cfile=importlib.util.cache_from_source(str(dst)), doraise=True)
    except Exception:  # the source works too, a little slower
        pass
    return boot


def child_env(workdir: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if workdir is None:
        return env
    from ..instrument.events import ENV_DIR

    events = workdir / "events"
    events.mkdir()
    boot = _boot_dir(workdir)
    env["PYTHONPATH"] = str(boot) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[ENV_DIR] = str(events)
    env["MPDOCTOR_PKG_ROOT"] = str(Path(__file__).resolve().parent.parent.parent)
    return env


class _Forwarder:
    """Our SIGINT/SIGTERM/SIGHUP go to the child's process group while it runs."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.received: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Forwarder":
        for sig in _FORWARDED:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False when the reader has gone (EPIPE)."""
    view: Any = data
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except BrokenPipeError:
            return False
        except BlockingIOError:
            import select

            select.select([], [fd], [])
            continue
        if n == len(view):
            return True
        view = memoryview(view)[n:]
    return True


def _pump(sel: selectors.BaseSelector, routes: dict[int, int], tail: OutputTail, proc: subprocess.Popen,
          stdin_to: int | None = None) -> None:
    """Copy child fds -> our fds until they close, or the child is gone and they are quiet."""
    open_fds = set(routes)
    child_gone_at: float | None = None
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable when the child exits (Linux 5.3+)
        sel.register(pidfd, selectors.EVENT_READ, "pid")
    except (AttributeError, OSError):
        pidfd = None
    if stdin_to is not None:
        sel.register(0, selectors.EVENT_READ, "stdin")
    try:
        while open_fds:
            if child_gone_at is not None:
                # What is still buffered arrives at once; a grandchild holding the pipe
                # open must not keep us (a bare run would have returned to the shell).
                timeout = max(0.0, child_gone_at + 0.2 - time.monotonic())
            else:
                timeout = None if pidfd is not None else 0.1
            events = sel.select(timeout)
            if not events:
                if child_gone_at is not None:
                    break
                if proc.poll() is not None:
                    child_gone_at = time.monotonic()
                continue
            for key, _ in events:
                if key.data == "pid":
                    sel.unregister(key.fd)
                    child_gone_at = time.monotonic()
                    continue
                if key.data == "stdin":
                    try:
                        data = os.read(0, _CHUNK)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(0)
                    else:
                        _write_all(stdin_to, data)  # type: ignore[arg-type]
                    continue
                fd = key.fd
                try:
                    data = os.read(fd, _CHUNK)
                except OSError as exc:  # EIO: the pty's other side closed
                    if exc.errno not in (errno.EIO, errno.EBADF):
                        raise
                    data = b""
                if not data:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                tail.feed(data)
                if not _write_all(routes[fd], data):
                    # Our reader went away (`| head`): close the child's pipe, so that it
                    # meets the broken pipe itself, as it would have bare.
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    os.close(fd)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _spawn_kwargs() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover


def run_pipes(cmd: list[str], env: dict[str, str]) -> ChildResult:
    tail = OutputTail()
    start = time.monotonic()
    stdin_tty = _isatty(0) and _foreground(0)
    with _Forwarder() as fwd:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                **_spawn_kwargs())
        fwd.pgid = proc.pid
        handed = _hand_terminal(proc.pid) if stdin_tty else False
        try:
            sel = selectors.DefaultSelector()
            out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
            sel.register(out_fd, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            _pump(sel, {out_fd: 1, err_fd: 2}, tail, proc)
            returncode = _wait(proc)
        finally:
            if handed:
                _take_terminal()
            for f in (proc.stdout, proc.stderr):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
    return _result(returncode, tail, start)


def run_pty(cmd: list[str], env: dict[str, str]) -> ChildResult:
    import fcntl
    import pty
    import termios
    import tty

    tail = OutputTail()
    start = time.monotonic()
    master, slave = pty.openpty()
    # Relay the keyboard only from the foreground: a backgrounded `mpdoctor run ... &` that
    # read the terminal would be stopped (SIGTTIN), and the training with it.
    stdin_tty, stderr_tty = _isatty(0) and _foreground(0), _isatty(2)
    saved = None
    try:
        if _isatty(0):
            termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(0))
        if not stdin_tty:
            # Our terminal stays cooked (we do not own it), so it turns \n into \r\n itself:
            # the child's side must not do it a second time.
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.OPOST
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    _copy_winsize(master)

    def become_session_leader_of_pty() -> None:
        fcntl.ioctl(1, termios.TIOCSCTTY, 0)  # stdout is the pty's slave side here

    with _Forwarder() as fwd:
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(master))
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=slave if stdin_tty else None, stdout=slave,
                                    stderr=slave if stderr_tty else subprocess.PIPE, bufsize=0,
                                    start_new_session=True, preexec_fn=become_session_leader_of_pty)
        finally:
            os.close(slave)
        fwd.pgid = proc.pid
        try:
            if stdin_tty:
                saved = termios.tcgetattr(0)
                tty.setraw(0)  # keystrokes (Ctrl-C included) go to the child's terminal as typed
            sel = selectors.DefaultSelector()
            sel.register(master, selectors.EVENT_READ)
            routes = {master: 1}
            if not stderr_tty:
                err_fd = proc.stderr.fileno()  # type: ignore[union-attr]
                sel.register(err_fd, selectors.EVENT_READ)
                routes[err_fd] = 2
            _pump(sel, routes, tail, proc, stdin_to=master if stdin_tty else None)
            returncode = _wait(proc)
        finally:
            if saved is not None:
                termios.tcsetattr(0, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
            try:
                os.close(master)
            except OSError:
                pass
    return _result(returncode, tail, start)


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # our handler forwards; keep waiting for the child
            continue


def _result(returncode: int, tail: OutputTail, start: float) -> ChildResult:
    name = signal_name(-returncode) if returncode < 0 else None
    return ChildResult(returncode=returncode, tail=tail, signal_name=name, wall_s=time.monotonic() - start)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _foreground(fd: int) -> bool:
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


def _hand_terminal(pgid: int) -> bool:
    """In pipe mode with a terminal on stdin, the child's group gets the terminal, so that
    it can read it (pdb, input()) and Ctrl-C reaches it once, as in a bare run."""
    try:
        os.tcsetpgrp(0, pgid)
        return True
    except OSError:
        return False


def _take_terminal() -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we are in the background now
    try:
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _copy_winsize(master: int) -> None:
    import fcntl
    import termios

    for fd in (1, 0, 2):
        try:
            size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(master, termios.TIOCSWINSZ, size)
            return
        except OSError:
            continue


class CommandNotRunnable(Exception):
    """The command could not be started: `status` is the shell's 126 or 127."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def run_command(cmd: list[str], *, instrument: bool = True) -> tuple[ChildResult, list[Any]]:
    """Run `cmd` as a bare run would behave (a pty when our stdout is a terminal), with
    mpdoctor's instrumentation injected unless `instrument` is False; return how it
    ended and what each instrumented process recorded (instrument.events.RankRecord)."""
    workdir = Path(tempfile.mkdtemp(prefix="mpdoctor-run-")) if instrument else None
    try:
        env = child_env(workdir)
        try:
            result = run_pty(cmd, env) if _isatty(1) else run_pipes(cmd, env)
        except FileNotFoundError:
            raise CommandNotRunnable(f"{cmd[0]}: command not found", 127) from None
        except PermissionError:
            raise CommandNotRunnable(f"{cmd[0]}: permission denied", 126) from None
        records: list[Any] = []
        if workdir is not None:
            from ..instrument.events import read_events

            records = read_events(workdir / "events")
        return result, records
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
