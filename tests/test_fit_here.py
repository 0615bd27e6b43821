"""`explain --here` fits a log finding's fixes to this machine, and anomaly mode's forward
traceback is read for the line that made the NaN (issue 19: "mpdoctor cites
`loss.backward()` and tells the user to go read the warning"; a CPU-only machine was told
`torch.autocast("cuda", ...)`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scripts" / "scenarios" / "fit_anomaly_nan_cpu.py"


@pytest.fixture(scope="module")
def anomaly_log(tmp_path_factory) -> Path:
    """The real output of a CPU run under anomaly mode (torch 2.13)."""
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "SqrtBackward0" in out.stderr
    log = tmp_path_factory.mktemp("anomaly") / "train.log"
    log.write_text(out.stdout + out.stderr, encoding="utf-8")
    return log


def _first(log: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "mpdoctor", "explain", str(log), "--format", "json", *extra],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    return json.loads(out.stdout)["findings"][0]


@pytest.mark.slow
def test_the_forward_line_anomaly_mode_printed_is_the_fix(anomaly_log):
    f = _first(anomaly_log)
    assert f["rule"] == "anomaly-backward-nan"
    made = f"{SCRIPT}:20"
    assert f["facts"]["stack_frame"] == made and f["facts"]["stack_code"].startswith("loss = torch.sqrt(")
    assert f"names the line that created it: {made}" in f["explanation"]
    assert f["fixes"][0].startswith("Guard `loss = torch.sqrt(") and "Look at the forward traceback" not in f["fixes"][0]
    assert any(e["text"].strip().startswith(f'File "{SCRIPT}", line 20') for e in f["evidence"])
    # without the machine, the device is not known from this log: a spelling that fits any
    assert "torch.autocast(x.device.type, enabled=False)" in f["fixes"][0]


@pytest.mark.slow
def test_explain_here_spells_the_autocast_of_this_machine(anomaly_log):
    f = _first(anomaly_log, "--here")
    assert 'torch.autocast("cpu", enabled=False)' in f["fixes"][0]
    assert "cuda" not in f["fixes"][0]


def test_the_log_own_device_words_come_before_the_machine(tmp_path):
    """A log that says its device keeps it under --here (the log may come from another
    machine; the machine only fills what the log does not say)."""
    from mpdoctor.diagnosis.sharpen import sharpen_with
    from mpdoctor.logs.explain import explain_text
    from mpdoctor.rulebase import load

    rules = load()
    text = ("Using device: cuda\n"
            "RuntimeError: Function 'SqrtBackward0' returned nan values in its 0th output.\n")
    report = explain_text(text, rules=rules)
    snap = json.loads((ROOT / "fixtures" / "snapshots" / "cpu-laptop-fp16.json").read_text(encoding="utf-8"))
    assert snap["torch"]["cuda_available"] is False
    sharpen_with(report, snap, "test", rules)
    fix = report.findings[0].fixes[0]
    assert 'torch.autocast("cuda", enabled=False)' in fix
    bare = explain_text(text.replace("Using device: cuda\n", ""), rules=rules)
    sharpen_with(bare, snap, "test", rules)
    assert 'torch.autocast("cpu", enabled=False)' in bare.findings[0].fixes[0]
