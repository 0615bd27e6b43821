"""The terminal: whose it is (the foreground process group), the pseudo-terminals the
child gets in place of ours (their settings and window size copied from ours), and
Ctrl-Z typed to a child's pty."""

from __future__ import annotations

import os
import signal

from .forward import default_action

__all__ = ["copy_winsize", "foreground", "hand_terminal", "pty_like", "suspend_key", "take_terminal"]


def foreground(fd: int) -> bool:
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


def hand_terminal(pgid: int) -> bool:
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


def take_terminal(child_pgid: int) -> None:
    """The terminal back from the child's group (not from the shell, after `bg`)."""
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we are in the background now
    try:
        if os.tcgetpgrp(0) == child_pgid:
            os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def copy_winsize(master: int, sources: tuple[int, ...] = (1, 0, 2)) -> None:
    import fcntl
    import termios

    for fd in sources:
        try:
            size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(master, termios.TIOCSWINSZ, size)
            return
        except OSError:
            continue


def pty_like(fd: int) -> tuple[int, int]:
    """A new pty (master, slave) for a stream the user left on the terminal `fd` while
    another stream is not a terminal (`cmd > file` in a terminal: stderr): the child
    writes to a terminal there, as bare (progress bars, colours), and we still read what
    it wrote. The slave gets `fd`'s settings and window size, without output processing:
    our own terminal turns \\n into \\r\\n itself, once."""
    import pty
    import termios

    master, slave = pty.openpty()
    try:
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    copy_winsize(master, (fd, 1, 0, 2))
    return master, slave


def suspend_key(master: int, pid: int, data: bytes) -> None:
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
    if default_action(fg, signal.SIGTSTP):
        try:
            os.killpg(fg, signal.SIGSTOP)
        except OSError:
            pass
