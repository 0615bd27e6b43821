"""Child -> wrapper, through files only (never the child's stdout/stderr).

Each instrumented process writes, in the directory named by ``MPDOCTOR_EVENTS_DIR``:

* ``rank{R}-pid{P}.jsonl``: events, one JSON object a line, appended and flushed as they
  happen (``start``, ``snapshot`` — the recorder's whole state, the last one wins —,
  ``exception``, ``recovered`` — an exception recorded earlier was caught and an
  optimizer step completed after it —, ``internal-error``, ``exit``), so a rank killed
  mid-run leaves what it had found;
* ``rank{R}-pid{P}.progress``: one small JSON object rewritten in place (step, where:
  "forward", "backward", "optimizer", "in all_reduce", ...), so a rank killed while
  waiting for a dead peer is seen waiting.

Nothing is written by a process that never ran a model (a launcher such as
``accelerate launch`` or ``torchrun`` imports torch too). No torch import here: the
wrapper reads these files with this module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_DIR = "MPDOCTOR_EVENTS_DIR"
_PROGRESS_BYTES = 256


def current_rank() -> int | None:
    for key in ("RANK", "LOCAL_RANK", "ACCELERATE_PROCESS_INDEX"):
        val = os.environ.get(key)
        if val is not None and val.strip().isdigit():
            return int(val)
    return None


class EventSink:
    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self.rank = current_rank()
        self.pid = os.getpid()
        stem = f"rank{self.rank if self.rank is not None else 'x'}-pid{self.pid}"
        self.path = self.dir / f"{stem}.jsonl"
        self.progress_path = self.dir / f"{stem}.progress"
        self._fh: Any = None
        self._progress_fd: int | None = None
        self._last_progress: tuple[int, str] | None = None

    def _open(self) -> Any:
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")
            self._write({"type": "start", "rank": self.rank, "pid": self.pid, "argv": sys.argv[:8],
                         "world_size": os.environ.get("WORLD_SIZE"), "time": time.time()})
        return self._fh

    def _write(self, obj: dict[str, Any]) -> None:
        fh = self._fh
        fh.write(json.dumps(obj, default=str, allow_nan=True) + "\n")
        fh.flush()

    def event(self, name: str, /, **fields: Any) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader worker: not the rank's story
            return
        self._open()
        self._write({"type": name, "time": time.time(), **fields})

    def snapshot(self, snap: dict[str, Any]) -> None:
        self.event("snapshot", snap=snap)

    def progress(self, step: int, where: str) -> None:
        if self._last_progress == (step, where) or os.getpid() != self.pid:
            return
        self._last_progress = (step, where)
        if self._progress_fd is None:
            self._open()
            self._progress_fd = os.open(self.progress_path, os.O_WRONLY | os.O_CREAT, 0o644)
        data = json.dumps({"step": step, "where": where, "time": time.time()}).encode()
        os.pwrite(self._progress_fd, data.ljust(_PROGRESS_BYTES)[:_PROGRESS_BYTES], 0)

    @property
    def started(self) -> bool:
        return self._fh is not None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        if self._progress_fd is not None:
            os.close(self._progress_fd)


# ---- the wrapper's side ----------------------------------------------------------------
@dataclass
class RankRecord:
    """What one instrumented process left behind."""

    rank: int | None
    pid: int
    snapshot: dict[str, Any] = field(default_factory=dict)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    # exceptions caught by the program, after which it trained on (not the run's failure)
    recovered: list[dict[str, Any]] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)
    exit: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    start_time: float | None = None
    world_size: str | None = None
    env: dict[str, Any] | None = None  # the process's environment (env.inprocess)

    @property
    def first_exception(self) -> dict[str, Any] | None:
        return min(self.exceptions, key=lambda e: e.get("time", 0)) if self.exceptions else None


def read_events(directory: str | Path) -> list[RankRecord]:
    out: list[RankRecord] = []
    d = Path(directory)
    if not d.is_dir():
        return out
    for path in sorted(d.glob("*.jsonl")):
        rec: RankRecord | None = None
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            kind = ev.get("type")
            if kind == "start":
                rec = RankRecord(rank=ev.get("rank"), pid=int(ev.get("pid", 0)), start_time=ev.get("time"),
                                 world_size=ev.get("world_size"))
            elif rec is None:
                continue
            elif kind == "snapshot":
                rec.snapshot = ev.get("snap") or {}
            elif kind in ("exception", "exit-exception"):
                rec.exceptions.append(ev)
            elif kind == "recovered":
                rec.recovered.append(ev)
                rec.exceptions = [e for e in rec.exceptions
                                  if not (e.get("type") == "exception" and e.get("time") == ev.get("raised_time"))]
            elif kind == "internal-error":
                rec.internal_errors.append(ev.get("text", ""))
            elif kind == "env":
                rec.env = ev.get("env") or {}
            elif kind == "exit":
                rec.exit = ev
        if rec is None:
            continue
        prog = path.with_suffix(".progress")
        if prog.exists():
            try:
                rec.progress = json.loads(prog.read_bytes().decode("utf-8", "replace").strip() or "{}")
            except ValueError:
                rec.progress = None
        out.append(rec)
    return out
