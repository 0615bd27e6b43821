"""The fact vocabulary: which facts can reach a rule's templates, and from where.

A placeholder in a title, explanation or fix is a fact. Facts come from:
- a log rule's patterns (named groups) and context patterns;
- the engine itself for log rules (ENGINE_FACTS: the exception type, the user frame, ranks);
- the rule's deriver (`@deriver(..., facts=...)` declares them);
- the rule's check, for env / run / probe rules (`@check(facts=...)`);
- what a face adds when it judges a rule on its own evidence (the module and step a
  run saw fail, the dtype a run's first matmul produced): `added` below, declared by
  the faces and handed in by the composition root (mpdoctor.rulebase).

The loader asks `Vocabulary.problem(rule)` when it parses a rule file: a placeholder
nothing produces is a RuleError naming the file, the rule and the placeholder, so a
typo (`{gpuu}`) never renders as an empty sentence. `rules show` lists `produced(rule)`.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

from .rule import Rule
from .template import fields_of

ENGINE_FACTS: dict[str, str] = {
    "exception": "the exception type of the traceback the matched line is in",
    "user_frame": "the last frame of the traceback outside libraries, as file:line",
    "ranks": "the ranks the line was seen on",
    "stack_frame": "the last frame outside libraries of the stack printed after a `frames_after` line, as file:line",
    "stack_code": "the code line of that frame",
    "_stack": "a code set for every rule with `frames_after` (its [words._stack] table picks the words, stack known or not)",
}


class Vocabulary:
    """`checks`: kind -> module names whose @check functions judge rules of that kind
    (imported only when a rule file is validated); `added`: kind -> {fact: where from},
    the facts a face adds to rules of that kind."""

    def __init__(self, checks: dict[str, tuple[str, ...]] | None = None,
                 added: dict[str, tuple[str, ...]] | None = None) -> None:
        # both are module names ("pkg.module" or "pkg.module:ATTRIBUTE" for `added`),
        # imported only when a rule file is validated: explain's start-up never pays
        self.check_modules = dict(checks or {})
        self.added_specs = dict(added or {})
        self._checks: dict[str, dict[str, Callable[..., Any]]] = {}
        self._added: dict[str, dict[str, str]] = {}

    def added(self, kind: str) -> dict[str, str]:
        """fact -> where from, for the facts faces add to rules of `kind`."""
        if kind not in self._added:
            out: dict[str, str] = {}
            for spec in self.added_specs.get(kind, ()):
                module, _, attr = spec.partition(":")
                out.update(getattr(importlib.import_module(module), attr))
            self._added[kind] = out
        return self._added[kind]

    def checks(self, kind: str) -> dict[str, Callable[..., Any]]:
        if kind not in self._checks:
            from .judge import checks_in

            modules = [importlib.import_module(m) for m in self.check_modules.get(kind, ())]
            self._checks[kind] = checks_in(*modules)
        return self._checks[kind]

    def produced(self, rule: Rule) -> dict[str, str]:
        """fact -> where it comes from, for every fact this rule's templates may use."""
        out: dict[str, str] = {}
        if rule.kind == "log":
            for key, label in (("patterns", "pattern"), ("context", "context pattern")):
                for rx in getattr(rule, key):
                    for name in _groups(rx.pattern):
                        out.setdefault(name, label)
            for name, why in ENGINE_FACTS.items():
                out.setdefault(name, f"engine: {why}")
            if rule.derive:
                from .derive import facts_of

                for name in facts_of(rule.derive):
                    out.setdefault(name, f"deriver {rule.derive}")
        else:
            fn = self.checks(rule.kind).get(rule.check or "")
            info = getattr(fn, "__check__", None)
            for name in (info.facts if info is not None else ()):
                out.setdefault(name, f"check {rule.check}")
        for name, why in self.added(rule.kind).items():
            out.setdefault(name, why)
        return out

    def problem(self, rule: Rule) -> str | None:
        """What is wrong with the rule's facts, or None."""
        if rule.kind != "log":
            known = self.checks(rule.kind)
            if known and rule.check not in known:
                return (f"check {rule.check!r} is not one of mpdoctor's {rule.kind} checks: "
                        f"{', '.join(sorted(known))}")
        produced = self.produced(rule)
        def flat(values: Any) -> list[str]:
            return [t for v in values for t in ([v] if isinstance(v, str) else v)]

        words = flat(w for table in (rule.words or {}).values() for w in table.values())
        for part, templates in (("title", rule.titles), ("explanation", rule.explanation), ("fixes", rule.fixes),
                                ("each", flat((rule.each or {}).values())), ("words", words)):
            for i, template in enumerate(templates, 1):
                for name in fields_of(template):
                    if name not in produced:
                        close = _close(name, produced)
                        return (f"{part} {i} uses {{{name}}}, a fact nothing produces for this rule"
                                + (f" (did you mean {{{close}}}?)" if close else "")
                                + f"; known: {', '.join(sorted(produced)) or 'none'}")
        return None


_GROUP = re.compile(r"\(\?P<(\w+)>")


def _groups(pattern: str) -> list[str]:
    return _GROUP.findall(pattern)


def _close(name: str, known: dict[str, str]) -> str | None:
    import difflib

    got = difflib.get_close_matches(name, list(known), n=1)
    return got[0] if got else None
