"""The one path from a rule and its facts to a Finding, and the one merge of two
findings of the same cause. Every face (explain, check, run, probe) ends here.

- `assemble(rule, facts, evidence)`: renders the title (the first of the rule's titles
  whose facts are all known; else the last, cut before its unfinished clause), the
  explanation and the fixes; a deriver may lower or raise the severity through the
  `severity` fact; `_name` facts feed the templates and are left out of the JSON.
- `merge_findings(findings, rules)`: the same cause seen several times (on eight GPUs,
  on several ranks, in the log and by the instrumentation) becomes one finding, with
  the facts of both and re-rendered, so that a sentence the log alone could not fill
  (the module the instrumentation saw) appears.
- `supersede(findings, rules)`: a rule's `supersedes` list drops the more generic
  findings it replaces, whatever face found them.
- `conclude(findings, rules)`: supersede, merge, rank: the one conclusion step.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from ..findings import SEVERITIES, Evidence, Finding, rank_findings
from ..logtext.lines import LazyRe
from .rule import Rule
from .template import render, render_all, render_first, render_paragraph

MAX_EVIDENCE = 6
# Two findings of one rule are one cause when every fact they both know agrees, except
# these, which say where or when it was seen, not what it is (the same NaN on rank 0 at
# step 3 and on rank 1 at step 4; the same V100 model at index 0 and 1).
WHERE_NOT_WHAT = frozenset({"gpu_index", "rank", "ranks", "step", "steps_affected", "user_frame", "exception",
                            "input_min", "input_max", "pid", "line", "local_rank", "memory_context"})


def assemble(rule: Rule, facts: dict[str, Any], evidence: Iterable[Evidence] = (), *, count: int = 1,
             ranks: Iterable[int] = (), likely: bool = False,
             refinements: Iterable[tuple[str, "str | None", "Rule | str", dict[str, Any]]] = ()) -> Finding:
    """The finding `rule` says over `facts`. `likely`: a near match (engine.likely), framed
    by the [likely] words of rules/_frames.toml; `refinements`: (where its sentences go,
    where its fixes go or None for none, a rule or a frame of rules/_frames.toml, its
    facts) of other rules' words that join this finding (a machine's facts under a log
    finding), each "first" or "last"."""
    # the codes as handed in: a merge or a machine's facts re-render from them, so that a
    # [words] table picks its words again with the facts a later sighting adds
    coded = dict(facts)
    facts = apply_words(rule, dict(facts))
    severity = facts.pop("severity", None)
    if severity not in SEVERITIES:
        severity = rule.severity
    titles = render_all(rule.titles, facts)
    title = titles[0] if titles else fallback_title(rule.titles[-1])
    explanation = render_paragraph(rule.explanation, facts)
    fixes = render_all(rule.fixes, facts)
    priority = rule.priority
    refinements = list(refinements)
    words_at: dict[str, list[str]] = {"first": [], "last": []}
    fixes_at: dict[str, list[str]] = {"first": [], "last": []}
    for words_pos, fix_pos, other, other_facts in refinements:
        said, more = _refinement_words(other, other_facts)
        if said:
            words_at[words_pos].append(said)
        if fix_pos is not None:
            fixes_at[fix_pos] += more
    explanation = " ".join(x for x in words_at["first"] + [explanation] + words_at["last"] if x)
    fixes = list(dict.fromkeys(fixes_at["first"] + fixes + fixes_at["last"]))
    if likely:
        from .frames import frame

        words = frame("likely")
        if not titles or "…" in title or len(title) < 24:
            title = rule.summary or title  # never a cut title on a guess
        framed = {**facts, "title": title, "rule": rule.id}
        title = render(words["title"], framed) or title
        said = render(words["explanation"], framed)
        explanation = " ".join(x for x in (said, explanation) if x)
        if words.get("severity") in SEVERITIES:
            severity = words["severity"]
        priority = min(priority, 30)
    finding = Finding(
        rule=rule.id,
        category=rule.category,
        severity=severity,
        title=title,
        explanation=explanation,
        fixes=fixes,
        evidence=list(evidence),
        facts={k: v for k, v in facts.items() if not k.startswith("_")},
        references=list(rule.references),
        count=count,
        ranks=sorted(set(ranks)),
        consequence=rule.consequence,
        priority=priority,
        likely=likely,
        refinements=refinements,
    )
    finding.all_facts = coded  # with the helpers, codes unsaid: what a merge re-renders from
    return finding


def _refinement_words(source: "Rule | str", facts: dict[str, Any]) -> tuple[str, list[str]]:
    """The sentences and fixes one refinement says: a rule's own templates, or a frame's."""
    if isinstance(source, str):
        from .frames import frame

        words = frame(source)
        said = render(words.get("explanation", ""), facts) or ""
        fix = render(words["fix"], facts) if words.get("fix") else None
        return said, [fix] if fix else []
    facts = apply_words(source, dict(facts))
    return render_paragraph(source.explanation, facts), render_all(source.fixes, facts)


def apply_words(rule: Rule, facts: dict[str, Any]) -> dict[str, Any]:
    """A rule's [words] and [each] over its facts: a fact whose value is a code named in
    `[words.FACT]` becomes the words the rule says for it (themselves a template over the
    facts); a fact that is a list of records named in `[each]` becomes each record said
    with that template (the record's own facts first; a list of templates: the first
    whose facts are known), joined by "; "."""
    words = getattr(rule, "words", None) or {}
    each = getattr(rule, "each", None) or {}
    if not words and not each:
        return facts
    for key, template in each.items():
        items = facts.get(key)
        if isinstance(items, list):
            said = []
            for item in items:
                if isinstance(item, dict):
                    one = _say_codes(words, {**facts, **{k: v for k, v in item.items() if v not in (None, "")}})
                    s = render_first(template, one)
                    if s:
                        said.append(s)
            facts[key] = "; ".join(said) if said else None
    return _say_codes(words, facts)


def _say_codes(words: dict[str, dict[str, str]], facts: dict[str, Any]) -> dict[str, Any]:
    # a table whose words use another table's fact is said after it (in any file order)
    def uses_other(key: str) -> bool:
        said = str(words[key])
        return any("{" + other in said for other in words if other != key)

    for key in sorted(words, key=uses_other):
        table = words[key]
        code = facts.get(key)
        if isinstance(code, str) and code in table:
            facts[key] = render_first(table[code], {**facts, key: None})
    return facts


# Where a clause starts: an open bracket, a colon, a dash, a comma, a sentence end.
# (the spaces before it are found with rstrip: a leading \s* would make finditer quadratic
# on a run of spaces)
_CLAUSE = LazyRe(r"[(\[:;,\u2014\u2013]|\s-\s|\.\s")
_DANGLING = " \t([{:;,.-\u2014\u2013"


def fallback_title(title: str) -> str:
    """A title whose facts are missing, as far as it reads complete: cut at the last
    clause boundary before the first placeholder ("The GPU ran out of memory (asked
    for {requested})" -> "The GPU ran out of memory"), never a dangling "(asked for"."""
    head = title.split("{")[0]
    if head == title:
        return title.strip()
    cut = head
    last = None
    for m in _CLAUSE.finditer(head):
        start = m.start()
        while start > 0 and head[start - 1].isspace():  # the spaces before it (each run once: linear)
            start -= 1
        if start > 0:
            last = start
    if last is not None:
        cut = head[:last]
    # never leave a bracket open: "defaults (mixed precision" -> "defaults"
    for opener, closer in ("()", "[]"):
        while cut.count(opener) > cut.count(closer):
            cut = cut[:cut.rindex(opener)]
    cut = cut.rstrip(_DANGLING)
    # nothing before the first fact: the title with its holes marked
    return cut or re.sub(r"\{[^{}]*\}", "…", title).strip()


def same_cause(a: Finding, b: Finding) -> bool:
    if a.rule != b.rule:
        return False
    for key in a.facts.keys() & b.facts.keys():
        if key not in WHERE_NOT_WHAT and str(a.facts[key]) != str(b.facts[key]):
            return False
    return True


def merge_findings(findings: list[Finding], rules: dict[str, Rule] | None = None, *,
                   same_sighting: bool = False) -> list[Finding]:
    """One finding per cause. `same_sighting`: the findings are views of one occurrence
    (the log and the instrumentation of one run), so the count does not add up; else
    each is another sighting (another GPU, another rank) and counts."""
    out: list[Finding] = []
    for f in findings:
        target = next((g for g in out if same_cause(g, f)), None)
        if target is None:
            out.append(f)
        else:
            _merge_into(target, f, same_sighting, (rules or {}).get(f.rule))
    return out


def _merge_into(into: Finding, other: Finding, same_sighting: bool, rule: Rule | None) -> None:
    ranks = sorted(set(into.ranks) | set(other.ranks))
    if same_sighting:
        into.count = max(into.count, other.count, len(ranks))
    else:
        into.count = max(into.count + other.count, len(ranks))
    into.ranks = ranks
    if len(ranks) > 1:
        into.facts.pop("rank", None)
    seen = {(e.line, e.text, e.source) for e in into.evidence}
    for e in other.evidence:
        if (e.line, e.text, e.source) not in seen and len(into.evidence) < MAX_EVIDENCE:
            into.evidence.append(e)
            seen.add((e.line, e.text, e.source))
    # a guess joined by a certain sighting of the same cause is certain; two guesses stay one
    likely = into.likely and other.likely
    relabel = likely != into.likely
    into.likely = likely
    into.priority = max(into.priority, other.priority)
    into.consequence = into.consequence and other.consequence
    if _rank(other.severity) < _rank(into.severity):
        into.severity = other.severity
    mine = getattr(into, "all_facts", None) or dict(into.facts)
    theirs = getattr(other, "all_facts", None) or dict(other.facts)
    added = {k: v for k, v in theirs.items() if k not in mine and k != "rank"}
    for r in other.refinements:
        if r not in into.refinements:
            into.refinements.append(r)
            relabel = True
    if not added and not relabel:
        return
    facts = {**mine, **added}
    if rule is not None:  # re-render: a sentence the first sighting could not fill may now be
        fresh = assemble(rule, facts, likely=into.likely, refinements=into.refinements)
        into.title, into.explanation, into.fixes = fresh.title, fresh.explanation, fresh.fixes
        into.facts = {k: v for k, v in fresh.facts.items() if k in into.facts or k in added}
        into.all_facts = facts
    else:
        into.facts.update({k: v for k, v in added.items() if not k.startswith("_")})
        into.all_facts = facts


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def supersede(findings: list[Finding], rules: dict[str, Rule]) -> list[Finding]:
    """Drop the findings of rules that a present finding's rule supersedes."""
    present = {f.rule for f in findings}
    dropped: set[str] = set()
    for f in findings:
        rule = rules.get(f.rule)
        for other in (rule.supersedes if rule is not None else []):
            if other in present and other != f.rule:
                dropped.add(other)
    return [f for f in findings if f.rule not in dropped]


def conclude(findings: list[Finding], rules: dict[str, Rule], *, same_sighting: bool = False) -> list[Finding]:
    """The one conclusion step every face ends in: findings a present rule supersedes are
    dropped, the same cause seen several times becomes one finding (`same_cause`), and
    the rest is ranked root cause first. `same_sighting`: the findings are views of one
    occurrence (a run's log and its instrumentation), so counts do not add up."""
    return rank_findings(merge_findings(supersede(findings, rules), rules, same_sighting=same_sighting))
