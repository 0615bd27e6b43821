"""Rules test themselves (semgrep's `--test`, for mpdoctor).

Every log rule's `[[example]]` must make that rule the top finding, with the facts it
lists; every `[[near_miss]]` must not make the rule fire at all. Environment rules'
examples are snapshots: the rule must fire on an example and stay silent on a near
miss. Examples run against the whole rule set, as a user's log would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path
from typing import Callable

from .rules import Example, Rule


@dataclass
class CaseResult:
    rule: str
    kind: str  # "example" | "near_miss"
    index: int
    ok: bool
    message: str = ""


def example_path(rule: Rule, name: str) -> "Path":
    for base in (rule.path.parent, rule.root.parent, rule.root):
        p = base / name
        if p.exists():
            return p
    return rule.root.parent / name


def example_text(rule: Rule, ex: Example) -> str:
    if ex.text is not None:
        return ex.text
    assert ex.file is not None
    return example_path(rule, ex.file).read_bytes().decode("utf-8", errors="replace")


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


_facts_problems = facts_problems  # the old private name, for callers not yet moved


def _log_case(rule: Rule, ex: Example, positive: bool, rules: list[Rule]) -> tuple[bool, str]:
    from ..explain import explain_text

    try:
        text = example_text(rule, ex)
    except OSError as exc:
        return False, f"cannot read example file {ex.file}: {exc.strerror}"
    report = explain_text(text, rules)
    ids = [f.rule for f in report.findings]
    if positive:
        if not ids:
            return False, "no finding at all (expected this rule first)"
        if ids[0] != rule.id:
            where = f"found at position {ids.index(rule.id) + 1}" if rule.id in ids else "did not fire"
            return False, f"top finding is {ids[0]!r}; this rule {where}"
        problems = facts_problems(ex.facts, report.findings[0].facts)
        if problems:
            return False, "; ".join(problems)
        return True, ""
    if rule.id in ids:
        return False, "fired on a near miss"
    return True, ""


# Environment rules are judged by the env package; it registers its case runner here
# so that this module stays free of any collector import.
EnvCaseRunner = Callable[[Rule, Example, bool, list[Rule]], "tuple[bool, str]"]
ENV_CASE_RUNNER: list[EnvCaseRunner] = []


def _env_case(rule: Rule, ex: Example, positive: bool, rules: list[Rule]) -> tuple[bool, str]:
    if not ENV_CASE_RUNNER:
        try:
            from ..env import judge  # noqa: F401  (registers the runner)
        except ImportError as exc:
            return False, f"environment rules cannot be tested: {exc}"
    if not ENV_CASE_RUNNER:
        return False, "environment rules cannot be tested: no case runner registered"
    return ENV_CASE_RUNNER[0](rule, ex, positive, rules)


def run_selftest(rules: list[Rule], only: list[Rule] | None = None) -> list[CaseResult]:
    results: list[CaseResult] = []
    for rule in only if only is not None else rules:
        runner = _log_case if rule.kind == "log" else _env_case
        for kind, cases, positive in (("example", rule.examples, True), ("near_miss", rule.near_misses, False)):
            for i, ex in enumerate(cases):
                try:
                    ok, msg = runner(rule, ex, positive, rules)
                except Exception as exc:  # a broken case is a failure, not a crash
                    ok, msg = False, f"{type(exc).__name__}: {exc}"
                results.append(CaseResult(rule.id, kind, i, ok, msg))
    return results
