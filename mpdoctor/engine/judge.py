"""Predicate rules (env, run, probe): a named check judged over JSON evidence.

A check is a small pure function of a view of the evidence (an environment snapshot, a
wrapped run's recorded events, one probe mode's measurements). It returns a list of
Hits (one per thing that is wrong: per GPU, per module, per library) or a Skip saying
why it cannot be judged here. A Hit's facts fill the rule's templates; its evidence
names the fields of the evidence it rests on.

Checks declare the facts they produce (`@check(facts=...)`); the declaration is what
the loader validates a rule's placeholders against. Nothing is registered by importing
a module: a face builds its table of checks with `checks_in(module, ...)`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Union

from ..findings import Evidence, Finding
from .assemble import assemble, merge_findings, supersede
from .rule import Rule


@dataclass
class Hit:
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[tuple[str, Any]] = field(default_factory=list)  # (field path, value)


@dataclass
class Skip:
    reason: str


Result = Union[list[Hit], Skip]


@dataclass(frozen=True)
class CheckInfo:
    name: str
    facts: tuple[str, ...]


def check(*, facts: Iterable[str] = ()) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Mark a function as a check producing `facts` (names; `_name` facts are helpers the
    templates see and the finding's JSON does not)."""
    def mark(fn: Callable[..., Result]) -> Callable[..., Result]:
        fn.__check__ = CheckInfo(fn.__name__, tuple(facts))  # type: ignore[attr-defined]
        return fn
    return mark


def checks_in(*modules: Any) -> dict[str, Callable[..., Result]]:
    """name -> check, for every function the modules mark with @check."""
    out: dict[str, Callable[..., Result]] = {}
    for module in modules:
        for value in vars(module).values():
            info = getattr(value, "__check__", None)
            if isinstance(info, CheckInfo) and getattr(value, "__module__", None) == module.__name__:
                if info.name in out:
                    raise ValueError(f"check {info.name!r} is defined twice")
                out[info.name] = value
    return out


_MADE: dict[tuple[str, ...], dict[str, Callable[..., Result]]] = {}


def checks_of(*modules: Any) -> dict[str, Callable[..., Result]]:
    """checks_in(*modules), made once per set of modules (each face's table of checks)."""
    key = tuple(m.__name__ for m in modules)
    if key not in _MADE:
        _MADE[key] = checks_in(*modules)
    return _MADE[key]


class UnknownCheck(ValueError):
    """A rule names a check the face does not have."""


@dataclass
class RuleOutcome:
    rule: Rule
    findings: list[Finding]
    skipped: str | None = None
    crashed: bool = False


class CheckCrashed(RuntimeError):
    """A check raised on its evidence: a bug in mpdoctor, never "nothing found"."""


# Where a check that raises is a failure, not a "could not be judged": the rules' own
# tests (`rules test`, the suite: MPDOCTOR_STRICT_CHECKS=1) must see a broken check.
# A user's run still gets its report, with the check named as not judged.
_STRICT: list[bool] = []
# While tracing (the rules' self-tests), what became of each rule's check: "judged",
# "skipped: reason" or "crashed: reason" (a near miss must reach its check).
_TRACES: list[dict[str, str]] = []


def _strict() -> bool:
    return bool(_STRICT and _STRICT[-1]) or os.environ.get("MPDOCTOR_STRICT_CHECKS") == "1"


@contextmanager
def strict_checks(on: bool = True) -> Iterator[None]:
    _STRICT.append(on)
    try:
        yield
    finally:
        _STRICT.pop()


@contextmanager
def trace_checks() -> Iterator[dict[str, str]]:
    seen: dict[str, str] = {}
    _TRACES.append(seen)
    try:
        yield seen
    finally:
        _TRACES.remove(seen)


def _trace(rule_id: str, what: str) -> None:
    for seen in _TRACES:
        # a rule judged several times (per rank, per mode) keeps its worst outcome
        if not seen.get(rule_id, "").startswith("crashed"):
            if what == "judged" and rule_id in seen:
                continue
            seen[rule_id] = what


def evidence_of(hit: Hit) -> list[Evidence]:
    return [Evidence(text="(not set)" if val is None else str(val), line=None, source=path)
            for path, val in hit.evidence]


def judge_rules(view: Any, rules: list[Rule], checks: dict[str, Callable[..., Result]],
                extra_facts: dict[str, Any] | None = None) -> list[RuleOutcome]:
    """Every rule's check over `view`; `extra_facts` (what this face observed, e.g. the
    dtype a run's first matmul produced) join each hit's facts where the check left
    them unset. A check that raises is reported as "could not be judged" to a user, and
    raises CheckCrashed under strict_checks() (the rules' tests)."""
    outcomes = []
    for rule in rules:
        fn = checks.get(rule.check or "")
        if fn is None:
            raise UnknownCheck(f"{rule.path}: rule {rule.id!r} names check {rule.check!r}, which is not one of "
                               f"mpdoctor's {rule.kind} checks ({', '.join(sorted(checks))})")
        try:
            result = fn(view)
        except Exception as exc:  # a check bug on odd evidence
            why = f"{type(exc).__name__}: {exc}"
            _trace(rule.id, f"crashed: {why}")
            if _strict():
                raise CheckCrashed(f"check {rule.check!r} of rule {rule.id!r} raised {why}") from exc
            outcomes.append(RuleOutcome(rule, [], f"could not be judged ({why})", crashed=True))
            continue
        if isinstance(result, Skip):
            _trace(rule.id, f"skipped: {result.reason}")
            outcomes.append(RuleOutcome(rule, [], result.reason))
            continue
        _trace(rule.id, "judged")
        found: list[Finding] = []
        for hit in result:
            facts = {k: v for k, v in hit.facts.items() if v not in (None, "")}
            for k, v in (extra_facts or {}).items():
                if v not in (None, ""):
                    facts.setdefault(k, v)
            found.append(assemble(rule, facts, evidence_of(hit)))
        # eight identical V100s are one finding, x8
        outcomes.append(RuleOutcome(rule, merge_findings(found, {rule.id: rule})))
    kept = supersede([f for o in outcomes for f in o.findings], {o.rule.id: o.rule for o in outcomes})
    keep_ids = {id(f) for f in kept}
    for o in outcomes:
        o.findings = [f for f in o.findings if id(f) in keep_ids]
    return outcomes
