"""`mpdoctor explain` and `mpdoctor rules` as a user runs them: exit codes, formats,
colour, stdin, user rule folders, rule pages, the JSON contract, and what explain must
never import."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import __version__, cli
from tests.rulekit import private_cache, rule_toml, write_rule  # noqa: F401 (private_cache is an autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
FORMS = ROOT / "fixtures" / "logs" / "forms"
OOM_LOG = FORMS / "torchrun-tee-default-prefix.log"
UNRELATED = """\
epoch 1 step 10 loss 2.31
Traceback (most recent call last):
  File "/home/ana/proj/data.py", line 12, in <module>
    row = table["label"]
  File "/usr/lib/python3.11/json/__init__.py", line 293, in load
    return loads(fp.read())
KeyError: 'label'
"""
HEALTHY = "epoch 1 step 10 loss 2.31\nepoch 1 step 20 loss 2.05\nsaving checkpoint to out/ckpt-20\n"
SGR_COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-7]|9[0-7]|38;[0-9;]+)m")


def run_cli(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def run_proc(args, stdin=None, env=None, cwd=None):
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "MPDOCTOR_RULES_PATH")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "mpdoctor", *map(str, args)], input=stdin, capture_output=True,
                          env=full_env, cwd=cwd, timeout=120)


# --- exit codes and formats ---------------------------------------------------------------

def test_error_finding_exits_1_and_names_the_cause(capsys):
    code, out, err = run_cli(["explain", OOM_LOG], capsys)
    assert code == 1 and err == ""
    assert "The GPU ran out of memory (asked for 2.00 GiB)" in out
    assert "cuda-oom" in out and "line 19" in out


def test_healthy_log_exits_0_with_no_error_finding(tmp_path, capsys):
    log = tmp_path / "ok.log"
    log.write_text(HEALTHY)
    code, out, _ = run_cli(["explain", log, "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 0
    assert not [f for f in data["findings"] if f["severity"] == "error"]
    assert data["unrecognised"] == []


@pytest.mark.parametrize("fmt", ["terminal", "markdown", "json"])
def test_unrelated_python_error_is_reported_as_unrecognised(tmp_path, capsys, fmt):
    log = tmp_path / "keyerror.log"
    log.write_text(UNRELATED)
    code, out, _ = run_cli(["explain", log, "--format", fmt], capsys)
    assert code == 0
    if fmt == "json":
        data = json.loads(out)
        assert [f for f in data["findings"] if f["severity"] == "error"] == []
        assert data["unrecognised"] == [{"exception": "KeyError: 'label'", "line": 7,
                                         "user_frame": "/home/ana/proj/data.py:12", "count": 1, "ranks": []}]
    else:
        assert "KeyError: 'label'" in out and "/home/ana/proj/data.py:12" in out and "line 7" in out
        assert "not recognised" in out.lower()


def test_json_contract_key_set_is_pinned(capsys):
    code, out, _ = run_cli(["explain", OOM_LOG, "--format", "json"], capsys)
    data = json.loads(out)
    assert set(data) == {"schema", "findings", "input", "unrecognised"}
    assert data["schema"] == "mpdoctor.explain/1"
    assert {"path", "bytes", "lines"} <= set(data["input"])
    (f, *_) = data["findings"]
    assert set(f) == {"rule", "category", "severity", "title", "explanation", "fixes", "evidence", "facts",
                      "references", "count", "ranks", "consequence", "likely"}
    assert all(set(e) == {"line", "text", "source"} for e in f["evidence"])
    assert f["rule"] == "cuda-oom" and f["category"] == "out-of-memory" and f["severity"] == "error"
    assert isinstance(f["fixes"], list) and isinstance(f["facts"], dict) and isinstance(f["references"], list)
    assert f["evidence"][0] == {"line": 19, "source": "log", "text": f["evidence"][0]["text"]}
    assert f["count"] == 2 and f["ranks"] == [0, 1] and f["likely"] is False


def test_unrecognised_key_set_is_pinned(tmp_path, capsys):
    log = tmp_path / "k.log"
    log.write_text(UNRELATED)
    data = json.loads(run_cli(["explain", log, "--format", "json"], capsys)[1])
    assert set(data["unrecognised"][0]) == {"exception", "line", "user_frame", "count", "ranks"}


def test_markdown_is_pasteable(capsys):
    code, out, _ = run_cli(["explain", OOM_LOG, "--format", "markdown"], capsys)
    assert out.startswith("## mpdoctor explain")
    assert "### 1. ✗ error: The GPU ran out of memory (asked for 2.00 GiB) (×2, ranks 0, 1)" in out
    assert "```text\nline 19: [default0]:torch.OutOfMemoryError" in out
    assert "**Fix**\n\n1. " in out


def test_stdin_dash(capsys):
    proc = run_proc(["explain", "-", "--format", "json"], stdin=OOM_LOG.read_bytes())
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["input"]["path"] == "<stdin>" and data["findings"][0]["rule"] == "cuda-oom"


def test_no_color_is_respected():
    forced = run_proc(["explain", OOM_LOG], env={"FORCE_COLOR": "1"})
    assert SGR_COLOUR.search(forced.stdout.decode()), "FORCE_COLOR should colour the output"
    plain = run_proc(["explain", OOM_LOG], env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert plain.returncode == 1
    assert "The GPU ran out of memory" in plain.stdout.decode()
    assert not SGR_COLOUR.search(plain.stdout.decode())


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explain", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "0  no finding of severity error" in out and "1  at least one error finding" in out
    assert "2  the input could not be read" in out


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"mpdoctor {__version__}"


def test_wrong_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explain", str(OOM_LOG), "--format", "yaml"])
    assert exit_.value.code == 2
    assert cli.main(["rules"]) == 2


# --- user rules ------------------------------------------------------------------------------

def test_rules_dir_option_and_environment_variable(tmp_path, capsys):
    write_rule(tmp_path / "mine", "my-kernel-bug", patterns=[r"MYKERNEL FAILED with code (?P<code>\d+)"],
               title="My kernel failed with code {code}", examples=[{"text": "MYKERNEL FAILED with code 7"}])
    log = tmp_path / "run.log"
    log.write_text("step 3\nMYKERNEL FAILED with code 7\n")
    code, out, _ = run_cli(["explain", log, "--rules", tmp_path / "mine", "--format", "json"], capsys)
    assert code == 1 and json.loads(out)["findings"][0]["title"] == "My kernel failed with code 7"
    proc = run_proc(["explain", log, "--format", "json"], env={"MPDOCTOR_RULES_PATH": str(tmp_path / "mine")})
    assert proc.returncode == 1 and json.loads(proc.stdout)["findings"][0]["rule"] == "my-kernel-bug"
    # without them, the rule is not there
    code, out, _ = run_cli(["explain", log, "--format", "json"], capsys)
    assert "my-kernel-bug" not in out


def test_malformed_user_rule_is_a_clear_error(tmp_path, capsys):
    path = write_rule(tmp_path / "mine", "broken-rule", category="not-a-category")
    log = tmp_path / "run.log"
    log.write_text(HEALTHY)
    code, out, err = run_cli(["explain", log, "--rules", tmp_path / "mine"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("mpdoctor: bad rule: ") and str(path) in err
    assert "(rule 'broken-rule')" in err and "category 'not-a-category' is not in docs/categories.md" in err
    assert "Traceback" not in err
    proc = run_proc(["rules", "list"], env={"MPDOCTOR_RULES_PATH": str(tmp_path / "mine")})
    assert proc.returncode == 2 and b"broken-rule" in proc.stderr and b"Traceback" not in proc.stderr


def test_rules_list_show_and_test(tmp_path, capsys):
    write_rule(tmp_path / "mine", "my-rule", title="Mine failed ({code})",
               patterns=[r"MINE FAILED (?P<code>\d+)"], examples=[{"text": "MINE FAILED 3", "facts": {"code": "3"}}],
               near_misses=[{"text": "MINE OK 3", "note": "a success line"}],
               doc={"detects": "The mine failing.", "why": "Because mines fail."})
    code, out, _ = run_cli(["rules", "list", "--rules", tmp_path / "mine", "--format", "json"], capsys)
    assert code == 0 and "my-rule" in {r["id"] for r in json.loads(out)["rules"]}
    code, out, _ = run_cli(["rules", "show", "my-rule", "--rules", tmp_path / "mine", "--format", "markdown"], capsys)
    assert code == 0
    for section in ("# my-rule", "**Mine failed (⟨code⟩)**", "## What it detects", "The mine failing.",
                    "## Why it happens", "## Example", "MINE FAILED 3", "mpdoctor reports:", "> **Mine failed (3)**",
                    "## Fix", "1. Do the fix.", "## Not this rule", "a success line"):
        assert section in out, section
    code, out, _ = run_cli(["rules", "show", "cuda-oom"], capsys)  # the terminal page renders
    assert code == 0 and "What it detects" in out
    code, _, err = run_cli(["rules", "show", "cuda-oo"], capsys)
    assert code == 2 and "did you mean cuda-oom" in err
    code, out, _ = run_cli(["rules", "test", tmp_path / "mine"], capsys)
    assert code == 0 and "1 rules, 2 cases: 2 passed, 0 failed" in out


def test_rules_test_reports_a_failing_case(tmp_path, capsys):
    write_rule(tmp_path / "mine", "never-fires", examples=[{"text": "something else entirely"}])
    code, out, _ = run_cli(["rules", "test", tmp_path / "mine"], capsys)
    assert code == 1
    assert "FAIL never-fires example[0]: no finding at all" in out


def test_builtin_rules_test_passes_for_this_engine_owner_rule(capsys):
    code, out, _ = run_cli(["rules", "test", "--format", "json"], capsys)
    data = json.loads(out)
    assert data["rules"] > 0
    assert not [f for f in data["failed"] if f["rule"] == "cuda-oom"]


# --- progress, imports -------------------------------------------------------------------------

def test_progress_shows_on_a_terminal_only(tmp_path):
    import pty

    big = tmp_path / "big.log"
    with big.open("w") as fh:
        line = "step 1 | loss 2.3 | lr 3e-4 | tokens/s 51234 | grad_norm 0.77\n"
        fh.write(line * (20_000_000 // len(line)))
        fh.write(UNRELATED)
    env = {**os.environ, "MPDOCTOR_PROGRESS_AFTER": "0"}
    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "mpdoctor", "explain", str(big), "--format", "json"],
                          stdout=subprocess.PIPE, stderr=slave, env=env, timeout=120)
    os.close(slave)
    seen = b""
    try:
        while True:
            chunk = os.read(master, 65536)
            if not chunk:
                break
            seen += chunk
    except OSError:
        pass
    os.close(master)
    assert proc.returncode == 0
    assert b"mpdoctor: reading big.log:" in seen and b"MB of 20 MB" in seen
    piped = subprocess.run([sys.executable, "-m", "mpdoctor", "explain", str(big), "--format", "json"],
                           capture_output=True, env=env, timeout=120)
    assert piped.stderr == b""
    assert json.loads(piped.stdout)["unrecognised"][0]["exception"] == "KeyError: 'label'"


def test_explain_never_imports_torch_accelerate_numpy_pynvml_or_packaging():
    code = (
        "import sys\n"
        "from mpdoctor import cli\n"
        f"rc = cli.main(['explain', {str(OOM_LOG)!r}, '--format', 'json'])\n"
        f"rc2 = cli.main(['explain', {str(OOM_LOG)!r}])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'accelerate', 'numpy', 'pynvml', 'packaging'))\n"
        "sys.stderr.write('IMPORTED:' + ','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert b"IMPORTED:" in proc.stderr, proc.stderr
    assert proc.stderr.split(b"IMPORTED:")[1] == b""
    # and -X importtime agrees, for the console entry point
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpdoctor", "explain", str(OOM_LOG)],
                          capture_output=True, timeout=120)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert not imported & {"torch", "accelerate", "numpy", "pynvml", "packaging"}
