"""Reading a log of any size: small ones whole, big ones as candidate regions.

A log under `WHOLE_LIMIT` is decoded and handed on whole: every damaged-paste repair the
normaliser and the matcher know applies to all of it. A bigger one is streamed in chunks
and only the regions around what a rule could match (plus where tracebacks start) are
kept (`regions.RegionScanner`), so memory stays bounded whatever the log's size.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Iterable

    from .prefilter import Prefilter

    Progress = Callable[[int, "int | None"], None]  # (bytes read so far, total size or None)

from .encoding import sniff_encoding

WHOLE_LIMIT = 1024 * 1024  # read whole up to this size: a paste, a traceback, a short log


class InputError(Exception):
    """The input cannot be read as a log. The CLI prints it and exits 2."""


class LogInput:
    """The log as read: regions of (first line number, text), and what was read."""

    __slots__ = ("regions", "info")

    def __init__(self, regions: list[tuple[int, str]], info: dict | None = None):
        self.regions = regions
        self.info = info if info is not None else {}


def decode(data: bytes, encoding: str = "utf-8") -> str:
    return data.decode(encoding, errors="replace")


def open_input(path: str) -> tuple[BinaryIO, str, int | None]:
    """(stream, display name, size or None)."""
    if path == "-":
        return sys.stdin.buffer, "<stdin>", None
    if os.path.isdir(path):
        raise InputError(f"{path} is a folder, not a log file")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        size = os.fstat(fh.fileno()).st_size
    except OSError:
        size = None
    return fh, path, size


def read_log(path: str, literals: "Iterable[str] | Prefilter | Callable[[], Prefilter]",
             progress: Progress | None = None) -> LogInput:
    """Read a log (or '-' for stdin): whole when small, candidate regions when big.

    `literals` is what the region scan looks for; a callable is called only when the
    log is big enough to need it (building a prefilter costs more than a short log)."""
    fh, name, size = open_input(path)
    try:
        head = fh.read(WHOLE_LIMIT + 1)
    except OSError as exc:
        if fh is not sys.stdin.buffer:
            fh.close()
        raise InputError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    except MemoryError:
        raise InputError(f"{name}: not enough memory to read it") from None
    if not head:
        if fh is not sys.stdin.buffer:
            fh.close()
        raise InputError(f"{name} is empty: there is nothing to explain")
    encoding = sniff_encoding(head[:65536])
    if encoding is None:
        if fh is not sys.stdin.buffer:
            fh.close()
        raise InputError(f"{name} looks like a binary file, not a text log")
    info = {"path": name, "bytes": size if size is not None else len(head)}
    if encoding not in ("utf-8", "utf-8-sig"):
        info["encoding"] = encoding
    if len(head) <= WHOLE_LIMIT:
        if fh is not sys.stdin.buffer:
            fh.close()
        text = decode(head, encoding).rstrip("\x00")  # NUL padding a crash left
        del head
        info.update(lines=text.count("\n") + (0 if text.endswith("\n") else 1), scanned="whole")
        return LogInput([(1, text)], info)
    recode = None
    if encoding == "utf-8-sig":
        head = head[3:]
    elif encoding != "utf-8":  # the scan reads UTF-8 bytes: transcode as it goes
        import codecs

        decoder = codecs.getincrementaldecoder(encoding)("replace")
        recode = lambda b, final=False: decoder.decode(b, final).encode("utf-8", "surrogateescape")  # noqa: E731
        head = recode(head)
    from . import regions
    from .prefilter import Prefilter

    if callable(literals) and not isinstance(literals, Prefilter):
        literals = literals()
    scanner = regions.RegionScanner(literals if isinstance(literals, Prefilter) else Prefilter(list(literals)))
    try:
        scanner.feed(head)
        done = len(head)
        while True:
            if progress is not None:
                progress(done, size)
            chunk = fh.read(regions.CHUNK)
            if not chunk:
                if recode is not None:
                    scanner.feed(recode(b"", True))
                break
            done += len(chunk)
            scanner.feed(recode(chunk) if recode is not None else chunk)
    except OSError as exc:
        raise InputError(f"{name}: read failed ({exc.strerror or exc})") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    regions = scanner.finish()
    info.update(bytes=scanner.total_bytes if recode is None or size is None else size, lines=scanner.line_count, scanned="regions",
                regions=len(regions), matcher=scanner.engine,
                dropped_bytes=scanner.dropped_bytes, dropped_regions=scanner.dropped_regions)
    return LogInput([(no, decode(b)) for no, b in regions], info)

