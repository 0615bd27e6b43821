"""What a rule pattern cannot match without, read from its parsed form.

The literal prefilter is only sound if every pattern names a literal it cannot match
without. Rather than trusting rule authors to declare one, the loader derives it from
the compiled pattern: a set of literals such that every possible match contains at
least one of them (`required_literals`), and the literal runs every match holds in
order (`fixed_runs`). Patterns for which no such set exists (or whose literals are too
short to be selective) are rejected. `tolerant` makes a pattern forgive what a paste
loses (backticks, quotes, `__`). Whether a pattern can hang: backtracking.py.
"""

from __future__ import annotations

import re

try:  # Python 3.11+
    import re._parser as sre_parse  # type: ignore[import-not-found]
    from re._constants import (  # type: ignore[import-not-found]
        ASSERT,
        ASSERT_NOT,
        AT,
        BRANCH,
        IN,
        LITERAL,
        MAX_REPEAT,
        MAXREPEAT,
        MIN_REPEAT,
        SUBPATTERN,
    )
except ImportError:  # Python 3.10
    import sre_parse  # type: ignore[no-redef]
    from sre_constants import (  # type: ignore[no-redef]
        ASSERT,
        ASSERT_NOT,
        AT,
        BRANCH,
        IN,
        LITERAL,
        MAX_REPEAT,
        MAXREPEAT,
        MIN_REPEAT,
        SUBPATTERN,
    )

POSSESSIVE_REPEAT = getattr(sre_parse, "POSSESSIVE_REPEAT", None)
_SINGLE_CHAR = tuple(x for x in (getattr(sre_parse, "ANY", None), getattr(sre_parse, "NOT_LITERAL", None),
                                 getattr(sre_parse, "CATEGORY", None)) if x is not None)
ATOMIC_GROUP = getattr(sre_parse, "ATOMIC_GROUP", None)

MIN_LITERAL = 3


class PatternError(ValueError):
    pass


def required_literals(pattern: str) -> list[str]:
    """Literals (lower-cased) at least one of which is in every match of `pattern`."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise PatternError(f"not a valid regular expression: {exc}") from None
    lits = _seq_required(list(parsed))
    if not lits:
        raise PatternError(
            "has no literal text of at least 3 characters that every match must contain "
            "(the prefilter needs one: anchor the pattern on the message's fixed words)"
        )
    return sorted({lit.lower() for lit in lits})


def _runs(seq: list) -> list[str]:
    """The literal runs of consecutive LITERAL items in one sequence."""
    runs: list[str] = []
    cur: list[str] = []
    for op, av in seq:
        if op is LITERAL:
            cur.append(chr(av))
            continue
        if op is SUBPATTERN and _is_plain_literal_seq(av[-1]):
            cur.extend(chr(a) for _, a in av[-1])
            continue
        if cur:
            runs.append("".join(cur))
        cur = []
    if cur:
        runs.append("".join(cur))
    return runs


def _is_plain_literal_seq(sub) -> bool:
    return all(op is LITERAL for op, _ in sub)


def _seq_required(seq: list) -> list[str] | None:
    """Best (longest-shortest) required literal set of a sequence, or None."""
    candidates: list[list[str]] = []
    best_run = max(_runs(seq), key=len, default="")
    if len(best_run) >= MIN_LITERAL:
        candidates.append([best_run])
    for op, av in seq:
        sub: list[str] | None = None
        if op is SUBPATTERN:
            sub = _seq_required(list(av[-1]))
        elif op is BRANCH:
            branch_sets = [_seq_required(list(b)) for b in av[1]]
            if all(branch_sets):
                sub = [lit for s in branch_sets for lit in s]  # type: ignore[union-attr]
        elif op in (MAX_REPEAT, MIN_REPEAT) or (POSSESSIVE_REPEAT is not None and op is POSSESSIVE_REPEAT):
            lo, _hi, body = av
            if lo >= 1:
                sub = _seq_required(list(body))
        elif ATOMIC_GROUP is not None and op is ATOMIC_GROUP:
            sub = _seq_required(list(av))
        if sub:
            candidates.append(sub)
    if not candidates:
        return None
    # Prefer the set whose shortest literal is longest (most selective), then fewest.
    return max(candidates, key=lambda s: (min(len(x) for x in s), -len(s)))


def _is_repeat(op) -> bool:
    return op in (MAX_REPEAT, MIN_REPEAT) or (POSSESSIVE_REPEAT is not None and op is POSSESSIVE_REPEAT)


def fixed_runs(pattern: str) -> tuple[list[tuple[str, ...]], bool]:
    """(steps, caseless): what every match contains, in order. Each step is a tuple of
    alternatives (a literal run, or the first run of each branch of an alternation such
    as `nan|NaN|inf`); a line must hold one of them after the previous step's. A line
    that does not cannot match, so the pattern need not be compiled or run on it."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return [], False
    caseless = bool(parsed.state.flags & re.IGNORECASE)
    steps: list[tuple[str, ...]] = []
    _ordered_runs(list(parsed), steps)
    steps = [s for s in steps if s and all(s)]
    if caseless:
        steps = [tuple(x.lower() for x in s) for s in steps]
    return steps, caseless


def _ordered_runs(seq: list, steps: list[tuple[str, ...]]) -> None:
    cur: list[str] = []

    def flush() -> None:
        if cur:
            steps.append(("".join(cur),))
            cur.clear()

    for op, av in seq:
        if op is LITERAL:
            cur.append(chr(av))
            continue
        flush()
        if op is SUBPATTERN:
            if av[1] & re.IGNORECASE:  # a scoped (?i:...): its text may differ in case
                continue
            _ordered_runs(list(av[-1]), steps)
        elif _is_repeat(op) and av[0] >= 1:
            _ordered_runs(list(av[2]), steps)
        elif op is BRANCH:
            firsts = []
            for branch in av[1]:
                inner: list[tuple[str, ...]] = []
                _ordered_runs(list(branch), inner)
                if not inner or len(inner[0]) != 1 or not inner[0][0] or not _starts_with_literal(list(branch)):
                    firsts = []
                    break
                firsts.append(inner[0][0])
            if firsts:
                steps.append(tuple(firsts))
    flush()


def _starts_with_literal(seq: list) -> bool:
    """The branch begins with its first literal run (so nothing optional precedes it)."""
    if not seq:
        return False
    op, av = seq[0]
    if op is LITERAL:
        return True
    if op is SUBPATTERN and not (av[1] & re.IGNORECASE):
        return _starts_with_literal(list(av[-1]))
    return False


# (the parser's constants are shared with backtracking.py)
__all__ = ["PatternError", "required_literals", "fixed_runs", "tolerant", "MIN_LITERAL", "AT", "IN", "ASSERT",
           "ASSERT_NOT", "MAXREPEAT"]


# Characters a paste loses when markdown renders it (backticks, the `__` of `__init__`)
# or a reporter retypes it (quotes): a pattern matches with or without them.
_OPTIONAL = ("`", "'", '"')


def tolerant(pattern: str) -> str:
    """`pattern` with its literal backticks, quotes and double underscores made optional,
    outside character classes and lookbehinds: the message a markdown renderer or a
    retyping reporter damaged still matches. Returns the pattern unchanged when the
    result would not compile."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    behind = 0  # depth of (?<= / (?<! groups: their width must stay fixed
    depth_stack: list[bool] = []
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            out.append(c)
            if c == "]":
                in_class = False
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1:i + 2] == "]":  # "[]...]": a literal ] first
                out.append("]")
                i += 1
            i += 1
            continue
        if c == "(":
            is_behind = pattern.startswith(("(?<=", "(?<!"), i)
            depth_stack.append(is_behind)
            behind += is_behind
            out.append(c)
            i += 1
            continue
        if c == ")":
            if depth_stack and depth_stack.pop():
                behind -= 1
            out.append(c)
            i += 1
            continue
        nxt = pattern[i + 1:i + 2]
        quantified = nxt in ("?", "*", "+", "{")
        if not behind and not quantified and c in _OPTIONAL:
            # the mark, or nothing where a mark could have been: never inside a word, so
            # that a quote that ends a token still ends it ('Half' is not 'HalfTensor')
            out.append(f"(?:{re.escape(c)}|(?<!\\w)|(?!\\w))")
            i += 1
            continue
        if (not behind and pattern.startswith("__", i) and pattern[i + 2:i + 3] not in ("?", "*", "+", "{", ")")
                and not "".join(out).endswith("(?:")):
            out.append("(?:__)?")
            i += 2
            continue
        out.append(c)
        i += 1
    result = "".join(out)
    try:
        re.compile(result)
    except re.error:
        return pattern
    return result
