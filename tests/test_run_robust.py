"""`mpdoctor run` on an ordinary machine that is not kind to it: the wrapper killed
outright, no writable temporary folder, a stderr left on the terminal while stdout goes
to a file, a scheduler that signals every process of the job, Ctrl-C, a report path
that cannot be written. Real subprocesses, no mocks; the children are tiny Python
programs (torch only where the instrumentation itself is the point)."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpdoctor

PY = sys.executable
MPDOCTOR = [PY, "-m", "mpdoctor", "run"]
ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("timeout", 120)
    return subprocess.run(args, **kw)


def _state(pid: int) -> str | None:
    """The process's state letter, or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _dies(pid: int, within: float = 30.0) -> bool:
    """Whether `pid` ends (gone, or a zombie nobody reaped yet) before `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _wait_for(path: Path, within: float = 60.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _kill_quietly(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ---- the child dies with the wrapper -----------------------------------------------------
# A launcher (as `accelerate launch` is) whose real training is its own child: both must
# die when the wrapper is killed outright.
LAUNCHER = ("import os, subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "with open(sys.argv[1], 'w') as fh:\n"
            "    fh.write(f'{os.getpid()} {g.pid}\\n')\n"
            "time.sleep(120)\n")


@pytest.mark.parametrize("how", ["group", "wrapper-only"])
def test_the_training_dies_with_a_wrapper_killed_by_sigkill(how: str, tmp_path: Path) -> None:
    # `timeout -s KILL N mpdoctor run -- train` kills the wrapper's process group; a plain
    # `kill -9` kills the wrapper alone. Neither may leave the training running.
    pids = tmp_path / "pids"
    proc = subprocess.Popen(MPDOCTOR + ["--no-probe", "--", PY, "-c", LAUNCHER, str(pids)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    child, grandchild = (int(p) for p in _wait_for(pids).split())
    try:
        if how == "group":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert _dies(child), "the command outlived the wrapper"
        assert _dies(grandchild), "the command's own child (the real training) outlived the wrapper"
    finally:
        _kill_quietly(child, grandchild)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("timeout") is None, reason="no timeout(1)")
def test_timeout_kill_leaves_no_training_running(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    proc = subprocess.Popen(["timeout", "-s", "KILL", "8"] + MPDOCTOR + ["--no-probe", "--", PY, "-c", LAUNCHER,
                                                                        str(pids)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child, grandchild = (int(p) for p in _wait_for(pids).split())
    try:
        assert proc.wait(timeout=60) in (128 + signal.SIGKILL, -signal.SIGKILL)  # timeout(1) kills its group
        assert _dies(child) and _dies(grandchild)
    finally:
        _kill_quietly(child, grandchild)


def test_a_clean_run_leaves_no_process_of_ours_behind(tmp_path: Path) -> None:
    # the lifeline leaves with the run, and kills nothing a finished run left running on
    # purpose (a daemon in a session of its own)
    pid_file = tmp_path / "daemon"
    code = ("import subprocess, sys\n"
            "d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,\n"
            "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            f"open({str(pid_file)!r}, 'w').write(f'{{d.pid}}\\n')\n")
    p = run(MPDOCTOR + ["--no-probe", "--", PY, "-c", code])
    daemon = int(_wait_for(pid_file))
    try:
        assert p.returncode == 0 and p.stderr == b""
        assert _state(daemon) not in (None, "Z")  # still running: not ours to kill
    finally:
        _kill_quietly(daemon)


# ---- no writable temporary folder --------------------------------------------------------
def _read_only(folder: Path, cmd: list[str]) -> list[str]:
    """`cmd` run where `folder` is read-only: a plain folder without write permission for
    a user; for root (whom permissions do not stop) a read-only bind mount of it in a
    mount namespace of its own."""
    folder.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return cmd
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("root without a mount namespace: no read-only folder to be had")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(folder)] + cmd


def test_no_writable_temp_folder_still_runs_the_command_and_says_so_once(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    code = ("import sys; print('out', flush=True); sys.stderr.write('err\\n')\n"
            "sys.stderr.write('RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half\\n')\n"
            "sys.exit(3)\n")
    env = dict(os.environ, TMPDIR=str(ro), HOME=str(ro), XDG_CACHE_HOME=str(ro / "cache"),
               MPDOCTOR_CACHE_DIR=str(ro / "mpdoctor-cache"), PYTHONPATH=str(ROOT))
    for fmt in ("terminal", "json"):
        p = run(_read_only(ro, MPDOCTOR + ["--format", fmt, "--", PY, "-c", code]), env=env, cwd=ro)
        assert p.returncode == 3, p.stderr
        assert p.stdout == b"out\n"
        assert p.stderr.startswith(b"err\nRuntimeError: mat1")
        ours = p.stderr.split(b"Half\n", 1)[1]
        assert b"internal error" not in ours and b"Traceback" not in ours
        if fmt == "terminal":
            assert ours.count(b"not instrumented") == 1
            assert b"no writable temporary folder (TMPDIR " + str(ro).encode() in ours
        else:
            data = json.loads(ours)
            assert data["input"]["instrumented"] is False
            assert "no writable temporary folder" in data["input"]["not_instrumented"]
            assert data["findings"][0]["category"] == "dtype-mismatch"  # the output is still diagnosed


# ---- a stderr left on the terminal -------------------------------------------------------
def _on_terminal(cmd: list[str], stdout_file: Path, pipe: bool = False) -> tuple[int, bytes]:
    """`cmd > stdout_file` (or `cmd | cat > stdout_file`) with stderr on a terminal: the
    exit status and what reached the terminal."""
    master, slave = pty.openpty()
    try:
        with open(stdout_file, "wb") as out:
            if pipe:
                cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=out)
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=cat.stdin, stderr=slave)
                cat.stdin.close()
            else:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=slave)
        os.close(slave)
        seen = b""
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other side is gone
                break
            if not data:
                break
            seen += data
        status = proc.wait(timeout=60)
        if pipe:
            cat.wait(timeout=60)
        return status, seen
    finally:
        os.close(master)


@pytest.mark.parametrize("stdout", ["file", "pipe"])
def test_a_stderr_left_on_the_terminal_stays_a_terminal(stdout: str, tmp_path: Path) -> None:
    # `mpdoctor run -- train > log` (or `| tee log`) in a terminal: the command's stderr is
    # a terminal, as bare (tqdm draws its bar, colours stay on); stdout is the file itself
    # (or a pipe)
    pipe = stdout == "pipe"
    code = ("import os, sys\n"
            "sys.stderr.write(f'isatty 1={os.isatty(1)} 2={os.isatty(2)}\\n')\n"
            "sys.stderr.write('\\x1b[31mred\\x1b[0m\\r50%\\r100%\\n')\n"
            "print('to the file')\n")
    bare_rc, bare_term = _on_terminal([PY, "-c", code], tmp_path / "bare.log", pipe)
    rc, term = _on_terminal(MPDOCTOR + ["--no-probe", "--", PY, "-c", code], tmp_path / "run.log", pipe)
    assert rc == bare_rc == 0
    assert b"isatty 1=False 2=True" in term
    assert term == bare_term  # byte for byte what the bare run put on the terminal
    assert (tmp_path / "run.log").read_bytes() == (tmp_path / "bare.log").read_bytes() == b"to the file\n"


def test_a_failure_on_a_stderr_terminal_is_still_diagnosed(tmp_path: Path) -> None:
    code = ("import sys\nsys.stderr.write('Traceback (most recent call last):\\n  File \"t.py\", line 1\\n'\n"
            "'RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half\\n')\nsys.exit(1)\n")
    report = tmp_path / "r.json"
    rc, term = _on_terminal(MPDOCTOR + ["--no-probe", "--report", str(report), "--", PY, "-c", code],
                            tmp_path / "out.log")
    assert rc == 1 and b"got Float and Half" in term
    assert json.loads(report.read_text())["findings"][0]["category"] == "dtype-mismatch"


# ---- no frame of ours in the user's traceback --------------------------------------------
FAILING = {
    "backward": ("import torch\nx = torch.randn(3, requires_grad=True)\ny = (x * 2).sum()\n"
                 "y.backward()\ny.backward()\n"),
    "clip": ("import torch\np = torch.nn.Parameter(torch.ones(2))\np.grad = torch.tensor([float('nan'), 1.0])\n"
             "torch.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)\n"),
    "unscale": ("import torch\nm = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                "s = torch.amp.GradScaler('cpu')\ns.scale(m(torch.ones(1, 2)).sum()).backward()\n"
                "s.unscale_(opt)\ns.unscale_(opt)\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FAILING))
def test_the_users_traceback_gains_no_frame_of_ours(case: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAILING[case])
    bare = run([PY, str(script)])
    wrapped = run(MPDOCTOR + ["--", PY, str(script)])  # instrumented: torch's methods are tapped
    assert bare.returncode == wrapped.returncode == 1
    assert bare.stderr.startswith(b"Traceback (most recent call last):")
    assert wrapped.stderr.startswith(bare.stderr), wrapped.stderr.decode(errors="replace")
    # no frame of mpdoctor's package (by its folder: a checkout named `mpdoctor` is in every path)
    package = os.path.dirname(os.path.realpath(mpdoctor.__file__)).encode() + b"/"
    assert package not in wrapped.stderr[:len(bare.stderr)]


# ---- a signal sent to the whole job is not sent twice ------------------------------------
# Counts the SIGUSR1s it gets: after the first, it waits a moment for a second copy.
COUNTER = ("import os, signal, sys, time\n"
           "{prelude}"
           "got = []\n"
           "signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))\n"
           "print('ready', flush=True)\n"
           "deadline = time.time() + 60\n"
           "while not got and time.time() < deadline:\n"
           "    time.sleep(0.01)\n"
           "time.sleep(1.5)\n"
           "print('got', len(got), flush=True)\n")


def _tree(root: int) -> list[int]:
    """`root` and every process under it, by pid (as a scheduler's process tracking
    lists a job step's processes)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parent.items() if p == pid and c not in out]
        out.update(kids)
        frontier.extend(kids)
    return sorted(out)


@pytest.mark.parametrize("sender", ["every-process", "wrapper-only", "shared-group"])
def test_the_child_gets_a_signal_once(sender: str) -> None:
    # every-process: SLURM's cgroup tracking signals each process of the step (the
    # wrapper, the child, all) -- the child has its own copy, the wrapper must not add
    # one; wrapper-only: `kill -USR1 PID` -- forwarded; shared-group: a killpg of a group
    # holding both the wrapper and the child (the child joined it)
    prelude = "os.setpgid(0, os.getpgid(os.getppid()))\n" if sender == "shared-group" else ""
    proc = subprocess.Popen(MPDOCTOR + ["--no-probe", "--", PY, "-c", COUNTER.format(prelude=prelude)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"ready\n"
        if sender == "every-process":
            pids = _tree(proc.pid)
            assert len(pids) >= 3  # the wrapper, its lifeline, the child
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
        elif sender == "wrapper-only":
            proc.send_signal(signal.SIGUSR1)
        else:
            os.killpg(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, out, err) == (0, b"got 1\n", b"")


# ---- Ctrl-C ------------------------------------------------------------------------------
def test_an_interrupted_run_is_not_an_unrecognised_error(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code = "print('epoch 1', flush=True)\nraise KeyboardInterrupt\n"
    p = run(MPDOCTOR + ["--no-probe", "--report", str(report), "--", PY, "-c", code])
    assert p.returncode == 130 and p.stdout == b"epoch 1\n"
    assert b"not recognised" not in p.stderr
    assert p.stderr.count(b"KeyboardInterrupt") == 1  # the child's own line, not ours again
    data = json.loads(report.read_text())
    assert data["exit_code"] == 130 and not data.get("unrecognised")


@pytest.mark.slow
def test_an_interrupted_instrumented_run_reports_once(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    script = tmp_path / "train.py"
    script.write_text("import os, signal, torch\nm = torch.nn.Linear(4, 4)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for step in range(100):\n"
                      "    m(torch.randn(2, 4)).pow(2).mean().backward(); opt.step(); opt.zero_grad()\n"
                      "    if step == 3:\n"
                      "        os.kill(os.getpid(), signal.SIGINT)\n")
    p = run(MPDOCTOR + ["--report", str(report), "--", PY, str(script)])
    assert p.returncode == 130
    assert b"not recognised" not in p.stderr and p.stderr.count(b"KeyboardInterrupt") == 1
    data = json.loads(report.read_text())
    assert not data.get("unrecognised") and not data["findings"]  # a healthy run, interrupted


# ---- a report that cannot be written -----------------------------------------------------
@pytest.mark.parametrize("where", ["no-folder", "a-folder"])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(where: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    target = str(tmp_path / "missing" / "x.json") if where == "no-folder" else str(tmp_path)
    p = run(MPDOCTOR + ["--report", target, "--", PY, "-c", f"open({str(marker)!r}, 'w')"])
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.count(b"\n") == 1 and b"cannot write the report" in p.stderr
    assert not marker.exists()  # nothing was started


# ---- signal dispositions the child inherits ----------------------------------------------
def test_the_child_inherits_the_signal_dispositions_of_a_bare_run() -> None:
    # `nohup mpdoctor run -- train`: SIGHUP ignored when we start stays ignored in the
    # child (and a hangup is not forwarded to it); the terminal signals the wrapper
    # ignores for itself (TTIN, TTOU) are at their default in the child, as bare
    code = ("import signal\n"
            "print(*(signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGHUP, signal.SIGTTIN, "
            "signal.SIGTTOU)))\n")

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    bare = run([PY, "-c", code], preexec_fn=nohup)
    wrapped = run(MPDOCTOR + ["--no-probe", "--", PY, "-c", code], preexec_fn=nohup)
    assert bare.stdout == wrapped.stdout == b"True False False\n"
