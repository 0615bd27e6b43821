"""Parent side: one child process per precision mode, each with a deadline.

Never imports torch. A child that raises, dies by a signal or hangs becomes a failed
row with its stderr tail; the other modes still run and report.

The children start together (import, build, warm-up: nothing timed), then wait. The
timed steps are the parent's to schedule: in rounds, round-robin, one mode at a time
(the others idle), the order turned each round, so a neighbour's burst or the CPU's
clock lands on every mode alike; the rounds go on until the speed-ups are stable or a
bound is reached (probe/stability.py). Then each child finishes alone, one after
another (the overhead pairs and --max-batch must not share the machine).
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .events import PREFIX

MODES = ("no", "fp16", "bf16", "fp8")
STDERR_TAIL_BYTES = 64 * 1024


@dataclass
class ProbeOptions:
    modes: list[str] = field(default_factory=lambda: list(MODES))
    steps: int = 20  # per mode, warm-up included: the least before the rounds may stop
    warmup: int = 5
    # Timed steps come in rounds of `round_steps` per mode. The rounds stop when the
    # speed-ups are stable (after `steps`), at `max_steps` per mode (None: three times
    # `steps`), or when the timed rounds have taken `round_budget_s` (even before
    # `steps`: the report then says the rounds were too few), whichever comes first;
    # max_steps equal to steps: exactly that many, whatever the time.
    max_steps: int | None = None
    round_steps: int = 3
    round_budget_s: float = 30.0
    model: str = "transformer"
    batch_size: int | None = None
    device: str | None = None
    stress: bool = False
    timeout_s: float = 180.0
    seed: int = 0
    overhead_steps: int = 5
    rules: list[str] = field(default_factory=list)  # extra rule folders for explaining failures
    # --model SPEC other than a built-in name (probe/spec.py's parse_model_spec)
    model_spec: dict[str, Any] | None = None
    seq_len: int = 128
    max_batch: int | None = None  # --max-batch: the search's upper bound
    memory_limit: int | None = None  # --memory-limit: RLIMIT_AS of each child, in bytes

    def validate(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
        if not self.modes:
            raise ValueError("no modes given")
        if self.steps < 2:
            raise ValueError("--steps must be at least 2")
        if self.max_steps is not None and self.max_steps < self.steps:
            raise ValueError("--max-steps must be at least --steps")
        if self.round_steps < 1:
            raise ValueError("round_steps must be at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        # nan compares false with everything: `<= 0` alone lets it through, and a
        # deadline of nan or inf never comes
        if not isinstance(self.timeout_s, (int, float)) or not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"--timeout must be a positive number of seconds, not {self.timeout_s!r}")
        if self.timeout_s > 7 * 24 * 3600:
            raise ValueError("--timeout must be at most a week (604800 s)")
        if self.seq_len < 1:
            raise ValueError("--seq-len must be at least 1")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError("--max-batch must be at least 1")
        if self.memory_limit is not None and self.memory_limit < 64 * 1024 * 1024:
            raise ValueError("--memory-limit must be at least 64M: torch itself needs more")
        if self.model_spec and self.stress:
            raise ValueError("--stress applies to the built-in models only (it scales their widest layer); "
                             "your model's own activations are measured against fp16's limit anyway")

    @property
    def child_timeout_s(self) -> float:
        """--max-batch's search gets as long again as the probe itself."""
        return self.timeout_s * (2 if self.max_batch else 1)

    @property
    def warmup_steps(self) -> int:
        return min(self.warmup, self.steps - 1)

    def round_bounds(self) -> tuple[int, int]:
        """(the least, the most) rounds of timed steps."""
        k = self.round_steps
        least = max(1, math.ceil((self.steps - self.warmup_steps) / k))
        most_steps = self.max_steps if self.max_steps is not None else 3 * self.steps
        most = max(least, (most_steps - self.warmup_steps) // k)
        return least, most

    @property
    def model_name(self) -> str:
        return str(self.model_spec["spec"]) if self.model_spec else self.model


class ModelSpecFailed(Exception):
    """The fp32 child could not make a model of the --model SPEC (exit status 2)."""


class Interrupted(BaseException):
    """SIGTERM/SIGHUP to the probe: raised where it waits, after its child is killed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def die(self) -> int:
        """The child's process group is killed and the temporary folder removed: now go
        the way the signal meant, so the caller sees "terminated", not an exit status."""
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)
        return 128 + self.signum  # only if the signal is blocked


@dataclass
class ChildOutcome:
    """What one child left behind: its result (if it finished) and how it ended."""

    mode: str
    result: dict[str, Any] | None
    returncode: int | None
    timed_out: bool
    wall_s: float
    stderr_tail: str
    last_phase: str | None
    last_step: int
    baseline_only: bool = False
    rounds: list[list[float]] = field(default_factory=list)  # the step times of each timed round


Progress = Callable[[str, dict[str, Any]], None]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The child must import this very mpdoctor, installed or not.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    # A --model config.json is built, never fetched: transformers stays off the network.
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    # Our own words to the progress bar, not accelerate's; keeps its logs short.
    env.setdefault("ACCELERATE_LOG_LEVEL", "warning")
    return env


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        proc.kill()


def _spec(mode: str, opts: ProbeOptions, workdir: Path, measure_overhead: bool, driven: bool) -> dict[str, Any]:
    return {
        "mode": mode, "steps": opts.steps, "warmup": opts.warmup_steps,
        "model": opts.model, "batch_size": opts.batch_size, "device": opts.device,
        "stress": opts.stress, "seed": opts.seed,
        "user_model": opts.model_spec, "seq_len": opts.seq_len,
        "max_batch": opts.max_batch, "memory_limit": opts.memory_limit,
        "max_batch_deadline": opts.timeout_s * 0.9 if opts.max_batch else None,
        "measure_overhead": measure_overhead, "overhead_steps": opts.overhead_steps,
        # the overhead pairs stop here even if their figure is not yet reliable (it says so)
        "overhead_budget_s": min(20.0, opts.timeout_s * 0.1),
        "driven": driven,
        "result_path": str(workdir / f"{mode}.result.json"),
        "logits_path": str(workdir / f"{mode}.logits.f32"),
    }


class _Child:
    """One live child: its process, its events (on the shared queue) and its deadline,
    which counts only the time it is working (not the time it waits for its turn)."""

    def __init__(self, mode: str, opts: ProbeOptions, workdir: Path, events: "queue.Queue[Any]",
                 measure_overhead: bool, driven: bool = True, share: int = 1) -> None:
        self.mode, self.opts = mode, opts
        # `share` children start together and share the machine while they do: each
        # gets that many times its deadline until it is ready (then its time counts alone)
        self.share = max(1, share)
        self.spec = _spec(mode, opts, workdir, measure_overhead, driven)
        spec_path = workdir / f"{mode}.spec.json"
        spec_path.write_text(json.dumps(self.spec))
        self.err_path = workdir / f"{mode}.stderr"
        self.phase: str | None = None
        self.step = 0
        self.ready = self.timed = self.exited = self.timed_out = False
        self.rounds: list[list[float]] = []
        self.used_s = 0.0
        self.started = time.monotonic()
        self.running_since: float | None = self.started
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mpdoctor.probe.child", str(spec_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                env=_child_env(), start_new_session=True,  # its own group: a timeout kills all of it
            )
        self.reader = threading.Thread(target=self._read, args=(events,), daemon=True)
        self.reader.start()

    def _read(self, events: "queue.Queue[Any]") -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            if not line.startswith(PREFIX):
                continue
            try:
                event = json.loads(line[len(PREFIX):])
            except ValueError:
                continue
            if isinstance(event, dict):
                events.put((self, event))
        events.put((self, None))  # its stdout closed: it exited (or is about to)

    @property
    def alive(self) -> bool:
        return not (self.exited or self.timed_out)

    def seen(self, event: dict[str, Any] | None) -> None:
        if event is None:
            self.exited = True
            self._pause()
            return
        kind = event.get("event")
        if kind == "phase":
            self.phase = event.get("name")
        elif kind == "step":
            self.step = int(event.get("step", 0))
        elif kind == "ready":
            self.ready, self.timed = True, bool(event.get("timed"))
            self._pause()
            self.used_s /= self.share
        elif kind == "round":
            self.rounds.append([float(t) for t in event.get("times") or []])
            self._pause()

    def _pause(self) -> None:
        if self.running_since is not None:
            self.used_s += time.monotonic() - self.running_since
            self.running_since = None

    def send(self, line: str) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        self.running_since = time.monotonic()
        return True

    def close_stdin(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        if self.running_since is None:
            self.running_since = time.monotonic()

    def deadline(self) -> float | None:
        """When it must have answered (monotonic), while it works; None while it waits."""
        if self.running_since is None or not self.alive:
            return None
        limit = self.opts.child_timeout_s * (1 if self.ready else self.share)
        return self.running_since + max(0.0, limit - self.used_s)

    def kill(self, timed_out: bool = False) -> None:
        self.timed_out = self.timed_out or timed_out
        _kill_group(self.proc)
        self.proc.wait()
        self._pause()

    def outcome(self) -> ChildOutcome:
        if self.proc.poll() is None:
            self.kill()
        self.reader.join(timeout=5)
        result = None
        result_path = Path(self.spec["result_path"])
        spec_error = Path(self.spec["result_path"] + ".spec-error")
        if self.proc.returncode == 3 and spec_error.exists():
            raise ModelSpecFailed(f"--model {self.opts.model_name}: {spec_error.read_text(errors='replace')}")
        if not self.timed_out and self.proc.returncode == 0 and result_path.exists():
            try:
                result = json.loads(result_path.read_text())
            except ValueError:
                result = None
        with open(self.err_path, "rb") as f:
            f.seek(max(0, self.err_path.stat().st_size - STDERR_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
        return ChildOutcome(mode=self.mode, result=result, returncode=self.proc.returncode,
                            timed_out=self.timed_out, wall_s=time.monotonic() - self.started, stderr_tail=tail,
                            last_phase=self.phase, last_step=self.step, rounds=self.rounds)


class _Pump:
    """The children's events, one queue for all, handed to each child and to the
    progress callback; waits end when a condition holds or a working child's deadline
    passes (it is killed: a timeout)."""

    def __init__(self, progress: Progress | None) -> None:
        self.events: "queue.Queue[Any]" = queue.Queue()
        self.progress = progress

    def until(self, children: list[_Child], done: Callable[[], bool]) -> None:
        while not done():
            now = time.monotonic()
            dues = [(d, c) for c in children if (d := c.deadline()) is not None]
            wait = max(0.0, min(d for d, _ in dues) - now) if dues else 1.0
            try:
                child, event = self.events.get(timeout=min(wait, 1.0) + 0.01)
            except queue.Empty:
                for d, c in dues:
                    if time.monotonic() >= d:
                        c.kill(timed_out=True)
                continue
            child.seen(event)
            if event is not None and self.progress and event.get("event") not in ("ready", "round"):
                self.progress(child.mode, event)


def run_child(mode: str, opts: ProbeOptions, workdir: Path, progress: Progress | None = None,
              measure_overhead: bool = False) -> ChildOutcome:
    """One mode alone, start to finish (its timed steps in rounds of its own)."""
    pump = _Pump(progress)
    child = _Child(mode, opts, workdir, pump.events, measure_overhead)
    try:
        pump.until([child], lambda: child.ready or not child.alive)
        if child.alive and child.timed:
            least, _ = opts.round_bounds()
            for _ in range(least):
                if not _one_round(pump, child, opts):
                    break
        _finish(pump, child)
        return child.outcome()
    except BaseException:
        child.kill()
        raise


def _one_round(pump: _Pump, child: _Child, opts: ProbeOptions) -> bool:
    n = len(child.rounds)
    if not child.send(f"run {opts.round_steps}"):
        return False
    pump.until([child], lambda: len(child.rounds) > n or not child.alive)
    return child.alive and len(child.rounds) > n


def _finish(pump: _Pump, child: _Child) -> None:
    if child.alive:
        child.send("finish")
        child.close_stdin()
        pump.until([child], lambda: not child.alive)
        if not child.timed_out:
            child.proc.wait()


def _schedule(order: list[_Child], r: int) -> list[_Child]:
    """Round r's order: turned by one each round, so no mode always runs first."""
    k = r % len(order) if order else 0
    return order[k:] + order[:k]


def _stable(children: list[_Child], rounds: int) -> bool:
    """Every mode's speed-up over fp32 settled or precise (probe/stability.py)."""
    from .stability import SPEED_THRESHOLDS, figure, round_ratios, steady

    base = next((c for c in children if c.mode == "no" and c.alive), None)
    if base is None:
        return True  # no baseline: no speed-up to make stable
    others = [c for c in children if c is not base and c.alive and c.timed]
    mins = {id(c): [min(t) for t in c.rounds[:rounds] if t] for c in [base] + others}
    figures = [figure(round_ratios(mins[id(base)], mins[id(c)]), SPEED_THRESHOLDS) for c in others]
    if not figures:  # fp32 alone: its own step time steady enough to print
        figures = [figure([t / mins[id(base)][0] for t in mins[id(base)]] if mins[id(base)] else [])]
    return steady(figures)


def run_modes(opts: ProbeOptions, progress: Progress | None = None) -> tuple[list[ChildOutcome], dict[str, Any]]:
    """Every requested mode, `no` first (it is the baseline the others are measured
    against, so it runs even when not asked for, marked baseline-only)."""
    opts.validate()
    order = ["no"] + [m for m in opts.modes if m != "no"]
    started = time.monotonic()
    pump = _Pump(progress)
    children: list[_Child] = []
    meta: dict[str, Any] = {"rounds": 0, "round_steps": opts.round_steps, "stable": None, "interleaved": True}
    with _signals_raise(), tempfile.TemporaryDirectory(prefix="mpdoctor-probe-") as tmp:
        workdir = Path(tmp)
        try:
            for mode in order:
                if progress:
                    progress(mode, {"event": "start"})
                children.append(_Child(mode, opts, workdir, pump.events, measure_overhead=(mode == "no"),
                                       share=len(order)))
            # all started, built and warmed up (nothing timed yet), or gone
            pump.until(children, lambda: all(c.ready or not c.alive for c in children))
            timed = [c for c in children if c.alive and c.timed]
            least, most = opts.round_bounds()
            rounds_started = time.monotonic()
            r = 0
            while timed and r < most:
                for c in _schedule(timed, r):
                    if c.alive and progress:
                        progress(c.mode, {"event": "phase", "name": f"round {r + 1}"})
                    if c.alive:
                        _one_round(pump, c, opts)
                timed = [c for c in timed if c.alive]
                r += 1
                if r >= least and _stable(children, r):
                    break
                if opts.max_steps != opts.steps and time.monotonic() - rounds_started >= opts.round_budget_s:
                    break  # a machine this slow gets a bounded probe: too few rounds are said to be so
            meta["rounds"] = r
            meta["stable"] = _stable(children, r) if r else None
            meta["rounds_s"] = round(time.monotonic() - rounds_started, 2)
            outcomes = []
            for c in children:  # one at a time: the overhead pairs and --max-batch run alone
                _finish(pump, c)
                out = c.outcome()
                out.baseline_only = c.mode not in opts.modes
                if out.result is not None:
                    # Read the logits now: the folder goes away with this block.
                    out.result["eval"]["logits"] = _read_floats(Path(out.result["eval"]["logits_file"]))
                outcomes.append(out)
                if progress:
                    progress(c.mode, {"event": "end", "ok": out.result is not None})
        except BaseException:
            # Ctrl-C, SIGTERM (Interrupted), a --model that makes no model: every child
            # and all it started go with us; the folder is removed by the `with`.
            for c in children:
                if c.proc.poll() is None:
                    _kill_group(c.proc)
                    c.proc.wait()
            raise
    meta["wall_s"] = time.monotonic() - started
    return outcomes, meta


def _read_floats(path: Path) -> list[float] | None:
    from array import array

    try:
        data = array("f")
        data.frombytes(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data.tolist()  # native order: the child wrote it on this same machine


class _signals_raise:
    """While the probe runs (main thread only): SIGTERM and SIGHUP raise Interrupted
    where the parent waits, so its child's process group is killed and the temporary
    folder removed before the probe goes (the caller then dies of the same signal)."""

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

    def __enter__(self) -> "_signals_raise":
        self.saved: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.SIGNALS:
            try:
                self.saved[sig] = signal.signal(sig, self._raise)
            except (ValueError, OSError):
                pass
        return self

    @staticmethod
    def _raise(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self.saved.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError):
                pass
