"""Reading a log of any size: small ones whole, big ones as candidate regions.

A log under `WHOLE_LIMIT` is decoded and handed on whole. A bigger one is streamed in
chunks and only the regions around a rule literal (plus the traceback headers) are
kept, so memory stays bounded whatever the log's size. The literal scan uses
Hyperscan when it is installed (it scans at memory speed) and Python's `re` over
bytes when it is not; both find the same literals, so the result is the same.
"""

from __future__ import annotations

import os
import re
import sys
from collections import deque
from typing import BinaryIO, Callable, Iterable

from .engine.fixedruns import runs_in_order

Progress = Callable[[int, "int | None"], None]  # (bytes read so far, total size or None)

WHOLE_LIMIT = 16 * 1024 * 1024  # read whole up to this size
CHUNK = 16 * 1024 * 1024  # read at a time: the scan is as fast, and memory stays low
LINES_BEFORE = 80  # the traceback above an error line
LINES_AFTER = 40  # the message below a header or an error line
HEAD_BUDGET = 16 * 1024 * 1024  # region bytes kept from the start of the log
TAIL_BUDGET = 48 * 1024 * 1024  # ... and from its end

# Always worth a look, whatever the rules say: where tracebacks start.
TRIGGERS = ("Traceback (most recent call last)", "Error: ", "Exception: ")


class InputError(Exception):
    """The input cannot be read as a log. The CLI prints it and exits 2."""


class LogInput:
    """The log as read: regions of (first line number, text), and what was read."""

    __slots__ = ("regions", "info")

    def __init__(self, regions: list[tuple[int, str]], info: dict | None = None):
        self.regions = regions
        self.info = info if info is not None else {}


def looks_binary(sample: bytes) -> bool:
    if not sample:
        return False
    if sample.count(b"\x00") > len(sample) // 100:
        return True
    text = sample.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") + sum(1 for ch in text if ch < " " and ch not in "\t\n\r\x1b\x0c\x0b")
    return bad > len(text) * 0.15


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


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
    if looks_binary(head[:65536]):
        if fh is not sys.stdin.buffer:
            fh.close()
        raise InputError(f"{name} looks like a binary file, not a text log")
    info = {"path": name, "bytes": size if size is not None else len(head)}
    if len(head) <= WHOLE_LIMIT:
        if fh is not sys.stdin.buffer:
            fh.close()
        text = decode(head)
        info.update(lines=text.count("\n") + (0 if text.endswith("\n") else 1), scanned="whole")
        return LogInput([(1, text)], info)
    if callable(literals) and not isinstance(literals, Prefilter):
        literals = literals()
    spec = literals if isinstance(literals, Prefilter) else Prefilter(list(literals))
    scanner = RegionScanner(spec)
    try:
        scanner.feed(head)
        done = len(head)
        while True:
            if progress is not None:
                progress(done, size)
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            done += len(chunk)
            scanner.feed(chunk)
    except OSError as exc:
        raise InputError(f"{name}: read failed ({exc.strerror or exc})") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    regions = scanner.finish()
    info.update(bytes=scanner.total_bytes, lines=scanner.line_count, scanned="regions",
                regions=len(regions), matcher=scanner.engine,
                dropped_bytes=scanner.dropped_bytes)
    return LogInput([(no, decode(b)) for no, b in regions], info)


class Prefilter:
    """What the streaming scan looks for. `skeletons`: one Hyperscan expression per pattern
    (its least common fixed text, engine.prefilter.native_expression), so that a word such as
    "loss" on every line of a training log does not make every line a hit; `literals` and
    `checks`: the same for the pure-Python scan, which checks a hit's line against the
    pattern's other fixed runs."""

    __slots__ = ("literals", "skeletons", "first_literals", "first_skeletons", "checks")

    def __init__(self, literals: list[str], skeletons: list[tuple[bytes, bool]] | None = None,
                 first_literals: list[str] | None = None, first_skeletons: list[tuple[bytes, bool]] | None = None):
        self.literals = literals
        self.skeletons = skeletons or []
        # requires / excludes / context patterns need only the log's first match of
        # each (a context line such as "[rank0]" may be on every line): these are
        # reported once per chunk, so they add a region, not the whole log.
        self.first_literals = first_literals or []
        self.first_skeletons = first_skeletons or []
        # literal -> the patterns' ordered runs (engine.patterns.fixed_runs) that the
        # pure-Python scan checks on a line holding the literal before keeping it
        self.checks: dict[tuple[str, bool], list | None] = {}


_MARKUP = re.compile(rb"\*\*|`")
_PERCENT = re.compile(rb"%(?!0[aAdD])([0-9A-Fa-f]{2})")
_GLUED_COLON = re.compile(rb"(?:(?<=rror)|(?<=ception)|(?<=arning)|(?<=ailed)|(?<=FAILED)|(?<=ERROR)):(?=[A-Za-z])")


def paste_view(buf: bytes) -> bytes:
    """The chunk with the paste folds the normaliser applies to each line
    (logtext.clean.fold_paste): markdown marks and backticks out, URL-encoding undone, a
    glued colon spaced. Never removes a line break, so a line keeps its number."""
    view = buf
    if b"**" in view or b"`" in view:
        view = _MARKUP.sub(b"", view)
    if b"%" in view and _PERCENT.search(view):
        view = _PERCENT.sub(lambda m: bytes([int(m.group(1), 16)]), view)
    if b":" in view and _GLUED_COLON.search(view):
        view = _GLUED_COLON.sub(b": ", view)
    return view


class _PyLiteralFinder:
    """The pure-Python scan: literals found with bytes.find (memchr-fast), each in its
    pattern's own case (so "inf" is not found in every "INFO"), and each hit kept only
    when its line also holds the pattern's other fixed runs (Prefilter.checks)."""

    engine = "python"

    def __init__(self, spec: Prefilter):
        self.scan: list[tuple[bytes, bool, list | None]] = []
        seen: set[tuple[bytes, bool]] = set()

        def add(lit: str, caseless: bool, checks: list | None) -> None:
            key = ((lit.lower() if caseless else lit).encode("utf-8"), caseless)
            if key in seen or not key[0]:
                return
            seen.add(key)
            enc = None if checks is None else [
                (tuple(tuple((a.lower() if c else a).encode("utf-8") for a in step) for step in runs), c)
                for runs, c in checks]
            self.scan.append((key[0], caseless, enc))

        for t in TRIGGERS:
            add(t, True, None)
        if spec.checks:
            for (lit, caseless), checks in sorted(spec.checks.items()):
                add(lit, caseless, checks)
        else:
            for lit in spec.literals:
                add(lit, True, None)
        self.first = [lit.lower().encode("utf-8") for lit in sorted(set(spec.first_literals))]

    def positions(self, buf: bytes) -> list[int]:
        low = buf.lower()
        out: list[int] = []
        # a space of a literal may be a line break where a paste was wrapped: those
        # literals are looked for across lines too (the same length: offsets hold)
        joined = low.replace(b"\n", b" ") if b"\n" in low else low
        for lit, caseless, checks in self.scan:
            if b" " in lit and joined is not low:
                i = joined.find(lit)
                while i >= 0:
                    if low.find(b"\n", i, i + len(lit)) >= 0:
                        out.append(i)  # it spans a line break: kept, the matcher joins the lines
                    i = joined.find(lit, i + 1)
            hay = low if caseless else buf
            find = hay.find
            i = find(lit)
            while i >= 0:
                if checks is None:
                    out.append(i)
                    i = find(lit, i + 1)
                    continue
                start = buf.rfind(b"\n", 0, i) + 1
                end = buf.find(b"\n", i)
                end = len(buf) if end < 0 else end
                if any(runs_in_order(low if c else buf, runs, start, end) for runs, c in checks):
                    out.append(i)
                i = find(lit, end)  # one verdict per line
        for lit in self.first:
            i = low.find(lit)
            if i >= 0:
                out.append(i)
        out.sort()
        return out


class _HyperscanFinder:
    engine = "hyperscan"

    def __init__(self, spec: Prefilter):
        import hyperscan  # optional, fast

        self.hs = hyperscan
        exprs: list[tuple[bytes, int]] = [(re.escape(t.encode()), hyperscan.HS_FLAG_CASELESS) for t in TRIGGERS]
        for expr, caseless in spec.skeletons:
            exprs.append((expr, hyperscan.HS_FLAG_CASELESS if caseless else 0))
        if not spec.skeletons:
            exprs += [(re.escape(lit.encode()), hyperscan.HS_FLAG_CASELESS) for lit in spec.literals]
        for expr, caseless in spec.first_skeletons:  # reported once per chunk
            exprs.append((expr, (hyperscan.HS_FLAG_CASELESS if caseless else 0) | hyperscan.HS_FLAG_SINGLEMATCH))
        exprs = sorted(set(exprs))
        self.db = _cached_database(hyperscan, exprs)

    def positions(self, buf: bytes) -> list[int]:
        out: list[int] = []

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            out.append(to - 1)

        self.db.scan(buf, match_event_handler=on_match)
        out.sort()
        return out


def _cached_database(hyperscan, exprs: list[tuple[bytes, int]]):
    """Compile (a second or so for a few hundred skeletons) or load the database compiled
    for the same expressions before, from the rule cache folder."""
    import hashlib

    from .engine.rulecache import cache_dir

    key = hashlib.sha256(repr((hyperscan.__version__ if hasattr(hyperscan, "__version__") else "",
                               exprs)).encode()).hexdigest()[:24]
    path = cache_dir() / f"hs-{key}.db"
    if os.environ.get("MPDOCTOR_NO_CACHE") != "1":
        try:
            db = hyperscan.loadb(path.read_bytes(), hyperscan.HS_MODE_BLOCK)
            db.scratch = hyperscan.Scratch(db)  # a loaded database comes without one
            return db
        except Exception:  # missing, stale or from another build: compile
            pass
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[e for e, _ in exprs], ids=list(range(len(exprs))), elements=len(exprs),
               flags=[f | hyperscan.HS_FLAG_PREFILTER for _, f in exprs])
    if os.environ.get("MPDOCTOR_NO_CACHE") != "1":
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(hyperscan.dumpb(db))
            os.replace(tmp, path)
        except Exception:
            pass
    return db


def literal_finder(spec: Prefilter):
    if os.environ.get("MPDOCTOR_NO_HYPERSCAN") != "1":
        try:
            return _HyperscanFinder(spec)
        except ImportError:  # not installed, or no wheel for this platform
            pass
        except Exception:  # an expression Hyperscan refuses: the pure-Python scan is exact too
            pass
    return _PyLiteralFinder(spec)


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
        self.pending_after = 0  # lines still wanted after the previous buffer
        self.line_count = 0

    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        buf = self.carry + data
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) < CHUNK:  # a very long line: wait for its end
                self.carry = buf
                return
            cut = len(buf)
        self._scan(buf[:cut])
        self.carry = buf[cut:]

    def finish(self) -> list[tuple[int, bytes]]:
        if self.carry:
            self._scan(self.carry)
            self.carry = b""
        regions = [(r[0], r[2]) for r in self.head] + [(r[0], r[2]) for r in self.tail]
        return regions

    def _scan(self, buf: bytes) -> None:
        base = self.line_base
        spans: list[tuple[int, int]] = []
        if self.pending_after:
            spans.append((0, _nth_newline_after(buf, 0, self.pending_after)))
        end_wanted = 0
        for pos in _positions_in(self.finder, buf):
            if pos < end_wanted:
                continue
            start = _back_lines(buf, pos, LINES_BEFORE)
            end = _nth_newline_after(buf, pos, LINES_AFTER)
            spans.append((start, end))
            end_wanted = end
        # Lines still wanted after the buffer's end belong to the next one.
        self.pending_after = LINES_AFTER if spans and spans[-1][1] >= len(buf) else 0
        merged: list[list[int]] = []
        for s, e in sorted(spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        for s, e in merged:
            first_no = base + buf.count(b"\n", 0, s) + 1
            chunk = buf[s:e]
            self._keep(first_no, chunk)
        newlines = buf.count(b"\n")
        self.line_base = base + newlines
        self.line_count = self.line_base + (0 if buf.endswith(b"\n") else 1)

    def _keep(self, first_no: int, data: bytes) -> None:
        # the number of the region's last line (a final newline ends it, it starts none)
        last_no = first_no + data.count(b"\n") - (1 if data.endswith(b"\n") else 0)
        # Adjacent to the last kept region: extend it.
        target = self.tail[-1] if self.tail else (self.head[-1] if self.head else None)
        if target is not None and first_no <= target[1] + 1:
            overlap = target[1] - first_no + 1
            if overlap > 0:
                data = data.split(b"\n", overlap)[-1] if data.count(b"\n") >= overlap else b""
            if data:
                if not target[2].endswith(b"\n"):
                    target[2] += b"\n"
                target[2] += data
                target[1] = max(target[1], last_no)
                if self.tail:
                    self.tail_bytes += len(data)
                else:
                    self.head_bytes += len(data)
            self._trim()
            return
        region = [first_no, last_no, data]
        if self.head_bytes + len(data) <= HEAD_BUDGET and not self.tail:
            self.head.append(region)
            self.head_bytes += len(data)
        else:
            self.tail.append(region)
            self.tail_bytes += len(data)
        self._trim()

    def _trim(self) -> None:
        while self.tail_bytes > TAIL_BUDGET and len(self.tail) > 1:
            old = self.tail.popleft()
            self.tail_bytes -= len(old[2])
            self.dropped_bytes += len(old[2])


def _positions_in(finder, buf: bytes) -> list[int]:
    """The finder's hits over the chunk's paste view, as offsets into the chunk itself
    (the view removes characters but no line break: a hit keeps its line)."""
    view = paste_view(buf)
    found = finder.positions(view)
    if view is buf or not found:
        return found
    import bisect

    view_lines = [m.start() for m in re.finditer(b"\n", view)]
    buf_lines = [m.start() for m in re.finditer(b"\n", buf)]
    out = []
    for pos in found:
        line = bisect.bisect_left(view_lines, pos)
        out.append(buf_lines[line - 1] + 1 if line > 0 else 0)
    return out


def _back_lines(buf: bytes, pos: int, n: int) -> int:
    start = pos
    for _ in range(n + 1):
        i = buf.rfind(b"\n", 0, start)
        if i < 0:
            return 0
        start = i
    return start + 1


def _nth_newline_after(buf: bytes, pos: int, n: int) -> int:
    end = pos
    for _ in range(n):
        i = buf.find(b"\n", end)
        if i < 0:
            return len(buf)
        end = i + 1
    return end
