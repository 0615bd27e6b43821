"""The rules' self-tests at the anchors' level: every pattern is matched by an example of
its rule or excused in [unexercised]; an evidence rule has a near miss of its own, not
only a file many rules share; and what each example makes its rule say is rendered for
its snapshot (tests/snapshots/rules/)."""

from __future__ import annotations

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.rule import Example, RuleError
from mpdoctor.engine.selftest import SHARED_NEAR_MISS, run_selftest, snapshot_text
from tests.rulekit import private_cache, rule_toml, rules_in  # noqa: F401 (private_cache is an autouse fixture)


def _coverage(rules):
    return [r for r in run_selftest(rules, rulebase.case_runners()) if r.kind == "pattern"]


def test_a_pattern_no_example_matches_fails_with_its_key(tmp_path):
    rules = rules_in(tmp_path, ("two-ways", {"patterns": ["TWO-WAYS FAILED", "an older wording of it"]}))
    [result] = _coverage(rules)
    assert not result.ok
    assert "patterns.2" in result.message and "patterns.1" not in result.message
    assert "[unexercised]" in result.message


def test_context_and_requires_count_too(tmp_path):
    rules = rules_in(tmp_path, ("needs", {"requires": ["never in any example"], "context": [r"seen (?P<x>\d+)"]}))
    [result] = _coverage(rules)
    assert "requires.1" in result.message and "context.1" in result.message


def test_an_excuse_passes_and_a_stale_one_fails(tmp_path):
    folder = tmp_path / "rules"
    folder.mkdir()
    text = rule_toml("excused", patterns=["EXCUSED FAILED", "torch 1.4 wording"])
    (folder / "excused.toml").write_text(text + '[unexercised]\n"patterns.2" = "no log of torch 1.4 survives"\n')
    [result] = _coverage(rulebase.load_folder(folder))
    assert result.ok, result.message

    (folder / "excused.toml").write_text(text + '[unexercised]\n"patterns.1" = "wrongly excused"\n"patterns.2" = "ok"\n')
    [result] = _coverage(rulebase.load_folder(folder))
    assert not result.ok and "patterns.1" in result.message and "remove the excuse" in result.message


@pytest.mark.parametrize("table, problem", [
    ('"patterns.3" = "why"', "names no pattern"),
    ('"unless.1" = "why"', "names no pattern"),
    ('"patterns.1" = ""', "must be a table"),
])
def test_the_loader_refuses_a_bad_excuse(tmp_path, table, problem):
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "bad.toml").write_text(rule_toml("bad") + "[unexercised]\n" + table + "\n")
    with pytest.raises(RuleError, match=problem):
        rulebase.load_folder(folder)


def test_a_pattern_matched_only_case_folded_or_across_a_hard_wrap_counts(tmp_path):
    wrapped = ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0\n"
               "and cpu! (when checking argument for argument mat1 in method wrapper_addmm)")
    rules = rules_in(tmp_path, ("folded", {"patterns": ["FOLDED FAILED", r"found at least two devices, cuda:0 and cpu!"],
                                           "examples": [{"text": "folded failed here"}, {"text": wrapped}]}))
    [result] = _coverage(rules)
    assert result.ok, result.message


def test_every_builtin_log_pattern_is_matched_or_excused():
    rules = rulebase.load()
    failing = [r for r in _coverage(rules) if not r.ok]
    # the one rule the lead is rewriting (its GPU-name context) is reported by test_rulebase
    assert {r.rule for r in failing} <= {"unscale-fp16-gradients-hf"}, [(r.rule, r.message) for r in failing]


def test_a_near_miss_many_rules_share_is_not_a_look_alike():
    rules = rulebase.load()
    generic = "fixtures/snapshots/a100-bf16.json"
    users = {r.id for r in rules for ex in r.near_misses if ex.evidence and ex.evidence[1] == generic}
    assert len(users) > SHARED_NEAR_MISS
    rule = next(r for r in rules if r.id == "host-memory-low")
    saved = rule.near_misses
    try:
        rule.near_misses = [Example(snapshot=generic)]
        results = run_selftest(rules, rulebase.case_runners(), [rule])
    finally:
        rule.near_misses = saved
    flagged = [r for r in results if not r.ok and "look-alike of this rule's own" in r.message]
    assert flagged, results
    ok = run_selftest(rules, rulebase.case_runners(), [rule])
    assert all(r.ok for r in ok), [r.message for r in ok if not r.ok]


def test_the_snapshot_shows_what_the_user_reads(tmp_path):
    rules = rules_in(tmp_path, ("snap", {"patterns": [r"SNAP FAILED (?P<n>\d+)"],
                                         "title": "Snap failed {n} times", "explanation": ["It failed {n} times."],
                                         "fixes": ["Fix it {n} times."], "examples": [{"text": "SNAP FAILED 3"}]}))
    results = run_selftest(rules, rulebase.case_runners())
    text = snapshot_text(rules[0], results, {str(tmp_path): "<tmp>"})
    assert "## example 1" in text
    assert "title: Snap failed 3 times" in text
    assert "  It failed 3 times." in text
    assert "  - Fix it 3 times." in text
    assert "  n: '3'" in text
