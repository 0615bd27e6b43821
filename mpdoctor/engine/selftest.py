"""Rules test themselves (semgrep's `--test`, for mpdoctor).

Every rule's `[[example]]` must make that rule fire with the facts it lists (a log
rule: the top finding of its example log); every `[[near_miss]]` must not make it fire
at all. Examples run against the whole rule set, as a user's evidence would.

And every sentence a rule can say is said by at least one of its examples: each title,
explanation and fix template renders on the facts of some example's finding, unless the
rule's `[unrendered]` table says why no example can show it. A sentence nobody has seen
rendered is a sentence nobody has read.

Likewise every pattern of a log rule (`patterns`, `context`, `requires`) matches a line of
at least one of its examples, unless `[unexercised]` says why none can ("patterns.3" =
"why"): a pattern no example matches is a pattern nobody has seen match. And an evidence
rule (env, run, probe) has at least one near miss that is a look-alike of its own: a file
that more than SHARED_NEAR_MISS rules use as their near miss (a healthy machine, a clean
run) shows only that the check keeps quiet on health, not that it tells its case apart.

`snapshot_text()` renders what each example's finding says (title, explanation, fixes,
facts), for the rendered-output snapshots (tests/snapshots/rules/, ruff's `.snap`) that
make a change of words a reviewed diff.

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
from .judge import strict_checks, trace_checks
from .rule import Example, Rule, RuleError
from .template import render


@dataclass
class CaseResult:
    rule: str
    kind: str  # "example" | "near_miss" | "sentence" | "pattern"
    index: int
    ok: bool
    message: str = ""
    # an example's finding of this rule (what its snapshot shows); None elsewhere
    finding: Finding | None = None


# A near miss file used by more rules than this is a generic one (a healthy snapshot, a
# clean run), not a look-alike of any of them.
SHARED_NEAR_MISS = 3
# The evidence rules that still have only a generic near miss (a baseline, as ruff's: it
# only shrinks; a rule listed here that gains a look-alike fails until it is removed).
NO_LOOK_ALIKE_YET: frozenset[str] = frozenset({"rank-summary"})


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
        fates: list[str] = []  # what became of the check on each evidence near miss
        traced_any = False  # did any case go through the engine's judge (a test's own runner may not)
        for kind, cases, positive in (("example", rule.examples, True), ("near_miss", rule.near_misses, False)):
            for i, ex in enumerate(cases):
                if runner is None:
                    results.append(CaseResult(rule.id, kind, i, False, f"no way to test {rule.kind} rules here"))
                    continue
                try:
                    # a check that raises fails the case (never "nothing found")
                    with strict_checks(), trace_checks() as traced:
                        found = runner(rule, ex, rules)
                    ok, msg, finding = _judge_case(rule, ex, positive, found)
                    traced_any = traced_any or rule.id in traced
                    if not positive and rule.check and ex.evidence is not None:
                        fates.append(traced.get(rule.id, "not judged at all"))
                except Exception as exc:  # a broken case is a failure, not a crash
                    ok, msg, finding = False, f"{type(exc).__name__}: {exc}", None
                if finding is not None:
                    seen.append(finding)
                results.append(CaseResult(rule.id, kind, i, ok, msg, finding if positive else None))
        if traced_any and fates and "judged" not in fates and rule.severity != "info":  # a summary states, it does not diagnose
            results.append(CaseResult(
                rule.id, "near_miss", len(rule.near_misses), False,
                f"no near miss reaches check {rule.check!r} ({fates[0]}): at least one must be a look-alike "
                "the check judges and finds healthy, not evidence it skips"))
        if rule.check and rule.near_misses:
            generic = shared_near_misses(rules)
            files = [ex.evidence[1] for ex in rule.near_misses if ex.evidence is not None]
            lacking = bool(files) and len(files) == len(rule.near_misses) and all(f in generic for f in files)
            if lacking and rule.id not in NO_LOOK_ALIKE_YET:
                results.append(CaseResult(
                    rule.id, "near_miss", len(rule.near_misses), False,
                    f"every near miss is a file more than {SHARED_NEAR_MISS} rules share ({', '.join(files)}): add a "
                    "look-alike of this rule's own (an example's evidence with the one value that makes the "
                    "difference changed)"))
            elif not lacking and rule.id in NO_LOOK_ALIKE_YET:
                results.append(CaseResult(
                    rule.id, "near_miss", len(rule.near_misses), False,
                    "this rule has a look-alike near miss now: remove it from selftest.NO_LOOK_ALIKE_YET"))
        if sentences and runner is not None:
            missing = unrendered_sentences(rule, seen)
            results.append(CaseResult(
                rule.id, "sentence", 0, not missing,
                "" if not missing else
                f"no example renders {', '.join(missing)}: add an example whose evidence has the facts, "
                "or say why none can under [unrendered]"))
        if sentences and rule.kind == "log":  # coverage: of the sentences, and of the patterns
            try:
                unmatched, stale = unexercised_patterns(rule, rules)
            except (OSError, RuleError) as exc:  # an unreadable example or rule file
                unmatched, stale = [], [f"({type(exc).__name__}: {exc})"]
            problems = []
            if unmatched:
                problems.append(f"no example matches {', '.join(unmatched)}: add an example with the message it "
                                "is for, remove the pattern if nothing says that, or say why under [unexercised]")
            if stale:
                problems.append(f"[unexercised] excuses {', '.join(stale)}, which an example matches: "
                                "remove the excuse")
            results.append(CaseResult(rule.id, "pattern", 0, not problems, "; ".join(problems)))
    return results


_SHARED: dict[int, tuple[list[Rule], set[str]]] = {}


def shared_near_misses(rules: list[Rule]) -> set[str]:
    """The evidence files more than SHARED_NEAR_MISS rules use as a near miss (cached
    per rule list: run_selftest is called once per rule by the test suite)."""
    entry = _SHARED.get(id(rules))
    if entry is None or entry[0] is not rules:
        users: dict[str, set[str]] = {}
        for r in rules:
            for ex in r.near_misses:
                if ex.evidence is not None:
                    users.setdefault(ex.evidence[1], set()).add(r.id)
        entry = (rules, {f for f, ids in users.items() if len(ids) > SHARED_NEAR_MISS})
        _SHARED.clear()
        _SHARED[id(rules)] = entry
    return entry[1]


def unexercised_table(rule: Rule) -> dict[str, str]:
    """The rule's `[unexercised]` table (read from its file: only the self-tests need it)."""
    from .loader import _read_toml

    table = _read_toml(rule.path).get("unexercised", {})
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}


def example_lines(rule: Rule, ex: Example) -> list[str]:
    """The clean logical lines a log example's text shows its rule's patterns, with the
    joins of hard-wrapped lines the matcher also tries; [] for a recorded run."""
    if ex.evidence is not None:
        return []
    from ..logtext import normalise
    from .match import wrap_joins

    lines = normalise(example_text(rule, ex))
    return [ln.text for ln in lines + wrap_joins(lines)]


def _matches(rx: Any, texts: list[str]) -> bool:
    return any(rx.search(t) or rx.search_folded(t) for t in texts)


_SHARED_CONTEXT: dict[int, tuple[list[Rule], set[str]]] = {}


def exercised_context(rules: list[Rule]) -> set[str]:
    """The context patterns (as text) some log rule's own examples match. A context
    pattern reads a fact from a line that does not depend on the rule (the nvidia-smi
    table, torch's device properties, `torch==2.1.0`): the same regular expression in
    another rule is exercised wherever one of the rules that share it is."""
    entry = _SHARED_CONTEXT.get(id(rules))
    if entry is None or entry[0] is not rules:
        seen: set[str] = set()
        for r in rules:
            if r.kind != "log" or not r.context:
                continue
            try:
                texts = [t for ex in r.examples for t in example_lines(r, ex)]
            except OSError:
                continue
            seen.update(rx.pattern for rx in r.context if _matches(rx, texts))
        entry = (rules, seen)
        _SHARED_CONTEXT.clear()
        _SHARED_CONTEXT[id(rules)] = entry
    return entry[1]


def unexercised_patterns(rule: Rule, rules: list[Rule] | None = None) -> tuple[list[str], list[str]]:
    """(keys of the log rule's patterns no example line matches and [unexercised] does not
    excuse, keys [unexercised] excuses although an example matches them). A pattern counts
    as matched by a line it finds, as written or case-folded, as the matcher tries it; a
    context pattern also when `rules` has another rule with the same one whose examples
    match it (exercised_context)."""
    texts = [t for ex in rule.examples for t in example_lines(rule, ex)]
    excused = unexercised_table(rule)
    shared = exercised_context(rules) if rules is not None else set()
    unmatched, stale = [], []
    for part in ("patterns", "context", "requires"):
        for i, rx in enumerate(getattr(rule, part), 1):
            key = f"{part}.{i}"
            hit = _matches(rx, texts) or (part == "context" and rx.pattern in shared)
            if hit and key in excused:
                stale.append(key)
            elif not hit and key not in excused:
                unmatched.append(key)
    return unmatched, stale


def snapshot_text(rule: Rule, results: list[CaseResult], scrub: dict[str, str] | None = None) -> str:
    """What each example of `rule` made it say, as a user reads it: the finding's title,
    explanation, fixes and facts, one block per example (the rule's `.snap`). `scrub`
    replaces machine-specific text (the checkout's folder, the home folder)."""
    out = [f"# rule {rule.id} ({rule.kind}): what each example makes it say"]
    for r in results:
        if r.rule != rule.id or r.kind != "example":
            continue
        ex = rule.examples[r.index] if r.index < len(rule.examples) else None
        where = "" if ex is None else (f" ({ex.evidence[0]} {ex.evidence[1]})" if ex.evidence is not None
                                       else f" (file {ex.file})" if ex.file else "")
        out += ["", f"## example {r.index + 1}{where}"]
        f = r.finding
        if f is None:
            out.append(f"(no finding: {r.message})")
            continue
        out.append(f"severity: {f.severity}")
        out.append(f"title: {f.title}")
        out.append("explanation:")
        out += [f"  {line}" for line in (f.explanation or "").splitlines()] or ["  (none)"]
        out.append("fixes:")
        out += [f"  - {fix}" for fix in f.fixes] or ["  (none)"]
        out.append("facts:")
        out += [f"  {k}: {f.facts[k]!r}" for k in sorted(f.facts)] or ["  (none)"]
    text = "\n".join(out) + "\n"
    for old, new in (scrub or {}).items():
        if old:
            text = text.replace(old, new)
    return text


def case_summary(results: list[CaseResult]) -> dict[str, Any]:
    failed = [r for r in results if not r.ok]
    return {"rules": len({r.rule for r in results}), "cases": len([r for r in results if r.kind != "sentence"]),
            "failed": failed}
