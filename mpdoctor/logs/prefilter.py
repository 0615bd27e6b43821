"""What a streaming scan of a big log must keep: every line a pattern (or a requires /
excludes / context pattern) could match, as native (Hyperscan) expressions and, for
the pure-Python scan, literals with the ordered fixed runs to check on their line.

Built from what the rule cache holds (each pattern's ordered fixed runs), so it costs
no pattern parsing. Complete by construction over the view the matcher reads: every match
of a pattern contains each of its fixed runs in order, so a line without them cannot
match; the scan is case-insensitive (the matcher's second chance folds case), a space
of a fixed run may be a line break (a paste wrapped at a space: the matcher joins the
lines again), and it reads the chunk with the paste folds the normaliser applies
(markdown marks and URL-encoding undone: regions.paste_view). Not covered: a word split in
the middle by a wrap, which the matcher rejoins only in logs read whole (4 MB and less,
every paste).
"""

from __future__ import annotations

from typing import Any

from ..engine.rule import Rule

# Always worth a look, whatever the rules say: where tracebacks start.
TRIGGERS = ("Traceback (most recent call last)", "Error: ", "Exception: ")


class Prefilter:
    """What the streaming scan looks for. `skeletons`: one Hyperscan expression per pattern
    (its least common fixed text, native_expression below), so that a word such as
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


def build_prefilter(rules: list[Rule]) -> Prefilter:
    scan_literals: set[str] = set()
    expressions: list[tuple[bytes, bool]] = []
    first_literals: set[str] = set()
    first_expressions: list[tuple[bytes, bool]] = []
    checks: dict[tuple[str, bool], list] = {}
    for rule in rules:
        for rx in rule.patterns:
            expr = native_expression(rx)
            step = scan_step(rx)
            if expr is None or step is None:  # no runs: the rule's literals, every hit kept
                expressions.extend((escape_bytes(lit), True) for lit in rule.literals)
                for lit in rule.literals:
                    scan_literals.add(lit)
                    checks.setdefault((lit.lower(), True), []).append(None)
                continue
            expressions.append(expr)
            for alt in step:  # the pure-Python scan: this step, in the pattern's case
                scan_literals.add(alt.lower())
                checks.setdefault((alt.lower(), True), []).append((rx.runs, True))
        for rx in (*rule.requires, *rule.excludes, *rule.context):
            expr = native_expression(rx)
            step = scan_step(rx)
            if expr is None or step is None:
                continue  # nothing fixed to look for: the head of the log still has it
            first_expressions.append(expr)
            first_literals.update(a.lower() for a in step)
    # the matcher folds case as a second chance: the scan is caseless for every pattern
    expressions = [(e, True) for e, _ in expressions]
    first_expressions = [(e, True) for e, _ in first_expressions]
    prefilter = Prefilter(sorted(scan_literals), sorted(set(expressions)),
                          sorted(first_literals), sorted(set(first_expressions)))
    # (literal, caseless) -> the runs to check on its line; None keeps every hit
    prefilter.checks = {key: (c if all(x is not None for x in c) else None) for key, c in checks.items()}
    return prefilter


# Words on nearly every line of a training log: a poor literal to scan a big log for.
_COMMON_IN_LOGS = ("loss", "norm", "step", "epoch", "rank", "error", "warning", "train", "time",
                   "grad", "batch", "iter", "eval", "cuda", "torch", "memory", "tokens", "samples",
                   "grad_norm", "learning_rate", "throughput")


def scan_step(rx: Any) -> tuple[str, ...] | None:
    """The pattern's fixed step best to scan a big log for: no alternative that is (part
    of) a word common in training logs, then the longest shortest alternative."""
    best, best_key = None, (0, 0)
    caseless = getattr(rx, "caseless", True)
    for step in getattr(rx, "runs", ()):
        alts = [a.lower() for a in step] if caseless else list(step)
        if any(len(a.strip()) < 3 for a in alts):
            continue
        key = (0 if is_common(tuple(alts), False) else 1, min(len(a) for a in alts))
        if key > best_key:
            best, best_key = step, key
    return best


def native_expression(rx: Any) -> tuple[bytes, bool] | None:
    """The Hyperscan expression for a pattern: its least common fixed step (an
    alternation of literals, fast to scan for); when every step is common in training
    logs, the two longest in their order ("loss.*(?:nan|inf)"), so that a literal on
    every line does not make every line a hit. Matches a superset of the lines the
    pattern matches: (expression, caseless)."""
    steps = [s for s in getattr(rx, "runs", ()) if all(len(a) >= 3 for a in s)]
    best = scan_step(rx)
    if best is None or best not in steps:
        return None
    group = lambda step: b"(?:" + b"|".join(escape_bytes(a) for a in step) + b")"  # noqa: E731
    if not is_common(best, rx.caseless) or len(steps) < 2:
        return group(best), rx.caseless
    longest = sorted(steps, key=lambda s: -min(len(a) for a in s))[:2]
    ordered = [s for s in steps if s in longest]
    return b".*".join(group(s) for s in ordered), rx.caseless


def is_common(step: tuple[str, ...], caseless: bool) -> bool:
    alts = [a.lower() for a in step] if caseless else list(step)
    return any(a.strip() in w or w in a.strip() and len(a.strip()) < len(w) + 6
               for a in alts for w in _COMMON_IN_LOGS)


def escape_bytes(lit: str) -> bytes:
    """A literal as a Hyperscan expression (every non-alphanumeric byte as \\xHH; a space
    may also be a line break, where a paste was wrapped)."""
    return "".join(c if c.isascii() and c.isalnum() else (r"(?:\x20|\r?\n)" if c == " " else
                   "".join(f"\\x{b:02x}" for b in c.encode())) for c in lit).encode("ascii")
