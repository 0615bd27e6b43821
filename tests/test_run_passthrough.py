"""`mpdoctor run` as a transparent wrapper: bytes, exit statuses, signals, stdin, pty.

The children here are tiny non-torch Python programs, so these tests are fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpdoctor.run.wrapper import OutputTail

PY = sys.executable
MPDOCTOR = [PY, "-m", "mpdoctor", "run"]
WRITER = r"""
import os, sys
os.write(1, b"no newline yet")
os.write(2, b"err\r\n\x1b[31mred\x1b[0m\n")
os.write(1, b"\rprogress 50%\rprogress 100%\n")
os.write(1, bytes(range(256)))
os.write(1, "ü 中文\n".encode())
os.write(1, b"\xff\xfe invalid utf-8 \x00 nul")
"""


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 60)
    return subprocess.run(args, **kw)


def test_bytes_pass_through_exactly_on_pipes() -> None:
    bare = run([PY, "-c", WRITER])
    wrapped = run(MPDOCTOR + ["--", PY, "-c", WRITER])
    assert wrapped.returncode == bare.returncode == 0
    assert wrapped.stdout == bare.stdout
    assert wrapped.stderr == bare.stderr  # a clean run adds nothing to stderr either
    assert b"\rprogress 50%" in wrapped.stdout and bytes(range(256)) in wrapped.stdout


def test_exit_status_is_the_childs() -> None:
    for code in (0, 1, 3, 42):
        assert run(MPDOCTOR + ["--", PY, "-c", f"raise SystemExit({code})"]).returncode == code


def test_death_by_signal_is_128_plus_s_and_reported(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = run(MPDOCTOR + ["--report", str(report), "--", PY, "-c",
                        "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGTERM)"])
    assert p.returncode == 128 + signal.SIGTERM
    assert p.stdout == b"bye\n"
    assert b"killed by SIGTERM (exit status 143)" in p.stderr
    data = json.loads(report.read_text())
    assert data["exit_code"] == 143 and data["signal"] == "SIGTERM"


def test_sigkill_without_traceback_suggests_the_oom_killer(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = run(MPDOCTOR + ["--report", str(report), "--", PY, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert p.returncode == 137
    data = json.loads(report.read_text())
    assert data["findings"][0]["category"] == "host-out-of-memory"
    assert data["findings"][0]["facts"]["signal"] == "SIGKILL"


def test_stdin_reaches_the_child() -> None:
    payload = b"line one\nline two\n\x00\xff"
    p = run(MPDOCTOR + ["--", PY, "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])"],
            input=payload)
    assert p.returncode == 0 and p.stdout == payload[::-1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signals_are_forwarded_to_the_childs_process_group(sig: int, tmp_path: Path) -> None:
    # The child starts a grandchild in its group; both must get the signal.
    marker = tmp_path / "grandchild"
    child = (
        "import os, signal, subprocess, sys, time\n"
        f"g = subprocess.Popen([sys.executable, '-c', \"import signal, time, pathlib\\n"
        f"signal.signal({int(sig)}, lambda *a: (pathlib.Path({str(marker)!r}).write_text('got'), exit(0)))\\n"
        "print('ready', flush=True)\\ntime.sleep(30)\"], stdout=subprocess.PIPE)\n"
        "g.stdout.readline()\n"
        f"signal.signal({int(sig)}, lambda s, f: (g.wait(), print('child got', s, flush=True), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(MPDOCTOR + ["--", PY, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err
    assert out == f"child got {int(sig)}\n".encode()
    assert marker.read_text() == "got"


def test_child_on_a_pty_when_stdout_is_a_terminal() -> None:
    import pty

    master, slave = pty.openpty()
    code = "import os, sys; print('tty', os.isatty(0), os.isatty(1), os.isatty(2)); sys.stdout.write('a\\rb\\n')"
    proc = subprocess.Popen(MPDOCTOR + ["--no-probe", "--", PY, "-c", code], stdin=slave, stdout=slave,
                            stderr=slave, close_fds=True)
    os.close(slave)
    chunks = b""
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks += data
    proc.wait(timeout=30)
    os.close(master)
    assert proc.returncode == 0
    assert b"tty True True True" in chunks
    assert b"a\rb\r\n" in chunks  # \r untouched; \n -> \r\n is the terminal's own doing, as bare


def test_no_command_is_a_usage_error() -> None:
    p = run(MPDOCTOR + ["--"])
    assert p.returncode == 2 and b"no command" in p.stderr
    p = run(MPDOCTOR + ["--", "/nonexistent/train"])
    assert p.returncode == 127 and b"command not found" in p.stderr


def test_a_python_child_that_never_imports_torch_stays_without_it() -> None:
    p = run(MPDOCTOR + ["--", PY, "-c", "import sys; print(sorted(m for m in sys.modules if 'torch' in m "
                                        "or 'mpdoctor' in m))"])
    assert p.stdout == b"[]\n"


def test_no_probe_injects_nothing() -> None:
    code = "import os; print(os.environ.get('MPDOCTOR_EVENTS_DIR'), 'mpdoctor' in os.environ.get('PYTHONPATH', ''))"
    assert run(MPDOCTOR + ["--no-probe", "--", PY, "-c", code]).stdout == b"None False\n"
    assert run(MPDOCTOR + ["--", PY, "-c", code]).stdout.endswith(b" True\n")


def test_a_pre_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['FROM_SITECUSTOMIZE'] = 'yes'\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    code = "import os, sitecustomize; print(os.environ.get('FROM_SITECUSTOMIZE'), sitecustomize.__file__)"
    bare = run([PY, "-c", code], env=env)
    wrapped = run(MPDOCTOR + ["--", PY, "-c", code], env=env)
    assert bare.stdout.startswith(b"yes ")
    assert wrapped.stdout == bare.stdout


def test_failure_is_diagnosed_from_the_output_after_the_childs_own(tmp_path: Path) -> None:
    tb = ("import sys\nprint('epoch 1', flush=True)\n"
          "sys.stderr.write('Traceback (most recent call last):\\n  File \"train.py\", line 9, in <module>\\n'\n"
          "                 'RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half\\n')\n"
          "sys.exit(1)\n")
    report = tmp_path / "r.json"
    p = run(MPDOCTOR + ["--no-probe", "--format", "json", "--report", str(report), "--", PY, "-c", tb])
    assert p.returncode == 1
    assert p.stdout == b"epoch 1\n"
    child_err, _, ours = p.stderr.partition(b"Half\n")
    data = json.loads(ours)
    assert data == json.loads(report.read_text())
    assert data["exit_code"] == 1
    assert data["findings"][0]["category"] == "dtype-mismatch"


def test_output_tail_is_bounded_and_keeps_head_and_end() -> None:
    t = OutputTail(head=100, tail=1000)
    t.feed(b"HEAD\n" + b"x" * 95)
    for i in range(10000):
        t.feed(f"line {i}\n".encode())
    text = t.text()
    assert len(t.tail) == 1000 and t.kept < 1000 + 20 and text.startswith("HEAD\n")
    assert "bytes not kept" in text and text.endswith("line 9999\n")
