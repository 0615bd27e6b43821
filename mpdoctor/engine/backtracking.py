"""Whether a rule pattern can take more than linear time: nested unbounded
quantifiers ((a+)+, how a regular expression takes exponential time), repeated
alternations whose branches start alike, counted repetitions nested to a large product,
and repetitions side by side over overlapping characters. Read from the parsed pattern
(patterns.py's parser and constants); the loader refuses such a user pattern."""

from __future__ import annotations

from .patterns import (
    _SINGLE_CHAR,
    ASSERT,
    ASSERT_NOT,
    ATOMIC_GROUP,
    BRANCH,
    IN,
    LITERAL,
    MAXREPEAT,
    SUBPATTERN,
    PatternError,
    _is_repeat,
    sre_parse,
)


def check_bounded(pattern: str, shapes: bool = True) -> None:
    """Reject nested repetition that can backtrack exponentially: (a+)+, (\\s*x*)*,
    (?:\\w+\\s?)+. A repeated group is safe when each round must consume something
    outside its own inner repetitions (a literal, a character class): (?:foo\\s+)+.
    Also rejected: a repeated alternation whose branches can start alike ((a|aa)+),
    counted repetitions nested to a large product ((a{1,100}){1,100}), and repetitions
    side by side over overlapping characters (\\s*\\s*, \\S{0,300}?[\\w-]{1,80}): each
    backtracks polynomially or worse on a long run of one character."""
    parsed = sre_parse.parse(pattern)
    _walk(list(parsed), inside_unbounded=False)
    if shapes:  # (the built-in rules are held to the fuzz test in tests/test_bounded.py instead)
        _walk_shapes(list(parsed))
    if _wildcards(list(parsed)) >= 2:
        raise PatternError(
            "has two unbounded wildcards (.* .+ \\S+ [^x]*), which can take polynomial time "
            "on a long line; bound one of them, e.g. .{0,200}"
        )


def _wildcards(seq: list) -> int:
    """How many unbounded repetitions of a wide class (., \\S, [^...]) the pattern has."""
    n = 0
    for op, av in seq:
        if _is_repeat(op):
            lo, hi, body = av
            if (hi is MAXREPEAT or hi > 1000) and len(body) == 1 and _is_wide(body[0]):
                n += 1
            else:
                n += _wildcards(list(body))
        elif op is SUBPATTERN:
            n += _wildcards(list(av[-1]))
        elif op is BRANCH:
            n += max((_wildcards(list(b)) for b in av[1]), default=0)
    return n


def _is_wide(item) -> bool:
    op, av = item
    any_op = getattr(sre_parse, "ANY", None)
    if op is any_op:
        return True
    if op is IN:
        items = list(av)
        if items and items[0][0] is getattr(sre_parse, "NEGATE", None):
            return True
        return any(o is getattr(sre_parse, "CATEGORY", None) and "NOT" in str(a) for o, a in items)
    return False


def _walk(seq: list, inside_unbounded: bool) -> None:
    for op, av in seq:
        if _is_repeat(op):
            lo, hi, body = av
            unbounded = hi is MAXREPEAT or hi > 100
            if unbounded and _can_repeat(list(body)) and not _has_mandatory(list(body)):
                raise PatternError(
                    "nests an unbounded repetition inside another one, which can take "
                    "exponential time; make each round consume fixed text, or bound the "
                    "inner part, e.g. {0,80}"
                )
            _walk(list(body), inside_unbounded or unbounded)
        elif op is SUBPATTERN:
            _walk(list(av[-1]), inside_unbounded)
        elif op is BRANCH:
            for b in av[1]:
                _walk(list(b), inside_unbounded)
        elif op in (ASSERT, ASSERT_NOT):
            _walk(list(av[1]), inside_unbounded)
        elif ATOMIC_GROUP is not None and op is ATOMIC_GROUP:
            _walk(list(av), inside_unbounded)


# Character sets over a sample alphabet: enough to tell whether two parts can take the
# same character (what makes backtracking blow up), without modelling all of Unicode.
_SAMPLE = [chr(c) for c in range(9, 127)] + ["\u00e9", "\u4e2d", "\u2500", "\u00a0"]
_ALL = frozenset(_SAMPLE)
_CATEGORY_TESTS = {
    "CATEGORY_DIGIT": str.isdigit, "CATEGORY_NOT_DIGIT": lambda c: not c.isdigit(),
    "CATEGORY_SPACE": str.isspace, "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_", "CATEGORY_NOT_WORD": lambda c: not (c.isalnum() or c == "_"),
}
_BIG = 1000  # a repetition count above this is as good as unbounded for backtracking


def _item_chars(op, av) -> frozenset | None:
    """The characters one single-character item can take, or None if it is not one."""
    name = str(op)
    if op is LITERAL:
        return frozenset({chr(av)})
    if name == "NOT_LITERAL":
        return _ALL - {chr(av)}
    if name == "ANY":
        return _ALL - {"\n"}
    if name == "CATEGORY":
        test = _CATEGORY_TESTS.get(str(av))
        return frozenset(c for c in _SAMPLE if test(c)) if test else _ALL
    if op is IN:
        chars: set[str] = set()
        negate = False
        for o, a in av:
            oname = str(o)
            if oname == "NEGATE":
                negate = True
            elif o is LITERAL:
                chars.add(chr(a))
            elif oname == "RANGE":
                chars.update(c for c in _SAMPLE if a[0] <= ord(c) <= a[1])
            elif oname == "CATEGORY":
                test = _CATEGORY_TESTS.get(str(a))
                chars.update(c for c in _SAMPLE if test(c)) if test else chars.update(_SAMPLE)
            else:
                chars.update(_SAMPLE)
        return _ALL - chars if negate else frozenset(chars)
    return None


def _first(seq: list) -> tuple[frozenset, bool]:
    """(characters a match of `seq` can start with, whether `seq` can match empty)."""
    out: set[str] = set()
    for op, av in seq:
        chars = _item_chars(op, av)
        if chars is not None:
            return frozenset(out | chars), False
        if op is SUBPATTERN or (ATOMIC_GROUP is not None and op is ATOMIC_GROUP):
            f, empty = _first(list(av[-1] if op is SUBPATTERN else av))
        elif op is BRANCH:
            parts = [_first(list(b)) for b in av[1]]
            f = frozenset().union(*(p[0] for p in parts))
            empty = any(p[1] for p in parts)
        elif _is_repeat(op):
            f, empty = _first(list(av[2]))
            empty = empty or av[0] == 0
        else:  # AT, ASSERT, GROUPREF...: zero width (or unknown: assume anything, empty)
            if str(op) == "GROUPREF":
                return frozenset(out | _ALL), True
            continue
        out |= f
        if not empty:
            return frozenset(out), False
    return frozenset(out), True


def _single(body: list) -> frozenset | None:
    """The characters of a repetition's body when it is one character (\\s, [a-z], .)."""
    while len(body) == 1 and body[0][0] is SUBPATTERN:
        body = list(body[0][1][-1])
    if len(body) == 1:
        return _item_chars(*body[0])
    return None


def _max(hi) -> int:
    return 1 << 30 if hi is MAXREPEAT else hi


def _walk_shapes(seq: list, outer: int = 1) -> None:
    """The alternation, nested-count and side-by-side checks of check_bounded."""
    # side by side: runs of single-character repetitions with nothing mandatory between
    run: list[tuple[frozenset, int]] = []
    for op, av in _flatten(seq):
        if _is_repeat(op):
            lo, hi, body = av
            chars = _single(list(body))
            if chars is not None:
                for other, other_hi in run:
                    both_big = _max(hi) >= _BIG and other_hi >= _BIG
                    if other & chars and (both_big or (max(_max(hi), other_hi) < _BIG and _max(hi) * other_hi > 2000)):
                        raise PatternError(
                            "has two repetitions side by side that can take the same characters "
                            "(such as \\s*\\s* or \\S{0,300}[\\w-]{1,80}), which backtracks polynomially on a "
                            "long line; merge them, or put fixed text between them")
                run = run + [(chars, _max(hi))] if lo == 0 else [(chars, _max(hi))]
                continue
            # an optional group ((?:-\\w+)?) may take nothing: what is around it stays side by side
            run = run if lo == 0 or _first(list(body))[1] else []
            inner = list(body)
            if _max(hi) > 1:
                if _max(hi) * outer > 1 and _nested_max(inner) * _max(hi) > _BIG and not _has_mandatory(inner):
                    raise PatternError(
                        "nests counted repetitions ((a{1,100}){1,100}), which can take a very long time "
                        "on a long line; bound the inner part or make each round consume fixed text")
                for branch in (_branches(inner) if _max(hi) > 10 else ()):
                    firsts = [_first(list(b)) for b in branch]
                    for i in range(len(firsts)):
                        for j in range(i + 1, len(firsts)):
                            if firsts[i][0] & firsts[j][0] or firsts[i][1] or firsts[j][1]:
                                raise PatternError(
                                    "repeats an alternation whose branches can start with the same "
                                    "character ((a|aa)+), which can take exponential time; make the "
                                    "branches start differently, or use a character class")
            _walk_shapes(inner, outer * _max(hi))
        elif op is BRANCH:
            # an alternation with an empty branch ((?:_|)) may take nothing: the
            # repetitions on either side of it are side by side
            run = run if any(_first(list(b))[1] for b in av[1]) else []
            for b in av[1]:
                _walk_shapes(list(b), outer)
        elif op in (ASSERT, ASSERT_NOT):
            _walk_shapes(list(av[1]), outer)
        elif str(op) == "AT":
            continue  # zero width: repetitions around it are still side by side
        else:
            run = []


def _flatten(seq: list) -> list:
    """The items of a sequence with plain groups opened (so (?P<x>\\w+)\\s* is side by side)."""
    out = []
    for op, av in seq:
        if op is SUBPATTERN:
            out.extend(_flatten(list(av[-1])))
        else:
            out.append((op, av))
    return out


def _branches(seq: list) -> list[list]:
    """The alternations directly inside a repeated body (through plain groups)."""
    found = []
    for op, av in seq:
        if op is BRANCH:
            found.append(list(av[1]))
        elif op is SUBPATTERN:
            found.extend(_branches(list(av[-1])))
    return found


def _nested_max(seq: list) -> int:
    """The largest count of a repetition inside `seq` (1 when there is none)."""
    best = 1
    for op, av in seq:
        if _is_repeat(op):
            best = max(best, _max(av[1]) * _nested_max(list(av[2])))
        elif op is SUBPATTERN:
            best = max(best, _nested_max(list(av[-1])))
        elif op is BRANCH:
            best = max([best] + [_nested_max(list(b)) for b in av[1]])
    return best


def _can_repeat(body: list) -> bool:
    """True when the body itself contains a repetition (what makes nesting dangerous)."""
    for op, av in body:
        if _is_repeat(op):
            _lo, hi, _ = av
            if hi is MAXREPEAT or hi > 1:
                return True
        elif op is SUBPATTERN and _can_repeat(list(av[-1])):
            return True
        elif op is BRANCH and any(_can_repeat(list(b)) for b in av[1]):
            return True
    return False


def _has_mandatory(body: list) -> bool:
    """True when every match of the body consumes a character outside its repetitions."""
    for op, av in body:
        if op is LITERAL or op is IN or op in _SINGLE_CHAR:
            return True
        if op is SUBPATTERN and _has_mandatory(list(av[-1])):
            return True
        if op is BRANCH and all(_has_mandatory(list(b)) for b in av[1]):
            return True
    return False
