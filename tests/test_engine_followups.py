"""Engine follow-ups: helper facts, title fallbacks, exception lines, user frames,
rich-handler continuation lines, the public facts checker."""

from __future__ import annotations

import pytest

from mpdoctor.engine import rulecache
from mpdoctor.engine.rules import load_dir
from mpdoctor.explain import explain_text
from tests.rulekit import write_rule


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MPDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    rulecache.reset()
    yield
    rulecache.reset()


def rules_in(tmp_path, *specs):
    folder = tmp_path / "rules"
    for rid, fields in specs:
        write_rule(folder, rid, **fields)
    return load_dir(folder)


def test_helper_facts_render_but_stay_out_of_the_json(tmp_path):
    rules = rules_in(tmp_path, ("helper-fact", dict(
        title="Op failed on {_where}",
        patterns=[r"HELPER-FACT FAILED on (?P<_where>\w+) with (?P<code>\d+)"],
        explanation=["{_where:.0}Only when the helper is known.", "Code {code} on {_where}."],
        fixes=["Fix {_where}."],
        examples=[{"text": "HELPER-FACT FAILED on cpu with 7"}])))
    f = explain_text("HELPER-FACT FAILED on cpu with 7\n", rules).findings[0]
    assert f.title == "Op failed on cpu"
    assert f.explanation == "Only when the helper is known. Code 7 on cpu."
    assert f.fixes == ["Fix cpu."]
    assert f.facts == {"code": "7"}


def test_derived_helper_facts_are_hidden_in_a_real_rule():
    from mpdoctor.engine.rules import load_rules

    log = "RuntimeError: \"LayerNormKernelImpl\" not implemented for 'Half'\n"
    tb = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 3, in <module>\n"
          "    x = torch.nn.functional.layer_norm(x.half().cpu(), (4,))\n" + log)
    report = explain_text(tb, load_rules())
    assert report.findings
    assert not [k for f in report.findings for k in f.facts if k.startswith("_")]
