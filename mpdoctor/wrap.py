"""`mpdoctor run -- CMD`: run a training command untouched, then diagnose it.

The child's output passes through byte for byte as it arrives (a pseudo-terminal when
our stdout is a terminal, so progress bars and colours behave as in a bare run; plain
pipes otherwise, stdout to stdout and stderr to stderr); stdin reaches it; SIGINT,
SIGTERM and SIGHUP go to its process group; our exit status is its own. We keep a
bounded head and tail of the output, and the instrumentation (instrument/, injected
through a sitecustomize on PYTHONPATH) leaves per-rank event files. When the run fails,
or the instrumentation saw trouble, the explain rules read the captured output and their
findings are merged with the instrumentation's, root cause first, on stderr after the
child's own output. This module never imports torch.
"""

from __future__ import annotations

import errno
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .findings import Evidence, Finding, Report, rank_findings

HEAD_BYTES = 256 * 1024
TAIL_BYTES = 4 * 1024 * 1024
_CHUNK = 1 << 16
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class OutputTail:
    """The first `head` and the last `tail` bytes of everything the child wrote.

    The chunks os.read returned are kept as they are (no copying on the hot path); the
    oldest are dropped once the tail holds more than it needs."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        from collections import deque

        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.chunks: Any = deque()
        self.kept = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if len(self.head) < self.head_limit:
            take = self.head_limit - len(self.head)
            self.head += data[:take]
            data = data[take:]
            if not data:
                return
        self.chunks.append(data)
        self.kept += len(data)
        while self.kept - len(self.chunks[0]) >= self.tail_limit:
            self.kept -= len(self.chunks.popleft())

    @property
    def tail(self) -> bytes:
        return b"".join(self.chunks)[-self.tail_limit:]

    def text(self) -> str:
        tail = self.tail
        if self.total > len(self.head) + len(tail):
            skipped = self.total - len(self.head) - len(tail)
            nl = tail.find(b"\n")
            body = bytes(self.head) + f"\n[... {skipped} bytes not kept ...]\n".encode() + tail[nl + 1:]
        else:
            body = bytes(self.head) + tail
        return body.decode("utf-8", "replace")


@dataclass
class ChildResult:
    returncode: int
    tail: OutputTail
    signal_name: str | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 128 - self.returncode if self.returncode < 0 else self.returncode


# ---- starting the child ----------------------------------------------------------------
def _boot_dir(workdir: Path) -> Path:
    """A copy of instrument/boot with its bytecode compiled, so the child's interpreter
    loads it without compiling (PYTHONDONTWRITEBYTECODE is common in containers)."""
    src = Path(__file__).parent / "instrument" / "boot" / "sitecustomize.py"
    boot = workdir / "boot"
    boot.mkdir()
    dst = boot / "sitecustomize.py"
    shutil.copyfile(src, dst)
    try:
        import importlib.util
        import py_compile

        py_compile.compile(str(dst), cfile=importlib.util.cache_from_source(str(dst)), doraise=True)
    except Exception:  # the source works too, a little slower
        pass
    return boot


def child_env(workdir: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if workdir is None:
        return env
    from .instrument.events import ENV_DIR

    events = workdir / "events"
    events.mkdir()
    boot = _boot_dir(workdir)
    env["PYTHONPATH"] = str(boot) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[ENV_DIR] = str(events)
    env["MPDOCTOR_PKG_ROOT"] = str(Path(__file__).resolve().parent.parent)
    return env


class _Forwarder:
    """Our SIGINT/SIGTERM/SIGHUP go to the child's process group while it runs."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.received: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Forwarder":
        for sig in _FORWARDED:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False when the reader has gone (EPIPE)."""
    view: Any = data
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except BrokenPipeError:
            return False
        except BlockingIOError:
            import select

            select.select([], [fd], [])
            continue
        if n == len(view):
            return True
        view = memoryview(view)[n:]
    return True


def _pump(sel: selectors.BaseSelector, routes: dict[int, int], tail: OutputTail, proc: subprocess.Popen,
          stdin_to: int | None = None) -> None:
    """Copy child fds -> our fds until they close, or the child is gone and they are quiet."""
    open_fds = set(routes)
    child_gone_at: float | None = None
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable when the child exits (Linux 5.3+)
        sel.register(pidfd, selectors.EVENT_READ, "pid")
    except (AttributeError, OSError):
        pidfd = None
    if stdin_to is not None:
        sel.register(0, selectors.EVENT_READ, "stdin")
    try:
        while open_fds:
            if child_gone_at is not None:
                # What is still buffered arrives at once; a grandchild holding the pipe
                # open must not keep us (a bare run would have returned to the shell).
                timeout = max(0.0, child_gone_at + 0.2 - time.monotonic())
            else:
                timeout = None if pidfd is not None else 0.1
            events = sel.select(timeout)
            if not events:
                if child_gone_at is not None:
                    break
                if proc.poll() is not None:
                    child_gone_at = time.monotonic()
                continue
            for key, _ in events:
                if key.data == "pid":
                    sel.unregister(key.fd)
                    child_gone_at = time.monotonic()
                    continue
                if key.data == "stdin":
                    try:
                        data = os.read(0, _CHUNK)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(0)
                    else:
                        _write_all(stdin_to, data)  # type: ignore[arg-type]
                    continue
                fd = key.fd
                try:
                    data = os.read(fd, _CHUNK)
                except OSError as exc:  # EIO: the pty's other side closed
                    if exc.errno not in (errno.EIO, errno.EBADF):
                        raise
                    data = b""
                if not data:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                tail.feed(data)
                if not _write_all(routes[fd], data):
                    # Our reader went away (`| head`): close the child's pipe, so that it
                    # meets the broken pipe itself, as it would have bare.
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    os.close(fd)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _spawn_kwargs() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover


def run_pipes(cmd: list[str], env: dict[str, str]) -> ChildResult:
    tail = OutputTail()
    start = time.monotonic()
    stdin_tty = _isatty(0) and _foreground(0)
    with _Forwarder() as fwd:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                **_spawn_kwargs())
        fwd.pgid = proc.pid
        handed = _hand_terminal(proc.pid) if stdin_tty else False
        try:
            sel = selectors.DefaultSelector()
            out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
            sel.register(out_fd, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            _pump(sel, {out_fd: 1, err_fd: 2}, tail, proc)
            returncode = _wait(proc)
        finally:
            if handed:
                _take_terminal()
            for f in (proc.stdout, proc.stderr):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
    return _result(returncode, tail, start)


def run_pty(cmd: list[str], env: dict[str, str]) -> ChildResult:
    import fcntl
    import pty
    import termios
    import tty

    tail = OutputTail()
    start = time.monotonic()
    master, slave = pty.openpty()
    # Relay the keyboard only from the foreground: a backgrounded `mpdoctor run ... &` that
    # read the terminal would be stopped (SIGTTIN), and the training with it.
    stdin_tty, stderr_tty = _isatty(0) and _foreground(0), _isatty(2)
    saved = None
    try:
        if _isatty(0):
            termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(0))
        if not stdin_tty:
            # Our terminal stays cooked (we do not own it), so it turns \n into \r\n itself:
            # the child's side must not do it a second time.
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.OPOST
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    _copy_winsize(master)

    def become_session_leader_of_pty() -> None:
        fcntl.ioctl(1, termios.TIOCSCTTY, 0)  # stdout is the pty's slave side here

    with _Forwarder() as fwd:
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(master))
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=slave if stdin_tty else None, stdout=slave,
                                    stderr=slave if stderr_tty else subprocess.PIPE, bufsize=0,
                                    start_new_session=True, preexec_fn=become_session_leader_of_pty)
        finally:
            os.close(slave)
        fwd.pgid = proc.pid
        try:
            if stdin_tty:
                saved = termios.tcgetattr(0)
                tty.setraw(0)  # keystrokes (Ctrl-C included) go to the child's terminal as typed
            sel = selectors.DefaultSelector()
            sel.register(master, selectors.EVENT_READ)
            routes = {master: 1}
            if not stderr_tty:
                err_fd = proc.stderr.fileno()  # type: ignore[union-attr]
                sel.register(err_fd, selectors.EVENT_READ)
                routes[err_fd] = 2
            _pump(sel, routes, tail, proc, stdin_to=master if stdin_tty else None)
            returncode = _wait(proc)
        finally:
            if saved is not None:
                termios.tcsetattr(0, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
            try:
                os.close(master)
            except OSError:
                pass
    return _result(returncode, tail, start)


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # our handler forwards; keep waiting for the child
            continue


def _result(returncode: int, tail: OutputTail, start: float) -> ChildResult:
    name = None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
    return ChildResult(returncode=returncode, tail=tail, signal_name=name, wall_s=time.monotonic() - start)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _foreground(fd: int) -> bool:
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


def _hand_terminal(pgid: int) -> bool:
    """In pipe mode with a terminal on stdin, the child's group gets the terminal, so that
    it can read it (pdb, input()) and Ctrl-C reaches it once, as in a bare run."""
    try:
        os.tcsetpgrp(0, pgid)
        return True
    except OSError:
        return False


def _take_terminal() -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we are in the background now
    try:
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _copy_winsize(master: int) -> None:
    import fcntl
    import termios

    for fd in (1, 0, 2):
        try:
            size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(master, termios.TIOCSWINSZ, size)
            return
        except OSError:
            continue


# ---- diagnosis -------------------------------------------------------------------------
def run_main(args: Namespace) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        sys.stderr.write("mpdoctor run: no command given; usage: mpdoctor run [--report FILE] -- COMMAND ...\n")
        return 2
    if getattr(args, "rules", None):
        os.environ["MPDOCTOR_RULES_PATH"] = os.pathsep.join(
            [*args.rules, *([os.environ["MPDOCTOR_RULES_PATH"]] if os.environ.get("MPDOCTOR_RULES_PATH") else [])])
    workdir = None if args.no_probe else Path(tempfile.mkdtemp(prefix="mpdoctor-run-"))
    try:
        env = child_env(workdir)
        try:
            result = run_pty(cmd, env) if _isatty(1) else run_pipes(cmd, env)
        except FileNotFoundError:
            sys.stderr.write(f"mpdoctor run: {cmd[0]}: command not found\n")
            return 127
        except PermissionError:
            sys.stderr.write(f"mpdoctor run: {cmd[0]}: permission denied\n")
            return 126
        records = []
        if workdir is not None:
            from .instrument.events import read_events

            records = read_events(workdir / "events")
        report = diagnose(cmd, result, records)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    _deliver(report, result, args)
    return result.exit_code


def _deliver(report: Report, result: ChildResult, args: Namespace) -> None:
    from . import render

    if args.report:
        try:
            Path(args.report).write_text(render.to_json(report), encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"mpdoctor run: cannot write the report {args.report}: {exc}\n")
    trouble = result.exit_code != 0 or any(f.severity != "info" for f in report.findings)
    if not trouble and args.format == "terminal":
        return
    if result.signal_name:
        sys.stderr.write(f"mpdoctor: the command was killed by {result.signal_name} "
                         f"(exit status {result.exit_code})\n")
    try:
        render.emit(report, args.format, stderr=True, heading=f"mpdoctor run (exit status {result.exit_code})")
    except BrokenPipeError:
        pass


def diagnose(cmd: list[str], result: ChildResult, records: list[Any]) -> Report:
    from .instrument.diagnose import findings_for

    ranked = [r for r in records if r.snapshot or r.exceptions or r.internal_errors]
    multi = len({r.rank for r in ranked if r.rank is not None}) > 1
    inst: list[Finding] = []
    for rec in ranked:
        snap = dict(rec.snapshot)
        snap["internal_errors"] = list(dict.fromkeys((snap.get("internal_errors") or []) + rec.internal_errors))
        for f in findings_for(snap):
            if rec.rank is not None and multi:
                f.ranks = [rec.rank]
                f.facts.setdefault("rank", rec.rank)
            inst.append(f)
    inst = _merge_same(inst)
    trouble = result.exit_code != 0 or any(f.severity != "info" for f in inst)
    findings: list[Finding] = []
    unrecognised: list[Any] = []
    text = result.tail.text()
    if trouble:
        try:
            from .explain import explain_text

            explained = explain_text(text)
            findings, unrecognised = list(explained.findings), list(explained.unrecognised)
        except Exception as exc:  # a broken rule must not hide what the instrumentation saw
            sys.stderr.write(f"mpdoctor run: the explain rules failed on the output: {type(exc).__name__}: {exc}\n")
    findings = _merge_into(findings, inst)
    if result.signal_name == "SIGKILL" and not any(f.category == "host-out-of-memory" for f in findings) \
            and "Traceback (most recent call last)" not in text:
        findings.append(_sigkill_finding(result))
    ranks = rank_summary(ranked) if multi else []
    if ranks:
        findings.append(_rank_finding(ranks))
    plan = next((r.snapshot.get("plan") for r in ranked if r.snapshot.get("plan")), None)
    if trouble and plan:
        from .instrument.diagnose import plan_summary_finding

        findings.append(plan_summary_finding(plan))
    extra: dict[str, Any] = {"exit_code": result.exit_code, "command": cmd}
    if result.signal_name:
        extra["signal"] = result.signal_name
    if ranks:
        extra["ranks"] = ranks
    if plan:
        extra["precision_plan"] = plan
    info = {"bytes": result.tail.total, "wall_s": round(result.wall_s, 3), "instrumented": bool(records) or None}
    return Report(findings=rank_findings(findings), unrecognised=unrecognised, extra=extra,
                  input={k: v for k, v in info.items() if v is not None})


def _key(f: Finding) -> tuple:
    return (f.rule, f.category, f.facts.get("module"), f.facts.get("phase"), f.facts.get("step"))


def _merge_same(findings: list[Finding]) -> list[Finding]:
    """One finding per (rule, module, phase, step) across ranks, counted."""
    out: dict[tuple, Finding] = {}
    for f in findings:
        k = _key(f)
        if k in out:
            have = out[k]
            have.count += f.count
            have.ranks = sorted(set(have.ranks) | set(f.ranks))
            have.facts.pop("rank", None)
        else:
            out[k] = f
    return list(out.values())


def _merge_into(explained: list[Finding], inst: list[Finding]) -> list[Finding]:
    """An instrumentation finding of the same category as a log finding sharpens it (the
    log knows the message and the fix; the instrumentation knows the module and step)."""
    out = list(explained)
    taken: set[int] = set()
    for f in inst:
        target = next((e for e in explained if e.category == f.category and e.severity == "error"
                       and f.severity == "error" and id(e) not in taken), None)
        if target is None:
            out.append(f)
            continue
        taken.add(id(target))
        target.priority = max(target.priority, f.priority)
        target.consequence = target.consequence and f.consequence
        for k, v in f.facts.items():
            target.facts.setdefault(k, v)
        target.evidence.extend(f.evidence)
        target.ranks = sorted(set(target.ranks) | set(f.ranks))
        module = f.facts.get("module")
        if module and module not in target.title:
            where = ", ".join(str(x) for x in (f.facts.get("phase"), f"step {f.facts['step']}"
                                               if f.facts.get("step") is not None else None) if x)
            target.title += f" — in `{module}`" + (f" ({where})" if where else "")
        # the instrumentation's fixes that name the module are the most specific ones
        local = [x for x in f.fixes if module and f"`{module}`" in x and x not in target.fixes]
        target.fixes = local + target.fixes
        if f.explanation and f.explanation not in target.explanation:
            target.explanation = (f.explanation + " " + target.explanation).strip()
    return out


def _sigkill_finding(result: ChildResult) -> Finding:
    return Finding(
        rule="run-killed-sigkill", category="host-out-of-memory", severity="error",
        title="The command was killed by SIGKILL with no traceback: most likely the host's out-of-memory killer",
        explanation="A process killed by SIGKILL cannot print anything. With no traceback before it, the usual "
                    "sender is the kernel's OOM killer (host RAM exhausted, often by data loading or by loading a "
                    "checkpoint on every rank at once); a scheduler's time or memory limit is the other one.",
        fixes=["Check `dmesg | grep -i -E 'killed process|out of memory'` (or `journalctl -k`) for the OOM killer.",
               "Lower host memory use: fewer DataLoader workers, `low_cpu_mem_usage=True` / loading on one rank, "
               "a smaller batch."],
        evidence=[Evidence(text=f"exit status {result.exit_code} (killed by SIGKILL), "
                                f"{result.tail.total} bytes of output, no traceback", source="run")],
        facts={"signal": "SIGKILL", "exit_code": result.exit_code}, priority=45)


def rank_summary(records: list[Any]) -> list[dict[str, Any]]:
    """Per rank: what it did at the end — failed (first or later), timed out, waited and
    was killed, was killed, or finished."""
    ranks = [r for r in records if r.rank is not None]
    failures = sorted((r.first_exception["time"], r.rank) for r in ranks if r.first_exception)
    first_rank = failures[0][1] if failures else None
    out = []
    for r in sorted(ranks, key=lambda x: x.rank):
        exc = r.first_exception
        prog = r.progress or {}
        step = prog.get("step", (r.snapshot or {}).get("step"))
        where = prog.get("where")
        entry: dict[str, Any] = {"rank": r.rank, "pid": r.pid, "step": step}
        if exc is not None:
            text = exc.get("exception", "")
            if any(w in text for w in ("timed out", "Timeout", "timeout")):
                status = "timed out"
            elif any(w in text for w in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                         "NCCL communicator was aborted")):
                status = "lost its peer"
            else:
                status = "failed first" if r.rank == first_rank else "failed"
            if status in ("timed out", "lost its peer") and where:
                status = f"waited in {where.removeprefix('in ')} and {status}"
            entry["status"] = status + (" and was killed" if r.exit is None else "")
            entry["exception"] = text
            if exc.get("module"):
                entry["module"] = exc["module"]
        elif r.exit is not None:
            entry["status"] = "finished"
        elif where and where.startswith("in "):
            entry["status"] = f"waited in {where[3:]} and was killed"
        else:
            entry["status"] = "was killed" + (f" during {where}" if where else "")
        out.append(entry)
    return out


def _rank_finding(ranks: list[dict[str, Any]]) -> Finding:
    parts = []
    for r in ranks:
        s = f"rank {r['rank']} {r['status']}"
        if r.get("step") is not None and r["step"] >= 0:
            s += f" at step {r['step']}"
        if r.get("exception"):
            s += f" ({r['exception'][:120]}" + (f", in `{r['module']}`" if r.get("module") else "") + ")"
        parts.append(s)
    first = next((r for r in ranks if r["status"] == "failed first"), None)
    head = [f"Rank {first['rank']} failed first" + (f" in `{first['module']}`" if first.get("module") else "")
            + (f" at step {first['step']}" if first.get("step") is not None else "")] if first else []
    title = "; ".join(head + [f"rank {r['rank']} {r['status']}" for r in ranks if r is not first])
    return Finding(rule="run-rank-summary", category="distributed-communication", severity="info",
                   title=title, explanation="; ".join(parts) + ".",
                   evidence=[Evidence(text=p, source="instrument") for p in parts],
                   facts={"first_failed_rank": first["rank"] if first else None, "ranks": len(ranks)},
                   consequence=True, priority=5)
