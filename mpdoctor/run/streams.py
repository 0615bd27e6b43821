"""Where the command's output goes: what each of our standard streams is (a terminal,
a pipe, a regular file, a device, closed), and the bytes the child wrote straight into a
regular file we handed it, read back after the run for the diagnosis."""

from __future__ import annotations

import os
import stat
from typing import Any

from .tail import HEAD_BYTES, TAIL_BYTES, OutputTail

__all__ = ["FileCapture", "close_files", "file_captures", "isatty", "kind", "reserve_closed", "same_file"]


def isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def kind(fd: int) -> str:
    """'tty', 'pipe' (pipe, FIFO or socket: pumped), 'file' (a regular file: handed over,
    read back), 'device' (/dev/null, /dev/full...: handed over) or 'closed'."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return "closed"
    if isatty(fd):
        return "tty"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "pipe"
    if stat.S_ISREG(mode):
        return "file"
    return "device"


def same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class FileCapture:
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


def file_captures(kinds: dict[int, str]) -> list[FileCapture]:
    caps: list[FileCapture] = []
    for fd in (1, 2):
        if kinds.get(fd) != "file":
            continue
        try:
            cap = FileCapture(fd)
        except OSError:
            continue
        same = next((c for c in caps if c.key == cap.key), None)
        if same is not None:  # 2>&1 into one file: read it once, from the earlier start
            same.start = min(same.start, cap.start)
            continue
        caps.append(cap)
    return caps


def reserve_closed(kinds: dict[int, str]) -> list[int]:
    """A closed stdin, stdout or stderr stays closed in the child (`<&-`, `>&-`); meanwhile
    /dev/null holds its number, so that no pipe of ours lands there and leaks into it.
    The child closes the returned numbers before it runs the command."""
    held = []
    for fd in (0, 1, 2):
        if (kinds[fd] if fd in kinds else kind(fd)) == "closed":
            nul = os.open(os.devnull, os.O_RDWR)
            if nul != fd:
                os.dup2(nul, fd)
                os.close(nul)
            held.append(fd)
    return held


def close_files(files: list[Any]) -> None:
    for f in files:
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
