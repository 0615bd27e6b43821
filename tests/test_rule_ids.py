"""Every finding of every face comes from a documented rule of rules/.

Two guards: the source has one place that makes a Finding from scratch (the engine's
assembler; reading one back from JSON is the other way in), and every rule id a finding
carried anywhere in this test session is a rule with its documentation, examples and
near misses. This module sorts last (test_rule_ids after every other test file), so
the session has run the faces by the time it checks.
"""

from __future__ import annotations

import re
from pathlib import Path

from mpdoctor import rulebase

ROOT = Path(__file__).resolve().parent.parent / "mpdoctor"


def test_findings_are_made_only_by_the_assembler():
    makers = []
    for path in ROOT.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"(?<![\w.])Finding\(", text):
            line = text.count("\n", 0, m.start()) + 1
            makers.append(f"{path.relative_to(ROOT)}:{line}")
    assert [m for m in makers if not m.startswith(("engine/assemble.py", "findings.py"))] == []


def test_every_rule_id_emitted_in_this_session_is_a_documented_rule():
    import os

    import pytest

    from mpdoctor.findings import Finding

    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("with workers, tests/conftest.py checks the ids of every worker at the end of the session")

    # conftest's recorder (the module pytest loaded, not a second import of it)
    recorder = Finding.__post_init__.__globals__
    EMITTED, TEST_RULES = recorder["EMITTED"], recorder["TEST_RULES"]
    rules = {r.id: r for r in rulebase.load()}
    assert len(EMITTED) > 30, "the faces have not run yet: run the whole suite"
    # the engine tests' own tiny rule folders make findings of their own rules
    unknown = sorted(r for r in EMITTED if r not in rules and r not in TEST_RULES)
    assert unknown == [], f"findings from rules that are not in rules/: {unknown}"
    for rid in EMITTED & rules.keys():
        rule = rules[rid]
        assert rule.examples and rule.near_misses and (rule.doc.get("detects") or rule.summary), rid


def test_the_category_contract_in_docs_is_the_one_the_code_knows():
    from mpdoctor.findings import CATEGORIES

    doc = (ROOT.parent / "docs" / "categories.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", doc, re.M)
    assert listed == list(CATEGORIES)
