"""The rule base tests itself: every rule's examples and near misses, every pattern
matched by an example (or excused), and what each example makes its rule say compared
with its rendered-output snapshot (tests/snapshots/rules/<rule-id>.snap).

A change of words is a reviewed diff: when a rule's sentences change on purpose, rewrite
the snapshots and read the diff before committing it:

    MPDOCTOR_UPDATE_SNAPSHOTS=1 python -m pytest -n0 -q tests/test_rulebase.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.selftest import run_selftest, snapshot_text
from mpdoctor.findings import CATEGORIES

RULES = rulebase.load()
ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "rules"
UPDATE = os.environ.get("MPDOCTOR_UPDATE_SNAPSHOTS") == "1"


def _scrub() -> dict[str, str]:
    """Text that depends on the checkout, not on the rule: its folder (a recorded run's
    frame is read back under it). A snapshot must pass from any clone."""
    return {str(ROOT): "<checkout>"}


def _check_snapshot(rule, results) -> list[str]:
    path = SNAPSHOTS / f"{rule.id}.snap"
    now = snapshot_text(rule, results, _scrub())
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != now:
            path.write_text(now, encoding="utf-8")
        return []
    if not path.exists():
        return [f"no snapshot {path.relative_to(ROOT)}: write it with MPDOCTOR_UPDATE_SNAPSHOTS=1 and review it"]
    was = path.read_text(encoding="utf-8")
    if was == now:
        return []
    diff = "".join(difflib.unified_diff(was.splitlines(True), now.splitlines(True),
                                        f"{path.name} (snapshot)", f"{path.name} (now)"))
    return [f"what the examples make {rule.id} say changed (MPDOCTOR_UPDATE_SNAPSHOTS=1 rewrites the "
            f"snapshot; review the diff):\n{diff}"]


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_examples(rule):
    # one run of the rule's cases: its verdicts, its pattern coverage and its snapshot
    results = run_selftest(RULES, rulebase.case_runners(), [rule])
    failed = [f"{r.kind}[{r.index}]: {r.message}" for r in results if not r.ok]
    failed += _check_snapshot(rule, results)
    assert not failed, "\n".join(failed)


def test_every_snapshot_belongs_to_a_rule():
    ids = {r.id for r in RULES}
    orphans = sorted(p.name for p in SNAPSHOTS.glob("*.snap") if p.stem not in ids)
    if UPDATE:
        for name in orphans:
            (SNAPSHOTS / name).unlink()
        return
    assert not orphans, f"snapshots of rules that no longer exist (delete them): {orphans}"


def test_every_category_is_reachable():
    missing = set(CATEGORIES) - {r.category for r in RULES}
    assert not missing, f"no rule for: {sorted(missing)}"
