"""Reports that stand alone in a GitHub issue: `run`'s markdown report says what ran
(the command line, secrets cut), how it ended (exit status, the signal's name) and how
its output ended (the last lines, bounded, secrets cut); every key of the JSON faces is
documented in docs/json-*.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mpdoctor.commands.run import LOG_TAIL_LINES, last_lines

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz123456"


def run(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["COLUMNS"] = "80"
    return subprocess.run([sys.executable, "-m", "mpdoctor", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)


def test_run_markdown_report_has_command_exit_reason_and_last_lines(tmp_path):
    code = ("import os, signal, sys\n"
            "for i in range(100): print(f'step {i} loss {1/(i+1):.3f}')\n"
            f"print('login with --hub_token {TOKEN}')\n"
            "sys.stdout.write('\\r 10%|#   |\\r 90%|######### |\\n')\n"
            "print('RuntimeError: CUDA error: an illegal memory access was encountered')\n"
            "sys.stdout.flush(); os.kill(os.getpid(), signal.SIGTERM)\n")
    report = tmp_path / "r.md"
    p = run(["run", "--no-instrument", "--report", report, "--", sys.executable, "-c", code, "--hub_token", TOKEN],
            tmp_path)
    assert p.returncode == 128 + 15, p.stderr
    md = report.read_text()
    assert TOKEN not in md
    run_block = md[md.index("**Run**"):md.index("</details>")]
    # the command line, its secret argument cut
    assert f"{sys.executable} -c " in run_block and run_block.count("--hub_token '<redacted>'") == 1
    assert "- exit status: 143 (killed by SIGTERM)" in run_block
    # the last lines, as a terminal left them: the bar's last state, bounded
    tail = run_block[run_block.index("```text\n") + 8:run_block.rindex("```")].rstrip("\n").split("\n")
    assert len(tail) == LOG_TAIL_LINES
    assert tail[-1] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert tail[-2] == " 90%|######### |" and "step 99 loss 0.010" in tail
    assert "step 50 loss" not in run_block  # older lines are not carried
    assert "login with --hub_token <redacted>" in tail
    assert not [x for x in md.split("\n") if x != x.rstrip()]


def test_run_json_carries_the_last_lines_and_documents_every_key(tmp_path):
    report = tmp_path / "r.json"
    p = run(["run", "--no-instrument", "--report", report, "--", sys.executable, "-c",
             "print('epoch 1'); raise SystemExit(3)"], tmp_path)
    assert p.returncode == 3
    data = json.loads(report.read_text())
    assert data["exit_code"] == 3 and data["log_tail"] == ["epoch 1"]
    assert sorted(set(data) - _documented("json-run.md")) == []


def test_last_lines_is_bounded_whatever_the_output():
    text = ("x" * 10_000 + "\n") * 50 + "\r\n\r\n"
    lines = last_lines(text)
    assert len(lines) == LOG_TAIL_LINES and all(len(x) <= 300 for x in lines)
    assert last_lines("") == [] and last_lines("a\r\nb\n") == ["a", "b"]


# --- every JSON key documented ---------------------------------------------------------------

def _documented(doc: str) -> set[str]:
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([^`]+)`", text, re.M)) | set(re.findall(r"`([a-z_0-9]+)`", text))


def test_every_check_json_key_is_documented(tmp_path):
    snap = ROOT / "fixtures" / "snapshots" / "dev-cpu-fp16.json"
    data = json.loads(run(["check", "--snapshot", snap, "--format", "json"], tmp_path).stdout)
    doc = _documented("json-check.md")
    assert sorted(set(data) - doc) == []
    assert sorted(set(data["environment"]) - doc) == []
    assert sorted(set(data["precision_plan"]) - doc) == []
    assert sorted({k for m in data["modes"] for k in m} - doc) == []


def test_every_probe_mode_key_and_run_plan_key_is_documented():
    from dataclasses import fields

    from mpdoctor.instrument.records import PrecisionPlan
    from mpdoctor.probe.rows import ModeRow

    probe = _documented("json-probe.md")
    assert sorted({f.name for f in fields(ModeRow)} - probe) == []
    assert sorted({f.name for f in fields(PrecisionPlan)} - _documented("json-run.md")) == []


def test_every_snapshot_field_is_documented():
    from mpdoctor.env.snapshot import SCHEMA

    doc = _documented("snapshot-schema.md")
    missing = []

    def walk(kind, path):
        if isinstance(kind, dict):
            for key, sub in kind.items():
                if key in ("error", "errors"):  # the one error shape, documented once
                    continue
                if key not in doc:
                    missing.append(path + key)
                walk(sub, path + key + ".")
        elif isinstance(kind, tuple):
            walk(kind[1], path)
    walk(SCHEMA, "")
    assert missing == []


def test_old_snapshots_still_load_and_new_fields_are_checked(tmp_path):
    from mpdoctor.env import SnapshotError
    from mpdoctor.env.snapshot import normalise_snapshot, read_snapshot_file

    for path in sorted((ROOT / "fixtures" / "snapshots").glob("*.json")):
        snap = read_snapshot_file(str(path))
        assert "threads" not in json.loads(path.read_text()) or snap["threads"]
    bad = json.loads((ROOT / "fixtures" / "snapshots" / "dev-cpu-fp16.json").read_text())
    bad["threads"] = {"affinity_cores": "two"}
    try:
        normalise_snapshot(bad)
    except SnapshotError as exc:
        assert '"threads.affinity_cores" must be a whole number' in str(exc)
    else:
        raise AssertionError("a wrong type in a new field is refused")
