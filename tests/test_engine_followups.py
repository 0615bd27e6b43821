"""Engine follow-ups: helper facts, title fallbacks, exception lines, user frames,
rich-handler continuation lines, the public facts checker."""

from __future__ import annotations

import pytest

from mpdoctor import rulebase
from mpdoctor.engine import rulecache
from mpdoctor.logs import explain_text
from tests.rulekit import private_cache, rules_in, write_rule  # noqa: F401 (private_cache is an autouse fixture)


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
    from mpdoctor import rulebase

    log = "RuntimeError: \"LayerNormKernelImpl\" not implemented for 'Half'\n"
    tb = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 3, in <module>\n"
          "    x = torch.nn.functional.layer_norm(x.half().cpu(), (4,))\n" + log)
    report = explain_text(tb, rulebase.load())
    assert report.findings
    assert not [k for f in report.findings for k in f.facts if k.startswith("_")]


def test_a_title_without_its_facts_drops_the_unfinished_clause(tmp_path):
    rules = rules_in(tmp_path, ("oom-ish", dict(
        title="The GPU ran out of memory (asked for {requested})",
        patterns=[r"OOM-ISH FAILED(?: asking (?P<requested>\d+ GiB))?"])))
    assert explain_text("OOM-ISH FAILED\n", rules).findings[0].title == "The GPU ran out of memory"
    full = explain_text("OOM-ISH FAILED asking 2 GiB\n", rules).findings[0]
    assert full.title == "The GPU ran out of memory (asked for 2 GiB)"


@pytest.mark.parametrize("title, expected", [
    ("bf16 needs Ampere: your {gpu} is {arch}", "bf16 needs Ampere"),
    ("NaN loss — from step {step}", "NaN loss"),
    ("Loss scale collapsed, last seen {scale}", "Loss scale collapsed"),
    ("{gpu} cannot do bf16", "… cannot do bf16"),
    ("launch filled in defaults (mixed precision: {mp})", "launch filled in defaults"),  # no bracket left open
])
def test_fallback_title_forms(title, expected):
    from mpdoctor.engine.assemble import fallback_title

    assert fallback_title(title) == expected


def test_a_title_list_uses_the_first_whose_facts_are_known(tmp_path):
    spec = dict(title=["Kernel {op} failed on {gpu}", "Kernel {op} failed", "A kernel failed"],
                patterns=[r"TITLES FAILED(?: op=(?P<op>\w+))?(?: gpu=(?P<gpu>\w+))?"],
                examples=[{"text": "TITLES FAILED op=mm"}])
    rules = rules_in(tmp_path, ("titles", spec))
    assert rules[0].title == "Kernel {op} failed on {gpu}"  # listings show the fullest
    assert explain_text("TITLES FAILED op=mm gpu=T4\n", rules).findings[0].title == "Kernel mm failed on T4"
    assert explain_text("TITLES FAILED op=mm\n", rules).findings[0].title == "Kernel mm failed"
    assert explain_text("TITLES FAILED\n", rules).findings[0].title == "A kernel failed"
    # the same from the rule cache, loaded afresh
    rulecache.reset()
    cached = rulebase.load_folder(tmp_path / "rules")
    assert cached[0].titles == spec["title"]
    assert explain_text("TITLES FAILED op=mm\n", cached).findings[0].title == "Kernel mm failed"


def test_a_title_list_with_a_non_string_is_refused(tmp_path):
    from mpdoctor.engine.rule import RuleError

    with pytest.raises(RuleError, match="title"):
        rules_in(tmp_path, ("bad-title", dict(title=["ok", 3])))


@pytest.mark.parametrize("line, expected", [
    ("Exception: something broke", ("Exception", "something broke")),
    ("Exception", ("Exception", "")),
    ("builtins.Exception: boom", ("builtins.Exception", "boom")),
    ("ValueError: bad", ("ValueError", "bad")),
])
def test_plain_exception_is_an_exception_line(line, expected):
    from mpdoctor.logtext import exception_line

    assert exception_line(line) == expected


@pytest.mark.parametrize("line", ["Error: file not found", "Warning: low disk", "Exceptional results: 3"])
def test_bare_error_words_are_not_exception_lines(line):
    from mpdoctor.logtext import exception_line

    assert exception_line(line) is None


def test_a_traceback_ending_in_plain_exception_is_reported():
    from mpdoctor import rulebase

    log = ("Traceback (most recent call last):\n"
           "  File \"/home/u/proj/train.py\", line 9, in <module>\n"
           "    raise Exception(\"the data loader gave up\")\n"
           "Exception: the data loader gave up\n")
    report = explain_text(log, rulebase.load())
    assert [u.exception for u in report.unrecognised] == ["Exception: the data loader gave up"]
    assert report.unrecognised[0].user_frame == "/home/u/proj/train.py:9"


@pytest.mark.parametrize("path, user", [
    ("/workspace/proj/scripts/train.py", True),
    ("C:\\Users\\ana\\proj\\scripts\\train.py", True),
    ("/home/u/proj/train.py", True),
    ("C:\\Users\\ana\\venv\\Scripts\\accelerate.exe\\__main__.py", False),
    ("C:\\Users\\ana\\proj\\.venv\\Scripts\\accelerate-script.py", False),
    ("pandas/_libs/parsers.pyx", False),
    ("pandas/_libs/hashtable_class_helper.pxi", False),
    ("/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", False),
])
def test_user_frame_detection(path, user):
    from mpdoctor.logtext import Frame

    assert Frame(path, 1, "f", 0).is_user_code is user


RICH_HANDLER_LOG = (
    "17:05:31-835745 ERROR    Exception: \"LayerNormKernelImpl\" not implemented for   \n"
    "                         'Half'                                                 \n"
    "17:05:31-838229 ERROR    Arguments: args=('task', 'photo of a  \n"
    "                         tree', 20) kwargs={}\n"
    "                      not a continuation (wrong column)\n"
    "17:05:31-840247 INFO     done\n"
    "                         next\n"
)


def test_rich_handler_prefix_is_stripped_and_its_wrapped_message_joined():
    from mpdoctor.logtext import normalise

    texts = [ln.text for ln in normalise(RICH_HANDLER_LOG) if ln.text]
    assert texts == [
        "Exception: \"LayerNormKernelImpl\" not implemented for 'Half'",
        "Arguments: args=('task', 'photo of a tree', 20) kwargs={}",
        "                      not a continuation (wrong column)",
        "done next",
    ]


def test_rich_handler_wrapped_half_op_is_explained_from_the_joined_line():
    from mpdoctor import rulebase

    report = explain_text(RICH_HANDLER_LOG, rulebase.load())
    top = report.findings[0]
    assert top.category == "half-op-not-implemented"
    assert "'Half'" in top.evidence[0].text


def test_facts_problems_is_public_and_the_old_name_still_works():
    from mpdoctor.engine import selftest

    assert selftest.facts_problems({"cc": "7.5"}, {"cc": "7.5", "gpu": "T4"}) == []
    assert selftest.facts_problems({"cc": "8.0", "sm": "sm_80"}, {"cc": "7.5"}) == [
        "fact 'cc' is '7.5', expected '8.0'", "fact 'sm' missing (expected 'sm_80')"]
