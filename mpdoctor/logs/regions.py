"""Streaming a big log and keeping the regions around what a rule could match.

The literal scan uses Hyperscan when it is installed (it scans at memory speed) and a
pure-Python trie scan when it is not; both keep every line a rule's pattern could match as
written, so the findings are the same. The log is scanned as written: the repairs for
damaged pastes apply in the regions kept (the normaliser and the matcher run on them).
Memory is bounded by what is kept, not by the log: a kept line costs about four times
its bytes once normalised and matched, so the kept regions are capped at a few MB.
"""

from __future__ import annotations

import os
from collections import deque

from .prefilter import Prefilter

CHUNK = 16 * 1024 * 1024  # read at a time: the scan is as fast, and memory stays low
LINES_BEFORE = 80  # the traceback above an error line
LINES_AFTER = 40  # the message below a header or an error line
HEAD_BUDGET = 1 * 1024 * 1024  # region bytes kept from the start of the log
TAIL_BUDGET = 3 * 1024 * 1024  # ... and from its end (regions between are dropped, counted)


def literal_finder(spec: Prefilter):
    if os.environ.get("MPDOCTOR_NO_HYPERSCAN") != "1":
        try:
            from .scan_hyperscan import HyperscanFinder

            return HyperscanFinder(spec)
        except ImportError:  # not installed, or no wheel for this platform
            pass
        except Exception:  # an expression Hyperscan refuses: the pure-Python scan is exact too
            pass
    from .scan_python import PyLiteralFinder

    return PyLiteralFinder(spec)


class RegionScanner:
    """Streams bytes, keeps line-aligned windows around literal hits."""

    def __init__(self, spec: Prefilter | list[str]):
        if not isinstance(spec, Prefilter):
            spec = Prefilter(list(spec))
        self.finder = literal_finder(spec)
        self.engine = self.finder.engine
        self.carry = b""
        self.line_base = 0  # newlines before the current buffer
        self.total_bytes = 0
        self.head: list[list] = []  # [first_line_no, last_line_no, bytes]
        self.head_bytes = 0
        self.tail: deque[list] = deque()
        self.tail_bytes = 0
        self.dropped_bytes = 0
        self.dropped_regions = 0
        self.pending_after = 0  # lines still wanted after the previous buffer
        self.line_count = 0

    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        start = 0
        if self.carry:  # the line cut at the last chunk's end, completed first
            nl = data.find(b"\n")
            if nl < 0 and len(self.carry) + len(data) < CHUNK:  # a very long line: wait for its end
                self.carry += data
                return
            start = len(data) if nl < 0 else nl + 1
            line, self.carry = self.carry + data[:start], b""
            self._scan(line, 0, len(line))
        cut = data.rfind(b"\n") + 1
        if cut <= start:
            if len(data) - start < CHUNK:
                self.carry = data[start:]
                return
            cut = len(data)
        self._scan(data, start, cut)  # the chunk itself, never a copy of it (16 MB a time)
        self.carry = data[cut:]

    def finish(self) -> list[tuple[int, bytes]]:
        if self.carry:
            self._scan(self.carry, 0, len(self.carry))
            self.carry = b""
        regions = [(r[0], r[2]) for r in self.head] + [(r[0], r[2]) for r in self.tail]
        return regions

    def _scan(self, buf: bytes, begin: int, size: int) -> None:
        """Keep the regions of the whole lines buf[begin:size]."""
        base = self.line_base
        spans: list[tuple[int, int]] = []
        if self.pending_after:
            spans.append((begin, _nth_newline_after(buf, begin, self.pending_after, size)))
        end_wanted = begin
        for pos in self.finder.positions(buf):
            if pos >= size:
                break
            if pos < end_wanted:
                continue
            start = _back_lines(buf, pos, LINES_BEFORE, begin)
            end = _nth_newline_after(buf, pos, LINES_AFTER, size)
            spans.append((start, end))
            end_wanted = end
        # Lines still wanted after the buffer's end belong to the next one.
        self.pending_after = LINES_AFTER if spans and spans[-1][1] >= size else 0
        merged: list[list[int]] = []
        for s, e in sorted(spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        counted, newlines = begin, 0
        for s, e in merged:
            newlines += buf.count(b"\n", counted, s)
            counted = s
            self._keep(base + newlines + 1, buf[s:e])
        newlines += buf.count(b"\n", counted, size)
        self.line_base = base + newlines
        self.line_count = self.line_base + (0 if buf[size - 1:size] == b"\n" else 1)

    def _keep(self, first_no: int, data: bytes) -> None:
        """Keep a region: in the head while HEAD_BUDGET lasts (a region that does not fit
        is cut at a line break, its rest starts the tail), then in the tail, whose oldest
        bytes are dropped past TAIL_BUDGET (counted in dropped_bytes / dropped_regions)."""
        last = self.tail[-1] if self.tail else (self.head[-1] if self.head else None)
        if last is not None and first_no <= last[1]:  # lines already kept: skip them
            overlap = last[1] - first_no + 1
            data = data.split(b"\n", overlap)[-1] if data.count(b"\n") >= overlap else b""
            first_no += overlap
        if not data:
            return
        if not self.tail:
            room = HEAD_BUDGET - self.head_bytes
            if len(data) > room:
                cut = data.rfind(b"\n", 0, max(room, 0)) + 1
                if cut > 0:
                    self._add(self.head, first_no, data[:cut])
                    self.head_bytes += cut
                    first_no += data.count(b"\n", 0, cut)
                    data = data[cut:]
                if data:
                    self._add(self.tail, first_no, data, join=False)
                    self.tail_bytes += len(data)
            else:
                self._add(self.head, first_no, data)
                self.head_bytes += len(data)
        else:
            self._add(self.tail, first_no, data)
            self.tail_bytes += len(data)
        self._trim()

    @staticmethod
    def _add(regions, first_no: int, data: bytes, join: bool = True) -> None:
        # the number of the region's last line (a final newline ends it, it starts none)
        last_no = first_no + data.count(b"\n") - (1 if data.endswith(b"\n") else 0)
        target = regions[-1] if regions and join else None
        if target is not None and first_no <= target[1] + 1:  # adjacent: extend it
            if not target[2].endswith(b"\n"):
                target[2] += b"\n"
            target[2] += data
            target[1] = max(target[1], last_no)
        else:
            regions.append([first_no, last_no, data])

    def _trim(self) -> None:
        while self.tail_bytes > TAIL_BUDGET and len(self.tail) > 1:
            old = self.tail.popleft()
            self.tail_bytes -= len(old[2])
            self.dropped_bytes += len(old[2])
            self.dropped_regions += 1
        if self.tail_bytes > TAIL_BUDGET and self.tail:
            # one region grew past the budget (a marker on every line): keep its end
            last = self.tail[-1]
            data = last[2]
            cut = data.find(b"\n", len(data) - TAIL_BUDGET)
            if cut >= 0:
                cut += 1
                last[0] += data.count(b"\n", 0, cut)
                last[2] = data[cut:]
                self.tail_bytes -= cut
                self.dropped_bytes += cut


def _back_lines(buf: bytes, pos: int, n: int, begin: int) -> int:
    start = pos
    for _ in range(n + 1):
        i = buf.rfind(b"\n", begin, start)
        if i < 0:
            return begin
        start = i
    return start + 1


def _nth_newline_after(buf: bytes, pos: int, n: int, size: int) -> int:
    end = pos
    for _ in range(n):
        i = buf.find(b"\n", end, size)
        if i < 0:
            return size
        end = i + 1
    return end

