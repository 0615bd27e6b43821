"""The wrapper of `mpdoctor run -- CMD`: run a training command as if it ran bare.

What the command sees is what it would see bare:
- stdout/stderr: a pseudo-terminal when our stdout is a terminal (progress bars and
  colours behave as in a bare run); a pipe when ours is a pipe or socket (or stderr a
  terminal while stdout is not), pumped byte for byte until it closes (a grandchild
  still holding it is waited for, as `cmd | cat` waits); our own file descriptor itself
  when ours is a file or a device such as /dev/null or /dev/full (no copy, no cost; the
  child meets ENOSPC or EFBIG itself; a regular file's new bytes are read back
  afterwards for the diagnosis, what goes to /dev/null is not read); a closed one closed.
- signals: every catchable signal we get goes to its process group (SLURM's
  `--signal=USR1@N`, `kill -QUIT`); job control works: when the child stops (Ctrl-Z)
  we stop too, and `fg` (SIGCONT) resumes it.
- exec: `execvp` semantics: a script without a shebang runs under /bin/sh; a missing
  command is 127 and one that cannot be executed 126, with the shell's messages.
- exit status: its own (death by signal N is 128+N, as in a shell).
We keep a bounded head and tail of the output, and the instrumentation (instrument/,
injected through a sitecustomize on PYTHONPATH) leaves per-rank event files. When the run
fails, or the instrumentation saw trouble, the explain rules read the captured output and
their findings are merged with the instrumentation's, root cause first, on stderr after
the child's own output. This module never imports torch.
"""

from __future__ import annotations

import errno
import os
import selectors
import shutil
import signal
import stat
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
_READ = 1 << 20  # bytes per read: as much as the pipe holds
_PIPE_SIZE = 1 << 20  # the child's pipes are made this big (the unprivileged maximum)
_COALESCE_S = 0.001  # after a short read from a pipe, let the child's writes gather this long
# Not forwarded: uncatchable, ours (SIGCHLD), or a fault of our own process, not a request.
_NOT_FORWARDED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGSEGV,
                  signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGSYS, signal.SIGTRAP}
# Ignored by us while the child runs: the terminal's "you are in the background" signals
# concern our own reads and writes of it (the child has its own terminal, or the
# terminal itself); ignored, a background read fails (EIO) and a write goes through.
_OURS_IGNORED = (signal.SIGTTIN, signal.SIGTTOU)


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
        self._text: str | None = None

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
        if self._text is None:
            self._text = self._body().decode("utf-8", "replace")
        return self._text

    def _body(self) -> bytes:
        tail = self.tail
        if self.total > len(self.head) + len(tail):
            skipped = self.total - len(self.head) - len(tail)
            nl = tail.find(b"\n")
            return bytes(self.head) + f"\n[... {skipped} bytes not kept ...]\n".encode() + tail[nl + 1:]
        return bytes(self.head) + tail


class CapturedOutput:
    """All the child's output we kept: the pumped streams (in the order they arrived) and
    the regular files it wrote to directly (read back after the run), as one text."""

    def __init__(self, parts: list[OutputTail]) -> None:
        self.parts = [p for p in parts if p.total]
        self.total = sum(p.total for p in self.parts)
        self._text: str | None = None

    def text(self) -> str:
        if self._text is None:
            texts = [p.text() for p in self.parts]
            self._text = "".join(t if t.endswith("\n") or i == len(texts) - 1 else t + "\n"
                                 for i, t in enumerate(texts))
        return self._text


@dataclass
class ChildResult:
    returncode: int
    tail: Any  # OutputTail or CapturedOutput: .text(), .total
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


class CommandNotRunnable(Exception):
    """The command could not be started: `status` is the shell's 126 or 127."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _not_runnable(cmd: list[str], exc: OSError) -> CommandNotRunnable:
    """What a shell says, and its status, for a command it cannot start."""
    name = cmd[0]
    path = name if "/" in name else (shutil.which(name) or "")
    if exc.errno == errno.ENOENT:
        if "/" not in name and not path:
            return CommandNotRunnable(f"{name}: command not found", 127)
        if not os.path.exists(path):
            return CommandNotRunnable(f"{name}: No such file or directory", 127)
        interp = _shebang(path)  # the file is there: its interpreter is not
        return CommandNotRunnable(f"{name}: {interp + ': ' if interp else ''}bad interpreter: "
                                  "No such file or directory", 127)
    if os.path.isdir(path):
        return CommandNotRunnable(f"{name}: Is a directory", 126)
    return CommandNotRunnable(f"{name}: {exc.strerror or exc}", 126)


def _shebang(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return ""
    if not first.startswith(b"#!"):
        return ""
    parts = first[2:].split()
    return parts[0].decode("utf-8", "replace") if parts else ""


def _binary(path: str) -> bool:
    """bash's test: a NUL byte in the first line (of the first 80 bytes)."""
    try:
        with open(path, "rb") as fh:
            sample = fh.read(80)
    except OSError:
        return False
    return b"\0" in sample.split(b"\n", 1)[0]


def _spawn(cmd: list[str], **kw: Any) -> subprocess.Popen:
    """Popen with execvp's semantics: a file the kernel will not execute (no shebang)
    runs under /bin/sh, as execvp and every shell run it; a command that cannot be
    started raises CommandNotRunnable."""
    if not cmd[0]:
        raise CommandNotRunnable(f"{cmd[0]}: command not found", 127)
    try:
        return subprocess.Popen(cmd, **kw)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise _not_runnable(cmd, exc) from None
    path = cmd[0] if "/" in cmd[0] else (shutil.which(cmd[0]) or cmd[0])
    if _binary(path):  # as a shell does: a binary for another machine is not a script
        raise CommandNotRunnable(f"{cmd[0]}: cannot execute binary file: Exec format error", 126)
    try:
        return subprocess.Popen(["/bin/sh", path] + cmd[1:], **kw)
    except OSError as exc:
        raise _not_runnable(cmd, exc) from None


def _spawn_kwargs() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover


# ---- where the output goes -------------------------------------------------------------
def _kind(fd: int) -> str:
    """'tty', 'pipe' (pipe, FIFO or socket: pumped), 'file' (a regular file: handed over,
    read back), 'device' (/dev/null, /dev/full...: handed over) or 'closed'."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return "closed"
    if _isatty(fd):
        return "tty"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "pipe"
    if stat.S_ISREG(mode):
        return "file"
    return "device"


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class _FileCapture:
    """The bytes the child writes into a regular file we handed it, read back after the
    run (the first HEAD_BYTES and the last TAIL_BYTES of them)."""

    def __init__(self, fd: int) -> None:
        st = os.fstat(fd)
        self.key = (st.st_dev, st.st_ino)
        self.fd = fd
        try:
            import fcntl

            append = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)
            self.start = st.st_size if append else os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:
            self.start = st.st_size

    def read(self) -> OutputTail:
        out = OutputTail()
        try:
            rfd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY)  # ours may be write-only
        except OSError:
            return out
        try:
            end = os.fstat(rfd).st_size
            size = max(0, end - self.start)
            head = os.pread(rfd, min(size, HEAD_BYTES), self.start)
            rest = size - len(head)
            tail = os.pread(rfd, min(rest, TAIL_BYTES), end - min(rest, TAIL_BYTES)) if rest > 0 else b""
        except OSError:
            return out
        finally:
            os.close(rfd)
        out.feed(head)
        if tail:
            out.feed(tail)
            out.total = size
        return out


def _file_captures(kinds: dict[int, str]) -> list[_FileCapture]:
    caps: list[_FileCapture] = []
    for fd in (1, 2):
        if kinds.get(fd) != "file":
            continue
        try:
            cap = _FileCapture(fd)
        except OSError:
            continue
        same = next((c for c in caps if c.key == cap.key), None)
        if same is not None:  # 2>&1 into one file: read it once, from the earlier start
            same.start = min(same.start, cap.start)
            continue
        caps.append(cap)
    return caps


# ---- signals ----------------------------------------------------------------------------
class _Forwarder:
    """Every catchable signal we get goes to the child's process group while it runs
    (SIGTTIN/SIGTTOU excepted: they are about our own use of the terminal, and ignored);
    when the child stops (Ctrl-Z, SIGTSTP), we stop too, with our job's group when a shell
    made it, so that the shell sees the job stop; SIGCONT (`fg`) resumes the child."""

    def __init__(self, winch: Any = None, orphaned: bool = False) -> None:
        self.pgid: int | None = None
        # pty mode: the child leads its own session, so its group is orphaned and the
        # kernel drops a SIGTSTP whose action is the default; SIGSTOP is what that default
        # action would have done
        self.orphaned = orphaned
        self.pid: int | None = None
        self.received: list[int] = []
        self._old: dict[int, Any] = {}
        self._winch = winch  # pty mode: copy the window size (the pty signals the child)
        self.on_stop: Any = None  # called before we stop, and
        self.on_continue: Any = None  # after we were continued
        self.continued = False

    def __enter__(self) -> "_Forwarder":
        for sig in sorted(signal.valid_signals()):
            if sig in _NOT_FORWARDED:
                continue
            try:
                self._old[sig] = signal.signal(sig, signal.SIG_IGN if sig in _OURS_IGNORED else self._handle)
            except (ValueError, OSError, RuntimeError):  # not the main thread; a reserved one
                pass
        try:
            self._old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._child_changed)
        except (ValueError, OSError):
            pass
        return self

    def started(self, proc: subprocess.Popen) -> None:
        self.pid = self.pgid = proc.pid
        for sig in self.received:  # what came while it was being started
            self._send(sig)

    def _send(self, signum: int) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _handle(self, signum: int, frame: Any) -> None:
        if self.pgid is None:
            self.received.append(signum)
            return
        if signum == signal.SIGWINCH and self._winch is not None:
            self._winch()
            return
        if signum == signal.SIGTSTP and self.orphaned and _default_action(self.pgid, signum):
            signum = signal.SIGSTOP
        if signum == signal.SIGCONT:
            self.continued = True
            if self.on_continue is not None:
                self.on_continue()  # the terminal is the child's again before it runs on
        self._send(signum)

    def _child_changed(self, signum: int, frame: Any) -> None:
        if self.pid is None:
            return
        try:
            info = os.waitid(os.P_PID, self.pid, os.WSTOPPED | os.WNOHANG)
        except (ChildProcessError, OSError):
            return
        if info is None or info.si_pid == 0:
            return
        self._stop_ourselves()

    def _stop_ourselves(self) -> None:
        """The child stopped: the job stops. Our group gets SIGTSTP (the pipeline we are in
        stops too, as a bare one would), the shell sees the job stopped; `fg` continues us
        (SIGCONT, which _handle passes on to the child)."""
        if self.on_stop is not None:
            self.on_stop()
        self.continued = False
        old = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            if _job_of_a_shell():
                os.killpg(os.getpgrp(), signal.SIGTSTP)  # `mpdoctor run ... | tee log`: tee too
            else:
                os.kill(os.getpid(), signal.SIGTSTP)  # a script's child: not the script itself
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTSTP, old)
        _breathe()  # the Python-level SIGCONT handler runs here
        if not self.continued and self.on_continue is not None:
            # We did not stop (an orphaned group ignores SIGTSTP: no job-control shell
            # above us). Whoever stopped the child will continue it; our terminal is ours.
            self.on_continue()

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError, TypeError):
                pass


def _job_of_a_shell() -> bool:
    """Whether our process group is a job a shell made (our parent is outside it), rather
    than the group of a program that started us as a plain child."""
    try:
        return os.getpgid(os.getppid()) != os.getpgrp()
    except OSError:
        return False


def _breathe() -> None:
    """A Python-level call: pending signal handlers run at its start."""


# ---- the pump ---------------------------------------------------------------------------
def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False when the reader has gone (EPIPE) or the output failed."""
    view: Any = data
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except BlockingIOError:
            import select

            select.select([], [fd], [])
            continue
        except OSError:  # EPIPE, EIO...: nobody reads any more
            return False
        if n == len(view):
            return True
        view = memoryview(view)[n:]
    return True


def _let_go(fd: int) -> None:
    """Close our end of the child's pipe (or pty), so that the child meets the broken pipe
    (or hangup) itself; /dev/null keeps the number ours until its owner closes it."""
    try:
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, fd)
        os.close(nul)
    except OSError:
        pass


def _grow_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (AttributeError, OSError):  # not Linux, or over the user's pipe quota
        pass


class _Keyboard:
    """The relay of our terminal's keystrokes to the child's pty: `to` (the pty's master);
    `typed(data)` sees what was relayed; `rearm` set when it is worth reading our terminal
    again (we are back in the foreground after `bg`/`fg`)."""

    def __init__(self, to: int, typed: Any = None) -> None:
        self.to, self.typed, self.rearm = to, typed, False


def _pump(routes: dict[int, int], tail: OutputTail, keyboard: _Keyboard | None = None,
          coalesce: bool = True) -> None:
    """Copy child fds -> our fds until every one of them is closed: by the child and by
    any process it left holding them (a grandchild's late output passes through, as it
    does in `cmd | cat`). Where our side is gone (`| head`), the child's pipe is closed,
    so that it meets the broken pipe itself, as it would have bare."""
    sel = selectors.DefaultSelector()
    for fd in routes:
        sel.register(fd, selectors.EVENT_READ)
    reading_keys = keyboard is not None
    if reading_keys:
        sel.register(0, selectors.EVENT_READ, "stdin")
    open_fds = set(routes)
    read, feed = os.read, tail.feed
    try:
        while open_fds:
            short = False
            if keyboard is not None and keyboard.rearm:
                keyboard.rearm = False
                if not reading_keys:
                    sel.register(0, selectors.EVENT_READ, "stdin")
                    reading_keys = True
            for key, _ in sel.select():
                fd = key.fd
                if key.data == "stdin":
                    try:
                        data = read(0, _READ)
                    except OSError:  # EIO: in the background (`bg`) until `fg`
                        data = b""
                    if not data or not _write_all(keyboard.to, data):  # type: ignore[union-attr]
                        sel.unregister(0)
                        reading_keys = False
                    elif keyboard.typed is not None:  # type: ignore[union-attr]
                        keyboard.typed(data)  # type: ignore[union-attr]
                    continue
                try:
                    data = read(fd, _READ)
                except OSError as exc:  # EIO: the pty's other side closed
                    if exc.errno not in (errno.EIO, errno.EBADF):
                        raise
                    data = b""
                if not data:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                feed(data)
                if len(data) < _READ:
                    short = True
                if not _write_all(routes[fd], data):
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    _let_go(fd)
            if short and coalesce:
                # A chatty child writes a line at a time: each write would wake us for a
                # few bytes. A millisecond's pause lets them gather into one read (the
                # pipe holds a megabyte; a full read does not pause).
                time.sleep(_COALESCE_S)
    finally:
        sel.close()


# ---- the two modes ----------------------------------------------------------------------
def _reserve_closed(kinds: dict[int, str]) -> list[int]:
    """A closed stdin, stdout or stderr stays closed in the child (`<&-`, `>&-`); meanwhile
    /dev/null holds its number, so that no pipe of ours lands there and leaks into it."""
    held = []
    for fd in (0, 1, 2):
        if (kinds[fd] if fd in kinds else _kind(fd)) == "closed":
            nul = os.open(os.devnull, os.O_RDWR)
            if nul != fd:
                os.dup2(nul, fd)
                os.close(nul)
            held.append(fd)
    return held


def _closer(fds: list[int], then: Any = None) -> Any:
    if not fds and then is None:
        return None

    def preexec() -> None:
        for fd in fds:
            os.close(fd)
        if then is not None:
            then()
    return preexec


def run_pipes(cmd: list[str], env: dict[str, str]) -> ChildResult:
    tail = OutputTail()
    start = time.monotonic()
    stdin_tty = _isatty(0) and _foreground(0)
    kinds = {fd: _kind(fd) for fd in (1, 2)}
    held = _reserve_closed(kinds)
    captures = _file_captures(kinds)
    pumped = {fd: kinds[fd] in ("pipe", "tty") for fd in (1, 2)}
    kw: dict[str, Any] = {"stdout": subprocess.PIPE if pumped[1] else None,
                          "stderr": subprocess.PIPE if pumped[2] else None}
    if pumped[1] and pumped[2] and _same_file(1, 2):
        # `2>&1 | tee log`: one pipe for both, so that their lines interleave as bare
        kw["stderr"] = subprocess.STDOUT
    if held:
        kw["preexec_fn"] = _closer(held, os.setpgrp)
    else:
        kw.update(_spawn_kwargs())
    with _Forwarder() as fwd:
        proc = _spawn(cmd, env=env, bufsize=0, **kw)
        fwd.started(proc)
        handed = _hand_terminal(proc.pid) if stdin_tty else False
        if handed:
            fwd.on_stop = None  # the shell takes the terminal back itself
            # `fg`: the shell gave our group the terminal; the child's group gets it again
            # (after `bg` it stays the shell's)
            fwd.on_continue = lambda: _foreground(0) and _hand_terminal(proc.pid)
        try:
            routes = {}
            for fd, f in ((1, proc.stdout), (2, proc.stderr)):
                if f is not None:
                    _grow_pipe(f.fileno())
                    routes[f.fileno()] = fd
            _pump(routes, tail)
            returncode = _wait(proc)
        finally:
            if handed:
                _take_terminal(proc.pid)
            _close_files([proc.stdout, proc.stderr])
            for fd in held:
                os.close(fd)
    return _result(returncode, CapturedOutput([c.read() for c in captures] + [tail]), start)


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
    stdin_tty = _isatty(0) and _foreground(0)
    err_kind = _kind(2)
    held = _reserve_closed({1: "tty", 2: err_kind})
    captures = _file_captures({2: err_kind})
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
        for fd in held:
            os.close(fd)

    def raw() -> None:
        nonlocal saved
        if stdin_tty:
            try:
                saved = termios.tcgetattr(0)
                tty.setraw(0)  # keystrokes (Ctrl-C, Ctrl-Z) go to the child's terminal as typed
            except termios.error:
                saved = None

    def cooked() -> None:
        nonlocal saved
        if saved is not None:
            try:
                termios.tcsetattr(0, termios.TCSADRAIN, saved)
            except termios.error:
                pass
            saved = None

    keyboard = _Keyboard(master) if stdin_tty else None

    def resumed() -> None:
        # `fg` gives us the terminal back; after `bg` it stays the shell's, left as it is
        if saved is None and _foreground(0):
            raw()
            if keyboard is not None:
                keyboard.rearm = True
        _copy_winsize(master)

    with _Forwarder(winch=lambda: _copy_winsize(master), orphaned=True) as fwd:
        try:
            stderr: Any = slave if err_kind == "tty" else (subprocess.PIPE if err_kind == "pipe" else None)
            proc = _spawn(cmd, env=env, stdin=slave if stdin_tty else None, stdout=slave, stderr=stderr,
                          bufsize=0, start_new_session=True, preexec_fn=become_session_leader_of_pty)
        finally:
            os.close(slave)
        fwd.started(proc)
        fwd.on_stop, fwd.on_continue = cooked, resumed
        try:
            raw()
            routes = {master: 1}
            if proc.stderr is not None:
                _grow_pipe(proc.stderr.fileno())
                routes[proc.stderr.fileno()] = 2
            if keyboard is not None:
                keyboard.typed = lambda data: _suspend_key(master, proc.pid, data)
            _pump(routes, tail, keyboard, coalesce=False)
            returncode = _wait(proc)
        finally:
            fwd.on_stop = fwd.on_continue = None
            cooked()
            os.close(master)
            _close_files([proc.stderr])
            for fd in held:
                os.close(fd)
    return _result(returncode, CapturedOutput([c.read() for c in captures] + [tail]), start)


def _suspend_key(master: int, pid: int, data: bytes) -> None:
    """Ctrl-Z typed to the child's pty. Its terminal sent SIGTSTP to its foreground group,
    but that group, the pty's session leader's, is orphaned (we, its parent, are in
    another session), and the kernel drops a stop signal to an orphaned group whose
    action is the default. Under a shell the job would stop: stop it as the default
    action would, with SIGSTOP (SIGCHLD then stops us, and the shell sees the job stop).
    A child that handles or ignores SIGTSTP got it and does as it pleases."""
    import termios

    try:
        attrs = termios.tcgetattr(master)  # the pty's settings, as the child left them
    except termios.error:
        return
    susp = attrs[6][termios.VSUSP]
    if not attrs[3] & termios.ISIG or susp in (b"\0", 0) or susp not in data:
        return
    try:
        fg = os.tcgetpgrp(master)
    except OSError:
        fg = pid
    if _default_action(fg, signal.SIGTSTP):
        try:
            os.killpg(fg, signal.SIGSTOP)
        except OSError:
            pass


def _default_action(pid: int, sig: int) -> bool:
    """Whether `sig` has its default action in process `pid` (neither caught nor ignored)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            masks = dict(line.split(":", 1) for line in fh if line.startswith(("SigCgt", "SigIgn")))
        bit = 1 << (sig - 1)
        return not any(int(masks[k], 16) & bit for k in ("SigCgt", "SigIgn"))
    except (OSError, KeyError, ValueError):
        return True


def _close_files(files: list[Any]) -> None:
    for f in files:
        try:
            if f is not None:
                f.close()
        except OSError:
            pass


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # our handler forwards; keep waiting for the child
            continue


def _result(returncode: int, tail: Any, start: float) -> ChildResult:
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
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # after `fg` we may not be in front yet
    try:
        os.tcsetpgrp(0, pgid)
        return True
    except OSError:
        return False
    finally:
        signal.signal(signal.SIGTTOU, old)


def _take_terminal(child_pgid: int) -> None:
    """The terminal back from the child's group (not from the shell, after `bg`)."""
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we are in the background now
    try:
        if os.tcgetpgrp(0) == child_pgid:
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


def run_command(cmd: list[str], *, instrument: bool = True) -> tuple[ChildResult, list[Any]]:
    """Run `cmd` as a bare run would behave (a pty when our stdout is a terminal), with
    mpdoctor's instrumentation injected unless `instrument` is False; return how it
    ended and what each instrumented process recorded (instrument.events.RankRecord).
    Raises CommandNotRunnable (126/127) when it cannot be started."""
    workdir = Path(tempfile.mkdtemp(prefix="mpdoctor-run-")) if instrument else None
    try:
        env = child_env(workdir)
        result = run_pty(cmd, env) if _isatty(1) else run_pipes(cmd, env)
        records: list[Any] = []
        if workdir is not None:
            from ..instrument.events import read_events

            records = read_events(workdir / "events")
        return result, records
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
