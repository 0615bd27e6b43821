"""Starting the command as a shell would: `execvp` semantics (a script without a
shebang runs under /bin/sh; a missing command is 127 and one that cannot be executed
126, with the shell's messages), and what the child does between fork and exec: its own
process group (or session), the closing of the streams the user closed, and its death
with the wrapper (PR_SET_PDEATHSIG on Linux)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
from typing import Any, Callable

__all__ = ["CommandNotRunnable", "child_setup", "not_runnable", "spawn"]


class CommandNotRunnable(Exception):
    """The command could not be started: `status` is the shell's 126 or 127."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def not_runnable(cmd: list[str], exc: OSError) -> CommandNotRunnable:
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


def spawn(cmd: list[str], **kw: Any) -> subprocess.Popen:
    """Popen with execvp's semantics: a file the kernel will not execute (no shebang)
    runs under /bin/sh, as execvp and every shell run it; a command that cannot be
    started raises CommandNotRunnable."""
    if not cmd[0]:
        raise CommandNotRunnable(f"{cmd[0]}: command not found", 127)
    try:
        return subprocess.Popen(cmd, **kw)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise not_runnable(cmd, exc) from None
    path = cmd[0] if "/" in cmd[0] else (shutil.which(cmd[0]) or cmd[0])
    if _binary(path):  # as a shell does: a binary for another machine is not a script
        raise CommandNotRunnable(f"{cmd[0]}: cannot execute binary file: Exec format error", 126)
    try:
        return subprocess.Popen(["/bin/sh", path] + cmd[1:], **kw)
    except OSError as exc:
        raise not_runnable(cmd, exc) from None


# ---- between fork and exec --------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_PRCTL: list[Any] = []  # [libc.prctl] or [None], looked up once, before any fork


def _prctl() -> Any:
    if not _PRCTL:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):  # a libc without it (static, musl oddities)
                fn = None
        _PRCTL.append(fn)
    return _PRCTL[0]


def child_setup(*, new_group: bool, close: tuple[int, ...] | list[int] = (),
                then: Callable[[], None] | None = None, default: tuple[int, ...] | list[int] = ()
                ) -> Callable[[], None]:
    """The function the child runs between fork and exec (subprocess's preexec_fn):
    its own process group (`new_group`; a new session is Popen's start_new_session),
    `then`, the closing of `close`, and PR_SET_PDEATHSIG = SIGKILL: the kernel kills the
    child when the thread that forked it ends, and the wrapper forks from its main
    thread, which ends only with the wrapper (`timeout -s KILL N mpdoctor run -- train`
    must not leave the training running). If the wrapper died between the fork and the
    prctl, getppid() is no longer ours: the child kills itself, as the signal would have.
    The child's own children are the lifeline's to kill (lifeline.py). `default`: the
    signals set back to their default action (the ones the wrapper ignores for itself)."""
    prctl = _prctl()
    parent = os.getpid()
    fds = list(close)
    reset = list(default)

    def setup() -> None:
        for sig in reset:
            signal.signal(sig, signal.SIG_DFL)
        if new_group:
            os.setpgrp()
        if then is not None:
            then()
        for fd in fds:
            os.close(fd)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
    return setup
