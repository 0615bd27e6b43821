"""Parent side: one child process per precision mode, each with a deadline.

Never imports torch. A child that raises, dies by a signal or hangs becomes a failed
row with its stderr tail; the other modes still run and report. Modes run one after
another, not in parallel: on a small machine parallel children would time each
other's contention, not the precision modes.
"""

from __future__ import annotations

import json
import math
import os
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
    steps: int = 20
    warmup: int = 5
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


def run_child(mode: str, opts: ProbeOptions, workdir: Path, progress: Progress | None = None,
              measure_overhead: bool = False) -> ChildOutcome:
    spec = {
        "mode": mode, "steps": opts.steps, "warmup": min(opts.warmup, opts.steps - 1),
        "model": opts.model, "batch_size": opts.batch_size, "device": opts.device,
        "stress": opts.stress, "seed": opts.seed,
        "user_model": opts.model_spec, "seq_len": opts.seq_len,
        "max_batch": opts.max_batch, "memory_limit": opts.memory_limit,
        "max_batch_deadline": opts.timeout_s * 0.9 if opts.max_batch else None,
        "measure_overhead": measure_overhead, "overhead_steps": min(opts.overhead_steps, opts.steps),
        "result_path": str(workdir / f"{mode}.result.json"),
        "logits_path": str(workdir / f"{mode}.logits.f32"),
    }
    spec_path = workdir / f"{mode}.spec.json"
    spec_path.write_text(json.dumps(spec))
    err_path = workdir / f"{mode}.stderr"
    state: dict[str, Any] = {"phase": None, "step": 0}

    def read_events(stream: Any) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace")
            if not line.startswith(PREFIX):
                continue
            try:
                event = json.loads(line[len(PREFIX):])
            except ValueError:
                continue
            if event.get("event") == "phase":
                state["phase"] = event.get("name")
            elif event.get("event") == "step":
                state["step"] = int(event.get("step", 0))
            if progress:
                progress(mode, event)

    started = time.monotonic()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mpdoctor.probe.child", str(spec_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            env=_child_env(), start_new_session=True,  # its own group: a timeout kills all of it
        )
        reader = threading.Thread(target=read_events, args=(proc.stdout,), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=opts.child_timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        except BaseException:
            # Ctrl-C, SIGTERM (Interrupted), anything: the child and all it started go
            # with us; the temporary folder is removed by the caller's `with`.
            _kill_group(proc)
            proc.wait()
            raise
        reader.join(timeout=5)
    wall = time.monotonic() - started
    result = None
    result_path = Path(spec["result_path"])
    spec_error = Path(spec["result_path"] + ".spec-error")
    if proc.returncode == 3 and spec_error.exists():
        raise ModelSpecFailed(f"--model {opts.model_name}: {spec_error.read_text(errors='replace')}")
    if not timed_out and proc.returncode == 0 and result_path.exists():
        try:
            result = json.loads(result_path.read_text())
        except ValueError:
            result = None
    with open(err_path, "rb") as f:
        f.seek(max(0, err_path.stat().st_size - STDERR_TAIL_BYTES))
        tail = f.read().decode("utf-8", "replace")
    return ChildOutcome(mode=mode, result=result, returncode=proc.returncode, timed_out=timed_out,
                        wall_s=wall, stderr_tail=tail, last_phase=state["phase"], last_step=state["step"])


def run_modes(opts: ProbeOptions, progress: Progress | None = None) -> tuple[list[ChildOutcome], dict[str, Any]]:
    """Every requested mode, `no` first (it is the baseline the others are measured
    against, so it runs even when not asked for, marked baseline-only)."""
    opts.validate()
    order = ["no"] + [m for m in opts.modes if m != "no"]
    outcomes: list[ChildOutcome] = []
    started = time.monotonic()
    with _signals_raise(), tempfile.TemporaryDirectory(prefix="mpdoctor-probe-") as tmp:
        workdir = Path(tmp)
        for mode in order:
            if progress:
                progress(mode, {"event": "start"})
            out = run_child(mode, opts, workdir, progress, measure_overhead=(mode == "no"))
            out.baseline_only = mode not in opts.modes
            if out.result is not None:
                # Read the logits now: the folder goes away with this block.
                out.result["eval"]["logits"] = _read_floats(Path(out.result["eval"]["logits_file"]))
            outcomes.append(out)
            if progress:
                progress(mode, {"event": "end", "ok": out.result is not None})
    return outcomes, {"wall_s": time.monotonic() - started}


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
