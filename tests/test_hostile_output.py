"""Output that survives any terminal and locale, and arguments that say what is wrong
(issue 17): COLUMNS of 0, negative, garbled or unset is 80 columns; a stdout that cannot
encode every character gets `?`, never a UnicodeEncodeError; a closed stdin or stdout is
exit 2 with one line; control characters from a rule file reach no terminal; a wrong
option is named in its own command's usage; every --help fits in 80 columns."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpdoctor import cli
from tests.rulekit import private_cache  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "fixtures" / "logs" / "accelerate-config" / "accelerator-fp32-recorded.log"
SNAPSHOT = ROOT / "fixtures" / "snapshots" / "t4-old-driver-fp16.json"
# a CUDA OOM line with characters no Latin-1 terminal has (the rule's own text adds `✗`)
OOM = ("Traceback (most recent call last):\n  File \"/w/训练.py\", line 3, in <module>\n"
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total "
       "capacity; 14.1 GiB already allocated; 5.19 MiB free)\n")


def run_cli(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def proc(args, *, env=None, shell_redirect="", **kw):
    """mpdoctor in a child, optionally with a shell redirection (`<&-`, `>&-`)."""
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    base.update(env or {})
    argv = [sys.executable, "-m", "mpdoctor", *map(str, args)]
    if shell_redirect:
        cmd = " ".join(f"'{a}'" for a in argv) + " " + shell_redirect
        return subprocess.run(["sh", "-c", cmd], capture_output=True, env=base, timeout=120, **kw)
    return subprocess.run(argv, capture_output=True, env=base, timeout=120, **kw)


# --- the width ----------------------------------------------------------------------------

@pytest.mark.parametrize("columns", ["0", "-5", "abc", "", None])
@pytest.mark.parametrize("args", [["explain", LOG], ["rules", "list"], ["check", "--snapshot", SNAPSHOT]],
                         ids=["explain", "rules-list", "check"])
def test_any_columns_value_prints_at_a_sane_width(columns, args, capsys, monkeypatch):
    """COLUMNS=0: explain, rules list and check printed nothing (explain still exited 1)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    _, out, err = run_cli(args, capsys)
    assert out.strip() and err == ""
    monkeypatch.setenv("COLUMNS", "80")
    _, at80, _ = run_cli(args, capsys)
    assert out == at80


def test_render_findings_with_a_width_of_zero_or_less_uses_80():
    import mpdoctor
    from mpdoctor.logs import explain_path
    from mpdoctor.rulebase import load

    findings = explain_path(str(LOG), load()).findings
    at80 = mpdoctor.render_findings(findings, width=80)
    assert at80.strip()
    for width in (-5, 0, None):
        assert mpdoctor.render_findings(findings, width=width) == at80


# --- the locale ---------------------------------------------------------------------------

@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "latin-1"}, {"PYTHONIOENCODING": "ascii"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}],
                         ids=["latin-1", "ascii", "C-locale"])
@pytest.mark.parametrize("fmt", ["terminal", "markdown", "json", "oneline"])
def test_a_stdout_that_cannot_encode_gets_replacement_characters(tmp_path, env, fmt):
    """`LC_ALL=C` or a Latin-1 stdout: explain exited 2 'internal error (UnicodeEncodeError)'."""
    log = tmp_path / "oom.log"
    log.write_text(OOM, encoding="utf-8")
    out = proc(["explain", log, "--format", fmt], env=env)
    assert out.returncode == 1, out.stderr
    assert b"internal error" not in out.stderr and b"UnicodeEncodeError" not in out.stderr
    assert b"cuda-oom" in out.stdout
    if env.get("PYTHONIOENCODING") == "ascii":
        assert max(out.stdout) < 128
    if fmt == "json":
        json.loads(out.stdout.decode("latin-1"))


def test_rules_show_and_check_survive_an_ascii_stdout():
    for args in (["rules", "show", "cuda-oom"], ["check", "--snapshot", SNAPSHOT], ["rules", "list"]):
        out = proc(args, env={"PYTHONIOENCODING": "ascii"})
        assert out.returncode in (0, 1) and b"internal error" not in out.stderr, (args, out.stderr)
        assert out.stdout.strip() and max(out.stdout) < 128


# --- closed streams -----------------------------------------------------------------------

@pytest.mark.parametrize("args, redirect, words", [
    (["explain", "-"], "<&-", b"standard input is closed"),
    (["explain", LOG], ">&-", b"standard output is closed"),
    (["rules", "list"], ">&-", b"standard output is closed"),
    (["check", "--snapshot", SNAPSHOT], ">&-", b"standard output is closed"),
])
def test_a_closed_stream_is_exit_2_with_one_line(args, redirect, words):
    """`explain - <&-` and `explain LOG >&-`: 'internal error (AttributeError...) please report it'."""
    out = proc(args, shell_redirect=redirect)
    assert out.returncode == 2
    assert out.stderr.startswith(b"mpdoctor: ") and out.stderr.count(b"\n") == 1 and words in out.stderr
    assert b"internal error" not in out.stderr and b"Traceback" not in out.stderr


def test_closed_stdout_and_stderr_is_a_silent_exit_2():
    for args, redirect in ((["explain", LOG], ">&- 2>&-"), (["explain", "-"], "<&- 2>&-")):
        out = proc(args, shell_redirect=redirect)
        assert out.returncode == 2 and out.stdout == b""


def test_explain_dash_on_a_terminal_says_it_reads_standard_input():
    """`explain -` with a terminal on stdin waited without a word."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    child = subprocess.Popen([sys.executable, "-m", "mpdoctor", "explain", "-", "--format", "oneline"],
                             stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    try:
        said = b""
        deadline = time.monotonic() + 60
        while b"\n" not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([child.stderr], [], [], 1)
            if ready:
                said += os.read(child.stderr.fileno(), 4096)
        assert b"reading the log from standard input" in said and b"Ctrl-D" in said
        os.write(master, OOM.encode() + b"\x04")
        out, err = child.communicate(timeout=60)
    finally:
        os.close(master)
        if child.poll() is None:
            child.kill()
    assert child.returncode == 1 and b"cuda-oom" in out


def test_explain_dash_from_a_pipe_says_nothing_extra():
    out = proc(["explain", "-", "--format", "oneline"], input=OOM.encode())
    assert out.returncode == 1 and out.stderr == b""


# --- control characters from a rule file ------------------------------------------------------

HOSTILE = {  # TOML escapes: what the rule file holds is the raw control characters
    "title": r"Mine failed \u001b]52;c;aGVsbG8=\u0007 here",
    "explanation": r"It cleared the screen \u001b[2J\u001b[H and \u009b31m and \u202eevil",
    "fix": r"Run it \u001b[31mred\u001b[0m again\u0008\u0008\u0008",
}


def _hostile_rule(folder: Path) -> Path:
    (folder / "log").mkdir(parents=True, exist_ok=True)
    (folder / "log" / "mine.toml").write_text("\n".join([
        'id = "mine"', 'category = "cuda-kernel-fault"', f'title = "{HOSTILE["title"]}"',
        'patterns = ["MINE FAILED"]', f'explanation = ["{HOSTILE["explanation"]}"]', f'fixes = ["{HOSTILE["fix"]}"]',
        'references = ["https://example.com/x"]', "[doc]", f'why = "{HOSTILE["explanation"]}"',
        "[[example]]", 'text = "MINE FAILED here"', "[[near_miss]]", 'text = "fine"']) + "\n")
    return folder


def _obeyable(text: str) -> list[str]:
    """Control characters a terminal would obey, but rich's colour sequences (SGR)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0 or 0x202a <= ord(c) <= 0x202e]


@pytest.mark.parametrize("fmt", ["terminal", "json", "markdown", "oneline"])
def test_escape_sequences_from_a_rule_file_are_shown_not_obeyed(tmp_path, capsys, fmt):
    """OSC 52 (a clipboard write) and `\\x1b[2J` (clear screen) in a rule's text reached the
    terminal unchanged."""
    folder = _hostile_rule(tmp_path / "r")
    log = tmp_path / "t.log"
    log.write_text("Traceback (most recent call last):\nMINE FAILED here\n")
    outputs = [run_cli(["explain", log, "--rules", folder, "--format", fmt], capsys)[1]]
    outputs.append(run_cli(["rules", "list", "--rules", folder, "--format", fmt], capsys)[1])
    if fmt != "oneline":
        outputs.append(run_cli(["rules", "show", "mine", "--rules", folder, "--format", fmt], capsys)[1])
    for out in outputs:
        assert out.strip()
        assert _obeyable(out) == [], (fmt, out)
        assert "]52;c;aGVsbG8=" in out  # still shown, as text
    if fmt == "json":
        assert "\\\\x1b]52;c;aGVsbG8=\\\\x07" in outputs[0]


def test_escape_sequences_stay_inert_on_a_colour_terminal(tmp_path):
    folder = _hostile_rule(tmp_path / "r")
    log = tmp_path / "t.log"
    log.write_text("Traceback (most recent call last):\nMINE FAILED here\n")
    for args in (["explain", log, "--rules", folder], ["rules", "show", "mine", "--rules", folder],
                 ["rules", "list", "--rules", folder]):
        out = proc(args, env={"FORCE_COLOR": "1", "COLUMNS": "80"})
        text = out.stdout.decode()
        assert "\x1b[" in text, "coloured, as on a terminal"
        assert _obeyable(text) == [], args


def test_a_bad_rule_message_shows_its_control_characters(tmp_path):
    folder = tmp_path / "r"
    (folder / "log").mkdir(parents=True)
    (folder / "log" / "x.toml").write_text('id = "x"\ncategory = "\\u001b]52;c;aGk=\\u0007"\n')
    out = proc(["rules", "list", "--rules", folder])
    assert out.returncode == 2 and b"\x1b" not in out.stderr and b"\x07" not in out.stderr


# --- arguments ------------------------------------------------------------------------------

def test_a_misspelt_option_is_named_in_its_commands_usage(capsys):
    """`mpdoctor explain --frmat json x` showed the top-level usage and called the path
    unrecognised."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explain", "--frmat", "json", "x.log"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert err.startswith("usage: mpdoctor explain ")
    assert "unrecognized option '--frmat'" in err and "did you mean '--format'?" in err
    assert "x.log" not in err and "json" not in err.split("error:")[1]


@pytest.mark.parametrize("argv, usage, option", [
    (["rules", "list", "--knd", "run"], "usage: mpdoctor rules list ", "--knd"),
    (["check", "--snapshto", "s.json"], "usage: mpdoctor check ", "--snapshto"),
    (["run", "--reprt", "r.json", "--", "true"], "usage: mpdoctor run ", "--reprt"),
    (["-x", "explain", "a.log"], "usage: mpdoctor ", "-x"),
])
def test_every_command_names_its_own_wrong_option(capsys, argv, usage, option):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage) and f"'{option}'" in err


def test_options_after_runs_command_are_the_commands_own():
    out = proc(["run", "--no-probe", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--frmat", "x"])
    assert out.returncode == 0 and b"['--frmat', 'x']" in out.stdout


def test_bare_mpdoctor_lists_the_commands_on_stdout_with_status_0(capsys):
    """pip's convention (documented in `mpdoctor --help`); it printed the whole help with 2."""
    from mpdoctor.commands import COMMANDS

    code, out, err = run_cli([], capsys)
    assert code == 0 and err == ""
    assert out.startswith("usage: mpdoctor COMMAND") and all(f"  {name} " in out for name in COMMANDS)
    assert max(len(line) for line in out.splitlines()) <= 80 and len(out.splitlines()) < 20
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "lists the commands on standard output and exits 0" in " ".join(capsys.readouterr().out.split())


HELPS = [[], ["explain"], ["check"], ["collect"], ["run"], ["probe"], ["rules"], ["rules", "list"],
         ["rules", "show"], ["rules", "test"]]


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "mpdoctor")
@pytest.mark.parametrize("columns", ["80", "0"])
def test_every_help_fits_in_80_columns(command, columns, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    from mpdoctor import cli as fresh

    with pytest.raises(SystemExit):
        fresh.main([*command, "--help"])
    out = capsys.readouterr().out
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert wide == [], wide
    assert not [line for line in out.splitlines() if line != line.rstrip()]
