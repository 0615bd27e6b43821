"""Ordinary errors stay ordinary: 320 real pastes of everyday Python errors from ML projects
(fixtures/logs/ordinary/, collected blind) get no mixed-precision or GPU cause.

The near-match fallback (engine/likely.py) is the part that could guess one: it may speak on
at most 1 in 100 of them, and never with an error. A certain finding (a rule's own pattern)
on an ordinary paste may only be a library version that does not fit (an import of a removed
name), which is what the paste shows."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.logs.explain import explain_path

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "ordinary"
MANIFEST = tomllib.loads((FOLDER / "MANIFEST.toml").read_text(encoding="utf-8"))["log"]
# precision, device, memory, kernel and communication causes: never said of an ordinary error
MIXED_PRECISION_OR_GPU = {
    "bf16-unsupported", "fp16-unsupported-device", "fp8-unsupported", "half-op-not-implemented",
    "flash-attention-unsupported", "no-kernel-image", "driver-too-old", "cuda-unavailable", "cuda-library-missing",
    "dtype-mismatch", "device-mismatch", "fp16-gradient-unscale", "fp16-value-overflow", "autocast-unsafe-op",
    "non-finite-values", "loss-scale-overflow", "out-of-memory", "host-out-of-memory", "cuda-kernel-fault",
    "cublas-cudnn-failure", "amp-deprecated-api",
}


@pytest.fixture(scope="module")
def reports():
    rules = rulebase.load()
    return {e["file"]: explain_path(str(FOLDER / e["file"]), rules) for e in MANIFEST}


def test_the_corpus_is_well_formed():
    assert len(MANIFEST) >= 300
    assert len({e["source"] for e in MANIFEST}) == len(MANIFEST)
    for e in MANIFEST:
        assert e["category"] == "none" and (FOLDER / e["file"]).is_file(), e


def test_the_fallback_guesses_on_at_most_one_in_a_hundred(reports):
    guesses = [(name, f.rule) for name, r in reports.items() for f in r.findings if f.likely]
    assert len(guesses) <= len(MANIFEST) // 100, guesses
    for name, r in reports.items():
        for f in r.findings:
            if f.likely:
                assert f.severity == "warning" and f.title.startswith("Likely: ") and f.facts["shared_words"], name


def test_no_ordinary_error_gets_a_mixed_precision_or_gpu_cause(reports):
    loud = [(name, f.rule, f.category) for name, r in reports.items() for f in r.findings
            if f.severity in ("error", "warning") and f.category in MIXED_PRECISION_OR_GPU]
    assert not loud, loud
