"""Matching log rules against normalised lines: each line as written, then case-folded,
then joined with the lines a hard wrap cut it from (wraps.py); the hits become findings
in log_findings.py.

Speed comes from the literal index: every pattern has a fixed step it cannot match
without (fixedruns.best_step), so one search for all of them finds the few lines worth a
regular expression, and only the rules whose literal was seen there are tried on them
(and compiled, the first time they are).
"""

from __future__ import annotations

import bisect

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    import re
    from typing import Any, Iterable

    from ..findings import Finding, Unrecognised
    from ..logtext import Traceback

from ..logtext import MAX_MATCH_CHARS, LogLine
from .fixedruns import best_step
from .log_findings import MAX_EVIDENCE_CHARS, log_findings, same_message
from .rule import Rule
from .wraps import PASTE_CHARS, wrap_joins


class Hit:
    """A pattern's match on a line. `key` is the matched text onwards with its numbers
    masked: what makes two hits the same message whatever stands before it on the line
    (a prefix, a JSON key, a module path); `exact` keeps the numbers, to count distinct
    sightings on lines without a rank. (Plain classes here: see logtext.lines.)"""

    __slots__ = ("line", "facts", "key", "exact")

    def __init__(self, line: LogLine, facts: dict[str, Any], key: str = "", exact: str = ""):
        self.line = line
        self.facts = facts
        self.key = key
        self.exact = exact


class LiteralIndex:
    """Which rules a line may concern, found by searching the lower-cased text for
    literals every match holds (lower-cased, as the case-folded second chance needs).

    A small text (a paste, a traceback: up to SMALL_TEXT characters) is searched for
    each rule's literals (rule.literals: no setup at all, which counts at `explain`'s
    start). A bigger one for the alternatives of each pattern's best fixed step
    (fixedruns.best_step: not a word on every line of a training log, such as "loss",
    when the pattern has a better one), worked out on first use; and when its lines
    repeat a few shapes with other numbers, only the distinct shapes are searched."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.owners: dict[str, list[int]] = {}  # rule literal -> rule indices
        for i, rule in enumerate(self.rules):
            for lit in rule.literals:
                self.owners.setdefault(lit, []).append(i)
        self._steps: dict[str, list[int]] | None = None  # best-step alternative -> rule indices
        self._masked: dict[str, list[str]] | None = None  # ... digits masked -> the alternatives

    def positions(self, low: str, literals: Iterable[str] | None = None) -> Iterable[tuple[int, str]]:
        """(position, literal): the first occurrence of each literal on each line of
        lower-cased `low` (a literal inside a longer one is never hidden). One str.find
        scan per literal: C speed, and no alternation to compile."""
        find = low.find
        for lit in self.owners if literals is None else literals:
            i = find(lit)
            while i >= 0:
                yield i, lit
                # the first occurrence on a line is the one that counts: skip to the next
                nl = find("\n", i)
                if nl < 0:
                    break
                i = find(lit, nl + 1)

    def steps(self) -> dict[str, list[int]]:
        """best-step alternative (lower-cased) -> the rules with a pattern it stands for
        (a pattern with no such step: its rule's literals)."""
        if self._steps is None:
            self._steps = {}
            for i, rule in enumerate(self.rules):
                keys: set[str] = set()
                for rx in rule.patterns:
                    step = best_step(rx)
                    keys.update(rule.literals if step is None else (a.lower() for a in step))
                for lit in sorted(keys):
                    self._steps.setdefault(lit, []).append(i)
            self._masked = {}
            for lit in self._steps:
                self._masked.setdefault(lit.translate(_MASK_DIGITS), []).append(lit)
        return self._steps

    def candidates(self, lows: list[str]) -> dict[int, dict[int, int]]:
        """line index -> {rule index: where its first literal is on the line}, for the
        lower-cased lines `lows`."""
        if sum(map(len, lows)) <= SMALL_TEXT:
            found = self._first_positions(lows, self.owners)
            return {li: _by_rule(self.owners, lits.items()) for li, lits in found.items()}
        steps = self.steps()
        masked = [ln.translate(_MASK_DIGITS) for ln in lows]
        shapes = dict.fromkeys(masked)
        if len(shapes) * 2 > len(masked):  # few repeats: the lines themselves
            found = self._first_positions(lows, steps)
            return {li: _by_rule(steps, lits.items()) for li, lits in found.items()}
        assert self._masked is not None
        shape_list = list(shapes)
        by_shape = self._first_positions(shape_list, self._masked)
        index = {shape: k for k, shape in enumerate(shape_list)}
        per_line: dict[int, dict[int, int]] = {}
        for li, shape in enumerate(masked):
            found_here = by_shape.get(index[shape])
            if not found_here:
                continue
            real: list[tuple[str, int]] = []
            for mlit, at in found_here.items():
                for lit in self._masked[mlit]:
                    # masking may have made it match (another number): the real line decides
                    i = at if lit == mlit else lows[li].find(lit)
                    if i >= 0:
                        real.append((lit, i))
            if real:
                per_line[li] = _by_rule(steps, real)
        return per_line

    def _first_positions(self, texts: list[str], literals: Iterable[str]) -> dict[int, dict[str, int]]:
        """text index -> {literal: its first position in that text}."""
        starts: list[int] = []
        pos = 0
        for t in texts:
            starts.append(pos)
            pos += len(t) + 1
        out: dict[int, dict[str, int]] = {}
        for p, lit in self.positions("\n".join(texts), literals):
            li = bisect.bisect_right(starts, p) - 1
            out.setdefault(li, {}).setdefault(lit, p - starts[li])
        return out


def _by_rule(owners: dict[str, list[int]], found: Iterable[tuple[str, int]]) -> dict[int, int]:
    """{rule index: the first position of a literal of its} from (literal, position)s."""
    slot: dict[int, int] = {}
    for lit, at in found:
        for ri in owners[lit]:
            if ri not in slot or at < slot[ri]:
                slot[ri] = at
    return slot


_MASK_DIGITS = str.maketrans("0123456789", "0000000000")
# Up to this much text (a paste, a traceback) the rules' own literals are searched for.
SMALL_TEXT = 64 * 1024


def _first_match(rule: Rule, text: str, low: str) -> re.Match[str] | None:
    """The first pattern of `rule` that matches `text`, as written, else case-folded
    (a message retyped in other capitals); None, also when an `unless` pattern vetoes."""
    for folded in (False, True):
        for rx in rule.patterns:
            if folded:
                if not rx.may_match_folded(low):
                    continue
                m = rx.search_folded(text)
            else:
                if not rx.may_match(text, low):
                    continue
                m = rx.search(text)
            if m is None:
                continue
            if any(u.search(text) for u in rule.unless):
                return None
            return m
    return None


def _window(text: str, literal_pos: int) -> str:
    if len(text) <= MAX_MATCH_CHARS:
        return text
    half = MAX_MATCH_CHARS // 2
    start = max(0, literal_pos - half)
    return text[start:start + MAX_MATCH_CHARS]


class LogMatcher:
    def __init__(self, rules: Iterable[Rule]):
        self.rules = [r for r in rules if r.kind == "log"]
        self.index = LiteralIndex(self.rules)
        self._by_id = {r.id: r for r in self.rules}

    # -- hits ---------------------------------------------------------------------------

    def hits(self, lines: list[LogLine]) -> dict[int, list[Hit]]:
        """rule index -> its hits, over the view of the log a rule sees: each logical line
        (patterns case-sensitive first, then case-folded), and, where no pattern of a
        rule matched a line on its own, the line joined with the lines a hard wrap cut it
        from (a paste wrapped at a fixed width, a word split in two)."""
        by_rule: dict[int, list[Hit]] = {}
        candidates = self._scan(lines, by_rule, set())
        hit_lines = {(ri, h.line.no) for ri, hs in by_rule.items() for h in hs}
        # a paste is joined everywhere; a bigger text (a log, regions of one) only next to
        # the lines that hold a rule's literal: rarely hard-wrapped, and twice the work
        small = sum(len(ln.text) for ln in lines) <= PASTE_CHARS
        joins = wrap_joins(lines, None if small else candidates)
        if joins:
            self._scan(joins, by_rule, hit_lines)
        return by_rule

    def _scan(self, lines: list[LogLine], by_rule: dict[int, list[Hit]], skip: set[tuple[int, int]]) -> set[int]:
        """Match each rule a line holds a literal of; the indices of those lines."""
        lows = [ln.text.lower() for ln in lines]
        per_line = self.index.candidates(lows)
        for li in sorted(per_line):
            ln = lines[li]
            for ri, at in sorted(per_line[li].items()):
                if skip and ((ri, ln.no) in skip or (ri, ln.no + 1) in skip):
                    continue  # a join never second-guesses a line the rule already matched
                rule = self.rules[ri]
                text = _window(ln.text, at)
                low = lows[li] if text is ln.text else text.lower()
                m = _first_match(rule, text, low)
                if m is None:
                    continue
                facts = {k: v for k, v in m.groupdict().items() if v is not None}
                by_rule.setdefault(ri, []).append(Hit(ln, facts, same_message(text[m.start():]),
                                                      text[m.start():m.start() + MAX_EVIDENCE_CHARS]))
        return set(per_line)

    def findings(self, lines: list[LogLine], tracebacks: list[Traceback],
                 extra_facts: dict[str, Any] | None = None) -> tuple[list[Finding], list[Unrecognised]]:
        """Ranked findings and the exceptions no rule knows (log_findings.py). `extra_facts`,
        what another face observed around this text (the module a run saw raise it), join
        every finding's facts before its templates are rendered."""
        return log_findings(self.rules, self.hits(lines), lines, tracebacks, extra_facts)
