"""The wrapper of `mpdoctor run -- CMD`: run a training command as if it ran bare.

What the command sees is what it would see bare:
- stdout/stderr: a pseudo-terminal when our stdout is a terminal (progress bars and
  colours behave as in a bare run); a pipe when ours is a pipe or socket, pumped byte
  for byte until it closes (a grandchild still holding it is waited for, as `cmd | cat`
  waits); a pty of its own for a stderr the user left on the terminal while stdout is
  not one (`cmd > log` in a terminal: tqdm still sees a terminal); our own file
  descriptor itself when ours is a file or a device such as /dev/null or /dev/full (no
  copy, no cost; the child meets ENOSPC or EFBIG itself; a regular file's new bytes are
  read back afterwards for the diagnosis, what goes to /dev/null is not read); a closed
  one closed.
- signals: every catchable signal we get goes to its process group, once (forward.py);
  job control works: when the child stops (Ctrl-Z) we stop too, and `fg` resumes it.
- exec: `execvp` semantics (spawn.py); exit status: its own (death by signal N is 128+N,
  as in a shell).
- its life is tied to ours: if the wrapper is killed, so is the child's process group
  (spawn.child_setup's PR_SET_PDEATHSIG, lifeline.py).
We keep a bounded head and tail of the output (tail.py, pump.py), and the
instrumentation (instrument/, injected through a sitecustomize on PYTHONPATH, inject.py)
leaves per-rank event files. When the run fails, or the instrumentation saw trouble, the
explain rules read the captured output and their findings are merged with the
instrumentation's, root cause first, on stderr after the child's own output
(diagnose.py). This module never imports torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from ..knowledge.signals import signal_name
from . import terminal as term
from .forward import DEDUPED, Forwarder
from .inject import child_env, make_workdir
from .lifeline import Lifeline
from .pump import Keyboard, grow_pipe, pump
from .spawn import CommandNotRunnable, child_setup, spawn
from .streams import close_files, file_captures, isatty, kind, reserve_closed, same_file
from .tail import CapturedOutput, OutputTail

__all__ = ["ChildResult", "CommandNotRunnable", "OutputTail", "run_command", "run_pipes", "run_pty"]


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


def run_pipes(cmd: list[str], env: dict[str, str]) -> ChildResult:
    tail = OutputTail()
    start = time.monotonic()
    stdin_tty = isatty(0) and term.foreground(0)
    kinds = {fd: kind(fd) for fd in (1, 2)}
    held = reserve_closed(kinds)
    captures = file_captures(kinds)
    kw: dict[str, Any] = {"stdout": subprocess.PIPE if kinds[1] == "pipe" else None,
                          "stderr": subprocess.PIPE if kinds[2] == "pipe" else None}
    if kinds[1] == kinds[2] == "pipe" and same_file(1, 2):
        # `2>&1 | tee log`: one pipe for both, so that their lines interleave as bare
        kw["stderr"] = subprocess.STDOUT
    err_pty: tuple[int, int] | None = None
    if kinds[2] == "tty":  # `cmd > log` in a terminal: stderr stays a terminal
        try:
            err_pty = term.pty_like(2)
            kw["stderr"] = err_pty[1]
        except OSError:  # no pty to be had: the terminal itself (not read for the diagnosis)
            err_pty = None
    winch = (lambda: term.copy_winsize(err_pty[0], (2, 1, 0))) if err_pty else None  # type: ignore[index]
    lifeline = Lifeline(DEDUPED).start()
    try:
        with Forwarder(winch=winch, winch_only=False, lifeline=lifeline) as fwd:
            try:
                proc = spawn(cmd, env=env, bufsize=0, preexec_fn=child_setup(new_group=True, close=held, default=fwd.reset_in_child()), **kw)
            finally:
                if err_pty is not None:
                    os.close(err_pty[1])
            lifeline.guard(proc.pid)
            fwd.started(proc)
            handed = term.hand_terminal(proc.pid) if stdin_tty else False
            if handed:
                fwd.on_stop = None  # the shell takes the terminal back itself
                # `fg`: the shell gave our group the terminal; the child's group gets it again
                # (after `bg` it stays the shell's)
                fwd.on_continue = lambda: term.foreground(0) and term.hand_terminal(proc.pid)
            try:
                routes = {}
                for fd, f in ((1, proc.stdout), (2, proc.stderr)):
                    if f is not None:
                        grow_pipe(f.fileno())
                        routes[f.fileno()] = fd
                if err_pty is not None:
                    routes[err_pty[0]] = 2
                pump(routes, tail)
                returncode = _wait(proc)
            finally:
                if handed:
                    term.take_terminal(proc.pid)
                close_files([proc.stdout, proc.stderr])
    finally:
        lifeline.stop()
        if err_pty is not None:
            os.close(err_pty[0])
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
    stdin_tty = isatty(0) and term.foreground(0)
    err_kind = kind(2)
    held = reserve_closed({1: "tty", 2: err_kind})
    captures = file_captures({2: err_kind})
    saved = None
    try:
        if isatty(0):
            termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(0))
        if not stdin_tty:
            # Our terminal stays cooked (we do not own it), so it turns \n into \r\n itself:
            # the child's side must not do it a second time.
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.OPOST
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    term.copy_winsize(master)

    def become_session_leader_of_pty() -> None:
        fcntl.ioctl(1, termios.TIOCSCTTY, 0)  # stdout is the pty's slave side here

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

    keyboard = Keyboard(master) if stdin_tty else None

    def resumed() -> None:
        # `fg` gives us the terminal back; after `bg` it stays the shell's, left as it is
        if saved is None and term.foreground(0):
            raw()
            if keyboard is not None:
                keyboard.rearm = True
        term.copy_winsize(master)

    lifeline = Lifeline(DEDUPED).start()
    try:
        with Forwarder(winch=lambda: term.copy_winsize(master), orphaned=True, lifeline=lifeline) as fwd:
            try:
                stderr: Any = slave if err_kind == "tty" else (subprocess.PIPE if err_kind == "pipe" else None)
                setup = child_setup(new_group=False, close=held, then=become_session_leader_of_pty,
                                    default=fwd.reset_in_child())
                proc = spawn(cmd, env=env, stdin=slave if stdin_tty else None, stdout=slave, stderr=stderr,
                             bufsize=0, start_new_session=True, preexec_fn=setup)
            finally:
                os.close(slave)
            lifeline.guard(proc.pid)
            fwd.started(proc)
            fwd.on_stop, fwd.on_continue = cooked, resumed
            try:
                raw()
                routes = {master: 1}
                if proc.stderr is not None:
                    grow_pipe(proc.stderr.fileno())
                    routes[proc.stderr.fileno()] = 2
                if keyboard is not None:
                    keyboard.typed = lambda data: term.suspend_key(master, proc.pid, data)
                pump(routes, tail, keyboard, coalesce=False)
                returncode = _wait(proc)
            finally:
                fwd.on_stop = fwd.on_continue = None
                cooked()
                close_files([proc.stderr])
    finally:
        lifeline.stop()
        os.close(master)
        for fd in held:
            os.close(fd)
    return _result(returncode, CapturedOutput([c.read() for c in captures] + [tail]), start)


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # our handler forwards; keep waiting for the child
            continue


def _result(returncode: int, tail: Any, start: float) -> ChildResult:
    name = signal_name(-returncode) if returncode < 0 else None
    return ChildResult(returncode=returncode, tail=tail, signal_name=name, wall_s=time.monotonic() - start)


def run_command(cmd: list[str], *, instrument: bool = True) -> tuple[ChildResult, list[Any]]:
    """Run `cmd` as a bare run would behave (a pty when our stdout is a terminal), with
    mpdoctor's instrumentation injected unless `instrument` is False; return how it
    ended and what each instrumented process recorded (instrument.events.RankRecord).
    Without a writable temporary folder the command runs uninstrumented and the result's
    extra["not_instrumented"] says why. Raises CommandNotRunnable (126/127) when it
    cannot be started."""
    workdir, why = make_workdir() if instrument else (None, None)
    try:
        env = child_env(workdir)
        result = run_pty(cmd, env) if isatty(1) else run_pipes(cmd, env)
        if why:
            result.extra["not_instrumented"] = why
        records: list[Any] = []
        if workdir is not None:
            from ..instrument.events import read_events

            records = read_events(workdir / "events")
        return result, records
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
