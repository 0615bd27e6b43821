"""Real pasted logs from public issue threads are diagnosed right: fixtures/logs/real/ and
the blind sets (fixtures/logs/blind1/ to blind4/), each scored untouched before any rule
was tuned on it (the figures are in their MANIFEST.toml).

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
from mpdoctor.findings import CATEGORIES
from mpdoctor.logs import explain_path

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
SETS = ("real", "blind1", "blind2", "blind3", "blind4", "blind5")
MANIFESTS = {name: tomllib.loads((LOGS / name / "MANIFEST.toml").read_text(encoding="utf-8"))["log"] for name in SETS}
ROOT = LOGS / "real"
MANIFEST = MANIFESTS["real"]


@pytest.fixture(scope="module")
def rules():
    # One rule list for the module: explain's matcher cache then builds the matcher once.
    return rulebase.load()


@pytest.mark.parametrize("name", SETS)
def test_manifest_is_well_formed(name):
    manifest = MANIFESTS[name]
    names = [e["file"] for e in manifest]
    assert len(names) == len(set(names)), "a log is listed twice"
    on_disk = {p.name for p in (LOGS / name).glob("*.log")}
    assert set(names) == on_disk, "MANIFEST.toml and the .log files disagree"
    for e in manifest:
        assert e["source"].startswith("https://"), e["file"]
        assert e["category"] == "none" or e["category"] in CATEGORIES, e["file"]
    if name != "real":
        return
    # Every category of the contract has at least one real log, and look-alikes are there.
    cats = {e["category"] for e in MANIFEST}
    assert set(CATEGORIES) <= cats, sorted(set(CATEGORIES) - cats)
    assert "none" in cats


# blind3 (issue 21's fresh set) was added after its "after" score (95/103 top-1, 1/26 false
# alarms, the same as untouched): its misses are known, strict, and not tuned on.
BLIND3_MISSES = {  # what the scorer printed (the pastes themselves were not read)
    "accel-accelerate-mixedprecision-none.log": "silent (unrecognised AttributeError: 'NoneType' ... 'lower')",
    "accel-diffusers-dreambooth-mixedprecision-space.log": "silent [damaged:prose, symptom-only]",
    "dtype-llamafactory-sft-layernorm-cast-quoted.log": "silent [damaged:quoted, damaged:cut]",
    "fp8-rocm-mamf-tunable-scaled-gemm.log": "said half-op-not-implemented [platform:hip, damaged:cut, wording:new]",
    "hostoom-dreamerv3-killed-cjk.log": "silent [damaged:cjk, symptom-only]",
    "lossscale-cogvideo-keyerror-shadow.log": "silent [symptom-only, wording:indirect]",
    "nan-sdnext-vae-nansexception.log": "silent [damaged:prose, platform:windows]",
    "oom-damoyolo-cudnn-notinit-cjk.log": "said cublas-cudnn-not-initialized [damaged:cjk, wording:indirect]",
    "none-ltp-cpu-nodriver-warning.log": "a look-alike given an error finding: cuda-unavailable (no-nvidia-driver)",
}


# blind4 (issue 21's second fresh set, 137 pastes) was scored untouched at c12cec5 (90/109 top-1, 1/28 false
# alarms) and then worked on by class; what is left is a label other rules or sets disagree with, or a
# rule another helper owns (the reasons are in the session's report).
BLIND4_MISSES = {
    "autocast-cuda-warning-kubin-win.log":
        "said fp16-unsupported-device (autocast-disabled-no-cuda, warning): the same autocast warning is that rule's",
    "nan-gradnorm-glm4-finetune.log":
        "silent: one grad_norm nan as the last line; grad-norm-nan-repeated needs min_count 3 (survived.py covers 1)",
}
# blind5 (issue 21's held-out set, 126 pastes) was scored untouched at c12cec5 (86/103, 3/23) and at
# the session's end (92/103, 3/23) and never tuned on: its misses are what the scorer printed.
BLIND5_MISSES = {
    "p09-anima-trainer.log": "silent",
    "p11-fastchat.log": "a look-alike given an error finding: non-finite-values (logged-loss-nan)",
    "p42-diffuseq.log": "silent",
    "p56-pegasus-fp16.log": "silent",
    "p57-espnet-amp.log": "a look-alike given an error finding: fp16-gradient-unscale (scaler-call-order)",
    "p64-funmusic.log": "silent",
    "p67-lightning-ds-test.log": "said dtype-mismatch (operands-must-share-dtype, warning)",
    "p12-llamafactory-ascend.log": "silent",
    "p13-pytorch-gloo.log": "silent",
    "p14-dmlcloud.log": "silent",
    "p20-transformers-example.log": "silent",
    "p40-libnvidia-container.log": "silent",
    "p58-fate-llm.log": "silent",
    "p60-lvsm.log": "a look-alike given an error finding: fp16-gradient-unscale (scaler-call-order)",
}
MISSES = {"blind3": BLIND3_MISSES, "blind4": BLIND4_MISSES, "blind5": BLIND5_MISSES}


def _param(entry, name="real"):
    # A known miss carries its reason (`xfail = "..."`, usually an engine/normaliser limit);
    # strict, so the entry has to be updated the day it starts passing.
    if entry["file"] in MISSES.get(name, {}):
        entry = {**entry, "xfail": MISSES[name][entry["file"]]}
    marks = [pytest.mark.xfail(reason=entry["xfail"], strict=True)] if "xfail" in entry else []
    return pytest.param(entry, name, id=f"{name}/" + entry["file"].removesuffix(".log"), marks=marks)


@pytest.mark.parametrize("entry, name", [_param(e, n) for n in SETS for e in MANIFESTS[n]])
def test_real_log(entry, name, rules):
    report = explain_path(LOGS / name / entry["file"], rules)
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
