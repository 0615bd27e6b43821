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
    # the odd tensor of a dtype or device mismatch and what made it (instrument/origin.py)
    "odd_tensor": "run: the tensor that was odd (a variable, or a parameter/buffer by its qualified name)",
    "odd_dtype": "run: its dtype",
    "odd_device": "run: its device",
    "odd_against": "run: the dtype (or device) of the other tensors of the op",
    "origin": "run: what made it, a code (parameter, model-params, buffer, buffer-unloaded, module-output, "
              "function-output, cast, created, computed) the rule says in [words.origin]",
    "origin_fix": "run: the same code, said as the fix in [words.origin_fix]",
    "origin_module": "run: the module that holds it (parameter/buffer) or made it (output)",
    "origin_module_type": "run: that module's class",
    "origin_module_params": "run: that module's parameters by dtype",
    "origin_model_params": "run: the whole watched model's parameters by dtype",
    "origin_training": "run: how that module is trained, a code (outside: neither prepared nor in an optimizer; "
                       "unprepared; not-optimized)",
    "origin_at": "run: file:line of the user's code that assigned it",
    "origin_code": "run: that line",
    "origin_cast": "run: the cast spelled on that line (`.double()`, `.to(torch.float16)`)",
    "origin_maker": "run: the torch call on that line that created it (`torch.from_numpy`, `torch.tensor`)",
    "origin_function": "run: the custom autograd Function whose forward returned it",
    "origin_function_at": "run: file:line of that Function's forward",
    "origin_used_at": "run: file:line where it met the others",
    "fix_dtype": "run: the dtype to make it (float32 in a mixed-precision run, else the others')",
    "fix_cast": "run: the method call that makes it so (`.float()`, `.bfloat16()`)",
    "amp_device": "run: the device type the tensors were on (for `torch.autocast(...)`)",
    "amp_dtype": "run: the autocast dtype at the failure",
}
# Facts the run face adds to an env rule it judges on the environment a process ran in.
OBSERVED_FACTS: dict[str, str] = {
    "observed_dtype": "run: the dtype the first Linear/conv produced",
    "observed_module": "run: the module of that first matmul",
    "observed_device": "run: the device the trained parameters were on",
    "requested_by": "run: what asked for the precision (the Accelerator of this run)",
}


_CAST_CALL = {"float32": ".float()", "bfloat16": ".bfloat16()", "float16": ".half()", "float64": ".double()"}
_HALF = ("float16", "bfloat16")


def origin_facts(exc: dict[str, Any]) -> dict[str, Any]:
    """The facts of the odd tensor a recorded exception's context names (its "origin":
    codes and names from instrument/origin.py; the rules hold the words)."""
    ctx = exc.get("context") or {}
    o = ctx.get("origin")
    if not isinstance(o, dict) or not o.get("dtype"):
        return {}
    kind = str(o.get("kind") or "unknown")
    dtype, against = str(o.get("dtype")), str(o.get("against") or "")
    by_device = o.get("differs") == "device"
    autocast = o.get("autocast") or ctx.get("autocast") or {}
    amp_dtype = next(iter(autocast.values()), None) if isinstance(autocast, dict) else None
    name = o.get("variable") or o.get("tensor")
    if o.get("role") == "input" and not o.get("variable") and exc.get("module"):
        name = f"{exc['module']}'s {o.get('tensor')}"
    model = o.get("model_params") or {}
    mod_params = o.get("module_params") or {}
    if kind == "parameter" and model and set(model) == {dtype}:
        kind = "model-params"
    if kind == "buffer" and str(o.get("device")) == "meta" and o.get("persistent") is False:
        kind = "buffer-unloaded"
    fix_dtype = None
    if not by_device:
        if dtype == "float64":
            fix_dtype = against if against in _HALF and not amp_dtype else "float32"
        elif dtype in _HALF and amp_dtype and kind in ("parameter", "model-params", "buffer"):
            fix_dtype = "float32"
        else:
            fix_dtype = against or None
    training = None
    if o.get("in_optimizer") is False and o.get("prepared") is False:
        training = "outside"
    elif o.get("prepared") is False:
        training = "unprepared"
    elif o.get("in_optimizer") is False and kind in ("parameter", "model-params"):
        training = "not-optimized"
    known = kind not in ("unknown",)
    facts = {
        "odd_tensor": name, "odd_dtype": dtype if not by_device else None,
        "odd_device": o.get("device") if by_device else None, "odd_against": against or None,
        "origin": kind if known else None, "origin_fix": kind if known else None,
        "origin_module": o.get("module") or None, "origin_module_type": o.get("module_type") or None,
        "origin_module_params": _counts(mod_params), "origin_model_params": _counts(model),
        "origin_training": training, "origin_at": o.get("at"), "origin_code": o.get("code"),
        "origin_cast": o.get("cast"), "origin_maker": o.get("maker"), "origin_function": o.get("function"),
        "origin_function_at": o.get("function_at"), "origin_used_at": o.get("used_at"),
        "fix_dtype": fix_dtype, "fix_cast": _CAST_CALL.get(fix_dtype or ""),
        "amp_device": str(o.get("device") or "").split(":")[0] or None if not by_device else None,
        "amp_dtype": amp_dtype,
    }
    return {k: v for k, v in facts.items() if v not in (None, "")}


def _counts(counts: dict[str, Any]) -> str | None:
    if not isinstance(counts, dict) or not counts:
        return None
    return ", ".join(f"{n}× {k}" for k, n in sorted(counts.items(), key=lambda kv: -int(kv[1] or 0)))


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
