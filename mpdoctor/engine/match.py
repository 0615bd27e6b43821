"""Matching log rules against normalised lines, and turning hits into findings.

Speed comes from the literal prefilter: every pattern has literals it cannot match
without (engine.patterns derives them), so one scan for all literals finds the few
lines worth a regular expression, and only the rules whose literal was seen there are
tried on them.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..findings import Evidence, Finding, Unrecognised, rank_findings
from ..logtext import MAX_MATCH_CHARS, LogLine, Traceback
from .derive import run_deriver
from .rules import Rule
from .template import render_all, render_paragraph

MAX_EVIDENCE = 4
MAX_EVIDENCE_CHARS = 400


@dataclass
class Hit:
    line: LogLine
    facts: dict[str, Any]


@dataclass
class LiteralIndex:
    """All rules' literals in one case-insensitive alternation, and who needs each."""

    rules: list[Rule]
    regex: re.Pattern[str] = field(init=False)
    owners: dict[str, list[int]] = field(init=False)

    def __post_init__(self) -> None:
        self.owners = {}
        for i, rule in enumerate(self.rules):
            for lit in rule.literals:
                self.owners.setdefault(lit, []).append(i)
        # Longest first, so that a long literal is not hidden by a shorter prefix of it.
        alts = sorted(self.owners, key=len, reverse=True)
        self.regex = re.compile("|".join(re.escape(a) for a in alts) or r"(?!x)x", re.IGNORECASE)

    def candidates(self, text: str) -> set[int]:
        """Rule indices whose literal occurs in `text` (overlaps handled per literal)."""
        low = text.lower()
        found: set[int] = set()
        for m in self.regex.finditer(low):
            found.update(self.owners.get(m.group(0).lower(), ()))
        if found:
            # A shorter literal may sit inside a longer one that the alternation took.
            for lit, owners in self.owners.items():
                if not set(owners) <= found and lit in low:
                    found.update(owners)
        return found


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

    # -- hits ---------------------------------------------------------------------------

    def hits(self, lines: list[LogLine]) -> dict[int, list[Hit]]:
        joined = "\n".join(ln.text for ln in lines)
        starts: list[int] = []
        pos = 0
        for ln in lines:
            starts.append(pos)
            pos += len(ln.text) + 1
        # line index -> {rule index: first literal position in the line}
        per_line: dict[int, dict[int, int]] = {}
        for m in self.index.regex.finditer(joined):
            li = bisect.bisect_right(starts, m.start()) - 1
            slot = per_line.setdefault(li, {})
            for ri in self.index.owners.get(m.group(0).lower(), ()):
                slot.setdefault(ri, m.start() - starts[li])
        by_rule: dict[int, list[Hit]] = {}
        for li in sorted(per_line):
            ln = lines[li]
            slot = per_line[li]
            low = ln.text.lower() if len(ln.text) <= MAX_MATCH_CHARS else None
            cands = set(slot)
            if low is not None:
                for lit, owners in self.index.owners.items():
                    if lit in low:
                        cands.update(owners)
            for ri in sorted(cands):
                rule = self.rules[ri]
                text = _window(ln.text, slot.get(ri, 0))
                for rx in rule.patterns:
                    m = rx.search(text)
                    if m is None:
                        continue
                    if any(u.search(text) for u in rule.unless):
                        break
                    facts = {k: v for k, v in m.groupdict().items() if v is not None}
                    by_rule.setdefault(ri, []).append(Hit(ln, facts))
                    break
        return by_rule

    # -- findings -----------------------------------------------------------------------

    def findings(self, lines: list[LogLine], tracebacks: list[Traceback]) -> tuple[list[Finding], list[Unrecognised]]:
        joined: str | None = None
        by_rule = self.hits(lines)
        findings: list[Finding] = []
        explained_tracebacks: set[int] = set()
        tb_starts = [t.start for t in tracebacks]
        for ri, hits in by_rule.items():
            rule = self.rules[ri]
            if len(hits) < rule.min_count:
                continue
            if rule.requires or rule.excludes or rule.context:
                if joined is None:
                    joined = "\n".join(ln.text for ln in lines)
                if rule.requires and not any(rx.search(joined) for rx in rule.requires):
                    continue
                if rule.excludes and any(rx.search(joined) for rx in rule.excludes):
                    continue
            finding = self._finding(rule, hits, joined, tracebacks, tb_starts, explained_tracebacks)
            findings.append(finding)
        findings = _apply_supersedes(findings, {r.id: r for r in self.rules})
        unrecognised = _unrecognised(tracebacks, explained_tracebacks, findings)
        return rank_findings(findings), unrecognised

    def _finding(self, rule: Rule, hits: list[Hit], joined: str | None, tracebacks: list[Traceback],
                 tb_starts: list[int], explained: set[int]) -> Finding:
        facts: dict[str, Any] = dict(hits[0].facts)
        for h in hits[1:]:
            for k, v in h.facts.items():
                facts.setdefault(k, v)
        if rule.context and joined is not None:
            for rx in rule.context:
                m = rx.search(joined)
                if m:
                    for k, v in m.groupdict().items():
                        if v is not None:
                            facts.setdefault(k, v)
        tb = None
        for h in hits:
            t_i = _traceback_of(h.line, tracebacks, tb_starts)
            if t_i is not None:
                explained.add(t_i)
                if tb is None:
                    tb = tracebacks[t_i]
                    # The chain this traceback belongs to is explained too.
                    j = t_i
                    while tracebacks[j].chained_from is not None:
                        j = tracebacks[j].chained_from  # type: ignore[assignment]
                        explained.add(j)
        # Also any later traceback in a chain rooted at an explained one.
        for i, t in enumerate(tracebacks):
            if t.chained_from is not None and t.chained_from in explained:
                explained.add(i)
        evidence_lines: list[LogLine] = []
        seen_texts: set[str] = set()
        for h in hits:
            if h.line.text in seen_texts:
                continue
            seen_texts.add(h.line.text)
            evidence_lines.append(h.line)
            if len(evidence_lines) >= MAX_EVIDENCE - 1:
                break
        if tb is not None:
            if tb.exc_type:
                facts.setdefault("exception", tb.exc_type)
            uf = tb.user_frame
            if uf is not None:
                facts.setdefault("user_frame", uf.location)
        if rule.derive:
            for k, v in run_deriver(rule.derive, facts, [h.facts for h in hits]).items():
                facts.setdefault(k, v)
        ranks = sorted({h.line.rank for h in hits if h.line.rank is not None})
        distinct = {(h.line.rank, h.line.text) for h in hits}
        evidence = [Evidence(_clip(ln.raw or ln.text), ln.no) for ln in evidence_lines]
        if tb is not None and tb.user_frame is not None and not any(e.line == tb.user_frame.no for e in evidence):
            evidence.append(Evidence(_clip(f"user code: {tb.user_frame.location}"
                                           + (f" in {tb.user_frame.func}" if tb.user_frame.func else "")),
                                     tb.user_frame.no))
        if ranks:
            facts.setdefault("ranks", ", ".join(str(r) for r in ranks))
        facts = {k: v for k, v in facts.items() if not k.startswith("_")}
        severity = facts.pop("severity", None) if facts.get("severity") in ("error", "warning", "info") else None
        return Finding(
            rule=rule.id,
            category=rule.category,
            severity=severity or rule.severity,
            title=render_all([rule.title], facts)[0] if render_all([rule.title], facts) else rule.title.split("{")[0].strip(),
            explanation=render_paragraph(rule.explanation, facts),
            fixes=render_all(rule.fixes, facts),
            evidence=evidence,
            facts=facts,
            references=list(rule.references),
            count=len(distinct),
            ranks=ranks,
            consequence=rule.consequence,
            priority=rule.priority,
        )


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[: MAX_EVIDENCE_CHARS - 1] + "…"


def _traceback_of(line: LogLine, tracebacks: list[Traceback], tb_starts: list[int]) -> int | None:
    i = bisect.bisect_right(tb_starts, line.no) - 1
    # Several tracebacks (other ranks) can start before this line: look back a little.
    for j in range(i, max(-1, i - 16), -1):
        t = tracebacks[j]
        if t.start <= line.no <= t.end and (t.rank == line.rank or t.rank is None or line.rank is None):
            return j
    return None


def _apply_supersedes(findings: list[Finding], rules: dict[str, Rule]) -> list[Finding]:
    present = {f.rule for f in findings}
    dropped: set[str] = set()
    for f in findings:
        for other in (rules[f.rule].supersedes if f.rule in rules else []):
            if other in present:
                dropped.add(other)
    return [f for f in findings if f.rule not in dropped]


def _unrecognised(tracebacks: list[Traceback], explained: set[int], findings: list[Finding]) -> list[Unrecognised]:
    explained_lines = {e.line for f in findings for e in f.evidence}
    out: dict[str, Unrecognised] = {}
    for i, t in enumerate(tracebacks):
        if i in explained or t.exc_type is None or t.exc_line in explained_lines:
            continue
        first = t.exc_message.split("\n")[0]
        text = f"{t.exc_type}: {first}" if first else t.exc_type
        uf = t.user_frame
        if text in out:
            out[text].count += 1
            continue
        out[text] = Unrecognised(text[:MAX_EVIDENCE_CHARS], t.exc_line or t.start, uf.location if uf else None)
    return list(out.values())
