"""What `mpdoctor run` keeps of the command's output for the diagnosis: a bounded head
and tail of each stream (OutputTail), and the streams together as one text
(CapturedOutput). Nothing here reads or writes a file descriptor."""

from __future__ import annotations

from collections import deque
from typing import Any

HEAD_BYTES = 256 * 1024
TAIL_BYTES = 4 * 1024 * 1024

__all__ = ["HEAD_BYTES", "TAIL_BYTES", "CapturedOutput", "OutputTail"]


class OutputTail:
    """The first `head` and the last `tail` bytes of everything the child wrote.

    The chunks os.read returned are kept as they are (no copying on the hot path); the
    oldest are dropped once the tail holds more than it needs."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
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
