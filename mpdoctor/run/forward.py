"""Signals while the command runs: every catchable signal the wrapper gets goes to the
child's process group (SLURM's `--signal=USR1@N`, `kill -QUIT`), once: a signal that
was sent to every process of the job (the child included) is not sent again
(lifeline.Lifeline.also_got). Job control works: when the child stops (Ctrl-Z) the
wrapper stops too, and `fg` (SIGCONT) resumes the child."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

__all__ = ["DEDUPED", "NOT_FORWARDED", "OURS_IGNORED", "Forwarder", "default_action"]

# Not forwarded: uncatchable, ours (SIGCHLD), or a fault of our own process, not a request.
NOT_FORWARDED = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGSEGV,
                           signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGSYS, signal.SIGTRAP})
# Ignored by us while the child runs: the terminal's "you are in the background" signals
# concern our own reads and writes of it (the child has its own terminal, or the
# terminal itself); ignored, a background read fails (EIO) and a write goes through.
OURS_IGNORED = (signal.SIGTTIN, signal.SIGTTOU)
# Forwarded unless the whole job got them (requests such as USR1, TERM, INT). Job
# control (TSTP, CONT) and a window's new size (WINCH, harmless twice) always pass.
DEDUPED = frozenset(s for s in signal.valid_signals()
                    if s not in NOT_FORWARDED and s not in OURS_IGNORED
                    and s not in (signal.SIGCONT, signal.SIGTSTP, signal.SIGWINCH, signal.SIGURG))


class Forwarder:
    """Every catchable signal we get goes to the child's process group while it runs
    (SIGTTIN/SIGTTOU excepted: they are about our own use of the terminal, and ignored);
    when the child stops (Ctrl-Z, SIGTSTP), we stop too, with our job's group when a shell
    made it, so that the shell sees the job stop; SIGCONT (`fg`) resumes the child.

    `winch`: called on SIGWINCH (a pty of ours copies the new window size); the signal
    itself is forwarded too unless `winch_only` (the child's pty signals it itself).
    `lifeline`: tells a signal sent to the whole job (not forwarded) from one sent to us."""

    def __init__(self, winch: Any = None, orphaned: bool = False, winch_only: bool = True,
                 lifeline: Any = None) -> None:
        self.pgid: int | None = None
        # pty mode: the child leads its own session, so its group is orphaned and the
        # kernel drops a SIGTSTP whose action is the default; SIGSTOP is what that default
        # action would have done
        self.orphaned = orphaned
        self.pid: int | None = None
        self.received: list[int] = []
        self._old: dict[int, Any] = {}
        self._winch = winch
        self._winch_only = winch_only
        self.lifeline = lifeline
        self.on_stop: Any = None  # called before we stop, and
        self.on_continue: Any = None  # after we were continued
        self.continued = False

    def __enter__(self) -> "Forwarder":
        for sig in sorted(signal.valid_signals()):
            if sig in NOT_FORWARDED:
                continue
            try:
                if signal.getsignal(sig) == signal.SIG_IGN and sig not in OURS_IGNORED:
                    continue  # ignored when we started (`nohup`): the child inherits it ignored, as bare
                self._old[sig] = signal.signal(sig, signal.SIG_IGN if sig in OURS_IGNORED else self._handle)
            except (ValueError, OSError, RuntimeError):  # not the main thread; a reserved one
                pass
        try:
            self._old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._child_changed)
        except (ValueError, OSError):
            pass
        return self

    def reset_in_child(self) -> list[int]:
        """The signals we ignore for ourselves that the child must have at their default
        action, as they were when we started (an ignored disposition survives exec)."""
        return [s for s in OURS_IGNORED if self._old.get(s, signal.SIG_DFL) != signal.SIG_IGN]

    def started(self, proc: subprocess.Popen) -> None:
        self.pid = self.pgid = proc.pid
        for sig in self.received:  # what came while it was being started
            self._send(sig)

    def _send(self, signum: int) -> None:
        if self.pgid is None:
            return
        if self.lifeline is not None and self.lifeline.also_got(signum):
            return  # sent to every process of the job: the child has its own
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
            if self._winch_only:
                return
        if signum == signal.SIGTSTP and self.orphaned and default_action(self.pgid, signum):
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


def default_action(pid: int, sig: int) -> bool:
    """Whether `sig` has its default action in process `pid` (neither caught nor ignored)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            masks = dict(line.split(":", 1) for line in fh if line.startswith(("SigCgt", "SigIgn")))
        bit = 1 << (sig - 1)
        return not any(int(masks[k], 16) & bit for k in ("SigCgt", "SigIgn"))
    except (OSError, KeyError, ValueError):
        return True
