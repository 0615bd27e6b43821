"""From a log rule's hits to its finding: facts from the hits and the whole log, one
evidence line per distinct message, the count of sightings (per rank, per message), the
traceback chain a hit belongs to (its cause ranks first), and the exceptions no rule knows."""

from __future__ import annotations

import bisect

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    import re
    from typing import Any

    from .match import Hit

from ..findings import Evidence, Finding, Unrecognised, rank_findings
from ..logtext import MAX_MATCH_CHARS, LazyRe, LogLine, Traceback
from ..logtext.tracebacks import parse_frame
from .assemble import assemble, supersede
from .rule import Rule

MAX_EVIDENCE = 4
MAX_EVIDENCE_CHARS = 400
_DIGITS = LazyRe(r"\d+")
# how far after its header line a printed stack is read
_STACK_LINES = 120
# "torch.cuda.OutOfMemoryError: ..." and "OutOfMemoryError: ..." are the same message.
_QUALIFIED = LazyRe(r"^[\"']?(?:[A-Za-z_]\w{0,60}\.){1,8}(?=[A-Z]\w{0,80}:)")


def same_message(text: str) -> str:
    """What makes two hits 'the same message': the text with its numbers masked, so the
    same OOM on GPU 0 and GPU 1 (or on eight ranks) is one finding seen N times."""
    text = _QUALIFIED.sub("", text.strip()[:MAX_EVIDENCE_CHARS * 2])
    return _DIGITS.sub("#", text)[:MAX_EVIDENCE_CHARS]


def log_findings(rules: list[Rule], by_rule: dict[int, list[Hit]], lines: list[LogLine], tracebacks: list[Traceback],
             extra_facts: dict[str, Any] | None = None) -> tuple[list[Finding], list[Unrecognised]]:
    """Ranked findings and the exceptions no rule knows. `extra_facts`, what another
    face observed around this text (the module a run saw raise it), join every
    finding's facts before its templates are rendered."""
    by_id = {r.id: r for r in rules}
    findings: list[Finding] = []
    explained: set[int] = set()  # roots of the chains a finding explains, then every member
    tb_of: dict[int, int | None] = {}  # id(finding) -> index of its traceback
    tb_starts = [t.start for t in tracebacks]
    roots = _chain_roots(tracebacks)
    whole = _WholeLog(lines)
    for ri, hits in by_rule.items():
        rule = rules[ri]
        if len(hits) < rule.min_count:
            continue
        if rule.requires and not any(whole.search(rx) for rx in rule.requires):
            continue
        if rule.excludes and any(whole.search(rx) for rx in rule.excludes):
            continue
        finding, t_i = _finding(rule, hits, whole, tracebacks, tb_starts, explained, extra_facts, roots)
        findings.append(finding)
        tb_of[id(finding)] = t_i
    # a chain of exceptions is explained whole when one of its links is: one pass
    explained = {i for i, r in enumerate(roots) if r in explained}
    findings = supersede(findings, by_id)
    _causes_first(findings, tb_of, tracebacks)
    unrecognised = _unrecognised(tracebacks, explained, findings)
    if all(f.consequence for f in findings):
        # the last line of defence: no rule found a cause (at most a launcher's echo),
        # yet an error is there, in words a rule knows
        from .likely import likely_findings

        likely, unrecognised = likely_findings(lines, unrecognised, rules, extra_facts, findings)
        findings += likely
    return rank_findings(findings), unrecognised


def _finding(rule: Rule, hits: list[Hit], whole: "_WholeLog", tracebacks: list[Traceback],
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
    stack_lines: list[LogLine] = []
    for rx in rule.frames_after:
        said, at = whole.stack_after(rx)
        facts.update({k: v for k, v in said.items() if k not in facts})
        stack_lines += [at] if at is not None else []
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
    evidence = [Evidence(_clip(ln.raw or ln.text), ln.no) for ln in evidence_lines + stack_lines]
    if tb is not None and tb.user_frame is not None and not any(e.line == tb.user_frame.no for e in evidence):
        evidence.append(Evidence(_clip(f"user code: {tb.user_frame.location}"
                                       + (f" in {tb.user_frame.func}" if tb.user_frame.func else "")),
                                 tb.user_frame.no))
    if ranks:
        facts.setdefault("ranks", ", ".join(str(r) for r in ranks))
    return assemble(rule, facts, evidence, count=_count(hits), ranks=ranks), tb_index


class _WholeLog:
    """The whole log for `requires` / `excludes` / `context` patterns, searched one
    bounded line at a time so that a huge line cannot make a pattern slow. A pattern
    with literals (every match holds one of its first step's alternatives) is tried only
    on the lines where str.find meets one, in the log joined once: the lines before the
    first such line are never looked at from Python (a fired rule's context patterns read
    the whole log)."""

    def __init__(self, lines: list[LogLine]):
        self.lines = lines
        self._joined: tuple[str, list[int]] | None = None
        self._last_index = 0  # the line of the last match search() returned

    def _text(self) -> tuple[str, list[int]]:
        if self._joined is None:
            starts, pos = [], 0
            for ln in self.lines:
                starts.append(pos)
                pos += len(ln.text) + 1
            self._joined = ("\n".join(ln.text for ln in self.lines), starts)
        return self._joined

    def search(self, rx: Any) -> re.Match[str] | None:
        runs = getattr(rx, "runs", None)
        if not runs or getattr(rx, "caseless", False):
            return self._each_line(rx, range(len(self.lines)))
        text, starts = self._text()
        first = runs[0]
        at = 0
        while True:
            found = [p for p in (text.find(a, at) for a in first) if p >= 0]
            if not found:
                return None
            i = bisect.bisect_right(starts, min(found)) - 1
            m = self._each_line(rx, (i,))
            if m:
                return m
            at = starts[i] + len(self.lines[i].text) + 1

    def stack_after(self, rx: Any) -> tuple[dict[str, str], LogLine | None]:
        """`stack_frame` / `stack_code`: the last frame outside libraries of the frames
        printed right after the first line `rx` matches (and that frame's code line), and
        the log line of that frame (evidence)."""
        found: dict[str, str] = {"_stack": "s"}  # a code: a [words._stack] table says known or not
        at: LogLine | None = None
        if self.search(rx) is None:
            return found, at
        i = self._last_index
        user = False  # the frame just read is the user's
        for j in range(i + 1, min(i + 1 + _STACK_LINES, len(self.lines))):
            text = self.lines[j].text
            fr = parse_frame(text.strip(), self.lines[j].no)
            if fr is not None:
                user = fr.is_user_code
                if user:
                    found, at = {"_stack": "s", "stack_frame": fr.location}, self.lines[j]
            elif text[:1] in (" ", "\t") and text.strip():
                if user and "stack_code" not in found:
                    found["stack_code"] = text.strip()[:200]
                user = False
            elif text.strip():
                break  # the stack ended
        return found, at

    def _each_line(self, rx: Any, indices: Any) -> re.Match[str] | None:
        may = rx.may_match if getattr(rx, "runs", None) else None
        for i in indices:
            text = self.lines[i].text
            if len(text) > MAX_MATCH_CHARS:
                for start in range(0, min(len(text), 64 * MAX_MATCH_CHARS), MAX_MATCH_CHARS // 2):
                    m = rx.search(text[start:start + MAX_MATCH_CHARS])
                    if m:
                        self._last_index = i
                        return m
                continue
            if may is not None and not may(text):
                continue
            m = rx.search(text)
            if m:
                self._last_index = i
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
        key = same_message(text)
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
