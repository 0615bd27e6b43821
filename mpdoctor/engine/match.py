"""Matching log rules against normalised lines, and turning hits into findings.

Speed comes from the literal prefilter: every pattern has literals it cannot match
without (engine.patterns derives them), so one scan for all literals finds the few
lines worth a regular expression, and only the rules whose literal was seen there are
tried on them (and compiled, the first time they are).
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Iterable

from ..findings import Evidence, Finding, Unrecognised, rank_findings
from ..logtext import MAX_MATCH_CHARS, LazyRe, LogLine, Traceback
from .assemble import assemble, supersede
from .fixedruns import best_step
from .rule import Rule

MAX_EVIDENCE = 4
MAX_EVIDENCE_CHARS = 400
_DIGITS = LazyRe(r"\d+")
# "torch.cuda.OutOfMemoryError: ..." and "OutOfMemoryError: ..." are the same message.
_QUALIFIED = LazyRe(r"^[\"']?(?:[A-Za-z_]\w{0,60}\.){1,8}(?=[A-Z]\w{0,80}:)")


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
    """Which rules a line may concern. Each pattern is indexed by the alternatives of its
    best fixed step (fixedruns.best_step: every match holds one, and none is a word on
    every line of a training log when the pattern has a better one), lower-cased, as the
    case-folded second chance needs; a pattern with no such step by its rule's literals."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.owners: dict[str, list[int]] = {}
        self._masked: dict[str, list[str]] | None = None  # digits masked -> the literals
        for i, rule in enumerate(self.rules):
            keys: set[str] = set()
            for rx in rule.patterns:
                step = best_step(rx)
                keys.update(rule.literals if step is None else (a.lower() for a in step))
            for lit in sorted(keys):
                self.owners.setdefault(lit, []).append(i)

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

    def candidates(self, lows: list[str]) -> dict[int, dict[int, int]]:
        """line index -> {rule index: where its first literal is on the line}, for the
        lower-cased lines `lows`. A log repeats a few line shapes with other numbers: when
        it does, only the distinct shapes (digits masked) are searched, and a literal with
        a digit is looked up again on each line of its shape."""
        masked = [ln.translate(_MASK_DIGITS) for ln in lows]
        shapes = dict.fromkeys(masked)
        if len(shapes) * 2 > len(masked):  # few repeats: the lines themselves
            found = self._first_positions(lows, self.owners)
            return {li: self._by_rule(lits.items()) for li, lits in found.items()}
        if self._masked is None:
            self._masked = {}
            for lit in self.owners:
                self._masked.setdefault(lit.translate(_MASK_DIGITS), []).append(lit)
        shape_list = list(shapes)
        by_shape = self._first_positions(shape_list, self._masked)
        index = {shape: k for k, shape in enumerate(shape_list)}
        per_line: dict[int, dict[int, int]] = {}
        for li, shape in enumerate(masked):
            found = by_shape.get(index[shape])
            if not found:
                continue
            real: list[tuple[str, int]] = []
            for mlit, at in found.items():
                for lit in self._masked[mlit]:
                    # masking may have made it match (another number): the real line decides
                    i = at if lit == mlit else lows[li].find(lit)
                    if i >= 0:
                        real.append((lit, i))
            if real:
                per_line[li] = self._by_rule(real)
        return per_line

    def _by_rule(self, found: Iterable[tuple[str, int]]) -> dict[int, int]:
        slot: dict[int, int] = {}
        for lit, at in found:
            for ri in self.owners[lit]:
                if ri not in slot or at < slot[ri]:
                    slot[ri] = at
        return slot

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


_MASK_DIGITS = str.maketrans("0123456789", "0000000000")


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


# A line cut by a hard wrap: what does not start a line of its own.
_NEW_THING = LazyRe(r"^(?:File \"|Traceback \(|During handling|The above exception|\[?[\w.]{0,60}(?:Error|Exception|Warning)\b|"
                        r"\d{4}-\d\d-\d\d|\[rank\d|#\d+ |[-=*#|>]{2})")
_ENDS_WORD = LazyRe(r"[A-Za-z0-9_]$")
MAX_JOIN = 3
# Up to this much text (a paste: a GitHub comment holds 64K characters) every line may
# be a wrap's; in more, only the lines next to a rule's literal.
PASTE_CHARS = 64 * 1024


def wrap_width(lines: list[LogLine]) -> int | None:
    """The column a paste was hard-wrapped at, when it was: at least three lines end
    within a word's length of the longest one, and that is 40-300 characters."""
    lengths = [len(ln.raw or ln.text) for ln in lines if ln.text]
    if len(lengths) < 3:
        return None
    width = max(lengths)
    if not 40 <= width <= 300:
        return None
    near = sum(1 for n in lengths if n >= width - 12)
    return width if near >= 3 else None


def wrap_joins(lines: list[LogLine], near: set[int] | None = None) -> list[LogLine]:
    """The logical lines a hard wrap may have cut, joined again (each join twice: with a
    space, as a wrap at a space; and without, as a word split in two). They keep the
    first line's number, so that evidence points at where the message starts. `near`:
    only the joins that take in one of these line indices (None: every line)."""
    width = wrap_width(lines)
    out: list[LogLine] = []
    starts: range | list[int] = range(len(lines) - 1)
    if near is not None:
        starts = sorted({i for n in near for i in range(n - MAX_JOIN + 1, n + 1) if 0 <= i < len(lines) - 1})
    for i in starts:
        group = [lines[i]]
        for j in range(i + 1, min(i + MAX_JOIN, len(lines))):
            a, b = group[-1], lines[j]
            if not _wrapped(a, b, width):
                break
            group.append(b)
            for sep in (" ", ""):
                text = sep.join(x.text.strip() if k else x.text.rstrip() for k, x in enumerate(group))
                raw = " ".join((x.raw or x.text).strip() for x in group)
                out.append(LogLine(group[0].no, text, group[0].rank, raw, group[0].stream))
                if not (_ENDS_WORD.search(a.text) and b.text[:1].isalnum()):
                    break  # not cut inside a word: the spaced join is the only one
    return out


_EXCEPTION_START = LazyRe(r"^[\w.]{0,80}(?:Error|Exception|Warning)\b:? ")


def _wrapped(a: LogLine, b: LogLine, width: int | None) -> bool:
    """Could `b` be the rest of `a`, cut by a wrap? (A join is only ever a second chance
    for a rule that matched neither line alone.)"""
    if b.no != a.no + 1 or a.stream != b.stream or (b.rank is not None and b.rank != a.rank):
        return False
    at, bt = a.text.rstrip(), b.text.strip()
    if len(at) < 20 or not bt or _NEW_THING.match(bt):
        return False
    if width is not None and len(a.raw or a.text) >= width - 30:
        return True  # a paste wrapped at a fixed column (at a space: the next word did not fit)
    if _EXCEPTION_START.match(at):
        return True  # an exception's message continued on the next line
    # a word cut in two at the end of a long line ("collective opera" / "tion timeout")
    return len(at) >= 40 and bool(_ENDS_WORD.search(at)) and bt[:1].islower()


def _window(text: str, literal_pos: int) -> str:
    if len(text) <= MAX_MATCH_CHARS:
        return text
    half = MAX_MATCH_CHARS // 2
    start = max(0, literal_pos - half)
    return text[start:start + MAX_MATCH_CHARS]


def _same_message(text: str) -> str:
    """What makes two hits 'the same message': the text with its numbers masked, so the
    same OOM on GPU 0 and GPU 1 (or on eight ranks) is one finding seen N times."""
    text = _QUALIFIED.sub("", text.strip()[:MAX_EVIDENCE_CHARS * 2])
    return _DIGITS.sub("#", text)[:MAX_EVIDENCE_CHARS]


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
                by_rule.setdefault(ri, []).append(Hit(ln, facts, _same_message(text[m.start():]),
                                                      text[m.start():m.start() + MAX_EVIDENCE_CHARS]))
        return set(per_line)

    # -- findings -----------------------------------------------------------------------

    def findings(self, lines: list[LogLine], tracebacks: list[Traceback],
                 extra_facts: dict[str, Any] | None = None) -> tuple[list[Finding], list[Unrecognised]]:
        """Ranked findings and the exceptions no rule knows. `extra_facts`, what another
        face observed around this text (the module a run saw raise it), join every
        finding's facts before its templates are rendered."""
        by_rule = self.hits(lines)
        findings: list[Finding] = []
        explained: set[int] = set()  # roots of the chains a finding explains, then every member
        tb_of: dict[int, int | None] = {}  # id(finding) -> index of its traceback
        tb_starts = [t.start for t in tracebacks]
        roots = _chain_roots(tracebacks)
        whole = _WholeLog(lines)
        for ri, hits in by_rule.items():
            rule = self.rules[ri]
            if len(hits) < rule.min_count:
                continue
            if rule.requires and not any(whole.search(rx) for rx in rule.requires):
                continue
            if rule.excludes and any(whole.search(rx) for rx in rule.excludes):
                continue
            finding, t_i = self._finding(rule, hits, whole, tracebacks, tb_starts, explained, extra_facts, roots)
            findings.append(finding)
            tb_of[id(finding)] = t_i
        # a chain of exceptions is explained whole when one of its links is: one pass
        explained = {i for i, r in enumerate(roots) if r in explained}
        findings = supersede(findings, self._by_id)
        _causes_first(findings, tb_of, tracebacks)
        unrecognised = _unrecognised(tracebacks, explained, findings)
        if all(f.consequence for f in findings):
            # the last line of defence: no rule found a cause (at most a launcher's echo),
            # yet an error is there, in words a rule knows
            from .likely import likely_findings

            likely, unrecognised = likely_findings(lines, unrecognised, self.rules, extra_facts, findings)
            findings += likely
        return rank_findings(findings), unrecognised

    def _finding(self, rule: Rule, hits: list[Hit], whole: "_WholeLog", tracebacks: list[Traceback],
                 tb_starts: list[int], explained: set[int],
                 extra_facts: dict[str, Any] | None = None,
                 roots: list[int] | None = None) -> tuple[Finding, int | None]:
        facts: dict[str, Any] = dict(hits[0].facts)
        for h in hits[1:]:
            for k, v in h.facts.items():
                facts.setdefault(k, v)
        for rx in rule.context:
            m = whole.search(rx)
            if m:
                for k, v in m.groupdict().items():
                    if v is not None:
                        facts.setdefault(k, v)
        tb = None
        tb_index = None
        for h in hits:
            t_i = _traceback_of(h.line, tracebacks, tb_starts)
            if t_i is None:
                continue
            # the chain this traceback belongs to is explained: its root stands for it
            # (findings() expands roots to members once; a walk per hit was quadratic)
            explained.add(roots[t_i] if roots is not None else t_i)
            if tb is None:
                tb, tb_index = tracebacks[t_i], t_i
        # One evidence line per distinct message (numbers masked); the rest is a count.
        evidence_lines: list[LogLine] = []
        kinds: set[str] = set()
        used_lines: set[int] = set()
        for h in hits:
            key = h.key
            if key in kinds or h.line.no in used_lines:
                continue
            kinds.add(key)
            used_lines.add(h.line.no)
            if len(evidence_lines) < MAX_EVIDENCE - 1:
                evidence_lines.append(h.line)
        if tb is not None:
            if tb.exc_type:
                facts.setdefault("exception", tb.exc_type)
            uf = tb.user_frame
            if uf is not None:
                facts.setdefault("user_frame", uf.location)
        for k, v in (extra_facts or {}).items():
            if v not in (None, ""):
                facts.setdefault(k, v)
        if rule.derive:
            from .derive import run_deriver  # imported only when a rule needs it

            for k, v in run_deriver(rule.derive, facts, [h.facts for h in hits], rule.derive_module).items():
                facts.setdefault(k, v)
        ranks = sorted({h.line.rank for h in hits if h.line.rank is not None})
        evidence = [Evidence(_clip(ln.raw or ln.text), ln.no) for ln in evidence_lines]
        if tb is not None and tb.user_frame is not None and not any(e.line == tb.user_frame.no for e in evidence):
            evidence.append(Evidence(_clip(f"user code: {tb.user_frame.location}"
                                           + (f" in {tb.user_frame.func}" if tb.user_frame.func else "")),
                                     tb.user_frame.no))
        if ranks:
            facts.setdefault("ranks", ", ".join(str(r) for r in ranks))
        return assemble(rule, facts, evidence, count=_count(hits), ranks=ranks), tb_index


class _WholeLog:
    """The whole log for `requires` / `excludes` / `context` patterns, searched one
    bounded line at a time so that a huge line cannot make a pattern slow."""

    def __init__(self, lines: list[LogLine]):
        self.lines = lines

    def search(self, rx: Any) -> re.Match[str] | None:
        for ln in self.lines:
            text = ln.text
            if len(text) > MAX_MATCH_CHARS:
                for start in range(0, min(len(text), 64 * MAX_MATCH_CHARS), MAX_MATCH_CHARS // 2):
                    m = rx.search(text[start:start + MAX_MATCH_CHARS])
                    if m:
                        return m
                continue
            m = rx.search(text)
            if m:
                return m
        return None


def _count(hits: list[Hit]) -> int:
    """How many times the finding was seen: once per rank that reported it, and once per
    distinct message among lines with no rank (a launcher repeating a child's error is
    not a second occurrence)."""
    one_per_line: dict[tuple, Hit] = {}
    for h in hits:  # a physical line holding a message twice (a JSON blob) is one sighting
        one_per_line.setdefault((h.line.no, h.line.rank, h.line.stream), h)
    hits = list(one_per_line.values())
    ranked = {h.line.rank for h in hits if h.line.rank is not None}
    ranked_keys = {h.key for h in hits if h.line.rank is not None}
    unranked = {(h.exact, h.line.stream) for h in hits if h.line.rank is None and h.key not in ranked_keys}
    return max(1, len(ranked) + len(unranked))


def _clip(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_EVIDENCE_CHARS:
        return text
    # secrets cut before the text is: a cut never halves one
    from ..redact import clip

    return clip(text, MAX_EVIDENCE_CHARS)


def _traceback_of(line: LogLine, tracebacks: list[Traceback], tb_starts: list[int]) -> int | None:
    i = bisect.bisect_right(tb_starts, line.no) - 1
    # Several tracebacks (other ranks) can start before this line: look back a little.
    for j in range(i, max(-1, i - 64), -1):
        t = tracebacks[j]
        if (t.start <= line.no <= t.end and (t.rank == line.rank or t.rank is None or line.rank is None)
                and (t.stream == line.stream or t.stream is None or line.stream is None)):
            return j
    return None


def _chain_roots(tracebacks: list[Traceback]) -> list[int]:
    """The root (first link) of the chain of every traceback, in one pass: a link names an
    earlier traceback (segment() sorts by start), so its root is already known; a link to
    a later or unknown one (never made by segment()) makes a root of its own."""
    roots: list[int] = []
    for i, t in enumerate(tracebacks):
        j = t.chained_from
        roots.append(roots[j] if isinstance(j, int) and 0 <= j < i else i)
    return roots


def _chain_root(i: int, tracebacks: list[Traceback]) -> tuple[int, int]:
    """(root traceback index, depth) of the chain traceback i belongs to."""
    depth = 0
    seen = {i}
    while tracebacks[i].chained_from is not None and depth < 64:
        nxt = tracebacks[i].chained_from
        assert nxt is not None
        if nxt in seen:
            break
        seen.add(nxt)
        i, depth = nxt, depth + 1
    return i, depth


def _causes_first(findings: list[Finding], tb_of: dict[int, int | None], tracebacks: list[Traceback]) -> None:
    """In a chain of exceptions ("The above exception was the direct cause of...",
    "During handling of..."), the earliest explained link is the cause: a finding on a
    later link of the same chain is its consequence and ranks below it."""
    by_chain: dict[int, list[tuple[int, Finding]]] = {}
    for f in findings:
        t_i = tb_of.get(id(f))
        if t_i is None:
            continue
        root, depth = _chain_root(t_i, tracebacks)
        by_chain.setdefault(root, []).append((depth, f))
    for members in by_chain.values():
        causes = [d for d, f in members if not f.consequence]
        if not causes:
            continue
        first = min(causes)
        for d, f in members:
            if d > first and f.severity != "info":
                f.consequence = True


def _unrecognised(tracebacks: list[Traceback], explained: set[int], findings: list[Finding]) -> list[Unrecognised]:
    explained_lines = {e.line for f in findings for e in f.evidence}
    out: dict[str, Unrecognised] = {}
    for i, t in enumerate(tracebacks):
        if i in explained or t.exc_type is None or t.exc_line in explained_lines:
            continue
        first = t.exc_message.split("\n")[0]
        text = f"{t.exc_type}: {first}" if first else t.exc_type
        text = _clip(text)
        key = _same_message(text)
        uf = t.user_frame
        if key in out:
            u = out[key]
            if t.rank is not None and t.rank not in u.ranks:
                u.ranks.append(t.rank)
                u.ranks.sort()
                u.count = len(u.ranks)
            elif t.rank is None:
                pass  # a launcher repeating the same error is not a second occurrence
            continue
        out[key] = Unrecognised(text, t.exc_line or t.start, uf.location if uf else None,
                                ranks=[t.rank] if t.rank is not None else [])
    return list(out.values())
