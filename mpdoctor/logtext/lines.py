"""The plain data of the normaliser: logical lines, lazily compiled patterns, limits."""

from __future__ import annotations

import re


class LazyRe:
    """A module-level regular expression compiled on first use: `mpdoctor explain` on a
    short traceback needs only some of the forms below, and compiling all of them costs
    more than reading the traceback. After the first use its methods are plain
    attributes, as fast as the compiled pattern's own."""

    def __init__(self, pattern: str, flags: int = 0):
        self._args = (pattern, flags)

    def __getattr__(self, name: str):
        rx = re.compile(*self._args)
        for method in ("match", "search", "sub", "split", "finditer", "findall", "fullmatch", "pattern"):
            self.__dict__[method] = getattr(rx, method)
        return getattr(rx, name)


# The longest text a rule pattern ever sees at once (keeps matching bounded).
MAX_MATCH_CHARS = 8192


# Structure (prefixes, boxes, frames, exception lines) is read from this many
# characters of a line; the rest of a very long line is kept but not parsed.
_HEAD = 4096


class _Plain:
    """Plain data classes of the hot path. Not dataclasses: creating a dataclass costs
    about a millisecond at import, and `mpdoctor explain` must start like a small script."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


class LogLine(_Plain):
    """A clean logical line. `no` is the 1-based line number in the input; `raw` the line
    as pasted (ANSI removed, prefixes kept) for evidence; `stream` what separates
    interleaved writers that have no rank (a pid, a host, a service)."""

    __slots__ = ("no", "text", "rank", "raw", "stream")

    def __init__(self, no: int, text: str, rank: int | None = None, raw: str = "", stream: str | None = None):
        self.no = no
        self.text = text
        self.rank = rank
        self.raw = raw
        self.stream = stream
