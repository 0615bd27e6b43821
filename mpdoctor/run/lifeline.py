"""The lifeline: a small process of the wrapper's that outlives it by an instant.

1. The child dies with the wrapper. The child leads its own process group (job control
   needs it), so a `timeout -s KILL N mpdoctor run -- train` that kills the wrapper's
   group would leave the training running, and `accelerate launch` or `torchrun` put the
   real training one process further down, out of reach of the child's PR_SET_PDEATHSIG
   (spawn.child_setup). The lifeline holds the read end of a pipe whose write end only
   the wrapper holds: when the wrapper dies, however it dies, the read sees EOF without
   the wrapper's "done", and the lifeline SIGKILLs the child's whole process group, as
   the `timeout` would have killed the bare command's. It lives in a process group of
   its own (a kill of the wrapper's group does not reach it), with every signal it can
   block blocked and its standard streams on /dev/null.

2. It tells whether a signal reached more than the wrapper. A scheduler that signals
   every process of a job step (SLURM with cgroup process tracking, `kill -USR1 -1`,
   `pkill -P`) signals the child itself: forwarding the wrapper's copy too would give
   the child the signal twice (two checkpoints, two requeues). Such a sender reaches
   the lifeline too, and a kill() of a blocked signal leaves it pending there at once,
   visible in /proc/PID/status without the lifeline having to run. So before forwarding
   signal S the wrapper looks (for up to a few milliseconds, the sender being busy with
   the other processes) whether S is pending in the lifeline: if so, it was sent to the
   whole step and is not forwarded; the lifeline then takes it out (sigtimedwait) and
   says so, so that the next S is judged afresh. A copy that reaches the lifeline after
   the wrapper gave up looking (a sender slower than 80 ms between two processes: the
   child then gets it twice, as before) is taken out within a second of the forward, so
   that it is not mistaken for the next one. A signal sent to the wrapper alone
   (`kill PID`), or to its process group (`timeout`, the shell's `kill %1`, a terminal's
   Ctrl-C), never reaches the lifeline and is forwarded. Without /proc (not Linux) every
   signal is forwarded, as before.
"""

from __future__ import annotations

import os
import select
import signal
import time

__all__ = ["Lifeline"]

_GRACE_S = (0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08)  # when to look again for a signal on its way
_LATE_S = 1.0  # a copy that reaches the lifeline this long after a forward is taken out as late
_SETTLE_S = 2.0  # at most this long for the lifeline to take a pending signal out


class Lifeline:
    def __init__(self, watched: frozenset[int] | set[int]) -> None:
        self.pid: int | None = None
        self.watched = frozenset(watched)  # the signals it holds pending (sent to the step)
        self._ctl: int | None = None
        self._ack: int | None = None

    def start(self) -> "Lifeline":
        """Fork it; call before the child is started (it must hold none of the child's
        pipes). Nothing happens if fork fails: the run goes on without it."""
        try:
            ctl_r, ctl_w = os.pipe()
            ack_r, ack_w = os.pipe()
        except OSError:
            return self
        try:
            pid = os.fork()
        except OSError:
            for fd in (ctl_r, ctl_w, ack_r, ack_w):
                os.close(fd)
            return self
        if pid == 0:  # the lifeline
            try:
                _live(ctl_r, ack_w, self.watched, keep=(ctl_r, ack_w))
            finally:
                os._exit(0)
        os.close(ctl_r)
        os.close(ack_w)
        self.pid, self._ctl, self._ack = pid, ctl_w, ack_r
        return self

    def guard(self, pgid: int) -> None:
        """From now on the wrapper's death kills process group `pgid`."""
        self._say(f"guard {pgid}\n")

    def also_got(self, sig: int) -> bool:
        """Whether `sig`, just received by the wrapper, reached the lifeline too (it was
        sent to every process, not to the wrapper alone); if so it is taken out."""
        if self.pid is None or sig not in self.watched:
            return False
        waited = 0.0
        for at in _GRACE_S:
            if at > waited:
                time.sleep(at - waited)
                waited = at
            pending = _pending(self.pid)
            if pending is None:
                return False
            if pending & (1 << (sig - 1)):
                self._take_out(sig)
                return True
        # forwarded: a copy still on its way to the lifeline (a slow sender) must not stay
        # pending there and make the next signal sent to the wrapper alone look job-wide
        self._say(f"late {sig}\n")
        return False

    def _take_out(self, sig: int) -> None:
        if not self._say(f"take {sig}\n") or self._ack is None:
            return
        deadline = time.monotonic() + _SETTLE_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                ready = select.select([self._ack], [], [], left)[0]
            except InterruptedError:
                continue
            if not ready:
                return
            try:
                if os.read(self._ack, 64):
                    return
            except InterruptedError:
                continue
            except OSError:
                return

    def _say(self, line: str) -> bool:
        if self._ctl is None:
            return False
        try:
            os.write(self._ctl, line.encode())
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """The run is over: the lifeline leaves without killing anything."""
        if self.pid is None:
            return
        self._say("done\n")
        try:  # it may be taking out a late copy (up to a second): no need to wait for that
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        for fd in (self._ctl, self._ack):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._ctl = self._ack = None
        try:
            os.waitpid(self.pid, 0)
        except (ChildProcessError, InterruptedError, OSError):
            pass
        self.pid = None


def _pending(pid: int) -> int | None:
    """The signals pending for process `pid` (its shared and its thread's own), or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    mask = 0
    for line in data.split(b"\n"):
        if line.startswith((b"ShdPnd:", b"SigPnd:")):
            try:
                mask |= int(line.split(b":", 1)[1].strip(), 16)
            except ValueError:
                return None
    return mask


def _live(ctl: int, ack: int, watched: frozenset[int], keep: tuple[int, ...]) -> None:
    """The lifeline's whole life (in the forked process; it never returns to the caller's
    code: the caller _exits)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL if sig == signal.SIGCHLD else signal.SIG_IGN)
        except (OSError, ValueError, RuntimeError):
            pass
    # blocked, not ignored: a blocked signal stays pending (and visible); an ignored one
    # is thrown away at once
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    for sig in watched:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    nul = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(nul, fd)
    for lo, hi in _gaps(sorted(set(keep) | {0, 1, 2})):
        os.closerange(lo, hi)
    pgid = None
    buf = b""
    while True:
        try:
            data = os.read(ctl, 256)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:  # the wrapper is gone without saying "done"
            if pgid is not None:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            word, _, arg = line.decode("ascii", "replace").partition(" ")
            if word == "done":
                return
            if word == "guard" and arg.isdigit():
                pgid = int(arg)
            elif word == "late" and arg.isdigit():
                try:
                    signal.sigtimedwait([int(arg)], _LATE_S)
                except (OSError, ValueError):
                    pass
            elif word == "take" and arg.isdigit():
                try:
                    signal.sigtimedwait([int(arg)], 0)
                except (OSError, ValueError):
                    pass
                try:
                    os.write(ack, b"k")
                except OSError:
                    pass


def _gaps(keep: list[int], top: int = 1 << 16) -> list[tuple[int, int]]:
    """The ranges [lo, hi) of descriptor numbers above 2 not in `keep`."""
    out, lo = [], 3
    for fd in keep:
        if fd >= lo:
            if fd > lo:
                out.append((lo, fd))
            lo = fd + 1
    out.append((lo, max(lo, top)))
    return out
