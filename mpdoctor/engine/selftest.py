"""Rules test themselves (semgrep's `--test`, for mpdoctor).

Every rule's `[[example]]` must make that rule fire with the facts it lists (a log
rule: the top finding of its example log); every `[[near_miss]]` must not make it fire
at all. Examples run against the whole rule set, as a user's evidence would.

And every sentence a rule can say is said by at least one of its examples: each title,
explanation and fix template renders on the facts of some example's finding, unless the
rule's `[unrendered]` table says why no example can show it. A sentence nobody has seen
rendered is a sentence nobody has read.

The engine knows no face: how an example of each kind is judged (log text through the
explain path, a snapshot through the env rules, a run's events, a probe's measurements)
is handed in as `runners` (mpdoctor.rulebase.case_runners()).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from pathlib import Path

from ..findings import Finding
from .rule import Example, Rule
from .template import render


@dataclass
class CaseResult:
    rule: str
    kind: str  # "example" | "near_miss" | "sentence"
    index: int
    ok: bool
    message: str = ""


# (rule, example, all rules) -> the findings the example's evidence produces, ranked
CaseRunner = Callable[[Rule, Example, "list[Rule]"], "list[Finding]"]


def example_path(rule: Rule, name: str) -> "Path":
    """The file an example names, inside the rule's folder only (loader.resource_path)."""
    from .loader import resource_path

    return resource_path(rule, name)


def example_text(rule: Rule, ex: Example) -> str:
    if ex.text is not None:
        return ex.text
    assert ex.file is not None
    from .loader import read_resource

    return read_resource(rule, ex.file).decode("utf-8", errors="replace")


def facts_problems(expected: dict, actual: dict) -> list[str]:
    """What differs between the facts an example lists and a finding's facts (a listed
    fact must be there, with the same text); empty when they agree."""
    problems = []
    for k, v in expected.items():
        if k not in actual:
            problems.append(f"fact {k!r} missing (expected {v!r})")
        elif str(actual[k]) != str(v):
            problems.append(f"fact {k!r} is {actual[k]!r}, expected {v!r}")
    return problems


def _judge_case(rule: Rule, ex: Example, positive: bool, findings: list[Finding]) -> tuple[bool, str, Finding | None]:
    ids = [f.rule for f in findings]
    if positive:
        if rule.id not in ids:
            return False, ("no finding at all" if not ids else f"did not fire (found: {', '.join(ids[:4])})"), None
        mine = findings[ids.index(rule.id)]
        # a log example must make its rule the root cause; evidence examples judge one rule
        if rule.kind == "log" and ids[0] != rule.id:
            return False, f"top finding is {ids[0]!r}; this rule is at position {ids.index(rule.id) + 1}", mine
        problems = facts_problems(ex.facts, mine.facts)
        return (not problems), "; ".join(problems), mine
    if rule.id in ids:
        return False, "fired on a near miss", None
    return True, "", None


def _sentences(rule: Rule) -> list[tuple[str, str]]:
    out = [(f"title.{i}", t) for i, t in enumerate(rule.titles, 1)]
    out += [(f"explanation.{i}", t) for i, t in enumerate(rule.explanation, 1)]
    out += [(f"fixes.{i}", t) for i, t in enumerate(rule.fixes, 1)]
    return out


def unrendered_sentences(rule: Rule, seen: list[Finding]) -> list[str]:
    """The keys ("fixes.2") of the rule's sentences no example finding renders and the
    rule does not excuse in `[unrendered]`."""
    facts = [f.all_facts if f.all_facts is not None else f.facts for f in seen]
    missing = []
    for key, template in _sentences(rule):
        if key in rule.unrendered:
            continue
        if not any(render(template, fs) is not None for fs in facts):
            missing.append(key)
    return missing


def run_selftest(rules: list[Rule], runners: dict[str, CaseRunner], only: list[Rule] | None = None,
                 sentences: bool = True) -> list[CaseResult]:
    results: list[CaseResult] = []
    for rule in only if only is not None else rules:
        runner = runners.get(rule.kind)
        seen: list[Finding] = []
        for kind, cases, positive in (("example", rule.examples, True), ("near_miss", rule.near_misses, False)):
            for i, ex in enumerate(cases):
                if runner is None:
                    results.append(CaseResult(rule.id, kind, i, False, f"no way to test {rule.kind} rules here"))
                    continue
                try:
                    ok, msg, finding = _judge_case(rule, ex, positive, runner(rule, ex, rules))
                except Exception as exc:  # a broken case is a failure, not a crash
                    ok, msg, finding = False, f"{type(exc).__name__}: {exc}", None
                if finding is not None:
                    seen.append(finding)
                results.append(CaseResult(rule.id, kind, i, ok, msg))
        if sentences and runner is not None:
            missing = unrendered_sentences(rule, seen)
            results.append(CaseResult(
                rule.id, "sentence", 0, not missing,
                "" if not missing else
                f"no example renders {', '.join(missing)}: add an example whose evidence has the facts, "
                "or say why none can under [unrendered]"))
    return results


def case_summary(results: list[CaseResult]) -> dict[str, Any]:
    failed = [r for r in results if not r.ok]
    return {"rules": len({r.rule for r in results}), "cases": len([r for r in results if r.kind != "sentence"]),
            "failed": failed}
