"""Real pasted logs from public issue threads (fixtures/logs/real/) are diagnosed right.

Each entry of fixtures/logs/real/MANIFEST.toml names a log as its reporter pasted it, the
thread it came from and the category a user should see first (or "none": a look-alike with
no mixed-precision or GPU problem, which must produce no error-severity finding). These are
held-out style checks: the logs were not written for any rule, so a miss here is a miss a
user would meet.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.explain import explain_path
from mpdoctor.findings import CATEGORIES

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "real"
MANIFEST = tomllib.loads((ROOT / "MANIFEST.toml").read_text(encoding="utf-8"))["log"]


@pytest.fixture(scope="module")
def rules():
    # One rule list for the module: explain's matcher cache then builds the matcher once.
    return rulebase.load()


def test_manifest_is_well_formed():
    names = [e["file"] for e in MANIFEST]
    assert len(names) == len(set(names)), "a log is listed twice"
    on_disk = {p.name for p in ROOT.glob("*.log")}
    assert set(names) == on_disk, "MANIFEST.toml and the .log files disagree"
    for e in MANIFEST:
        assert e["source"].startswith("https://"), e["file"]
        assert e["category"] == "none" or e["category"] in CATEGORIES, e["file"]
    # Every category of the contract has at least one real log, and look-alikes are there.
    cats = {e["category"] for e in MANIFEST}
    assert set(CATEGORIES) <= cats, sorted(set(CATEGORIES) - cats)
    assert "none" in cats


def _param(entry):
    # A known miss carries its reason (`xfail = "..."`, usually an engine/normaliser limit);
    # strict, so the entry has to be updated the day it starts passing.
    marks = [pytest.mark.xfail(reason=entry["xfail"], strict=True)] if "xfail" in entry else []
    return pytest.param(entry, id=entry["file"].removesuffix(".log"), marks=marks)


@pytest.mark.parametrize("entry", [_param(e) for e in MANIFEST])
def test_real_log(entry, rules):
    report = explain_path(ROOT / entry["file"], rules)
    findings = report.findings
    summary = [(f.severity, f.category, f.rule) for f in findings[:4]]
    if entry["category"] == "none":
        errors = [(f.category, f.rule) for f in findings if f.severity == "error"]
        assert not errors, f"look-alike produced error findings: {errors}"
        return
    assert findings, "no finding at all"
    top = findings[0]
    assert top.category == entry["category"], f"top findings: {summary}"
    if "rule" in entry:
        assert top.rule == entry["rule"], f"top findings: {summary}"
    for key, value in entry.get("facts", {}).items():
        assert str(top.facts.get(key)) == value, f"fact {key}: {top.facts.get(key)!r} != {value!r}"
