"""The pure-Python literal scan of a big log (when Hyperscan is not installed): every
literal of the prefilter found in one pass of a trie regex over the distinct line shapes."""

from __future__ import annotations

import re
from typing import Iterable

from ..engine.fixedruns import runs_in_order
from .prefilter import TRIGGERS, Prefilter

_MASK_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")


def trie_regex(literals: Iterable[bytes], wrap: bool = True) -> bytes:
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


class PyLiteralFinder:
    """The pure-Python scan: every occurrence of every literal found in one pass of a
    trie regex (`trie_regex`), each literal in its pattern's own case, and each hit kept
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
        self.rx = re.compile(b"(?=(" + trie_regex(masked) + b"))")
        self.first_set = set(self.first)
        # a literal's text up to one of its spaces (masked), at a line's end -> literals
        self.ends: dict[bytes, set[bytes]] = {}
        for lit in self.checks:
            for k, ch in enumerate(lit):
                if ch == 32 and k:
                    self.ends.setdefault(lit[:k].translate(_MASK_DIGITS), set()).add(lit)
        self.rx_end = (re.compile(b"(?=(" + trie_regex([e + b"\n" for e in self.ends], wrap=False) + b"))")
                       if self.ends else None)
        # a literal " xyz ..." whose leading space was a line break: its first word at a line's start
        self.heads: dict[bytes, set[bytes]] = {}
        for lit in self.checks:
            if lit[:1] == b" " and lit.strip():
                self.heads.setdefault(b"\n" + lit[1:].split(b" ")[0].translate(_MASK_DIGITS), set()).add(lit)
        self.rx_head = (re.compile(b"(?=(" + trie_regex(list(self.heads), wrap=False) + b"))")
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
