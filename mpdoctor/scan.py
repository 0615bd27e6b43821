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
from .logtext.lines import _LazyRe  # compiled on first use: explain's start

Progress = Callable[[int, "int | None"], None]  # (bytes read so far, total size or None)

# Memory is bounded by what is kept, not by the log: a kept line costs about four times
# its bytes once normalised and matched, so the whole read and the kept regions are
# capped at a few MB (peak well under 200 MB whatever the log, with a marker on every line).
WHOLE_LIMIT = 4 * 1024 * 1024  # read whole up to this size
CHUNK = 16 * 1024 * 1024  # read at a time: the scan is as fast, and memory stays low
LINES_BEFORE = 80  # the traceback above an error line
LINES_AFTER = 40  # the message below a header or an error line
HEAD_BUDGET = 1 * 1024 * 1024  # region bytes kept from the start of the log
TAIL_BUDGET = 3 * 1024 * 1024  # ... and from its end (regions between are dropped, counted)

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


# C0 control bytes a text log does not hold (tab, line breaks, form feed and ESC it may)
_CONTROLS = bytes(c for c in range(32) if c not in (9, 10, 11, 12, 13, 27)) + b"\x7f"
_NUL_RUN = _LazyRe(rb"\x00{8,}")


def sniff_encoding(sample: bytes) -> str | None:
    """The encoding of a log from its first bytes, or None when it is not text.

    Text as people have it: a byte-order mark (UTF-8/16/32); UTF-16 or UTF-32 without
    one, by where its NUL bytes fall (PowerShell's `>` writes UTF-16); NUL padding a
    crash left (skipped); UTF-8, else the legacy encoding that decodes cleanly
    (GB18030/GBK, Shift-JIS, cp1252). Binary is what has control bytes a log does not
    (an ELF, a PNG, random bytes) or decodes as nothing."""
    if sample.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    if sample.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    body = sample.rstrip(b"\x00")
    n = len(body) - len(body) % 4
    if n >= 8:
        q = n // 4
        z = [body[i:n:4].count(0) for i in range(4)]
        if z[2] >= 0.95 * q and z[3] >= 0.95 * q and z[0] < 0.05 * q:
            return "utf-32-le"
        if z[0] >= 0.95 * q and z[1] >= 0.95 * q and z[3] < 0.05 * q:
            return "utf-32-be"
        h = n // 2
        even, odd = z[0] + z[2], z[1] + z[3]
        if odd >= 0.3 * h and even < 0.02 * h:
            return "utf-16-le"
        if even >= 0.3 * h and odd < 0.02 * h:
            return "utf-16-be"
    body = _NUL_RUN.sub(b"", body)  # padding in the middle: a crash, then more log
    if not body:
        return None if sample else "utf-8"
    controls = len(body) - len(body.translate(None, _CONTROLS))
    if controls > len(body) * 0.05:  # random bytes have ~10%, a terminal capture a few BELs
        return None
    import codecs

    def clean(enc: str) -> str | None:
        try:  # a character cut at the sample's end is not an error
            return codecs.getincrementaldecoder(enc)("strict").decode(body, final=False)
        except (UnicodeDecodeError, LookupError):
            return None

    text = clean("utf-8")
    if text is not None:
        return None if text.count("\ufffd") > len(text) * 0.15 else "utf-8"
    sjis = clean("shift_jis")
    if sjis is not None:
        wide = sum(1 for ch in sjis if ord(ch) > 127)
        if wide and sum(1 for ch in sjis if "\u3040" <= ch <= "\u30ff") > wide * 0.05:
            return "shift_jis"
    if clean("gb18030") is not None:
        return "gb18030"
    if sjis is not None:
        return "shift_jis"
    if clean("cp1252") is not None:
        return "cp1252"
    text = body.decode("utf-8", errors="replace")
    return None if text.count("\ufffd") > len(text) * 0.15 else "utf-8"


def looks_binary(sample: bytes) -> bool:
    return sniff_encoding(sample) is None


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


_MARKUP = _LazyRe(rb"\*\*|`")
_PERCENT = _LazyRe(rb"%(?!0[aAdD])([0-9A-Fa-f]{2})")
# (the colon first: `re` then skips to each colon at memchr speed, where a pattern that
# starts with lookbehinds is tried at every byte, ~150 ms per MB)
_GLUED_COLON = _LazyRe(rb":(?:(?<=rror:)|(?<=ception:)|(?<=arning:)|(?<=ailed:)|(?<=FAILED:)|(?<=ERROR:))(?=[A-Za-z])")


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


_MASK_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")


def _trie_regex(literals: Iterable[bytes], wrap: bool = True) -> bytes:
    """One regular expression for many literals, as a trie ("ab(?:c|d(?:e)?)"): `re`
    tries a plain alternation branch by branch at every position (hundreds of times
    slower); a trie costs one step per character. A space of a literal also matches a
    line break (a paste wrapped there)."""
    root: dict = {}
    for lit in literals:
        node = root
        for ch in lit:
            node = node.setdefault(ch, {})
        node[-1] = {}

    def build(node: dict) -> bytes:
        alts = [(b"[ \n]" if k == 32 and wrap else re.escape(bytes([k]))) + build(v)
                for k, v in sorted(node.items()) if k != -1]
        if not alts:
            return b""
        body = alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
        return b"(?:" + body + b")?" if -1 in node else body

    return build(root) or b"(?!x)x"


class _PyLiteralFinder:
    """The pure-Python scan: every occurrence of every literal found in one pass of a
    trie regex (`_trie_regex`), each literal in its pattern's own case, and each hit kept
    only when its line also holds the pattern's other fixed runs (Prefilter.checks).

    A training log repeats a few line shapes with other numbers: the lines are
    deduplicated with their digits masked, and only the distinct shapes are searched
    (and, for a literal a wrap split over a line break, the shapes that end with its text
    up to a space or start with its text after a leading space, checked line by line).
    Masking digits only widens a literal (fp16 -> fp00); a hit whose literal or runs hold
    a digit is checked again on each real line. The result is the same hits as searching
    every line for every literal, at a fraction of the passes."""

    engine = "python"

    def __init__(self, spec: Prefilter):
        self.exact: list[tuple[bytes, bool, list | None]] = []  # case-sensitive: one pass each
        self.checks: dict[bytes, list | None] = {}  # caseless literal -> checks (None: keep)
        seen: set[tuple[bytes, bool]] = set()

        def add(lit: str, caseless: bool, checks: list | None) -> None:
            key = ((lit.lower() if caseless else lit).encode("utf-8"), caseless)
            if key in seen or not key[0]:
                return
            seen.add(key)
            enc = None if checks is None else [
                (tuple(tuple((a.lower() if c else a).encode("utf-8") for a in step) for step in runs), c)
                for runs, c in checks]
            if caseless and (enc is None or all(c for _, c in enc)):
                self.checks[key[0]] = enc
            else:
                self.exact.append((key[0], caseless, enc))

        for t in TRIGGERS:
            add(t, True, None)
        if spec.checks:
            for (lit, caseless), checks in sorted(spec.checks.items()):
                add(lit, caseless, checks)
        else:
            for lit in spec.literals:
                add(lit, True, None)
        self.first = sorted({lit.lower().encode("utf-8") for lit in spec.first_literals} - {b""})
        # masked literal -> the real literals it stands for; which are prefixes of which
        self.real: dict[bytes, list[bytes]] = {}
        for lit in [*self.checks, *self.first]:
            self.real.setdefault(lit.translate(_MASK_DIGITS), []).append(lit)
        masked = sorted(self.real)
        self.prefixes = {m: [p for p in masked if m.startswith(p)] for m in masked}
        self.rx = re.compile(b"(?=(" + _trie_regex(masked) + b"))")
        self.first_set = set(self.first)
        # a literal's text up to one of its spaces (masked), at a line's end -> literals
        self.ends: dict[bytes, set[bytes]] = {}
        for lit in self.checks:
            for k, ch in enumerate(lit):
                if ch == 32 and k:
                    self.ends.setdefault(lit[:k].translate(_MASK_DIGITS), set()).add(lit)
        self.rx_end = (re.compile(b"(?=(" + _trie_regex([e + b"\n" for e in self.ends], wrap=False) + b"))")
                       if self.ends else None)
        # a literal " xyz ..." whose leading space was a line break: its first word at a line's start
        self.heads: dict[bytes, set[bytes]] = {}
        for lit in self.checks:
            if lit[:1] == b" " and lit.strip():
                self.heads.setdefault(b"\n" + lit[1:].split(b" ")[0].translate(_MASK_DIGITS), set()).add(lit)
        self.rx_head = (re.compile(b"(?=(" + _trie_regex(list(self.heads), wrap=False) + b"))")
                        if self.heads else None)
        self._low_lines: list[bytes] = []

    def positions(self, buf: bytes) -> list[int]:
        low = buf.lower()
        masked = low.translate(_MASK_DIGITS)
        out: list[int] = []
        lines = masked.split(b"\n")
        shapes = dict.fromkeys(lines)
        if len(shapes) * 4 > len(lines):
            self._scan_text(low, masked, out)
        else:
            self._low_lines = low.split(b"\n")
            self._scan_shapes(low, lines, shapes, out)
            self._low_lines = []
        for lit, caseless, checks in self.exact:  # rare: a pattern that is case-sensitive
            _find_each(buf, low, lit, caseless, checks, out)
        out.sort()
        return out

    def _hits(self, text: bytes):
        """(start, literal) of every occurrence of every literal in `text` (masked)."""
        real, prefixes = self.real, self.prefixes
        for m in self.rx.finditer(text):
            found = m.group(1)
            if b"\n" in found:
                found = found.replace(b"\n", b" ")
            for p in prefixes[found]:
                for lit in real[p]:
                    yield m.start(), lit

    def _verdict(self, low: bytes, masked: bytes, i: int, lit: bytes, start: int, end: int) -> bool:
        """Whether the hit of `lit` at i in the line low[start:end] is kept."""
        if low is not masked and not low.startswith(lit, i):
            return False  # masking made it match (another number)
        checks = self.checks.get(lit, None)
        if checks is None:
            return True
        return any(runs_in_order(low, runs, start, end) for runs, _c in checks)

    def _scan_text(self, low: bytes, masked: bytes, out: list[int]) -> None:
        """Every line searched (lines that do not repeat)."""
        done: dict[bytes, int] = {}  # literal -> end of the last line it was judged on
        firsts: set[bytes] = set()
        for i, lit in self._hits(masked):
            if lit in self.first_set and lit not in firsts and low.startswith(lit, i):
                firsts.add(lit)
                out.append(i)
            if lit not in self.checks:
                continue
            if masked.find(b"\n", i, i + len(lit)) >= 0:
                out.append(i)  # spans a line break: kept, the matcher joins the lines
                continue
            if i < done.get(lit, -1) or not low.startswith(lit, i):
                continue  # one verdict per line; masking made it match (another number)
            start = low.rfind(b"\n", 0, i) + 1
            end = low.find(b"\n", i)
            end = len(low) if end < 0 else end
            done[lit] = end
            if self._verdict(low, masked, i, lit, start, end):
                out.append(i)

    def _scan_shapes(self, low: bytes, lines: list[bytes], shapes: dict, out: list[int]) -> None:
        """Only the distinct line shapes searched; their verdicts given to every line."""
        text = b"\n" + b"\n".join(shapes)  # each shape after a line break
        keep: set[bytes] = set()  # shapes every line of which is kept
        verify: dict[bytes, list[bytes]] = {}  # shapes whose lines are checked one by one
        firsts: dict[bytes, bytes] = {}  # first literal -> a shape holding it
        lead: set[bytes] = set()  # shapes a literal " xyz" runs onto from the line before
        starts = [1]
        for ln in shapes:
            starts.append(starts[-1] + len(ln) + 1)
        shape_list = list(shapes)
        import bisect

        for i, lit in self._hits(text):
            k = bisect.bisect_right(starts, i) - 1
            if k < 0 or i == starts[k] + len(shape_list[k]):  # at the line break before shape k+1
                nxt = shape_list[k + 1] if k + 1 < len(shape_list) else None
                if (nxt is not None and lit[:1] == b" " and lit in self.checks
                        and i + len(lit) <= starts[k + 1] + len(nxt)):
                    lead.add(nxt)  # the previous line is kept, unchecked, as a break-spanning hit
                continue
            shape = shape_list[k]
            if i + len(lit) > starts[k] + len(shape):
                continue  # across two shapes: not a real line break
            if lit in self.first_set:
                firsts.setdefault(lit, shape)
            if lit not in self.checks or shape in keep:
                continue
            digits = _has_digit(lit) or self._checks_have_digits(lit)
            if digits:
                verify.setdefault(shape, []).append(lit)
            elif self._verdict(text, text, i, lit, starts[k], starts[k] + len(shape)):
                keep.add(shape)
        wanted_first = {shape for shape in firsts.values()}
        first_lits = {}
        for lit, shape in firsts.items():
            first_lits.setdefault(shape, []).append(lit)
        # the three-line runs, for a literal split over a line break by a wrap
        spans = self._spanning(lines)
        if not keep and not verify and not wanted_first and not spans and not lead:
            return
        pos = prev = 0
        for n, ln in enumerate(lines):
            if ln in lead and n:
                out.append(prev)
            if ln in keep:
                out.append(pos)
            elif ln in verify:
                end = pos + len(ln)
                for lit in verify[ln]:
                    j = low.find(lit, pos, end)
                    if j >= 0 and self._verdict(low, low, j, lit, pos, end):
                        out.append(pos)
                        break
            if ln in wanted_first:
                end = pos + len(ln)
                for lit in first_lits.pop(ln, ()):
                    if low.find(lit, pos, end) >= 0:
                        out.append(pos)
                    else:  # a digit differs: look on
                        _first_anywhere(low, lit, pos, out)
                if not first_lits.get(ln):
                    wanted_first.discard(ln)
            if spans and n in spans:
                out.append(pos)
            prev = pos
            pos += len(ln) + 1

    def _checks_have_digits(self, lit: bytes) -> bool:
        checks = self.checks.get(lit)
        return bool(checks) and any(_has_digit(a) for runs, _c in checks for step in runs for a in step)

    def _spanning(self, lines: list[bytes]) -> set[int]:
        """Indices of lines on which a literal with a space starts and runs on over a line
        break (a paste wrapped there): such a line ends with the literal's text up to one
        of its spaces. The distinct shapes that do are found with one trie regex; each
        line of those shapes is then checked with the lines that follow it."""
        shapes = list(dict.fromkeys(lines))
        text = b"\n".join(shapes) + b"\n"
        starts = [0]
        for ln in shapes:
            starts.append(starts[-1] + len(ln) + 1)
        import bisect

        cand: dict[bytes, set[bytes]] = {}
        if self.rx_end is not None:
            for m in self.rx_end.finditer(text):
                k = bisect.bisect_right(starts, m.start()) - 1
                cand.setdefault(shapes[k], set()).update(self.ends[m.group(1)[:-1]])
        head: dict[bytes, set[bytes]] = {}  # shapes that may continue a " xyz" from the line before
        if self.rx_head is not None:
            for m in self.rx_head.finditer(b"\n" + text):
                k = bisect.bisect_right(starts, m.start()) - 1
                if k < len(shapes):
                    head.setdefault(shapes[k], set()).update(self.heads[m.group(1)])
        if not cand and not head:
            return set()
        found: set[int] = set()
        low_lines = self._low_lines
        for n, ln in enumerate(lines):
            if n and ln in head:
                for lit in head[ln]:
                    joined = b" ".join(low_lines[n - 1:n + lit.count(b" ")])
                    if joined.startswith(lit, len(low_lines[n - 1])):
                        found.add(n - 1)
                        break
            lits = cand.get(ln)
            if not lits:
                continue
            for lit in lits:
                joined = b" ".join(low_lines[n:n + lit.count(b" ") + 1])
                first = len(low_lines[n])
                j = joined.find(lit, max(0, first - len(lit)))
                if 0 <= j < first < j + len(lit):
                    found.add(n)
                    break
        return found


def _has_digit(b: bytes) -> bool:
    return len(b.translate(None, b"0123456789")) != len(b)


def _first_anywhere(low: bytes, lit: bytes, pos: int, out: list[int]) -> None:
    j = low.find(lit, pos)
    if j >= 0:
        out.append(j)


def _find_each(buf: bytes, low: bytes, lit: bytes, caseless: bool, checks: list | None, out: list[int]) -> None:
    """One literal, one pass (the case-sensitive ones): each hit whose line passes."""
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
        i = find(lit, end)


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
        self.dropped_regions = 0
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
