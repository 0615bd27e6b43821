"""What a user sees and copies: the 80-column terminal layout (URLs and commands whole,
rule ids whole, no trailing padding, facts only with -v), the oneline format, markdown
reports (environment block, <details>), versioned JSON, exit codes a script can trust,
and --help that documents codes, choices and MPDOCTOR_* variables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import cli
from mpdoctor.render import sparkline, table_lines, wrap
from tests.rulekit import private_cache  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "fixtures" / "logs" / "real"
SNAPSHOT = ROOT / "fixtures" / "snapshots" / "t4-old-driver-fp16.json"
LOGS = sorted(REAL.glob("*.log"))[::9]  # a spread of real logs, kept fast
URL = re.compile(r"https?://[^\s`)>\]]+")
CODE = re.compile(r"`[^`\n]+`")


def run_cli(args, capsys, monkeypatch=None, columns=80):
    if monkeypatch is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def run_proc(args, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "MPDOCTOR_RULES_PATH")}
    env["COLUMNS"] = "80"
    pipes = {"stderr": subprocess.PIPE} if "stdout" in kw else {"capture_output": True}
    return subprocess.run([sys.executable, "-m", "mpdoctor", *map(str, args)], env=env, timeout=120, **pipes, **kw)


# --- the terminal at 80 columns ------------------------------------------------------------

@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_urls_and_commands_are_whole_on_one_line_at_80_columns(log, capsys, monkeypatch):
    _, data, _ = run_cli(["explain", log, "--format", "json"], capsys)
    findings = json.loads(data)["findings"]
    _, out, _ = run_cli(["explain", log], capsys, monkeypatch)
    lines = out.split("\n")
    for f in findings:
        for text in f["fixes"] + [f["explanation"]] + f["references"]:
            for piece in URL.findall(text) + CODE.findall(text):
                assert any(piece in line for line in lines), (log.name, piece)
    assert not [line for line in lines if line != line.rstrip()], "trailing padding"
    assert not any(ch in out for ch in "╭╮╰╯│"), "box characters"


def test_check_checklist_keeps_commands_whole_and_unpadded(capsys, monkeypatch):
    _, out, _ = run_cli(["check", "--snapshot", SNAPSHOT], capsys, monkeypatch)
    lines = out.split("\n")
    assert any("https://pytorch.org/get-started/locally/" in line for line in lines)
    assert any('`python -c "import torch; print(torch.cuda.is_available())"`' in line for line in lines)
    assert any("`accelerate launch --config_file /home/ana/.cache/huggingface/accelerate/default_config.yaml train.py`"
               in line for line in lines)
    assert not [line for line in lines if line != line.rstrip()]


def test_rules_list_never_truncates_an_id(capsys, monkeypatch):
    _, data, _ = run_cli(["rules", "list", "--format", "json"], capsys)
    ids = [r["id"] for r in json.loads(data)["rules"]]
    _, out, _ = run_cli(["rules", "list"], capsys, monkeypatch)
    words = set(out.split())
    assert [i for i in ids if i not in words] == []
    assert all(len(line) <= 80 or " " not in line.strip() for line in out.split("\n"))
    assert not [line for line in out.split("\n") if line != line.rstrip()]
    assert "{" not in out  # titles show their slots as ⟨name⟩, never raw or empty


def test_rules_show_has_no_trailing_padding(capsys, monkeypatch):
    _, out, _ = run_cli(["rules", "show", "cuda-oom"], capsys, monkeypatch)
    assert "What it detects" in out and "⟨requested⟩" in out
    assert not [line for line in out.split("\n") if line != line.rstrip()]


def test_facts_only_with_verbose(capsys, monkeypatch):
    log = REAL / "fp16-diffusers-dreambooth-launch.log"
    for fmt in ("terminal", "markdown"):
        _, out, _ = run_cli(["explain", log, "--format", fmt], capsys, monkeypatch)
        assert "facts" not in out, fmt
        _, out, _ = run_cli(["explain", log, "--format", fmt, "-v"], capsys, monkeypatch)
        assert "exception=ValueError" in out, fmt


def test_oneline_is_one_line_per_finding(capsys):
    log = REAL / "fp16-diffusers-dreambooth-launch.log"
    code, out, _ = run_cli(["explain", log, "--format", "oneline"], capsys)
    lines = out.rstrip("\n").split("\n")
    assert code == 1 and len(lines) == 3
    assert lines[0] == (f"{log}:11: error [accelerate-fp16-requires-gpu] fp16-unsupported-device: "
                        "accelerate refused fp16 mixed precision on this device")
    assert lines[-1] == "2 finding(s): 1 error, 0 warning, 1 info"
    code, out, _ = run_cli(["check", "--snapshot", SNAPSHOT, "--format", "oneline"], capsys)
    assert code == 1 and f"{SNAPSHOT}: error [driver-too-old-for-build] driver-too-old: " in out


# --- reports ---------------------------------------------------------------------------------

def test_every_json_output_carries_its_schema(capsys):
    log = REAL / "fp16-diffusers-dreambooth-launch.log"
    assert json.loads(run_cli(["explain", log, "--format", "json"], capsys)[1])["schema"] == "mpdoctor.explain/1"
    assert json.loads(run_cli(["check", "--snapshot", SNAPSHOT, "--format", "json"], capsys)[1])["schema"] == \
        "mpdoctor.check/1"
    for args, schema in ((["rules", "list", "--format", "json"], "mpdoctor.rules/1"),
                         (["rules", "show", "cuda-oom", "--format", "json"], "mpdoctor.rule/1")):
        assert json.loads(run_cli(args, capsys)[1])["schema"] == schema
    for name in ("explain", "run", "check", "probe"):
        doc = ROOT / "docs" / f"json-{name}.md"
        assert f"mpdoctor.{name}/1" in doc.read_text(), doc
    assert "mpdoctor.rules-test/1" in (ROOT / "docs" / "json-rules.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme and "(docs/categories.md)" in readme


def test_markdown_with_a_snapshot_carries_the_environment_block(capsys):
    log = REAL / "bf16-hf-trainer-colab-t4-chinese.log"
    _, out, _ = run_cli(["explain", log, "--snapshot", SNAPSHOT, "--format", "markdown"], capsys)
    env = out.split("**Environment**", 1)[1].split("###", 1)[0]
    for item in ("- mpdoctor: ", "- Python: 3.10.12", "- torch: 2.5.1+cu124 (CUDA 12.4)", "- accelerate: 1.4.0",
                 "- GPU: Tesla T4", "- driver: 470.239.06"):
        assert item in env, item
    _, plain, _ = run_cli(["explain", log, "--format", "markdown"], capsys)
    assert "**Environment**" not in plain  # without --here/--snapshot, nothing is collected


def test_long_evidence_folds_in_details(tmp_path, capsys):
    log = tmp_path / "t.log"
    log.write_text("".join(f"[rank{r}]: RuntimeError: CUDA error: no kernel image is available for execution on the "
                           f"device\n" for r in range(1)) + "x\n" * 3)
    _, out, _ = run_cli(["explain", log, "--format", "markdown"], capsys)
    assert "<details>" not in out  # short evidence stays open
    from mpdoctor.findings import Evidence, Finding, Report
    from mpdoctor.render import to_markdown

    f = Finding(rule="cuda-oom", category="out-of-memory", severity="error", title="t",
                evidence=[Evidence(f"line {i}", i) for i in range(1, 30)])
    md = to_markdown(Report(findings=[f]))
    assert "<details><summary>Evidence (29 lines)</summary>" in md and "</details>" in md


# --- exit codes ------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["check", "--snapshot", SNAPSHOT], ["explain", REAL / "fp16-kohya-plain.log"],
                                  ["rules", "list"]], ids=["check", "explain", "rules"])
def test_a_reader_that_goes_away_is_not_an_error_finding(args):
    env = {k: v for k, v in os.environ.items() if k != "MPDOCTOR_RULES_PATH"}
    p = subprocess.Popen([sys.executable, "-m", "mpdoctor", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # as `| head -0` does
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and b"Traceback" not in err and b"internal error" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_output_is_a_clear_error():
    with open("/dev/full", "w") as full:
        proc = run_proc(["explain", REAL / "fp16-kohya-plain.log"], stdout=full)
    assert proc.returncode == 2 and b"cannot write the output" in proc.stderr and b"Traceback" not in proc.stderr


@pytest.mark.slow
def test_run_fail_on_turns_a_passing_command_with_a_problem_into_3(tmp_path):
    cmd = [sys.executable, "-c", "print('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB')"]
    plain = run_proc(["run", "--no-probe", "--", *cmd])
    assert plain.returncode == 0
    failed = run_proc(["run", "--no-probe", "--fail-on", "error", "--", *cmd])
    assert failed.returncode == 3 and b"out of memory" in failed.stderr.lower()
    clean = run_proc(["run", "--no-probe", "--fail-on", "warning", "--", sys.executable, "-c", "print('loss 1.0')"])
    assert clean.returncode == 0
    broken = run_proc(["run", "--no-probe", "--fail-on", "error", "--", sys.executable, "-c", "raise SystemExit(5)"])
    assert broken.returncode == 5  # a failed command keeps its own status


@pytest.mark.parametrize("command", ["explain", "check", "collect", "run", "probe", "rules"])
def test_every_help_has_a_description_exit_codes_and_its_variables(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out
    description = out.split("\n\n", 2)[1]
    assert len(description) > 30, description
    assert "environment variables:" in out and "MPDOCTOR_" in out
    if command == "probe":
        assert "no, fp16, bf16, fp8" in out
    if command == "run":
        assert "--fail-on" in out and "3 with --fail-on" in out
    if command in ("explain", "check", "run", "probe", "collect"):
        assert "--anonymize" in out


def test_every_mpdoctor_variable_the_code_reads_is_documented():
    from mpdoctor.commands import ENV_VARS

    used = set()
    for path in (ROOT / "mpdoctor").rglob("*.py"):
        used |= set(re.findall(r"MPDOCTOR_[A-Z_]+[A-Z]", path.read_text(encoding="utf-8")))
    # set by run for its own child, or by the test suite itself (strict checks), not by users
    used -= {"MPDOCTOR_PKG_ROOT", "MPDOCTOR_EVENTS_DIR", "MPDOCTOR_STRICT_CHECKS"}
    assert sorted(used - set(ENV_VARS)) == []


# --- the helpers -----------------------------------------------------------------------------

def test_wrap_breaks_at_spaces_only_and_keeps_code_spans_whole():
    text = "Run `accelerate launch --mixed_precision bf16 --num_processes 8 train.py` then see https://x.org/" + "a" * 90
    lines = wrap(text, 40, indent=2)
    assert "  `accelerate launch --mixed_precision bf16 --num_processes 8 train.py`" in lines
    assert any(line.strip() == "https://x.org/" + "a" * 90 for line in lines)
    assert all(line == line.rstrip() for line in lines)


def test_table_stacks_when_narrow():
    cols, rows = ["mode", "works", "step time"], [["fp16", "✓ yes", "1.2 ms"], ["bf16", "✗ no", "–"]]
    assert table_lines(cols, rows, 80)[0] == "mode  works  step time"
    narrow = table_lines(cols, rows, 20)
    assert narrow[:3] == ["fp16", "  works:     ✓ yes", "  step time: 1.2 ms"]


def test_sparkline():
    assert sparkline([65536, 32768, 16384, 8192, 8192, 16384]) == "█▄▂▁▁▂"
    assert sparkline([1, 1, 1]) == "▄▄▄"


def test_a_loss_scale_series_is_drawn_in_terminal_and_markdown():
    from mpdoctor.findings import Finding, Report
    from mpdoctor.render import render_text

    f = Finding(rule="scaler-collapsed", category="loss-scale-overflow", severity="error", title="The scale collapsed",
                facts={"final_scale": "1"})
    f.all_facts = {"_scale_series": [65536.0, 32768.0, 1024.0, 8.0, 1.0], "final_scale": "1"}
    report = Report(findings=[f])
    term = render_text(report, "terminal")
    assert "scale series: ██▆▂▁  65536 → 1" in term  # log-scaled: the scale spans 2^16
    assert "scale series: `██▆▂▁` (65536 → 1, 5 values)" in render_text(report, "markdown")
    assert "_scale_series" not in render_text(report, "json")  # helper facts are never serialised


def test_wide_characters_count_as_two_columns(capsys, monkeypatch):
    from mpdoctor.render import cells

    _, out, _ = run_cli(["explain", REAL / "bf16-hf-trainer-colab-t4-chinese.log"], capsys, monkeypatch)
    evidence = out.split("Evidence\n", 1)[1].split("  Fix", 1)[0]
    assert "训练模型的时候出现这个报错" in evidence
    assert all(cells(line) <= 80 for line in evidence.split("\n")), evidence


def test_a_collapsing_loss_scale_is_drawn_from_the_recorded_run():
    """The run rule's facts carry the scale over the steps; the terminal and the markdown
    draw it (from a recorded run, through the same judging as `mpdoctor run`)."""
    from mpdoctor import rulebase
    from mpdoctor.findings import Report
    from mpdoctor.render import render_text

    rules = rulebase.load()
    rule = next(r for r in rules if r.id == "scaler-collapsed")
    example = next(e for e in rule.examples if "fp16-scaler-collapse" in str(getattr(e, "events", "") or e))
    got = rulebase.case_runners()["run"](rule, example, rules)
    findings = [f for f in (got if isinstance(got, list) else got.findings) if f.rule == "scaler-collapsed"]
    assert findings
    report = Report(findings=findings)
    for fmt in ("terminal", "markdown"):
        text = render_text(report, fmt)
        assert "scale series" in text and any(ch in text for ch in "▁▂▃▄▅▆▇█"), text
