"""The rule base tests itself: every rule's examples and near misses."""

from __future__ import annotations

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.selftest import run_selftest
from mpdoctor.findings import CATEGORIES

RULES = rulebase.load()


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_examples(rule):
    results = run_selftest(RULES, rulebase.case_runners(), [rule])
    failed = [f"{r.kind}[{r.index}]: {r.message}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)


def test_every_category_is_reachable():
    missing = set(CATEGORIES) - {r.category for r in RULES}
    assert not missing, f"no rule for: {sorted(missing)}"
