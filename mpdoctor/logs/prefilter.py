"""What a streaming scan of a big log must keep: every line a pattern (or a requires /
excludes / context pattern) could match as written, as native (Hyperscan) expressions
and, for the pure-Python scan, literals with the ordered fixed runs to check on their line.

Built from what the rule cache holds (each pattern's ordered fixed runs), so it costs
no pattern parsing. Complete by construction over the log as written: every match of a
pattern contains each of its fixed runs in order, in the pattern's case, so a line
without them cannot match. The repairs for damaged pastes (case folded, lines a wrap cut
joined, markdown and URL-encoding undone) are not scanned for: a big log is written by a
program, not retyped, and the matcher still applies them in the regions kept around
each hit (and to every line of a small input, read whole).
"""

from __future__ import annotations

from typing import Any

from ..engine.fixedruns import best_step, is_common
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
    expressions: set[tuple[bytes, bool]] = set()
    first_literals: set[str] = set()
    first_expressions: set[tuple[bytes, bool]] = set()
    checks: dict[tuple[str, bool], list] = {}
    for rule in rules:
        for rx in rule.patterns:
            expr = native_expression(rx)
            step = best_step(rx)
            if expr is None or step is None:  # no runs: the rule's literals, every hit kept
                expressions.update((escape_bytes(lit), True) for lit in rule.literals)
                for lit in rule.literals:
                    scan_literals.add(lit)
                    checks.setdefault((lit.lower(), True), []).append(None)
                continue
            expressions.add(expr)
            for alt in step:  # the pure-Python scan: this step, its runs checked in the pattern's case
                scan_literals.add(alt)
                checks.setdefault((alt, rx.caseless), []).append((rx.runs, rx.caseless))
        for rx in (*rule.requires, *rule.excludes, *rule.context):
            expr = native_expression(rx)
            step = best_step(rx)
            if expr is None or step is None:
                continue  # nothing fixed to look for: the head of the log still has it
            first_expressions.add(expr)
            first_literals.update(step)
    prefilter = Prefilter(sorted(scan_literals), sorted(expressions), sorted(first_literals), sorted(first_expressions))
    # (literal, caseless) -> the runs to check on its line; None keeps every hit
    prefilter.checks = {key: (c if all(x is not None for x in c) else None) for key, c in checks.items()}
    return prefilter


def native_expression(rx: Any) -> tuple[bytes, bool] | None:
    """The Hyperscan expression for a pattern: its least common fixed step (an
    alternation of literals, fast to scan for); when every step is common in training
    logs, the two longest in their order ("loss.*(?:nan|inf)"), so that a literal on
    every line does not make every line a hit. Matches a superset of the lines the
    pattern matches: (expression, caseless)."""
    steps = [s for s in getattr(rx, "runs", ()) if all(len(a) >= 3 for a in s)]
    best = best_step(rx)
    if best is None or best not in steps:
        return None

    def group(step: tuple[str, ...]) -> bytes:
        return b"(?:" + b"|".join(escape_bytes(a) for a in step) + b")"

    if not is_common(best) or len(steps) < 2:
        return group(best), rx.caseless
    longest = sorted(steps, key=lambda s: -min(len(a) for a in s))[:2]
    ordered = [s for s in steps if s in longest]
    return b".*".join(group(s) for s in ordered), rx.caseless


def escape_bytes(lit: str) -> bytes:
    """A literal as a Hyperscan expression (every non-alphanumeric byte as \\xHH)."""
    return "".join(c if c.isascii() and c.isalnum() else "".join(f"\\x{b:02x}" for b in c.encode())
                   for c in lit).encode("ascii")
