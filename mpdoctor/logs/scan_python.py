"""The pure-Python literal scan of a big log (when Hyperscan is not installed): every
literal of the prefilter found in one pass of a trie regex over the distinct line shapes,
each hit kept when its line holds the pattern's fixed runs in the pattern's own case."""

from __future__ import annotations

import bisect
import re
from typing import Iterable

from ..engine.fixedruns import runs_in_order
from .prefilter import TRIGGERS, Prefilter

_MASK_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")


def trie_regex(literals: Iterable[bytes]) -> bytes:
    """One regular expression for many literals, as a trie ("ab(?:c|d(?:e)?)"): `re`
    tries a plain alternation branch by branch at every position (hundreds of times
    slower); a trie costs one step per character."""
    root: dict = {}
    for lit in literals:
        node = root
        for ch in lit:
            node = node.setdefault(ch, {})
        node[-1] = {}

    def build(node: dict) -> bytes:
        alts = [re.escape(bytes([k])) + build(v) for k, v in sorted(node.items()) if k != -1]
        if not alts:
            return b""
        body = alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
        return b"(?:" + body + b")?" if -1 in node else body

    return build(root) or b"(?!x)x"


class PyLiteralFinder:
    """The pure-Python scan: every occurrence of every literal (lower-cased) found in one
    pass of a trie regex (`trie_regex`) over the lower-cased text, and each hit kept only
    when its line holds the pattern's fixed runs, in the pattern's case
    (Prefilter.checks): the lines Hyperscan's expressions keep, or fewer.

    A training log repeats a few line shapes with other numbers: the lines are
    deduplicated with their digits masked (their case kept), and only the distinct shapes
    are searched. Masking digits only widens a literal (fp16 -> fp00); a hit whose literal
    or runs hold a digit is checked again on each real line. The result is the same hits
    as searching every line for every literal, at a fraction of the passes."""

    engine = "python"

    def __init__(self, spec: Prefilter):
        # lower-cased literal -> [(runs, caseless)] to check on its line (None: keep every hit)
        self.checks: dict[bytes, list | None] = {}

        def add(lit: str, checks: list | None) -> None:
            key = lit.lower().encode("utf-8")
            if not key:
                return
            enc = None if checks is None else [
                (tuple(tuple(a.encode("utf-8") for a in step) for step in runs), c) for runs, c in checks]
            if key in self.checks:
                prev = self.checks[key]
                self.checks[key] = None if prev is None or enc is None else prev + enc
            else:
                self.checks[key] = enc

        for t in TRIGGERS:
            add(t, None)
        if spec.checks:
            for (lit, _caseless), checks in sorted(spec.checks.items()):
                add(lit, checks)
        else:
            for lit in spec.literals:
                add(lit, None)
        self.first = sorted({lit.lower().encode("utf-8") for lit in spec.first_literals} - {b""})
        # masked literal -> the real literals it stands for; which are prefixes of which
        self.real: dict[bytes, list[bytes]] = {}
        for lit in [*self.checks, *self.first]:
            self.real.setdefault(lit.translate(_MASK_DIGITS), []).append(lit)
        masked = sorted(self.real)
        self.prefixes = {m: [p for p in masked if m.startswith(p)] for m in masked}
        self.rx = re.compile(b"(?=(" + trie_regex(masked) + b"))")
        self.first_set = set(self.first)

    def positions(self, buf: bytes) -> list[int]:
        low = buf.lower()
        out: list[int] = []
        lines = buf.translate(_MASK_DIGITS).split(b"\n")
        shapes = dict.fromkeys(lines)
        if len(shapes) * 4 > len(lines):
            del lines, shapes
            self._scan_text(buf, low, out)
        else:
            self._scan_shapes(buf, low, lines, shapes, out)
        out.sort()
        return out

    def _hits(self, text: bytes):
        """(start, literal) of every occurrence of every literal in `text` (masked)."""
        real, prefixes = self.real, self.prefixes
        for m in self.rx.finditer(text):
            for p in prefixes[m.group(1)]:
                for lit in real[p]:
                    yield m.start(), lit

    def _verdict(self, text: bytes, low: bytes, lit: bytes, start: int, end: int) -> bool:
        """Whether a hit of `lit` on the line text[start:end] is kept (`low`: the text
        lower-cased, for the runs of a caseless pattern)."""
        checks = self.checks.get(lit, None)
        if checks is None:
            return True
        return any(runs_in_order(low if c else text, runs, start, end) for runs, c in checks)

    def _scan_text(self, buf: bytes, low: bytes, out: list[int]) -> None:
        """Every line searched (lines that do not repeat)."""
        done: dict[bytes, int] = {}  # literal -> end of the last line it was judged on
        firsts: set[bytes] = set()
        for i, lit in self._hits(low.translate(_MASK_DIGITS)):
            if not low.startswith(lit, i):
                continue  # masking made it match (another number)
            if lit in self.first_set and lit not in firsts:
                firsts.add(lit)
                out.append(i)
            if lit not in self.checks or i < done.get(lit, -1):
                continue  # one verdict per line
            start = low.rfind(b"\n", 0, i) + 1
            end = low.find(b"\n", i)
            end = len(low) if end < 0 else end
            done[lit] = end
            if self._verdict(buf, low, lit, start, end):
                out.append(i)

    def _scan_shapes(self, buf: bytes, low: bytes, lines: list[bytes], shapes: dict, out: list[int]) -> None:
        """Only the distinct line shapes searched; their verdicts given to every line."""
        shape_list = list(shapes)
        text = b"\n" + b"\n".join(shape_list)  # each shape after a line break
        text_low = text.lower()
        keep: set[bytes] = set()  # shapes every line of which is kept
        verify: dict[bytes, list[bytes]] = {}  # shapes whose lines are checked one by one
        firsts: dict[bytes, bytes] = {}  # first literal -> a shape holding it
        starts = [1]
        for ln in shape_list:
            starts.append(starts[-1] + len(ln) + 1)
        for i, lit in self._hits(text_low):
            k = bisect.bisect_right(starts, i) - 1
            if not 0 <= k < len(shape_list):
                continue
            shape = shape_list[k]
            if i + len(lit) > starts[k] + len(shape):
                continue  # across two shapes: not a real line
            if lit in self.first_set:
                firsts.setdefault(lit, shape)
            if lit not in self.checks or shape in keep:
                continue
            if _has_digit(lit) or self._checks_have_digits(lit):
                verify.setdefault(shape, []).append(lit)
            elif self._verdict(text, text_low, lit, starts[k], starts[k] + len(shape)):
                keep.add(shape)
        first_lits: dict[bytes, list[bytes]] = {}
        for lit, shape in firsts.items():
            first_lits.setdefault(shape, []).append(lit)
        if not keep and not verify and not first_lits:
            return
        pos = 0
        for ln in lines:
            if ln in keep:
                out.append(pos)
            elif ln in verify:
                end = pos + len(ln)
                for lit in verify[ln]:
                    if low.find(lit, pos, end) >= 0 and self._verdict(buf, low, lit, pos, end):
                        out.append(pos)
                        break
            if ln in first_lits:
                end = pos + len(ln)
                for lit in first_lits.pop(ln):
                    if low.find(lit, pos, end) >= 0:
                        out.append(pos)
                    else:  # a digit differs: look on
                        _first_anywhere(low, lit, pos, out)
            pos += len(ln) + 1

    def _checks_have_digits(self, lit: bytes) -> bool:
        checks = self.checks.get(lit)
        return bool(checks) and any(_has_digit(a) for runs, _c in checks for step in runs for a in step)


def _has_digit(b: bytes) -> bool:
    return len(b.translate(None, b"0123456789")) != len(b)


def _first_anywhere(low: bytes, lit: bytes, pos: int, out: list[int]) -> None:
    j = low.find(lit, pos)
    if j >= 0:
        out.append(j)
