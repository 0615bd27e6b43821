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

from mpdoctor.run.tail import OutputTail

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
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
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
    p = run(MPDOCTOR + ["--", "no-such-command-x"])
    assert (p.returncode, p.stderr) == (127, b"mpdoctor run: no-such-command-x: command not found\n")


@pytest.mark.slow
def test_exec_semantics_are_execvps_and_the_shells(tmp_path: Path) -> None:
    # execvp and every shell run an executable without a shebang under /bin/sh
    script = tmp_path / "train"
    script.write_text('echo "no shebang $1 $2"\nexit 3\n')
    script.chmod(0o755)
    p = run(MPDOCTOR + ["--no-probe", "--", str(script), "a", "b"])
    assert (p.returncode, p.stdout) == (3, b"no shebang a b\n")
    p = run(MPDOCTOR + ["--no-probe", "--", "train", "x", "y"], env=dict(os.environ, PATH=f"{tmp_path}:/usr/bin:/bin"))
    assert (p.returncode, p.stdout) == (3, b"no shebang x y\n")
    # the shell's statuses and messages, never a traceback
    script.chmod(0o644)
    cases = [
        ([str(script)], 126, f"{script}: Permission denied"),
        ([str(tmp_path)], 126, f"{tmp_path}: Is a directory"),
        ([str(tmp_path / "missing")], 127, f"{tmp_path / 'missing'}: No such file or directory"),
    ]
    bad = tmp_path / "bad"
    bad.write_text("#!/no/such/python\n")
    bad.chmod(0o755)
    cases.append(([str(bad)], 127, f"{bad}: /no/such/python: bad interpreter: No such file or directory"))
    binary = tmp_path / "foreign"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(64))  # not for this machine
    binary.chmod(0o755)
    cases.append(([str(binary)], 126, f"{binary}: cannot execute binary file: Exec format error"))
    cases.append(([""], 127, ": command not found"))
    for cmd, status, message in cases:
        p = run(MPDOCTOR + ["--", *cmd])
        assert (p.returncode, p.stderr.decode()) == (status, f"mpdoctor run: {message}\n")


def test_a_grandchilds_late_output_passes_through_until_the_pipe_closes() -> None:
    # `cmd | cat` prints "late": the pipe stays open while the grandchild holds it
    p = run(MPDOCTOR + ["--no-probe", "--", "sh", "-c", "(sleep 0.5; echo late; echo late-err >&2) & echo done"])
    assert (p.returncode, p.stdout, p.stderr) == (0, b"done\nlate\n", b"late-err\n")


@pytest.mark.slow
def test_a_full_stdout_is_the_childs_to_meet_as_bare() -> None:
    # the child writes to /dev/full itself: its own error, its own status, no traceback of ours
    for code in ("import sys; print('x' * 100000); sys.exit(5)",
                 "import os, sys\ntry:\n    os.write(1, b'x')\nexcept OSError as e:\n    sys.exit(e.errno)"):
        with open("/dev/full", "wb") as full:
            bare = run([PY, "-c", code], stdout=full)
            wrapped = run(MPDOCTOR + ["--no-probe", "--", PY, "-c", code], stdout=full)
        assert wrapped.returncode == bare.returncode != 0
        assert wrapped.stderr.startswith(bare.stderr)
        assert b"mpdoctor/" not in wrapped.stderr and b"Traceback" not in wrapped.stderr[len(bare.stderr):]
    with open("/dev/full", "wb") as full:
        p = run(MPDOCTOR + ["--no-probe", "--", "sh", "-c", "echo x; exit 5"], stdout=full)
    assert p.returncode == 5 and b"Traceback" not in p.stderr


@pytest.mark.slow
def test_our_own_stderr_full_or_closed_leaves_the_status_the_childs() -> None:
    # the report has nowhere to go: the command's status still passes through
    with open("/dev/full", "wb") as full:
        p = run(MPDOCTOR + ["--", PY, "-c", "import sys; print('out'); sys.exit(3)"], stderr=full)
    assert p.returncode == 3 and p.stdout == b"out\n"
    with open("/dev/full", "wb") as full:
        p = run(MPDOCTOR + ["--", PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], stderr=full)
    assert p.returncode == 143
    mp = " ".join(MPDOCTOR)
    # a closed stdin, stdout or stderr is closed in the child too (no pipe of ours there)
    for redirect, code, status in ((">&-", "import os; os.write(1, b'x')", 1),
                                   ("2>&-", "import sys; print('out'); sys.exit(5)", 5),
                                   ("<&-", "import os, sys; sys.exit(9 if not os.path.exists('/proc/self/fd/0') else 0)", 9)):
        bare = run(["sh", "-c", f"{PY} -c \"{code}\" {redirect}; echo rc=$?"])
        wrapped = run(["sh", "-c", f"{mp} -- {PY} -c \"{code}\" {redirect}; echo rc=$?"])
        assert wrapped.stdout == bare.stdout and wrapped.stdout.endswith(f"rc={status}\n".encode())
        assert b"mpdoctor/" not in wrapped.stderr


def test_a_closed_stdout_pipe_is_the_childs_to_meet_as_bare() -> None:
    # `| head -c0`: the reader is gone before the child writes; the child meets EPIPE itself
    code = "import sys\nfor i in range(200000): print(i)\n"

    def closed(cmd: list[str]) -> tuple[int, bytes]:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()
        err = proc.stderr.read()
        return proc.wait(timeout=60), err

    bare_rc, bare_err = closed([PY, "-c", code])
    rc, err = closed(MPDOCTOR + ["--no-probe", "--", PY, "-c", code])
    assert rc == bare_rc == 1 and b"BrokenPipeError" in bare_err
    assert err.startswith(bare_err) and b"mpdoctor/" not in err


def test_stdout_to_a_file_is_the_childs_own_and_still_diagnosed(tmp_path: Path) -> None:
    # A file (or /dev/null) is handed to the child as it is: no copy, no cost, appends
    # where the shell's `>>` would; what it wrote is read back for the diagnosis.
    log = tmp_path / "train.log"
    log.write_bytes(b"earlier run\n")
    code = ("import os, sys\n" + "".join(f"print('step {i} loss 0.{i}')\n" for i in range(5))
            + "print('RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half')\n"
            + "sys.stdout.flush(); os.write(1, bytes(range(256))); sys.exit(1)\n")
    report = tmp_path / "r.json"
    with open(log, "ab") as out:
        p = run(MPDOCTOR + ["--no-probe", "--format", "json", "--report", str(report), "--", PY, "-c", code],
                stdout=out)
    bare = run([PY, "-c", code])
    assert p.returncode == bare.returncode == 1
    assert log.read_bytes() == b"earlier run\n" + bare.stdout
    data = json.loads(report.read_text())
    assert data["findings"][0]["category"] == "dtype-mismatch"
    assert data["input"]["bytes"] == len(bare.stdout)


def test_many_bytes_pass_through_exactly_in_every_size_of_write() -> None:
    code = ("import os, random\nr = random.Random(7)\n"
            "for _ in range(200):\n    os.write(1, r.randbytes(r.choice((1, 17, 4096, 70000))))\n")
    bare = run([PY, "-c", code])
    wrapped = run(MPDOCTOR + ["--no-probe", "--", PY, "-c", code])
    assert wrapped.returncode == 0 and len(bare.stdout) > 2_000_000 and wrapped.stdout == bare.stdout


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


def test_stdout_and_stderr_into_one_pipe_interleave_as_bare() -> None:
    # `2>&1 | tee log`: the order of the lines across the two streams is the bare order
    code = ("import os\n"
            "for i in range(300):\n"
            "    os.write(1, f'out {i}\\n'.encode()); os.write(2, f'err {i}\\n'.encode())\n")
    bare = run([PY, "-c", code], stderr=subprocess.STDOUT)
    wrapped = run(MPDOCTOR + ["--no-probe", "--", PY, "-c", code], stderr=subprocess.STDOUT)
    assert wrapped.returncode == 0 and wrapped.stdout == bare.stdout


@pytest.mark.parametrize("value", ["x", "0", "-2", "1.5"])
def test_a_sampling_period_that_is_not_a_step_count_is_refused_before_the_run(tmp_path, value):
    marker = tmp_path / "ran"
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--", sys.executable, "-c",
                        f"open({str(marker)!r}, 'w')"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MPDOCTOR_WATCH_EVERY=value))
    assert p.returncode == 2 and "MPDOCTOR_WATCH_EVERY" in p.stderr
    assert not marker.exists()  # nothing was started
