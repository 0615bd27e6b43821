"""A wrapped run's evidence: what the instrumented processes recorded, as one JSON
document the run rules judge (the way env rules judge a snapshot).

The document (schema 1; `MPDOCTOR_SAVE_EVENTS=FILE` writes it, which is how the
fixtures under fixtures/events/ were recorded):

    {"schema": 1, "command": [...], "exit_code": 1, "signal": null,
     "output": {"bytes": N, "traceback": true},
     "processes": [{"rank": 0, "pid": 123, "world_size": "2",
                    "env": {...a snapshot of the process's environment...},
                    "watch": {...the watcher's state: plan, nonfinite, errors, scaler...},
                    "exceptions": [...], "exit": {...} | null, "progress": {...} | null,
                    "internal_errors": [...]}]}

Pure Python over JSON: no torch here. RunView is what run checks (run/checks/) see.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA = 1

# Facts the run face adds to a log rule it judges on an exception a process recorded
# (the rule base explains the message; the instrumentation saw where it was raised).
EXCEPTION_CONTEXT_FACTS: dict[str, str] = {
    "module": "run: the module whose forward raised",
    "module_type": "run: that module's class",
    "step": "run: the step it raised at (0-based forward count)",
    "phase": "run: forward / backward",
    "param_dtypes": "run: that module's parameters, as dtype@device",
    "input_dtypes": "run: its inputs, as dtype device shape",
    "autocast": "run: the autocast state at that moment",
    "memory_context": "run: process and device memory when it raised",
    "batch_shape": "run: the shape of the step's batch",
    "mode": "probe: the precision mode the failing child ran",
}
# Facts the run face adds to an env rule it judges on the environment a process ran in.
OBSERVED_FACTS: dict[str, str] = {
    "observed_dtype": "run: the dtype the first Linear/conv produced",
    "observed_module": "run: the module of that first matmul",
    "observed_device": "run: the device the trained parameters were on",
    "requested_by": "run: what asked for the precision (the Accelerator of this run)",
}


def build_evidence(cmd: list[str], result: Any, records: list[Any]) -> dict[str, Any]:
    """The evidence document of one run: the wrapper's ChildResult and the processes'
    RankRecords (instrument.events)."""
    text = result.tail.text() if result is not None else ""
    processes = []
    for r in records:
        processes.append({
            "rank": r.rank, "pid": r.pid, "world_size": r.world_size, "env": r.env or {},
            "watch": r.snapshot or {}, "exceptions": list(r.exceptions), "exit": r.exit,
            "progress": r.progress, "internal_errors": list(r.internal_errors),
        })
    return {
        "schema": SCHEMA,
        "command": list(cmd),
        "exit_code": result.exit_code if result is not None else 0,
        "signal": getattr(result, "signal_name", None),
        "output": {"bytes": result.tail.total if result is not None else 0,
                   "traceback": "Traceback (most recent call last)" in text},
        "processes": processes,
    }


class EvidenceError(ValueError):
    pass


def read_evidence(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise EvidenceError(f"{path}: cannot be read as run evidence ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("processes"), list):
        raise EvidenceError(f"{path}: not a run evidence file (schema {SCHEMA})")
    return data


class Process:
    """One instrumented process of the run."""

    def __init__(self, data: dict[str, Any], index: int):
        self.data = data
        self.index = index
        self.rank: int | None = data.get("rank")
        self.watch: dict[str, Any] = data.get("watch") or {}
        self.env: dict[str, Any] = data.get("env") or {}
        self.exceptions: list[dict[str, Any]] = data.get("exceptions") or []

    @property
    def path(self) -> str:
        return f"processes[{self.index}]"

    @property
    def plan(self) -> dict[str, Any]:
        return self.watch.get("plan") or {}

    @property
    def world_size(self) -> int | None:
        try:
            return int(self.data.get("world_size"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.data.get('pid')}"

    @property
    def first_exception(self) -> dict[str, Any] | None:
        return min(self.exceptions, key=lambda e: e.get("time", 0)) if self.exceptions else None


class RunView:
    """What the run checks read: the processes, the run's end, and the precision plan
    as the process that trained (the first with a plan) saw it."""

    def __init__(self, evidence: dict[str, Any]):
        self.evidence = evidence
        self.processes = [Process(p, i) for i, p in enumerate(evidence.get("processes") or [])]
        self.exit_code: int = int(evidence.get("exit_code") or 0)
        self.signal: str | None = evidence.get("signal")
        self.output: dict[str, Any] = evidence.get("output") or {}

    @property
    def watched(self) -> list[Process]:
        """The processes that ran a model (a launcher imports torch too, and records nothing)."""
        return [p for p in self.processes if p.watch or p.exceptions]

    @property
    def main(self) -> Process | None:
        """The process whose story is the run's: the first to fail, else rank 0 / the first."""
        failed = [p for p in self.watched if p.first_exception]
        if failed:
            return min(failed, key=lambda p: p.first_exception.get("time", 0))  # type: ignore[union-attr]
        ranked = sorted(self.watched, key=lambda p: (p.rank is None, p.rank or 0))
        return ranked[0] if ranked else None

    @property
    def plan(self) -> dict[str, Any]:
        for p in [self.main] + self.watched:
            if p is not None and p.plan:
                return p.plan
        return {}

    @property
    def world_size(self) -> int:
        return max([p.world_size or 1 for p in self.watched if p.rank is not None] or [1])

    @property
    def multi_rank(self) -> bool:
        """Ranked processes of a group (WORLD_SIZE > 1), or more than one rank recorded."""
        ranks = {p.rank for p in self.watched if p.rank is not None}
        return len(ranks) > 1 or (bool(ranks) and self.world_size > 1)
