"""`mpdoctor run` and signals: every catchable signal reaches the command, and job
control (Ctrl-Z, `fg`) stops and resumes the job as it would a bare command.

The children are tiny non-torch Python programs."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PY = sys.executable
MPDOCTOR = [PY, "-m", "mpdoctor", "run"]

HANDLER = (
    "import signal, sys, time\n"
    "def h(s, f):\n"
    "    print('got', signal.Signals(s).name, flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal({sig}, h)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM, signal.SIGWINCH])
def test_a_signal_reaches_the_child_and_its_exit_passes_through(sig: int) -> None:
    # SLURM's `--signal=USR1@60` pre-emption: the training checkpoints and exits 0.
    extra = [] if sig == signal.SIGUSR1 else ["--no-probe"]  # the real thing once, instrumented
    proc = subprocess.Popen(MPDOCTOR + extra + ["--", PY, "-c", HANDLER.format(sig=int(sig))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (0, f"got {signal.Signals(sig).name}\n".encode(), b"")


def test_a_signal_the_child_does_not_handle_kills_the_child_not_the_wrapper(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    proc = subprocess.Popen(MPDOCTOR + ["--no-probe", "--report", str(report), "--", PY, "-c",
                                        "import time; print('ready', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGUSR2
    assert b"killed by SIGUSR2" in err
    assert report.exists()  # the wrapper lived to write it: it was not the one killed


# A minimal job-control shell: the command runs as a foreground job on its own terminal;
# when the job stops the shell says "stopped" on the report fd, waits for a line on its
# stdin, `fg`s the job, and finally says "exit N" and what the job wrote to a pipe.
SHELL = r'''
import fcntl, os, signal, sys, termios
slave_path, mode, report = sys.argv[1], sys.argv[2], int(sys.argv[3])
cmd = sys.argv[4:]
for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
    signal.signal(s, signal.SIG_IGN)
os.setsid()
tty = os.open(slave_path, os.O_RDWR)
fcntl.ioctl(tty, termios.TIOCSCTTY, 0)
out_r, out_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(tty, os.getpid())
    for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
        signal.signal(s, signal.SIG_DFL)
    os.dup2(os.open(os.devnull, os.O_RDONLY) if mode == "pty-nokeys" else tty, 0)
    os.dup2(tty, 2)
    os.dup2(out_w if mode == "pipe" else tty, 1)
    os.execvp(cmd[0], cmd)
try:
    os.setpgid(pid, pid)  # as shells do; EACCES once the child has exec'd (it did it itself)
    os.tcsetpgrp(tty, pid)
except OSError:
    pass
os.close(out_w)
say = lambda msg: os.write(report, (msg + "\n").encode())
while True:
    _, status = os.waitpid(pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        break
    os.tcsetpgrp(tty, os.getpgrp())
    say("stopped")
    sys.stdin.readline()
    os.tcsetpgrp(tty, pid)
    os.killpg(pid, signal.SIGCONT)
piped = b""
while mode == "pipe":
    d = os.read(out_r, 65536)
    if not d:
        break
    piped += d
say(f"exit {os.waitstatus_to_exitcode(status)} piped {piped!r}")
'''

# Says its pid on the terminal (stderr), then waits for a line typed there.
TYPIST = ("import os, sys\n"
          "sys.stderr.write(f'ready {os.getpid()}\\n'); sys.stderr.flush()\n"
          "line = input()\n"
          "print('done', line, flush=True)\n"
          "raise SystemExit(3)\n")
# The same without a keyboard: it waits for a file instead.
SLEEPER = ("import os, sys, time\n"
           "sys.stderr.write(f'ready {{os.getpid()}}\\n'); sys.stderr.flush()\n"
           "deadline = time.time() + 30\n"
           "while not os.path.exists({go!r}) and time.time() < deadline:\n"
           "    time.sleep(0.05)\n"
           "print('done go', flush=True)\n"
           "raise SystemExit(3)\n")


def _read_until(fd: int, needle: bytes, seen: bytearray, timeout: float = 30) -> bytes:
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} in {bytes(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            assert data, f"EOF before {needle!r} in {bytes(seen)!r}"
            seen += data
    return bytes(seen)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pty", "pipe", "pty-nokeys"])
def test_ctrl_z_stops_the_job_and_fg_resumes_it(mode: str, tmp_path: Path) -> None:
    # pty: stdout is a terminal, the child gets a pty of its own (Ctrl-Z travels as a
    # byte through it); pipe: stdout is a pipe, the child gets the terminal itself;
    # pty-nokeys: stdin is not the terminal, Ctrl-Z is our terminal's SIGTSTP to us.
    shell = tmp_path / "shell.py"
    shell.write_text(SHELL)
    master, slave = pty.openpty()
    rep_r, rep_w = os.pipe()
    proc = subprocess.Popen([PY, str(shell), os.ttyname(slave), mode, str(rep_w)] + MPDOCTOR
                            + ["--no-probe", "--", PY, "-c", SLEEPER.format(go=str(tmp_path / "go")) if mode == "pty-nokeys" else TYPIST],
                            stdin=subprocess.PIPE, pass_fds=(rep_w,))
    os.close(rep_w)
    try:
        term = bytearray()
        _read_until(master, b"ready ", term)
        out = _read_until(master, b"\n", term)
        child = int(out.split(b"ready ", 1)[1].split()[0])
        time.sleep(0.3)  # the child is in input()
        os.write(master, b"\x1a")  # Ctrl-Z
        report = bytearray()
        _read_until(rep_r, b"stopped\n", report)
        assert _state(child) == "T"  # the training itself is stopped, not only the wrapper
        proc.stdin.write(b"\n")  # fg
        proc.stdin.flush()
        time.sleep(0.3)
        if mode == "pty-nokeys":
            (tmp_path / "go").touch()
        else:
            os.write(master, b"go\n")
        final = _read_until(rep_r, b"piped", report)
        _read_until(rep_r, b"\n", report)
        if mode != "pipe":
            _read_until(master, b"done go", term)
            assert b"exit 3 piped b''" in final
        else:
            assert b"exit 3 piped b'done go\\n'" in bytes(report)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(slave)
        os.close(rep_r)


def test_sigtstp_stops_the_child_and_sigcont_resumes_it_without_stopping_our_parent(tmp_path: Path) -> None:
    # Started by a program (not a shell) in the program's own process group: SIGTSTP to
    # mpdoctor stops the training; the program that started it must never be stopped.
    go = tmp_path / "go"
    code = SLEEPER.format(go=str(go)).replace("sys.stderr.write", "sys.stdout.write").replace(
        "sys.stderr.flush", "sys.stdout.flush")
    proc = subprocess.Popen(MPDOCTOR + ["--no-probe", "--", PY, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        child = int(proc.stdout.readline().split()[1])
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 20
        while _state(child) != "T":
            assert time.monotonic() < deadline, "the child was not stopped"
            time.sleep(0.05)
        go.touch()
        time.sleep(0.3)
        assert _state(child) == "T"  # still stopped: it did not see the file
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out) == (3, b"done go\n")
    finally:
        if proc.poll() is None:
            proc.kill()
