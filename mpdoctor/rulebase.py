"""The rule base as every face loads it: the rule folders, and the fact vocabulary
that ties each rule kind to the checks that judge it.

This is the composition root of the knowledge: the engine (mpdoctor.engine) knows no
face, so the faces' checks and the facts they add are named here, as module paths
imported only when a rule file has to be validated (a cache miss) or tested.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .run.checks import MODULES as RUN_CHECK_MODULES  # a tuple of names; imports no check

if TYPE_CHECKING:
    from pathlib import Path

    from .engine.facts import Vocabulary
    from .engine.rule import Rule
    from .engine.selftest import CaseRunner

# kind -> the modules whose @check functions judge rules of that kind
CHECK_MODULES: dict[str, tuple[str, ...]] = {
    "env": ("mpdoctor.env.checks.precision", "mpdoctor.env.checks.driver", "mpdoctor.env.checks.libraries",
            "mpdoctor.env.checks.config", "mpdoctor.env.checks.memory", "mpdoctor.env.checks.machine"),
    "run": tuple(f"mpdoctor.run.checks.{m}" for m in RUN_CHECK_MODULES),
    "probe": ("mpdoctor.probe.checks",),
    "job": ("mpdoctor.job.checks",),
}
# kind -> the facts faces add to rules of that kind when they judge them on their own
# evidence ("module:ATTRIBUTE", a dict of fact -> where it comes from)
ADDED_FACTS: dict[str, tuple[str, ...]] = {
    "log": ("mpdoctor.run.evidence:EXCEPTION_CONTEXT_FACTS",),
    "env": ("mpdoctor.run.evidence:OBSERVED_FACTS", "mpdoctor.probe.evidence:OBSERVED_FACTS"),
}

_VOCABULARY: "Vocabulary | None" = None


def vocabulary() -> "Vocabulary":
    global _VOCABULARY
    if _VOCABULARY is None:
        from .engine.facts import Vocabulary

        _VOCABULARY = Vocabulary(CHECK_MODULES, ADDED_FACTS)
    return _VOCABULARY


def load(extra: "list[str | Path] | None" = None, kind: str | None = None) -> "list[Rule]":
    """Every rule (built-in, MPDOCTOR_RULES_PATH, then `extra` folders), validated
    against the fact vocabulary. Raises engine.rule.RuleError."""
    from .engine.loader import load_rules

    return load_rules(extra, kind, vocabulary())


def load_folder(directory: "str | Path") -> "list[Rule]":
    from .engine.loader import load_dir

    return load_dir(directory, vocabulary=vocabulary())


def case_runners() -> "dict[str, CaseRunner]":
    """How `rules test` judges an example of each kind: the way its face would."""
    from .engine.selftest import example_path
    from .logs import explain_case

    def refinement_case(rule: Any, ex: Any, rules: Any) -> Any:
        # the example's log explained, then its top finding refined on the snapshot's machine
        import json

        from .diagnosis.sharpen import mode_hint, refinement_findings
        from .env.judge import make_view

        found = explain_case(rule, ex, rules)
        if not found:
            return []
        snap = json.loads(example_path(rule, ex.snapshot).read_text(encoding="utf-8"))
        return refinement_findings(found[0], make_view(snap, mode_hint(found[0])), rules)

    def evidence_case(rule: Any, ex: Any, rules: Any) -> Any:
        if getattr(rule, "refines", None):
            return refinement_case(rule, ex, rules)
        kind, name = ex.evidence
        path = str(example_path(rule, name))
        if kind == "snapshot":
            from .env.judge import snapshot_case

            return snapshot_case(path, rules)
        if kind == "events":
            from .diagnosis.run import events_case

            return events_case(path, rules)
        from .diagnosis.probe import probe_case

        return probe_case(path, rules)

    def log_case(rule: Any, ex: Any, rules: Any) -> Any:
        # a log rule's example may be a recorded run: the exception a process raised
        return evidence_case(rule, ex, rules) if ex.evidence is not None else explain_case(rule, ex, rules)

    def job_case(rule: Any, ex: Any, rules: Any) -> Any:  # a job's recorded evidence (JSON)
        from .job.judge import job_case as judge_recorded

        return judge_recorded(str(example_path(rule, ex.events)), rules)

    return {"log": log_case, "env": evidence_case, "run": evidence_case, "probe": evidence_case, "job": job_case}
