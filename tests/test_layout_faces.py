"""One layout for every face, checked on what a user sees at COLUMNS=80: no line wider
than 80 columns unless it is a single unbreakable item (a URL, a path, one code span,
after its indent and label), no trailing spaces anywhere (markdown included), aligned
evidence labels, tables that fit or stack, markdown tables in markdown, --help within
80 columns. `--format oneline` is one line per finding by design (the shape of gcc and
ruff): it is held to no trailing spaces only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import cli
from mpdoctor.commands import COMMANDS
from mpdoctor.findings import Evidence, Finding, Report
from mpdoctor.render import _UNIT, cells, print_checklist, render_text, to_checklist_markdown
from tests.rulekit import private_cache  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
SNAPS = ROOT / "fixtures" / "snapshots"
LOGS = sorted((ROOT / "fixtures" / "logs" / "real").glob("*.log"))[::12]  # a spread, kept fast
WIDTH = 80


def too_wide(text: str) -> list[str]:
    """The lines wider than WIDTH that are not one unbreakable item: a line may overflow
    only with a single unit (URL, path, code span) after at most 30 columns of indent and
    label, which is how the wrapper places a unit longer than the room left."""
    bad = []
    for line in text.split("\n"):
        if cells(line) <= WIDTH:
            continue
        units = _UNIT.findall(line)
        longest = max(units, key=cells) if units else ""
        if cells(line) - cells(longest) <= 30 and cells(longest) > WIDTH - 30:
            continue
        bad.append(line)
    return bad


def padded(text: str) -> list[str]:
    return [line for line in text.split("\n") if line != line.rstrip()]


def face(args, capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_laid_out(text: str, *, width_checked: bool = True) -> None:
    assert not padded(text), padded(text)[:3]
    if width_checked:
        assert not too_wide(text), too_wide(text)[:3]


# --- every face at 80 columns ------------------------------------------------------------------

@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_explain_at_80_columns(log, capsys, monkeypatch):
    for fmt in ("terminal", "markdown", "oneline"):
        _, out, err = face(["explain", log, "--format", fmt], capsys, monkeypatch)
        assert_laid_out(out, width_checked=fmt == "terminal")
        assert not err.strip() or not padded(err)


def test_explain_of_an_unknown_error_wraps_like_the_rest(tmp_path, capsys, monkeypatch):
    log = tmp_path / "crash.log"
    log.write_text('Traceback (most recent call last):\n  File "/home/ana/train.py", line 3, in <module>\n'
                   "    main()\nSomeLibraryError: the reticulated spline could not be aligned with the "
                   "frobnicator because the configuration names a mode that is not known here\n")
    _, out, _ = face(["explain", log], capsys, monkeypatch)
    assert out.startswith("No mixed-precision or GPU problem recognised.")
    assert "? not recognised, line 4: SomeLibraryError:" in out
    assert "(in /home/ana/train.py:3)" in out
    assert_laid_out(out)
    assert all(cells(line) <= WIDTH for line in out.split("\n"))


@pytest.mark.parametrize("snap", sorted(SNAPS.glob("*.json")), ids=lambda p: p.stem)
def test_check_of_every_recorded_machine_at_80_columns(snap, capsys, monkeypatch):
    _, out, _ = face(["check", "--snapshot", snap], capsys, monkeypatch)
    assert_laid_out(out)
    for fmt in ("markdown", "oneline"):
        _, text, _ = face(["check", "--snapshot", snap, "--format", fmt], capsys, monkeypatch)
        assert_laid_out(text, width_checked=False)


def test_rules_faces_at_80_columns(capsys, monkeypatch):
    for args in (["rules", "list"], ["rules", "show", "cuda-oom"]):
        _, out, _ = face(args, capsys, monkeypatch)
        assert_laid_out(out)


@pytest.mark.parametrize("command", [[]] + [[c] for c in COMMANDS] + [["rules", c] for c in ("list", "show", "test")],
                         ids=lambda c: " ".join(c) or "mpdoctor")
def test_every_help_fits_80_columns(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    with pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    out = capsys.readouterr().out
    assert out.strip()
    assert [line for line in out.split("\n") if cells(line) > WIDTH] == []
    assert not padded(out)


def test_run_help_names_no_probe_flag(capsys, monkeypatch):
    # `--no-probe` read as the `probe` command; the flag is --no-instrument (the old name still works)
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--no-instrument" in out and "--no-probe" not in out


def test_run_at_80_columns_and_the_old_flag_still_works(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["COLUMNS"] = str(WIDTH)
    code = ("import sys; print('epoch 1 loss 0.5'); "
            "raise ValueError('fp16 mixed precision requires a GPU')")
    for flag in ("--no-instrument", "--no-probe"):
        p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", flag, "--", sys.executable, "-c", code],
                           capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert p.returncode == 1
        assert "epoch 1 loss 0.5" in p.stdout
        report = p.stderr[p.stderr.index("✗ error"):]
        assert "accelerate-fp16-requires-gpu" in report
        assert_laid_out(report)


# --- the pieces of the layout ----------------------------------------------------------------------

def _terminal(report: Report) -> str:
    return render_text(report, "terminal", width=WIDTH)


def test_evidence_labels_align_and_a_long_name_does_not_push_the_text(tmp_path):
    f = Finding(rule="cuda-oom", category="out-of-memory", severity="error", title="t", explanation="",
                fixes=[], evidence=[Evidence(text="ValueError: fp16 " + "word " * 20, line=8),
                                    Evidence(text="user code: /content/train.py:210 in <module>", line=14),
                                    Evidence(text="fp16", source="the Accelerator of this run"),
                                    Evidence(text="(not set)", source="torch.cuda_build"),
                                    Evidence(text="True", source="accelerate_config.config.use_cpu_and_more_words")])
    out = _terminal(Report(findings=[f]))
    lines = out.split("\n")
    line8 = next(x for x in lines if "line 8:" in x)
    line14 = next(x for x in lines if "line 14:" in x)
    # the log lines: numbers right-aligned, text in one column, at the evidence indent
    assert line8.index(":") == line14.index(":") and line14.startswith("    line 14: ")
    # the snapshot values: their own column, left-aligned labels
    acc = next(x for x in lines if "the Accelerator of this run:" in x)
    cuda = next(x for x in lines if "torch.cuda_build:" in x)
    assert acc.index("fp16") == cuda.index("(not set)")
    assert cuda.startswith("    torch.cuda_build:")
    # a name longer than the label column is not padded to
    assert "    accelerate_config.config.use_cpu_and_more_words: True" in lines
    assert_laid_out(out)


def test_oneline_points_at_the_exception_line_not_the_user_frame(tmp_path, capsys, monkeypatch):
    log = tmp_path / "t.log"
    log.write_text('Traceback (most recent call last):\n  File "/home/ana/train.py", line 210, in <module>\n'
                   '    args = TrainingArguments(output_dir="out", fp16=True)\n'
                   '  File "/usr/lib/python3.10/site-packages/transformers/training_args.py", line 1405, in __post_init__\n'
                   "    raise ValueError(\nValueError: FP16 Mixed precision training with AMP or APEX (`--fp16`) and "
                   "FP16 half precision evaluation (`--fp16_full_eval`) can only be used on CUDA devices.\n")
    _, out, _ = face(["explain", log, "--format", "oneline"], capsys, monkeypatch)
    assert out.startswith(f"{log}:6: error [transformers-fp16-requires-cuda]"), out


PROBE_TABLE = {
    "columns": ["mode", "works", "step time", "speed-up", "peak memory", "saving", "loss Δ", "logits Δ",
                "autocast", "loss scaler", "non-finite", "fp16 room"],
    "rows": [["no (baseline)", "✓", "12.3 ms", "1.00×", "0.21 GiB", "–", "ref", "ref", "–", "–", "0", "1.2e+03×"],
             ["fp16", "! ran float32", "12.9 ms", "0.95×", "0.21 GiB", "0%", "0", "0", "float32", "none", "0", "–"],
             ["bf16", "✓", "24.0 ms", "unreliable", "0.16 GiB", "24%", "0.0011%", "0.3%", "bfloat16", "none",
              "0", "–"]],
}
FOOTER = ["Recommendation: no: no mixed-precision mode beat fp32 on this machine",
          "  accelerate config: mixed_precision: no   code: Accelerator(mixed_precision=\"no\")"]


def _probe_report() -> Report:
    from mpdoctor import rulebase
    from mpdoctor.env.judge import judge
    from mpdoctor.env.snapshot import read_snapshot_file

    report = judge(read_snapshot_file(str(SNAPS / "dev-cpu-fp16.json")), rules=rulebase.load())
    lines = ["(the probe's own fixed-width table)"] + FOOTER
    report.extra["probe"] = {"ran": True, "lines": lines, "table": PROBE_TABLE, "footer": FOOTER}
    return report


def test_check_probe_table_fits_80_columns_or_stacks():
    import io

    from rich.console import Console

    buf = io.StringIO()
    print_checklist(_probe_report(), Console(file=buf, width=WIDTH, no_color=True, highlight=False))
    out = buf.getvalue()
    probe = out[out.index("\nProbe\n"):].split("\n")
    assert_laid_out(out)
    # twelve columns cannot fit 80: one column per mode instead, every cell whole
    assert probe[2].split() == ["no", "(baseline)", "fp16", "bf16"]
    speed = next(x for x in probe if x.startswith("  speed-up"))
    assert speed.split() == ["speed-up", "1.00×", "0.95×", "unreliable"]
    assert any('Accelerator(mixed_precision="no")' in x for x in probe)


def test_a_table_too_wide_even_transposed_stacks():
    from mpdoctor.render import table_lines

    rows = [[f"mode{i}", "x" * 30, "y" * 30] for i in range(4)]
    lines = table_lines(["mode", "first", "second"], rows, 60, transpose=True)
    assert lines[:3] == ["mode0", "  first:  " + "x" * 30, "  second: " + "y" * 30]
    assert all(cells(x) <= 60 for x in lines) and not padded("\n".join(lines))


def test_check_probe_in_markdown_is_a_real_table():
    md = to_checklist_markdown(_probe_report())
    probe = md[md.index("**Probe**"):]
    assert "| mode | works | step time |" in probe and "|---|---|" in probe
    assert "| bf16 | ✓ | 24.0 ms | unreliable |" in probe
    assert not [x for x in probe.split("\n") if x.startswith("    ")], "an indented code block"
    assert_laid_out(md, width_checked=False)


def test_fp8_backends_table_keeps_its_columns(capsys, monkeypatch):
    _, out, _ = face(["check", "--snapshot", SNAPS / "h100-fp8-no-te.json"], capsys, monkeypatch)
    block = out[out.index("fp8 backends"):].split("\n")
    header = block[1]
    assert header.split() == ["backend", "installed", "verdict"]
    rows = [x for x in block[3:] if x.startswith("  ") and not x.startswith("   ")][:2]
    assert all(x[header.index("installed")] != " " for x in rows)
