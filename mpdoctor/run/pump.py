"""The copy of the child's output to ours, byte for byte, keeping a bounded tail for the
diagnosis; and, in pty mode, of our terminal's keystrokes to the child's pty."""

from __future__ import annotations

import errno
import os
import selectors
import time
from typing import Any

from .tail import OutputTail

READ_BYTES = 1 << 20  # bytes per read: as much as the pipe holds
PIPE_BYTES = 1 << 20  # the child's pipes are made this big (the unprivileged maximum)
COALESCE_S = 0.001  # after a short read from a pipe, let the child's writes gather this long

__all__ = ["COALESCE_S", "PIPE_BYTES", "READ_BYTES", "Keyboard", "grow_pipe", "let_go", "pump", "write_all"]


def write_all(fd: int, data: bytes) -> bool:
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


def let_go(fd: int) -> None:
    """Close our end of the child's pipe (or pty), so that the child meets the broken pipe
    (or hangup) itself; /dev/null keeps the number ours until its owner closes it."""
    try:
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, fd)
        os.close(nul)
    except OSError:
        pass


def grow_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):  # not Linux, or over the user's pipe quota
        pass


class Keyboard:
    """The relay of our terminal's keystrokes to the child's pty: `to` (the pty's master);
    `typed(data)` sees what was relayed; `rearm` set when it is worth reading our terminal
    again (we are back in the foreground after `bg`/`fg`)."""

    def __init__(self, to: int, typed: Any = None) -> None:
        self.to, self.typed, self.rearm = to, typed, False


def pump(routes: dict[int, int], tail: OutputTail, keyboard: Keyboard | None = None,
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
                        data = read(0, READ_BYTES)
                    except OSError:  # EIO: in the background (`bg`) until `fg`
                        data = b""
                    if not data or not write_all(keyboard.to, data):  # type: ignore[union-attr]
                        sel.unregister(0)
                        reading_keys = False
                    elif keyboard.typed is not None:  # type: ignore[union-attr]
                        keyboard.typed(data)  # type: ignore[union-attr]
                    continue
                try:
                    data = read(fd, READ_BYTES)
                except OSError as exc:  # EIO: the pty's other side closed
                    if exc.errno not in (errno.EIO, errno.EBADF):
                        raise
                    data = b""
                if not data:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                feed(data)
                if len(data) < READ_BYTES:
                    short = True
                if not write_all(routes[fd], data):
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    let_go(fd)
            if short and coalesce:
                # A chatty child writes a line at a time: each write would wake us for a
                # few bytes. A millisecond's pause lets them gather into one read (the
                # pipe holds a megabyte; a full read does not pause).
                time.sleep(COALESCE_S)
    finally:
        sel.close()
