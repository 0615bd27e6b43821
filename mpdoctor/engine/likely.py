"""The last line of defence: an error no rule's pattern matched, but whose words are
those of a rule's known messages, is reported as that rule's cause, as a likely match.

When a log gets no error finding, its unrecognised exceptions and error lines are
compared with what each log rule knows: the fixed words of its patterns and the error
lines of its own examples. A line that carries most of one message's distinctive words
(weighted by how rare each word is across the rule base; a word retyped with a typo
still counts) becomes a warning-level finding of that rule, which says it is a likely
match and on which words it rests. Harmless logs stay quiet: a message needs at least
three shared distinctive words and most of its weight, and a line that fits two
categories equally well is left alone.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..findings import Evidence, Finding, Unrecognised
from ..logtext import LogLine
from .assemble import assemble
from .rule import Rule

_WORD = re.compile(r"[a-z][a-z0-9_]{2,40}")
_ERRORISH = re.compile(r"error|exception|fail|fault|abort|illegal|invalid|unsupported|not supported|"
                       r"cannot|can't|unable|killed|overflow|\bnan\b|\binf\b|timed? ?out|denied|refus|deprecat",
                       re.IGNORECASE)
# Words every log and every message has: they say nothing about which cause it is.
_STOP = frozenset("""the and for with not but was are has have this that from into your you use used using
can cannot could should would will may might all any one two none only also when while then than there their
error errors exception runtimeerror valueerror typeerror file line self true false null call called
got get expected found must need needs more most other some such same please make sure set see try
python torch pytorch version warning warnings info debug note
exitcode exit code local_rank rank pid binary failed process worker child launcher""".split())
MIN_SHARED = 3
MIN_SCORE = 0.6
MARGIN = 0.1
MAX_CANDIDATES = 200
ANCHORS = 1


class _Message:
    __slots__ = ("rule", "words")

    def __init__(self, rule: Rule, words: frozenset[str]):
        self.rule = rule
        self.words = words


# An exception line as a rule's example shows it: the rule's message in its own words.
_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]{0,80}(?:Error|Exception|Warning)|[A-Z]{3,}[A-Z_ ]{0,20}(?:ERROR|WARN))\b:?\s\S")


class LikelyIndex:
    """Each log rule's known messages as sets of distinctive words, with their weights."""

    def __init__(self, rules: list[Rule]):
        self.messages: list[_Message] = []
        # a rule's near misses are the look-alikes it knows: a line closer to one of them
        # than to the rule's own messages is not that rule
        self.near: dict[str, list[frozenset[str]]] = {}
        for rule in rules:
            if rule.kind != "log" or rule.consequence or rule.severity == "info":
                continue
            for words in _known_messages(rule):
                if len(words) >= MIN_SHARED:
                    self.messages.append(_Message(rule, words))
            self.near[rule.id] = [w for w in _example_lines(rule, "near_misses", any_error_line=True)
                                  if len(w) >= MIN_SHARED]
        df: dict[str, int] = {}
        for m in self.messages:
            for w in m.words:
                df[w] = df.get(w, 0) + 1
        n = max(1, len(self.messages))
        self.weight = {w: math.log(1 + n / c) for w, c in df.items()}
        self.by_word: dict[str, list[int]] = {}
        for i, m in enumerate(self.messages):
            for w in m.words:
                self.by_word.setdefault(w, []).append(i)

    def best(self, text: str) -> tuple[_Message, float, list[str]] | None:
        """The message `text` most likely is, its score and the words they share."""
        words = _words(text)
        if len(words) < MIN_SHARED:
            return None
        seen: dict[int, set[str]] = {}
        for w in words:
            for i in self.by_word.get(w, ()):
                seen.setdefault(i, set()).add(w)
        # a word retyped with a typo ("attemting") counts for the word it was meant to be
        near = _near_words(words - self.weight.keys(), self.weight)
        for typo, meant in near.items():
            for i in self.by_word.get(meant, ()):
                seen.setdefault(i, set()).add(meant)
        scored = []
        for i, shared in seen.items():
            m = self.messages[i]
            if len(shared) < MIN_SHARED:
                continue
            total = sum(self.weight[w] for w in m.words)
            score = sum(self.weight[w] for w in shared) / total if total else 0.0
            scored.append((score, len(shared), i, shared))
        # the words Python and the OS say in every error are no sign of which library's cause
        # it is: at least ANCHORS shared words must be a library's own
        generic = python_words()
        scored = [s for s in scored if sum(1 for w in s[3] if w not in generic) >= ANCHORS]
        if not scored:
            return None
        scored.sort(reverse=True)
        score, _n, i, shared = scored[0]
        if score < MIN_SCORE:
            return None
        best = self.messages[i]
        rival = next((s for s in scored[1:] if self.messages[s[2]].rule.category != best.rule.category), None)
        if rival is not None and score - rival[0] < MARGIN:
            return None  # two causes fit as well: say nothing rather than guess
        for near in self.near.get(best.rule.id, ()):
            total = sum(self.weight.get(w, 1.0) for w in near)
            same = sum(self.weight.get(w, 1.0) for w in near & (words | set(near_words_of(words, near))))
            if total and same / total >= score - 0.05:
                return None  # as close to a look-alike the rule knows as to its message
        return best, score, sorted(shared, key=lambda w: -self.weight[w])


_PYTHON_WORDS: dict[str, int] | None = None


def python_words() -> dict[str, int]:
    """The words of Python's and the OS's own error messages, with their tier (0: the
    interpreter's and the OS's, 1: the standard library's): knowledge/tables/python-words.txt,
    mined by scripts/mine_python_words.py. They say an error happened, not which cause."""
    global _PYTHON_WORDS
    if _PYTHON_WORDS is None:
        import os

        path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "knowledge", "tables", "python-words.txt")
        out: dict[str, int] = {}
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) == 2 and not line.startswith("#"):
                        out[parts[0]] = int(parts[1])
        except OSError:
            pass
        _PYTHON_WORDS = out
    return _PYTHON_WORDS


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def _near_words(unknown: set[str], known: dict[str, float]) -> dict[str, str]:
    import difflib

    out = {}
    vocabulary = [w for w in known if len(w) >= 6]
    for w in unknown:
        if len(w) < 6:
            continue
        close = difflib.get_close_matches(w, vocabulary, n=1, cutoff=0.85)
        if close:
            out[w] = close[0]
    return out


def near_words_of(words: set[str], known: frozenset[str]) -> list[str]:
    return list(_near_words(words - known, {w: 1.0 for w in known}).values())


def _known_messages(rule: Rule) -> list[frozenset[str]]:
    out = []
    for rx in rule.patterns:
        text = " ".join(" ".join(step) for step in rx.runs)
        out.append(frozenset(_words(text)))
    out += _example_lines(rule, "examples")
    return [w for w in out if w]


def _example_lines(rule: Rule, which: str, any_error_line: bool = False) -> list[frozenset[str]]:
    """The exception lines of a rule's examples (or any error-looking line of its near
    misses), as word sets."""
    try:
        cases = getattr(rule, which)
    except Exception:  # a rule whose docs cannot be read still has its patterns
        return []
    out = []
    for ex in cases:
        if ex.text:
            for line in ex.text.splitlines()[-8:]:
                if _EXCEPTION_LINE.match(line) or (any_error_line and _ERRORISH.search(line)):
                    out.append(frozenset(_words(line)))
    return out


_INDEX: dict[int, tuple[list[Rule], LikelyIndex]] = {}


def index_for(rules: list[Rule]) -> LikelyIndex:
    entry = _INDEX.get(id(rules))
    if entry is None or entry[0] is not rules:
        if len(_INDEX) > 8:
            _INDEX.clear()
        entry = (rules, LikelyIndex(rules))
        _INDEX[id(rules)] = entry
    return entry[1]


def likely_findings(lines: list[LogLine], unrecognised: list[Unrecognised], rules: list[Rule],
                    extra_facts: dict[str, Any] | None = None,
                    found_already: list[Finding] = ()) -> tuple[list[Finding], list[Unrecognised]]:
    """Likely findings for a log with no error finding, and the unrecognised exceptions
    that remain unexplained. Lines that are evidence of a finding already made (a
    launcher's exit line) are not candidates, nor are rules that already fired."""
    taken = {e.line for f in found_already for e in f.evidence}
    known_rules = {f.rule for f in found_already}
    candidates: list[tuple[int, str]] = [(u.line, u.exception) for u in unrecognised]
    for ln in lines:
        if len(candidates) >= MAX_CANDIDATES:
            break
        if ln.no not in taken and _ERRORISH.search(ln.text[:2000]):
            candidates.append((ln.no, ln.text[:2000]))
    if not candidates:
        return [], unrecognised
    index = index_for(rules)
    found: dict[str, Finding] = {}
    used_lines: set[int] = set()
    for no, text in candidates:
        got = index.best(text)
        if got is None:
            continue
        message, score, shared = got
        rule = message.rule
        if rule.id in found or rule.id in known_rules:
            continue
        facts = dict(extra_facts or {})
        facts["likely"] = f"{score:.0%}"
        facts["shared_words"] = ", ".join(sorted(shared)[:8])  # the same words whatever the hash seed
        # secrets cut before the text is: a cut never halves one
        from ..redact import clip

        f = assemble(rule, facts, [Evidence(clip(text, 400), no or None)], likely=True)
        found[rule.id] = f
        used_lines.add(no)
    remaining = [u for u in unrecognised if u.line not in used_lines]
    return list(found.values()), remaining
